"""A/B: SpMV short-rows (scalar) module vs the vector module, plus torch CSR, interleaved."""
import sys, time, statistics
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import numpy as np, torch, scorch, scipy.sparse as sp
import kernels as K
from scorch.tensor_compiler import codegen, build

def load(name):
    import os
    if os.path.exists(f"/tmp/s20/{name}.npz"):
        A = sp.load_npz(f"/tmp/s20/{name}.npz").tocsr()
    else:
        A = K.load_matrix(name).astype("float32")
    A.indptr, A.indices = A.indptr.astype("int32"), A.indices.astype("int32")
    return A

def tm(f):
    f(); t0 = time.perf_counter(); f(); one = time.perf_counter() - t0
    n = max(1, int(0.03 / max(1e-6, one)))
    t0 = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t0) / n * 1e6

def run(name):
    A = load(name)
    As = scorch.from_scipy(A)
    X = np.random.default_rng(0).standard_normal(A.shape[1]).astype("float32"); out = np.zeros(A.shape[0], "float32")
    s = scorch.explain("ij,j->i", As, torch.from_numpy(X)).schedule
    args = [A.shape[0], A.shape[1], A.indptr.ctypes.data, A.indices.ctypes.data, A.data.ctypes.data, 1, X.ctypes.data, out.ctypes.data, 1]
    idx = {ap.id: torch.int32 for ap in s.accesses if ap.sparse}
    mods = {"short": build.load_kernel(codegen.generate(s, torch.float32, idx, scalar_inner=True)[0]),
            "vector": build.load_kernel(codegen.generate(s, torch.float32, idx)[0])}
    tc = torch.sparse_csr_tensor(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), torch.from_numpy(A.data), A.shape)
    xt = torch.from_numpy(X)
    for T in (1, 2):
        ts = {k: [] for k in list(mods) + ["mkl"]}
        for r in range(9):
            for k, m in mods.items():
                ts[k].append(tm(lambda: m.kernel(args, T)))
            torch.set_num_threads(T)
            ts["mkl"].append(tm(lambda: torch.mv(tc, xt)))
        md = {k: statistics.median(v) for k, v in ts.items()}
        print(f"{name:22} nnz/row {A.nnz/A.shape[0]:5.1f} T={T}  short {md['short']:8.1f}  vector {md['vector']:8.1f}  mkl {md['mkl']:8.1f} us   vec/short {md['short']/md['vector']:.2f}x  mkl/short {md['mkl']/md['short']:.2f} mkl/vec {md['mkl']/md['vector']:.2f}", flush=True)

for name in sys.argv[1:]:
    run(name)
