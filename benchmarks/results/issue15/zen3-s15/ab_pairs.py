"""(With ``entry_pairs.patch`` applied: ``git apply benchmarks/results/issue15/zen3-s15/entry_pairs.patch``.)
SpMM through scorch.einsum with and without entry pairs (``lower.loops._entry_pairs``),
interleaved in one process: pairs are switched off by patching ``PAIR_MAX_VECTORS`` to 0
and the plan cache is cleared at each switch (both kernels stay in the disk cache).
Wall time per call, medians (and mins) over rounds; checked against scipy.

    python benchmarks/results/issue15/zen3-s15/ab_pairs.py MATRIX[,MATRIX..] [K,K..] [rounds] [threads]

``PAIR_MIN=N`` in the environment overrides ``PAIR_MIN_ENTRIES`` for the run.
"""
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import kernels as kb  # noqa: E402
import scorch  # noqa: E402
from scorch.tensor_compiler.api import plan_cache_clear  # noqa: E402
from scorch.tensor_compiler.lower import loops  # noqa: E402

mats = sys.argv[1].split(",")
Ks = [int(k) for k in (sys.argv[2] if len(sys.argv) > 2 else "8,16,32").split(",")]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
loops.PAIR_MIN_ENTRIES = int(os.environ.get("PAIR_MIN", loops.PAIR_MIN_ENTRIES))
original = loops.PAIR_MAX_VECTORS
for m in mats:
    A = kb.load_matrix(m)
    S = scorch.from_scipy(A)
    for K in Ks:
        B = torch.from_numpy(np.random.default_rng(0).standard_normal((A.shape[1], K), dtype=np.float32))
        A64, B64 = A.astype(np.float64), B.numpy().astype(np.float64)
        want, scale = A64 @ B64, abs(A64) @ abs(B64)   # float32 sums of cancelling terms: error ~ eps * sum |terms|
        times = {"single": [], "pairs": []}
        for r in range(rounds):
            for name in (("single", "pairs") if r % 2 == 0 else ("pairs", "single")):
                loops.PAIR_MAX_VECTORS = original if name == "pairs" else 0
                plan_cache_clear()
                got = torch.as_tensor(scorch.einsum("ij,jk->ik", S, B)).numpy()
                assert (abs(got - want) <= 1e-5 * scale + 1e-6).all(), (m, K, name)
                reps = max(1, min(20, int(0.05 / max(1e-6, times[name][-1] if times[name] else 0.01))))
                for _ in range(reps):
                    t = time.perf_counter()
                    scorch.einsum("ij,jk->ik", S, B)
                    times[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        mn = {k: min(v) * 1e3 for k, v in times.items()}
        print(f"{m:22s} K={K:3d} T={torch.get_num_threads()} single {med['single']:.3f} ms (min {mn['single']:.3f}), "
              f"pairs {med['pairs']:.3f} (min {mn['pairs']:.3f}): {med['single'] / med['pairs']:.2f}x", flush=True)
loops.PAIR_MAX_VECTORS = original
