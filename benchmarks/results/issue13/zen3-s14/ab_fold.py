"""MoE expert gradient with and without the gate value folded into the copied rows
(``lower/pack_rows._segment_factor``), interleaved in one process: the fold is switched
off by patching ``_segment_factor`` and the plan cache is cleared at each switch (both
kernels stay in the disk cache, so a switch only re-plans). CPU time per call, medians.

    python benchmarks/results/issue13/zen3-s14/ab_fold.py [rounds] [threads]
"""
import statistics
import sys
import time

import torch

import scorch
from scorch.tensor_compiler.api import plan_cache_clear
from scorch.tensor_compiler.lower import pack_rows

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
g = torch.Generator().manual_seed(0)
B, D, H, N, k = 1024, 784, 512, 8, 2
x, dy = torch.rand(B, D, generator=g), torch.rand(B, H, generator=g)
chosen = torch.rand(B, N, generator=g).topk(k, dim=1).indices
dense = torch.zeros(B, N).scatter(1, chosen, torch.rand(B, k, generator=g))
G = scorch.sparse_tensor(dense, format="csc")
want = torch.einsum("bh,bd,bn->ndh", dy, x, dense)
original = pack_rows._segment_factor


def call():
    return scorch.einsum("bh,bd,bn->ndh", dy, x, G, out_format="ddd")


times = {"fold": [], "no fold": []}
for r in range(rounds):
    for name in (("fold", "no fold") if r % 2 == 0 else ("no fold", "fold")):
        pack_rows._segment_factor = original if name == "fold" else (lambda *a: None)
        plan_cache_clear()
        got = torch.as_tensor(call())
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-2)
        for _ in range(3):
            t = time.process_time()
            call()
            times[name].append(time.process_time() - t)
pack_rows._segment_factor = original
med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
print(f"threads {torch.get_num_threads()}: " + ", ".join(f"{k} {v:.1f} ms (min {min(times[k]) * 1e3:.1f})"
                                                      for k, v in med.items())
      + f"; no fold / fold {med['no fold'] / med['fold']:.2f}x")
