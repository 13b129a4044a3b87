"""SDDMM n x K: prefetch distance A/B in one process (plan cache cleared per switch)."""
import statistics, sys, time
import numpy as np, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import kernels as kb
import scorch
from scorch.tensor_compiler.api import plan_cache_clear
from scorch.tensor_compiler.lower import facts, loops
torch.set_num_threads(1)
mats = sys.argv[1].split(",")
K = int(sys.argv[2]) if len(sys.argv) > 2 else 128
settings = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "4096,8192,16384").split(",")]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
for m in mats:
    A = kb.load_matrix(m)
    rng = np.random.default_rng(0)
    S = scorch.from_scipy(A) if hasattr(scorch, "from_scipy") else None
    B = torch.from_numpy(rng.standard_normal((A.shape[0], K), dtype=np.float32))
    C = torch.from_numpy(rng.standard_normal((A.shape[1], K), dtype=np.float32))
    times = {s: [] for s in settings}
    for r in range(rounds):
        for s in (settings if r % 2 == 0 else settings[::-1]):
            facts.DOT_PREFETCH_BYTES = s
            facts.DOT_PREFETCH_MAX = max(64, s // 64)
            plan_cache_clear()
            scorch.einsum("ij,ik,jk->ij", S, B, C)
            n = max(1, int(0.3 / max(1e-5, (times[s][-1] if times[s] else 0.01))))
            for _ in range(min(n, 20)):
                t = time.perf_counter(); scorch.einsum("ij,ik,jk->ij", S, B, C); times[s].append(time.perf_counter() - t)
    base = statistics.median(times[settings[0]])
    print(m, A.nnz, " ".join(f"{s}:{statistics.median(v)*1e3:.3f}ms({statistics.median(v)/A.nnz*1e9:.1f}ns,{base/statistics.median(v):.2f}x)" for s, v in times.items()), flush=True)
