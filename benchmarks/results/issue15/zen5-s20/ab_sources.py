import sys, time, ctypes, statistics
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import numpy as np, kernels as K
from scorch.tensor_compiler import build
A = K.load_matrix(sys.argv[1]).astype("float32"); A.indptr, A.indices = A.indptr.astype("int32"), A.indices.astype("int32")
X = np.random.default_rng(0).standard_normal(A.shape[1]).astype("float32"); out = np.zeros(A.shape[0], "float32")
args = (ctypes.c_int64 * 9)(A.shape[0], A.shape[1], A.indptr.ctypes.data, A.indices.ctypes.data, A.data.ctypes.data, 1, X.ctypes.data, out.ctypes.data, 1)
get = ctypes.pythonapi.PyCapsule_GetPointer; get.restype = ctypes.c_void_p; get.argtypes = [ctypes.py_object, ctypes.c_char_p]
fns = {}
for s in sys.argv[2:]:
    m = build.load_kernel(open(s).read())
    fns[s] = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)(get(m.KERNEL_C, b"scorch.kernel_c"))
res = {s: [] for s in fns}
for r in range(7):
    for s, f in fns.items():
        t0 = time.perf_counter()
        for _ in range(2000): f(args, 1, 0)
        res[s].append((time.perf_counter() - t0) / 2000 * 1e6)
print(sys.argv[1], "  ".join(f"{s.split('/')[-1]} {statistics.median(v):.1f}" for s, v in res.items()))
