"""Times the C SpMV prototypes in prototypes.c (CPU time per call, 1 thread, interleaved
rounds, median) on the benchmark matrices; build first (see NOTES.md):

    python prototypes_bench.py rmat18,uniform18 s_native,s_haswell v_base,v_b512
"""
import ctypes
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))          # benchmarks/

import numpy as np  # noqa: E402

import kernels as K  # noqa: E402

P = ctypes.c_void_p
builds, fns = sys.argv[2].split(","), sys.argv[3].split(",")
libs = {b: ctypes.CDLL(str(HERE / f"spmv_{b}.so")) for b in builds}
for m in sys.argv[1].split(","):
    A = K.load_matrix(m).astype(np.float32)
    A.indptr, A.indices = A.indptr.astype(np.int32), A.indices.astype(np.int32)
    x = np.random.default_rng(0).standard_normal(A.shape[1]).astype(np.float32)
    y = np.empty(A.shape[0], np.float32)
    ref = A @ x
    args = [ctypes.c_int64(A.shape[0]), P(A.indptr.ctypes.data), P(A.indices.ctypes.data),
            P(A.data.ctypes.data), P(x.ctypes.data), P(y.ctypes.data)]
    reps = max(1, int(2e7 // A.nnz))
    res = {}
    for r in range(5):
        for b in builds:
            for f in fns:
                c = getattr(libs[b], f)
                c(*args)
                if r == 0 and not np.allclose(y, ref, rtol=1e-3, atol=1e-3):
                    raise AssertionError(f"{m}: {b}:{f} differs from scipy")
                t0 = time.thread_time()
                for _ in range(reps):
                    c(*args)
                res.setdefault(f"{b}:{f}", []).append((time.thread_time() - t0) / reps)
    base = statistics.median(res[f"{builds[0]}:{fns[0]}"])
    print(m, f"{A.nnz / A.shape[0]:.1f}/row")
    for k, v in res.items():
        t = statistics.median(v)
        print(f"   {k:20s} {t * 1e6:9.1f} us {t / A.nnz * 1e9:.2f} ns/entry  first/this {base / t:.2f}")
