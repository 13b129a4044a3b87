import sys, time, os, statistics, gc
sys.path.insert(0, '/work/main/benchmarks')
import numpy as np, torch, scorch, kernels as K
K.set_threads(int(os.environ.get("T", "1")))
for m in sys.argv[1:]:
    case = [c for c in K.cases(["spmv"], matrices=[m])][0]
    impls = {n: K.make_impl(case, n) for n in ["scorch", "torch_csr", "scipy"]}
    for i in impls.values(): i.fn(); i.fn()
    per = {n: [] for n in impls}; batch = {n: [] for n in impls}
    for r in range(9):
        for n, i in impls.items():
            for _ in range(15):
                t = time.perf_counter(); i.fn(); per[n].append(time.perf_counter() - t)
            t = time.perf_counter()
            for _ in range(50): i.fn()
            batch[n].append((time.perf_counter() - t) / 50)
    print(m, " ".join(f"{n}: per-call {statistics.median(per[n])*1e6:.1f} batch {statistics.median(batch[n])*1e6:.1f}" for n in impls))
