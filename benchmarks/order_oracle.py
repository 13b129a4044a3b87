"""The loop-order oracle: every valid loop order of an einsum timed, the compiler's choice
next to the fastest. Finds where the cost model (``scorch/tensor_compiler/cost_model.py``)
misprices an order: a case whose chosen order is more than ``--flag`` times slower than the
best is marked ``<==``.

    python benchmarks/order_oracle.py                    # every case, 1 thread
    python benchmarks/order_oracle.py --threads 2 --only csc
    python benchmarks/order_oracle.py --wider --only csf  # also CSF, sparse x sparse, sums

Each order is forced by replacing Algorithm 1's result (``schedule.algorithm1``), the plan
cache cleared before each, so every other choice (tiling, layouts, transposes, the output
format) follows from the forced order as it would from a chosen one; each result is checked
against dense torch. Calls repeat on the same operands, so a transpose the order needs is
converted once and its permutation kept (``kept_conversions``), as in a training loop.
Times: median ms over repeated calls after two warm-up calls (compiles).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import scorch  # noqa: E402
import scorch.tensor_compiler as tc  # noqa: E402
from scorch.tensor_compiler import cost_model, schedule  # noqa: E402

_FORCED: Optional[Tuple[str, ...]] = None
_ALGORITHM1 = schedule.algorithm1


def _forced_algorithm1(p, threads=1):
    lo = _ALGORITHM1(p, threads)
    if _FORCED is None:
        return lo
    return dataclasses.replace(lo, order=list(_FORCED), terms=cost_model.cost_terms(_FORCED, p))


def median_ms(fn: Callable[[], object], calls: int = 15, budget_s: float = 0.5) -> float:
    fn()
    fn()
    times, start = [], time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    return statistics.median(times) * 1e3


def _dense(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) and x.layout == torch.strided else x.to_dense()


def orders(equation: str, ops: Sequence, dense_ops: Sequence) -> Tuple[List[str], float, Dict[tuple, float]]:
    """The chosen order and its time, and the time of every valid order (checked against
    dense torch; an order the compiler cannot run is left out)."""
    global _FORCED
    schedule.algorithm1 = _forced_algorithm1
    try:
        _FORCED = None
        tc.plan_cache_clear()
        want = torch.einsum(equation, *dense_ops)
        plan = scorch.explain(equation, *ops)
        # the order repeated calls run: the reuse plan's where it has one (transposes kept)
        chosen = (plan.reused or plan).loop_order
        chosen_ms = median_ms(lambda: scorch.einsum(equation, *ops))
        times = {}
        names = sorted(set(equation.split("->")[0].replace(",", "")))
        for order in itertools.permutations(names):
            _FORCED = order
            tc.plan_cache_clear()
            try:
                got = scorch.einsum(equation, *ops)
            except Exception:  # noqa: BLE001  (an order no transpose makes valid)
                continue
            if not torch.allclose(_dense(got).to(want.dtype), want, rtol=1e-3, atol=1e-3):
                raise AssertionError(f"{equation} in loop order {order}: wrong result")
            times[order] = median_ms(lambda: scorch.einsum(equation, *ops))
        return chosen, chosen_ms, times
    finally:
        _FORCED = None
        schedule.algorithm1 = _ALGORITHM1
        tc.plan_cache_clear()


def _sparse(shape, density: float, fmt: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(*shape, generator=g)
    d = torch.where(torch.rand(*shape, generator=g) < density, d, torch.zeros(()))
    return d, scorch.sparse_tensor(d, format=fmt)


def cases(n: int, density: float) -> List[Tuple[str, str, tuple, tuple]]:
    """(label, equation, operands, dense operands): products of one sparse matrix with dense
    matrices, vectors and 3-D operands whose results take every dimension order, in CSR,
    CSC and COO."""
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(n, 32, generator=g), torch.randn(n, 32, generator=g)
    Xt, v = torch.randn(32, n, generator=g), torch.randn(n, generator=g)
    B3, B3b = torch.randn(4, n, 16, generator=g), torch.randn(n, 4, 16, generator=g)
    two = [("ij,jk->ik", X), ("ij,jk->ki", X), ("ij,kj->ik", Xt), ("ij,ik->jk", X), ("ij,ik->kj", X),
           ("ij,j->i", v), ("ij,i->j", v), ("ij,bjk->bik", B3), ("ij,bjk->ikb", B3), ("ij,bjk->ibk", B3),
           ("ij,jbk->ibk", B3b), ("ij,jbk->bik", B3b), ("ij,jbk->kib", B3b)]
    out = []
    for fmt in ("csr", "csc", "coo"):
        Ad, A = _sparse((n, n), density, fmt, 1)
        out += [(f"{fmt} {eq}", eq, (A, d), (Ad, d)) for eq, d in two]
        out += [(f"{fmt} {eq}", eq, (A, X, Y2), (Ad, X, Y2))
                for eq, Y2 in (("ij,ik,jk->ij", Y), ("ij,ik,kj->ij", Xt), ("ij,ik,jk->i", Y))]
    return out


def wider_cases(n: int, density: float) -> List[Tuple[str, str, tuple, tuple]]:
    """More kinds of products: a CSF 3-D tensor (TTV, TTM, MTTKRP), sparse x sparse
    (elementwise, SpGEMM, a chain with a dense matrix) and sums over one dimension."""
    g = torch.Generator().manual_seed(0)
    Td, T = _sparse((200, 200, 200), 0.002, "csf", 3)
    X, Y, v = torch.randn(200, 16, generator=g), torch.randn(200, 16, generator=g), torch.randn(200, generator=g)
    Ad, A = _sparse((n, n), density, "csr", 1)
    Bd, B = _sparse((n, n), density, "csr", 2)
    Cd, C = _sparse((n, n), density, "csc", 2)
    D = torch.randn(n, max(1, n // 100), generator=g)
    return [("csf ijk,k->ij", "ijk,k->ij", (T, v), (Td, v)),
            ("csf ijk,jr,kr->ir", "ijk,jr,kr->ir", (T, X, Y), (Td, X, Y)),
            ("csf ijk,kr->ijr", "ijk,kr->ijr", (T, Y), (Td, Y)),
            ("csf ijk,ir,jr->kr", "ijk,ir,jr->kr", (T, X, Y), (Td, X, Y)),
            ("csr*csr ij,ij->ij", "ij,ij->ij", (A, B), (Ad, Bd)),
            ("csr*csc ij,ij->ij", "ij,ij->ij", (A, C), (Ad, Cd)),
            ("csr@csr ij,jk->ik", "ij,jk->ik", (A, B), (Ad, Bd)),
            ("csr@csc ij,jk->ik", "ij,jk->ik", (A, C), (Ad, Cd)),
            ("csr@csr@dense ij,jk,kl->il", "ij,jk,kl->il", (A, B, D), (Ad, Bd, D)),
            ("csr ij->j", "ij->j", (A,), (Ad,)),
            ("csc ij->i", "ij->i", (C,), (Cd,))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n", type=int, default=3000, help="the sparse matrix is n x n")
    parser.add_argument("--density", type=float, default=0.005)
    parser.add_argument("--only", default="", help="only cases whose label contains this")
    parser.add_argument("--flag", type=float, default=1.3, help="mark choices this much slower than the best")
    parser.add_argument("--wider", action="store_true",
                        help="also CSF tensors, sparse x sparse products and sums (slow: some orders iterate densely)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.n} x {args.n} at {args.density:.2%}, {args.threads} thread(s); median ms per call")
    print(f"| case | chosen | ms | best | ms | chosen / best |\n|---|---|---:|---|---:|---:|")
    todo = cases(args.n, args.density) + (wider_cases(args.n, args.density) if args.wider else [])
    for label, eq, ops, dense_ops in todo:
        if args.only not in label:
            continue
        chosen, chosen_ms, times = orders(eq, ops, dense_ops)
        best = min(times, key=times.get)
        ratio = chosen_ms / times[best]
        flag = " <==" if ratio > args.flag else ""
        print(f"| {label} | {','.join(chosen)} | {chosen_ms:.3f} | {','.join(best)} | {times[best]:.3f} | "
              f"{ratio:.2f}{flag} |", flush=True)


if __name__ == "__main__":
    main()
