"""Where copying SDDMM's K x n factor to n x K stops paying (``relayout.COPY_PER_READ``):
the same einsum timed with the copy forced and with the strided read forced, 1 thread,
thread CPU time (median of 15).

    python benchmarks/results/issue15/sddmm4/relayout_crossing.py [K ...]
"""
import statistics
import sys
import time
import warnings

import torch

import scorch
from scorch.tensor_compiler import relayout as R

warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")


def main(ks):
    torch.set_num_threads(1)
    n, m = 200_000, 2000
    g = torch.Generator().manual_seed(0)
    for K in ks:
        B, C = torch.randn(m, K, generator=g), torch.randn(K, n, generator=g)
        for nnz in (2000, 10000, 25000, 50000, 100000, 200000):
            idx = torch.stack([torch.randint(0, m, (nnz,), generator=g), torch.randint(0, n, (nnz,), generator=g)])
            S = scorch.sparse_tensor(torch.sparse_coo_tensor(idx, torch.rand(nnz, generator=g), (m, n)).coalesce(),
                                     format="csr")
            res = {}
            for name, ratio in (("copy", float("inf")), ("strided", 0)):
                R.COPY_PER_READ = ratio
                scorch.einsum("ij,ik,kj->ij", S, B, C)
                ts = []
                for _ in range(15):
                    t0 = time.thread_time()
                    scorch.einsum("ij,ik,kj->ij", S, B, C)
                    ts.append(time.thread_time() - t0)
                res[name] = statistics.median(ts) * 1e3
            print(f"K={K} n={n} nnz={S._nnz()}: {n / S._nnz():.1f} copied per read  "
                  f"copy {res['copy']:.3f} ms  strided {res['strided']:.3f} ms", flush=True)


if __name__ == "__main__":
    main([int(k) for k in sys.argv[1:]] or [32, 128])
