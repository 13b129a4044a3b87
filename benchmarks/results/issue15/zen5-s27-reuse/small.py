import sys, os, torch, time, statistics
import scorch
def sparse(m, n, density, fmt, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(m, n, generator=g, dtype=torch.float64).to(dtype) + 0.5
    d = torch.where(torch.rand(m, n, generator=g) < density, d, torch.zeros((), dtype=dtype))
    return d, scorch.sparse_tensor(d, format=fmt)
torch.set_num_threads(int(sys.argv[1]))
def med(fn, n=400):
    for _ in range(5): fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6
for (m, n, d, fmt, K) in [(70, 70, 1.0, "csc", 8), (600, 600, 0.02, "csc", 8), (900, 500, 0.02, "csc", 8), (600, 600, 0.3, "csc", 8), (3000, 3000, 0.005, "csc", 32), (600, 600, 0.02, "coo", 8)]:
    Ad, A = sparse(m, n, d, fmt, 1)
    X = torch.randn(n, K)
    print(f"{m}x{n} {d} {fmt} K={K}: A@X {med(lambda: A @ X):.1f} us  einsum ij,jk->ik {med(lambda: scorch.einsum('ij,jk->ik', A, X)):.1f} us  A.t() {med(lambda: A.t() @ torch.randn(m, K)):.1f}")
