"""What the op layer costs on top of the compiler: ``A @ X`` (through
``SparseTensor.__torch_function__`` and ``scorch.sparse_ops.matmul``) against the equivalent
``scorch.einsum`` call, on a shared SuiteSparse matrix (CSR, float32).

    python benchmarks/report_ops_overhead.py                      # NotreDame_www, K=16
    python benchmarks/report_ops_overhead.py --matrix 4elt --k 8 --rounds 15

Method: both calls are warmed up, then timed in interleaved rounds (each round times a batch
of each, alternating which goes first) so load from other processes falls on both alike; the
figure is the ratio of the medians (A @ X / einsum; the spec asks for <= 1.10).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import scorch
from scorch.datasets import load_matrix


def _batch(fn, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--matrix", default="NotreDame_www")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    A = scorch.from_scipy(load_matrix(a.matrix))
    X = torch.rand(A.shape[1], a.k)
    matmul = lambda: A @ X                                        # noqa: E731
    einsum = lambda: scorch.einsum("ij,jk->ik", A, X, out_format="dense")  # noqa: E731
    assert torch.allclose(matmul(), einsum())
    t1 = _batch(einsum, 3)
    reps = max(1, int(0.2 / max(t1, 1e-7)))
    ours, ref = [], []
    for r in range(a.rounds):
        pair = [(matmul, ours), (einsum, ref)]
        for fn, out in (pair if r % 2 else pair[::-1]):
            out.append(_batch(fn, reps))
    mo, me = statistics.median(ours), statistics.median(ref)
    print(f"{a.matrix} {tuple(A.shape)} nnz={A.nnz} K={a.k} threads={a.threads}: "
          f"A @ X {mo * 1e3:.3f} ms, einsum {me * 1e3:.3f} ms, ratio {mo / me:.3f}")


if __name__ == "__main__":
    main()
