"""Relayout (2-D transpose) tile shapes at 1 thread, interleaved."""
import sys, time, statistics, torch
from scorch.tensor_compiler import relayout as RL
torch.set_num_threads(1)
cfgs = [(128, 256), (128, 512), (128, 1024), (64, 512), (32, 1024), (16, 2048)]
for n in (15606, 55476, 262144):
    x = torch.randn(128, n)
    ref = x.t().contiguous()
    times = {c: [] for c in cfgs}; kern = {}
    for c in cfgs:
        RL.TILE_R, RL.TILE_C = c; RL._kernels.clear(); RL._kernel(torch.float32); kern[c] = RL._kernels[torch.float32]
    for r in range(7):
        for c in (cfgs if r % 2 == 0 else cfgs[::-1]):
            RL._kernels[torch.float32] = kern[c]
            d = RL.relayout(x, (1, 0), (1, 0), lambda e: 1)
            if r == 0: assert torch.equal(d, ref.t()) or torch.equal(d.t().contiguous(), ref) or torch.equal(d, x), c
            for _ in range(3):
                a = time.perf_counter(); RL.relayout(x, (1, 0), (1, 0), lambda e: 1); times[c].append(time.perf_counter() - a)
    b = [] 
    for _ in range(9):
        a = time.perf_counter(); x.clone(); b.append(time.perf_counter() - a)
    print(n, " ".join(f"{c[0]}x{c[1]}:{statistics.median(v)*1e3:.2f}" for c, v in times.items()), f"clone:{statistics.median(b)*1e3:.2f} ms", flush=True)
