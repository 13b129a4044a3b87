"""GCN training steps of bench_models.gcn_case, interleaved: min and median of thread CPU time
(1 thread: the load-robust figure) and of wall time. From the repository root:
    PYTHONPATH=. python benchmarks/results/issue13/zen3-s12-gcn/cpu_probe.py cora 1
"""
import sys, time, statistics, torch
sys.path.insert(0, "benchmarks")
import bench_models as BM
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
case = BM.make_case("gcn", sys.argv[1] if len(sys.argv) > 1 else "cora")
fns = {k: v.train for k, v in case.impls.items()}
for f in fns.values(): f(); f()
C = {k: [] for k in fns}; W = {k: [] for k in fns}
for r in range(15):
    for k, f in fns.items():
        c = time.thread_time(); t = time.perf_counter(); f()
        W[k].append(time.perf_counter() - t); C[k].append(time.thread_time() - c)
for k in fns:
    print(f"{k:10s} cpu min {min(C[k])*1e3:7.2f} med {statistics.median(C[k])*1e3:7.2f}  wall min {min(W[k])*1e3:7.2f} med {statistics.median(W[k])*1e3:7.2f}")
for k in fns:
    if k != "scorch":
        print(f"ratio {k}/scorch: cpu-min {min(C[k])/min(C['scorch']):.2f}x  wall-med {statistics.median(W[k])/statistics.median(W['scorch']):.2f}x")
