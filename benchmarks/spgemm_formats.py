"""Sparse x sparse products by operand format, in one process (best of 3 warm calls, 1
thread): CSR x CSR (Gustavson) against CSC x CSR and COO x COO, which session 30 moved from
an outer product into a workspace as large as the result (1.1 s at 20k) to Gustavson after a
kept conversion (18 ms), and the conversions alone.

    python benchmarks/spgemm_formats.py [--sizes 2000 20000] [--per-row 10]
"""
from __future__ import annotations

import argparse
import time

import torch

import scorch


def _best(f, n: int = 3) -> float:
    f()
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--per-row", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n in args.sizes:
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, n, (2, n * args.per_row), generator=g)
        val = torch.rand(n * args.per_row, generator=g)
        A = {f: scorch.sparse_tensor((idx, val), size=(n, n), format=f) for f in ("csr", "csc", "coo")}
        times = {
            "csr @ csr": _best(lambda: A["csr"] @ A["csr"]),
            "csc @ csr": _best(lambda: A["csc"] @ A["csr"]),
            "coo @ coo": _best(lambda: A["coo"] @ A["coo"]),
            "csc -> csr": _best(lambda: A["csc"].to_format("csr")),
            "coo -> csr": _best(lambda: A["coo"].to_format("csr")),
        }
        order = scorch.explain("ij,jk->ik", A["csc"], A["csr"]).loop_order
        print(f"n = {n}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in times.items())
              + f"; csc @ csr loop order {order}")


if __name__ == "__main__":
    main()
