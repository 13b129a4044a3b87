# A/B of forced SpMV kernel variants in one process: python ab.py MATRICES ROUNDS "VARIANT,VARIANT"
# (TH=threads; wall clock here; the 1-thread figures in README.md used time.thread_time)
import sys, time, statistics, numpy as np, torch
sys.path.insert(0, "benchmarks")   # run from the repository root
import bench_spmv_paths as B, kernels as K
import os; TH = int(os.environ.get("TH", "1"))
names = sys.argv[1].split(","); rounds = int(sys.argv[2]); pick = sys.argv[3].split(",")
for name in names:
    A = K.load_matrix(name).astype("float32"); A.indptr = A.indptr.astype("int32"); A.indices = A.indices.astype("int32")
    x = np.random.default_rng(0).standard_normal(A.shape[1]).astype("float32")
    out = np.empty(A.shape[0], "float32")
    args = [A.shape[0], A.shape[1], A.indptr.ctypes.data, A.indices.ctypes.data, A.data.ctypes.data, 1, x.ctypes.data, out.ctypes.data, 1]
    V = {k: v for k, v in B._variants(A, x).items() if k in pick}
    import scorch, torch as T
    from scorch.tensor_compiler import codegen, build
    Ax = scorch.from_scipy(A); sch = scorch.explain("ij,j->i", Ax, T.from_numpy(x)).schedule
    short = codegen.generate(sch, T.float32, {ap.id: T.int32 for ap in sch.accesses if ap.sparse}, scalar_inner=True)[0]
    nopf = "\n".join(l for l in short.split("\n") if "+ qb + 8 + 512)" not in l)
    V["blocks-rowpf"] = build.load_kernel(B._forced(nopf, "run_chunk_blocks"))
    nopf2 = "\n".join(l for l in nopf.split("\n") if "scorch_prefetch_stream(a.t0_" not in l or "run_chunk_blocks" in l)
    
    ref = A @ x
    for k, m in V.items():
        m.kernel(args, TH); assert np.allclose(out, ref, rtol=1e-3, atol=1e-3), k
    t = {k: [] for k in V}
    for r in range(rounds):
        for k, m in V.items():
            f = m.kernel
            t0 = time.perf_counter(); n = 0
            while True:
                f(args, TH); n += 1
                if time.perf_counter() - t0 > 0.02: break
            t[k].append((time.perf_counter() - t0) / n)
    base = min(t[pick[0]])
    print(name, "  ".join(f"{k}: min {min(v)*1e6:.0f} med {statistics.median(v)*1e6:.0f} us ({base/min(v):.2f}x)" for k, v in t.items()))
