"""Comparisons, where and the fused addcmul against scipy.sparse (and addcmul against its
two-kernel operator form), on a shared SuiteSparse matrix (CSR, float32, one thread).

    SCORCH_DATA_DIR=/work/shared/data python benchmarks/report_comparison.py [--matrix M]

Same method as report_ops_overhead.py (interleaved rounds, ratio of medians; < 1: scorch
faster). scipy has no where/addcmul: its nearest forms are timed (``m.multiply(m > 0)``,
``m + 0.5 * m.multiply(mb)``).
"""
from __future__ import annotations

import argparse

import torch

import scorch
from scorch.datasets import load_matrix
from report_ops_overhead import interleaved


def _compare(name: str, ours, ref, rounds: int) -> None:
    """One row: each side's median time a call and their ratio (< 1: scorch faster)."""
    t = interleaved({"scorch": ours, "ref": ref}, rounds)
    print(f"  {name:16s} scorch {t['scorch'] * 1e3:8.3f} ms   other {t['ref'] * 1e3:8.3f} ms   "
          f"ratio {t['scorch'] / t['ref']:.2f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--matrix", default="NotreDame_www")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    m = load_matrix(a.matrix)
    A = scorch.from_scipy(m)
    B = A * 2.0
    mb = m * 2.0
    print(f"{a.matrix} {tuple(A.shape)} nnz={A.nnz}: scorch against scipy.sparse")
    for name, ours, ref in [
            ("A > 0", lambda: A > 0, lambda: m > 0),
            ("A != 0", lambda: A != 0, lambda: m != 0),
            ("A < B", lambda: A < B, lambda: m < mb),
            ("where(A>0,A,0)", lambda: torch.where(A > 0, A, 0.0), lambda: m.multiply(m > 0)),
            ("addcmul", lambda: torch.addcmul(A, A, B, value=0.5), lambda: m + 0.5 * m.multiply(mb))]:
        _compare(name, ours, ref, a.rounds)
    print("addcmul (one kernel) against A + 0.5 * A * B (three kernels):")
    _compare("addcmul", lambda: torch.addcmul(A, A, B, value=0.5), lambda: A + 0.5 * A * B, a.rounds)


if __name__ == "__main__":
    main()
