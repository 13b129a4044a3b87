import sys, time, torch, scorch
sys.path.insert(0, "benchmarks")
from order_oracle import _sparse, median_ms
torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(0)
B3 = torch.randn(4, 3000, 16, generator=g); X = torch.randn(3000, 32, generator=g)
for label, fn in [("A@X", lambda M: M @ X), ("A@B3", lambda M: torch.matmul(M, B3)), ("A.t()@X csr", lambda M: M.t() @ X)]:
    for seed in range(1, 4):
        Ad, A = _sparse((3000, 3000), 0.005, "csr" if "csr" in label else "csc", seed)
        ts = []
        for c in range(6):
            t0 = time.perf_counter(); fn(A); ts.append((time.perf_counter() - t0) * 1e3)
    print(label, "calls 1-6 (3rd matrix):", " ".join(f"{t:.3f}" for t in ts), f"steady {median_ms(lambda: fn(A), 300):.3f}")
