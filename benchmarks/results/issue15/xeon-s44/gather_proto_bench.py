"""Times gather_proto.c's row loops against torch CSR (MKL) in one process: CPU time per
call, 1 thread, interleaved rounds, median.

    python gather_proto_bench.py uniform16,rmat18 g_base,g_z16
"""
import ctypes
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))          # benchmarks/

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kernels as K  # noqa: E402

torch.set_num_threads(1)
P = ctypes.c_void_p
lib = ctypes.CDLL(str(HERE / "gather_proto.so"))
fns = sys.argv[2].split(",")
for m in sys.argv[1].split(","):
    A = K.load_matrix(m).astype(np.float32)
    A.indptr, A.indices = A.indptr.astype(np.int32), A.indices.astype(np.int32)
    x = np.random.default_rng(0).standard_normal(A.shape[1]).astype(np.float32)
    y = np.empty(A.shape[0], np.float32)
    At, xt = K._torch_csr(A), torch.from_numpy(x)
    ref = A @ x
    args = [ctypes.c_int64(A.shape[0]), P(A.indptr.ctypes.data), P(A.indices.ctypes.data),
            P(A.data.ctypes.data), P(x.ctypes.data), P(y.ctypes.data)]
    calls = {"torch CSR": lambda: torch.mv(At, xt)}
    for f in fns:
        calls[f] = (lambda c: lambda: c(*args))(getattr(lib, f))
        calls[f]()
        if not np.allclose(y, ref, rtol=1e-3, atol=1e-3):
            raise AssertionError(f"{m}: {f} differs from scipy")
    reps = max(1, int(1e7 // A.nnz))
    res = {}
    for r in range(7):
        for k, c in calls.items():
            c()
            t0 = time.thread_time()
            for _ in range(reps):
                c()
            res.setdefault(k, []).append((time.thread_time() - t0) / reps)
    base = statistics.median(res["torch CSR"])
    print(m, f"{A.nnz / A.shape[0]:.1f}/row")
    for k, v in res.items():
        t = statistics.median(v)
        print(f"   {k:12s} {t * 1e6:9.1f} us {t / A.nnz * 1e9:.2f} ns/entry  torch/this {base / t:.2f}")
