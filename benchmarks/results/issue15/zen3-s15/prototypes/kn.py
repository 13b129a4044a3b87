import sys, time, statistics, numpy as np, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import kernels as kb, scorch
from scorch.tensor_compiler import relayout as RL
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
K = 128
def t(f, n=5):
    f(); ts = []
    for r in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return statistics.median(ts) * 1e3
for m in sys.argv[1].split(","):
    A = kb.load_matrix(m); rng = np.random.default_rng(0)
    S = scorch.from_scipy(A)
    B = torch.from_numpy(rng.standard_normal((A.shape[0], K), dtype=np.float32))
    Ckn = torch.from_numpy(rng.standard_normal((K, A.shape[1]), dtype=np.float32))
    Cnk = Ckn.t().contiguous()
    print(m, f"kxn {t(lambda: scorch.einsum('ij,ik,kj->ij', S, B, Ckn)):.2f} ms, nxk {t(lambda: scorch.einsum('ij,ik,jk->ij', S, B, Cnk)):.2f}, "
          f"relayout {t(lambda: RL.relayout(Ckn, (1, 0), (1, 0), lambda n: torch.get_num_threads())):.2f}, torch .t().contiguous() {t(lambda: Ckn.t().contiguous()):.2f}, clone {t(lambda: Ckn.clone()):.2f}")
    p = scorch.explain('ij,ik,kj->ij', S, B, Ckn); print("  ", [l for l in str(p).splitlines() if "relayout" in l or "loop order" in l])
