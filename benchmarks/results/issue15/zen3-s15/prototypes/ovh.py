"""Per-call time of SpMV through scorch.einsum, S @ x, scipy and torch CSR, 1 thread: MATRIX[,MATRIX..] then a 16 x 16 matrix."""
import sys, time, statistics, numpy as np, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import kernels as kb, scorch
torch.set_num_threads(1)
def t(f, n=2000):
    for _ in range(50): f()
    ts = []
    for r in range(7):
        a = time.perf_counter()
        for _ in range(n): f()
        ts.append((time.perf_counter() - a) / n)
    return statistics.median(ts) * 1e6
for m in sys.argv[1].split(","):
    A = kb.load_matrix(m).astype(np.float32)
    x = np.random.default_rng(0).standard_normal(A.shape[1], dtype=np.float32)
    S = scorch.from_scipy(A); xt = torch.from_numpy(x)
    Ac = torch.sparse_csr_tensor(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), torch.from_numpy(A.data), A.shape)
    print(m, A.nnz, f"scorch einsum {t(lambda: scorch.einsum('ij,j->i', S, xt)):.1f} us, S@x {t(lambda: S @ xt):.1f}, scipy {t(lambda: A @ x):.1f}, torch csr {t(lambda: Ac @ xt):.1f}")
import scipy.sparse as sp
A = sp.random(16, 16, density=0.2, format="csr", dtype=np.float32, random_state=0)
S = scorch.from_scipy(A); xt = torch.randn(16); x = xt.numpy()
Ac = torch.sparse_csr_tensor(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), torch.from_numpy(A.data), A.shape)
print("tiny", f"scorch einsum {t(lambda: scorch.einsum('ij,j->i', S, xt)):.1f} us, S@x {t(lambda: S @ xt):.1f}, scipy {t(lambda: A @ x):.1f}, torch csr {t(lambda: Ac @ xt):.1f}")
