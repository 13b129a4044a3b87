"""Where a scorch GCN step (cora, 1 thread; argument: the implementation, scorch or torch_csr) spends its time: each profiled op call of the step,
min and median over 12 steps (the min is the load-robust figure). From the repository root:
    PYTHONPATH=. python benchmarks/results/issue13/zen3-s12-gcn/step_events.py
"""
import sys, time, torch, collections
sys.path.insert(0, "benchmarks")
import bench_models as BM
torch.set_num_threads(1)
case = BM.make_case("gcn", "cora")
impl = sys.argv[1] if len(sys.argv) > 1 else "scorch"
f = case.impls[impl].train
for _ in range(3): f()
per = collections.defaultdict(list)
for _ in range(12):
    with torch.profiler.profile() as prof:
        f()
    seen = collections.Counter()
    for e in prof.events():
        if e.name in ("EinsumFunction", "EinsumFunctionBackward", "aten::mm", "aten::addmm", "aten::bernoulli_", "aten::mul", "aten::sort", "_DropoutFunction", "_DropoutFunctionBackward", "aten::threshold_backward", "aten::add", "aten::clamp_min", "aten::sum"):
            seen[e.name] += 1
            per[(e.name, seen[e.name])].append(e.cpu_time_total)
for k in sorted(per, key=lambda k: -min(per[k]))[:16]:
    print(f"{k[0]:28s} #{k[1]}  min {min(per[k])/1e3:7.3f} ms  med {sorted(per[k])[len(per[k])//2]/1e3:7.3f}")
