"""What the op layer costs on top of the compiler: ``A @ X`` (through
``SparseTensor.__torch_function__`` and ``scorch.sparse_ops.matmul``) against the equivalent
``scorch.einsum`` call, on a shared SuiteSparse matrix (CSR, float32).

    python benchmarks/report_ops_overhead.py                      # NotreDame_www, K=16
    python benchmarks/report_ops_overhead.py --matrix 4elt --k 8 --rounds 15
    python benchmarks/report_ops_overhead.py --scipy    # also elementwise/reductions vs scipy

Method: both calls are warmed up, then timed in interleaved rounds (each round times a batch
of each, alternating which goes first) so load from other processes falls on both alike; the
figure is the ratio of the medians (A @ X / einsum; the spec asks for <= 1.10).
``--scipy`` times elementwise ops and reductions the same way against scipy.sparse (CSR, one
thread): ratio = scorch / scipy (< 1: scorch faster).
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


def _compare(name: str, ours_fn, ref_fn, rounds: int) -> None:
    ours_fn(); ref_fn()
    t1 = _batch(ref_fn, 3)
    reps = max(1, int(0.1 / max(t1, 1e-7)))
    ours, ref = [], []
    for r in range(rounds):
        pair = [(ours_fn, ours), (ref_fn, ref)]
        for fn, out in (pair if r % 2 else pair[::-1]):
            out.append(_batch(fn, reps))
    mo, me = statistics.median(ours), statistics.median(ref)
    print(f"  {name:12s} scorch {mo * 1e3:8.3f} ms  scipy {me * 1e3:8.3f} ms  ratio {mo / me:.2f}")


def scipy_table(A, m, rounds: int) -> None:
    B = scorch.sparse_tensor(A, format="csr")
    B = B * 2.0                      # same pattern, other values
    mb = m * 2.0
    cases = [
        ("A + B", lambda: A + B, lambda: m + mb),
        ("A - B", lambda: A - B, lambda: m - mb),
        ("A * B", lambda: A * B, lambda: m.multiply(mb)),
        ("A * 2", lambda: A * 2.0, lambda: m * 2.0),
        ("A / 3", lambda: A / 3.0, lambda: m / 3.0),
        ("-A", lambda: -A, lambda: -m),
        ("A.sum()", lambda: A.sum(), lambda: m.sum()),
        ("A.sum(1)", lambda: A.sum(1), lambda: m.sum(axis=1)),
        ("A.sum(0)", lambda: A.sum(0), lambda: m.sum(axis=0)),
    ]
    for name, ours_fn, ref_fn in cases:
        _compare(name, ours_fn, ref_fn, rounds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--matrix", default="NotreDame_www")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--scipy", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    m = load_matrix(a.matrix)
    A = scorch.from_scipy(m)
    X = torch.rand(A.shape[1], a.k)
    matmul = lambda: A @ X                                        # noqa: E731
    einsum = lambda: scorch.einsum("ij,jk->ik", A, X)                       # noqa: E731
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
    if a.scipy:
        print(f"elementwise and reductions against scipy.sparse ({a.matrix}, CSR float32):")
        scipy_table(A, m, max(5, a.rounds // 2))


if __name__ == "__main__":
    main()
