"""``torch.sparse.sampled_addmm`` on a scorch CSR tensor (one SDDMM einsum) against the same
call on torch's own CSR tensor, interleaved in one process: median ratio of 15 rounds of 10
calls each (> 1: scorch faster).

    python benchmarks/compare_sampled_addmm.py [--k 32] [--threads 1] [--matrices 4elt bcspwr10]
"""
import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import scorch  # noqa: E402
from scorch.datasets import load_matrix  # noqa: E402

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--matrices", nargs="+", default=["4elt", "bcspwr10"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.matrices:
        S = scorch.sparse_tensor(load_matrix(name), format="csr").float()
        T = S.to_torch()
        a, b = torch.rand(S.shape[0], args.k), torch.rand(args.k, S.shape[1])
        for _ in range(3):
            torch.sparse.sampled_addmm(S, a, b)
            torch.sparse.sampled_addmm(T, a, b)
        ratios = []
        for _ in range(15):
            t = time.perf_counter()
            for _ in range(10):
                torch.sparse.sampled_addmm(S, a, b)
            ours = time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(10):
                torch.sparse.sampled_addmm(T, a, b)
            ratios.append((time.perf_counter() - t) / ours)
        print(f"{name}: {S.nnz} stored, K = {args.k}, {args.threads} thread(s): torch / scorch "
              f"{statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
