"""GCN Cora step under cProfile, 1 thread (run from the repository root)."""
import sys, time, cProfile, pstats, torch
sys.path.insert(0, "benchmarks")
import bench_models as BM
torch.set_num_threads(1)
case = BM.make_case("gcn", "cora")
f = case.impls["scorch"].train
for _ in range(5): f()
pr = cProfile.Profile()
pr.enable()
for _ in range(40): f()
pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
