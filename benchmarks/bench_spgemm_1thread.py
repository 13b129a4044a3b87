"""SpGEMM ``A @ A`` at 1 thread: ``scorch.einsum("ij,jk->ik")`` (sorted, deduplicated output
columns; ``scorch_unsorted``: ``sorted=False``, unique columns in any order, scipy's contract)
against scipy (``A @ A``, columns left unsorted) and torch CSR, interleaved in one
process (the order rotates each repeat), median and best of repeats, as ratios to scipy.

Run from a tree's root (compare trees by running it in each, one after the other)::

    SCORCH_DATA_DIR=/work/shared/data PYTHONPATH=. python benchmarks/bench_spgemm_1thread.py [--repeats N] [matrix ...]

(default matrices: NotreDame_www 4elt copter2; non-square ones are truncated to square)."""
from __future__ import annotations

import statistics
import time
import warnings

import numpy as np
import scipy.sparse as sp
import torch

import scorch
import scorch.datasets


def _load(name: str) -> sp.csr_array:
    m = sp.csr_array(scorch.datasets.load_matrix(name), dtype=np.float32)
    s = min(m.shape)
    m = sp.csr_array(m[:s, :s])
    m.sum_duplicates()
    m.sort_indices()
    return m


def bench(name: str, repeats: int = 21) -> None:
    A = _load(name)
    As = scorch.from_scipy(A)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        At = torch.sparse_csr_tensor(torch.from_numpy(A.indptr.astype(np.int64)),
                                     torch.from_numpy(A.indices.astype(np.int64)),
                                     torch.from_numpy(A.data), A.shape)
    impls = {"scipy": lambda: A @ A, "torch_csr": lambda: At @ At,
             "scorch": lambda: scorch.einsum("ij,jk->ik", As, As),
             "scorch_unsorted": lambda: scorch.einsum("ij,jk->ik", As, As, sorted=False)}
    for f in impls.values():
        f()   # warm: compile, caches
    times = {k: [] for k in impls}
    names = list(impls)
    for r in range(repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            impls[k]()
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    ratios = ", ".join(f"{k} {med['scipy'] / med[k]:.2f}x (best {best['scipy'] / best[k]:.2f}x)"
                       for k in impls if k != "scipy")
    print(f"{name}: output nnz {(A @ A).nnz}, scipy {med['scipy'] * 1e3:.1f} ms; "
          f"speed vs scipy, median: {ratios}")


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("matrices", nargs="*", default=["NotreDame_www", "4elt", "copter2"])
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args()
    torch.set_num_threads(1)
    for name in args.matrices:
        bench(name, args.repeats)
