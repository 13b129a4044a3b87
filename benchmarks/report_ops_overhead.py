"""What the op layer costs: ``A @ X`` (and ``A.mm(X)``) against the equivalent
``scorch.einsum`` call, and elementwise ops and reductions against scipy.sparse, on the shared
SuiteSparse matrices (CSR, float32, one thread).

    python benchmarks/report_ops_overhead.py                       # A @ X on NotreDame_www
    python benchmarks/report_ops_overhead.py --matrix dwt_992 --k 8
    python benchmarks/report_ops_overhead.py --scipy               # + the scipy table
    python benchmarks/report_ops_overhead.py --scipy --matrix all  # every shared matrix
    python benchmarks/report_ops_overhead.py --scipy --matrix all --stat min  # best rounds
    python benchmarks/report_ops_overhead.py --fusion --matrix 4elt mdual  # expressions fused
    python benchmarks/report_ops_overhead.py --union-kernel --matrix arrow_spqr_46500 mdual
    python benchmarks/report_ops_overhead.py --fusion --matrix all --stat min --clock cpu  # loaded

(``SCORCH_DATA_DIR`` points at the matrices; default ``../shared/data``.)

Method: every call is warmed up, then the candidates are timed in interleaved rounds (each
round times a short batch of each, in a rotating order) so load from other processes falls on
all alike; a figure is the median over rounds. ``A @ X`` is reported as ``A @ X / einsum``
(the spec asks for <= 1.10); the scipy table as ``scipy / scorch`` (>= 1: scorch at least as
fast; the spec asks for >= 1). ``B`` has ``A``'s pattern (``A * 2``: the index arrays are
shared), ``C`` another one (``A``'s rows in a random order), so ``A + C`` merges two patterns.
``--fusion``: each expression of ``FUSION_CASES`` (``A * B + A``, ``A * B * 0.5 + A``,
``A * B * 0.5``, ``A * B + C``: the default policy) as one expression
(one fused kernel) against the same operators in statements (a kernel each), with B and C on
A's pattern in arrays of their own ("same") or on two other patterns (A's rows in random
orders: "different").
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch

import scorch
from scorch.datasets import MATRICES, load_matrix


STATS = {"median": statistics.median, "min": min}
#: ``--clock cpu``: this thread's CPU time, which leaves out the time slices other processes
#: take (steadier on a loaded machine; right for the one-thread calls measured here)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
_CLOCK = [time.perf_counter]


def interleaved(fns: Dict[str, Callable], rounds: int, budget: float = 0.1,
                stat: str = "median") -> Dict[str, float]:
    """Seconds per call of each function (the median over rounds, or with ``stat="min"`` the
    best round: steadier on a loaded machine), timed in rotating interleaved batches of
    about ``budget / rounds`` seconds each."""
    for f in fns.values():
        f()
    t = _CLOCK[0]()
    for f in fns.values():
        f()
    per_round = max(_CLOCK[0]() - t, 1e-7)
    reps = max(1, int(budget / rounds / per_round))
    times: Dict[str, List[float]] = {k: [] for k in fns}
    items = list(fns.items())
    for r in range(rounds):
        k0 = r % len(items)
        for name, f in items[k0:] + items[:k0]:
            t = _CLOCK[0]()
            for _ in range(reps):
                f()
            times[name].append((_CLOCK[0]() - t) / reps)
    return {k: STATS[stat](v) for k, v in times.items()}


def matmul_ratio(A, k: int, rounds: int) -> Tuple[float, float, float]:
    """(einsum seconds, A @ X / einsum, A.mm(X) / einsum)."""
    X = torch.rand(A.shape[1], k)
    assert torch.allclose(A @ X, scorch.einsum("ij,jk->ik", A, X))
    t = interleaved({"einsum": lambda: scorch.einsum("ij,jk->ik", A, X), "@": lambda: A @ X,
                     "mm": lambda: A.mm(X)}, rounds, budget=0.6)
    return t["einsum"], t["@"] / t["einsum"], t["mm"] / t["einsum"]


def scipy_cases(m, seed: int = 0):
    """(name, scorch call, scipy call) for the elementwise ops and reductions."""
    A = scorch.from_scipy(m)
    B = A * 2.0                                   # A's pattern, shared index arrays
    rows = np.random.default_rng(seed).permutation(m.shape[0])
    mc = m[rows].tocsr()
    mc.sort_indices()
    C = scorch.from_scipy(mc)                     # another pattern
    mb = m * 2.0
    return [
        ("A + B", lambda: A + B, lambda: m + mb),
        ("A + C", lambda: A + C, lambda: m + mc),
        ("A - C", lambda: A - C, lambda: m - mc),
        ("A * C", lambda: A * C, lambda: m.multiply(mc)),
        ("A * B", lambda: A * B, lambda: m.multiply(mb)),
        ("A * 2", lambda: A * 2.0, lambda: m * 2.0),
        ("A / 3", lambda: A / 3.0, lambda: m / 3.0),
        ("-A", lambda: -A, lambda: -m),
        ("A.sum()", lambda: A.sum(), lambda: m.sum()),
        ("A.sum(0)", lambda: A.sum(0), lambda: m.sum(axis=0)),
        ("A.sum(1)", lambda: A.sum(1), lambda: m.sum(axis=1)),
    ]


def scipy_row(m, rounds: int, stat: str = "median") -> Dict[str, float]:
    """scipy time / scorch time per case."""
    out = {}
    for name, ours, ref in scipy_cases(m):
        t = interleaved({"scorch": ours, "scipy": ref}, rounds, stat=stat)
        out[name] = t["scipy"] / t["scorch"]
    return out


def _clone_pattern(A, seed: int):
    """A's pattern in arrays of its own, with other values (nothing shared with A)."""
    values = torch.rand(A.nnz, generator=torch.Generator().manual_seed(seed))
    return scorch.sparse_tensor((A.indices(), values), A.shape, format="csr")


def _permuted_rows(m, seed: int):
    rows = np.random.default_rng(seed).permutation(m.shape[0])
    mc = m[rows].tocsr()
    mc.sort_indices()
    return scorch.from_scipy(mc)


def fusion_row(m, rounds: int, stat: str = "median") -> Dict[str, float]:
    """Two (or more) kernels' time / the fused kernel's time (>= 1: fusion pays) of each
    expression in ``FUSION_CASES``, with B, C on A's pattern ("same") or other patterns
    ("different")."""
    from scorch.sparse_ops import fusion
    A = scorch.from_scipy(m)
    out = {}
    for kind, (B, C) in {"same": (_clone_pattern(A, 1), _clone_pattern(A, 2)),
                         "different": (_permuted_rows(m, 1), _permuted_rows(m, 2))}.items():
        for case, (new_operands, fused, eager) in FUSION_CASES.items():
            fusion.set_eager_fusion(True, new_operands=new_operands)
            try:
                got, want = fused(A, B, C), eager(A, B, C)
                difference = got.to_scipy() - want.to_scipy()   # no dense copy
                # relative: a fused product-sum may round once (an FMA) where eager rounds twice
                scale = max(1.0, float(abs(want.to_scipy()).max()) if want.nnz else 1.0)
                assert difference.nnz == 0 or abs(difference).max() < 1e-4 * scale, case
                t = interleaved({"fused": lambda: fused(A, B, C),
                                 "eager": lambda: eager(A, B, C)}, rounds, stat=stat)
            finally:
                fusion.set_eager_fusion(True)       # the default
            out[f"{case} {kind}"] = t["eager"] / t["fused"]
            out[f"{case} {kind} ms"] = t["fused"] * 1e3
    return out


def union_split(m, rounds: int, stat: str = "median") -> Dict[str, float]:
    """``A + C`` (two patterns) split into its kernel and the rest: microseconds of the whole
    call, of the warm kernel alone (the compiled module called on the operands' arrays) and
    of scipy's ``m + mc``."""
    from scorch.sparse_ops import elementwise
    from scorch.tensor_compiler import api
    from scorch.tensor_compiler.arguments import arg_table, arg_values
    A, C = scorch.from_scipy(m), _permuted_rows(m, 0)
    mc = C.to_scipy()
    A + C
    asg = elementwise._SAME_SHAPE["add", 2]
    entry = next(v[3] for v in api._EXPR_FAST.values() if v[0] is asg)
    (module, args, _), = entry.kernels.values()
    sa, sc = A._storage, C._storage
    vals = arg_values(arg_table(args, entry.schedule), {0: sa, 1: sc},
                      {"i": sa.shape[0], "j": sa.shape[1]}, None)
    t = interleaved({"A + C": lambda: A + C, "kernel": lambda: module.kernel(vals, 1),
                     "scipy": lambda: m + mc}, rounds, budget=1.0, stat=stat)
    return {k: v * 1e6 for k, v in t.items()}


def _ab_c(A, B, C):
    return A * B + C               # one expression: one kernel (the product's matches and C)


def _ab_c_eager(A, B, C):
    x = A * B                      # a stored result is computed at once
    return x + C


def _ab_a(A, B, C):
    return A * B + A               # one kernel over two operands (fused by default)


def _ab_a_eager(A, B, C):
    x = A * B
    return x + A


def _scaled_ab_a(A, B, C):
    return A * B * 0.5 + A         # the number is a 0-d kernel argument: one kernel


def _scaled_ab_a_eager(A, B, C):
    x = A * B
    y = x * 0.5                    # on the stored values (no kernel)
    return y + A


def _scaled_ab(A, B, C):
    return A * B * 0.5


def _scaled_ab_eager(A, B, C):
    x = A * B
    return x * 0.5


#: case: (defer with new operands, the one expression, the same in statements)
FUSION_CASES = {
    "A * B + C": (False, _ab_c, _ab_c_eager),
    "A * B + A": (False, _ab_a, _ab_a_eager),
    "A * B * 0.5 + A": (False, _scaled_ab_a, _scaled_ab_a_eager),
    "A * B * 0.5": (False, _scaled_ab, _scaled_ab_eager),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--matrix", nargs="+", default=["NotreDame_www"],
                   help="shared matrices, or 'all'")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--scipy", action="store_true")
    p.add_argument("--union-kernel", action="store_true",
                   help="A + C split: the whole call, its kernel alone, scipy (microseconds)")
    p.add_argument("--fusion", action="store_true",
                   help="A * B + A, A * B + C, ... fused (one kernel) against statements "
                        "(a kernel each)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time, or this thread's CPU time (cpu: steadier under load)")
    p.add_argument("--stat", choices=sorted(STATS), default="median",
                   help="per-call time over the rounds (min: the best round, for loaded machines)")
    a = p.parse_args()
    _CLOCK[0] = CLOCKS[a.clock]
    torch.set_num_threads(a.threads)
    names = sorted(MATRICES) if a.matrix == ["all"] else a.matrix
    table = {}
    # --fusion or --union-kernel alone print only their own tables
    matmul = a.scipy or not (a.fusion or a.union_kernel)
    if matmul:
        print(f"threads={a.threads}, float32, CSR; A @ X and A.mm(X) over einsum (<= 1.10 asked)")
    for name in names if matmul else ():
        m = load_matrix(name)
        A = scorch.from_scipy(m)
        t, r_at, r_mm = matmul_ratio(A, a.k, a.rounds)
        print(f"  {name:20s} {str(tuple(A.shape)):18s} nnz={A.nnz:8d} K={a.k}: einsum "
              f"{t * 1e3:8.3f} ms, A @ X {r_at:.3f}, A.mm(X) {r_mm:.3f}", flush=True)
        if a.scipy:
            table[name] = scipy_row(m, a.rounds, a.stat)
    if a.union_kernel:
        print(f"\nA + C (two patterns): microseconds ({a.stat} over {a.rounds} rounds)")
        print("| matrix | `A + C` | its kernel | scipy | scipy / `A + C` | scipy / kernel |")
        print("|---|---:|---:|---:|---:|---:|")
        for name in names:
            u = union_split(load_matrix(name), a.rounds, a.stat)
            print(f"| {name} | {u['A + C']:.1f} | {u['kernel']:.1f} | {u['scipy']:.1f} | "
                  f"{u['scipy'] / u['A + C']:.3f} | {u['scipy'] / u['kernel']:.3f} |", flush=True)
    if a.fusion:
        print(f"\nstatements' time / one expression's time ({a.stat} over {a.rounds} rounds; "
              f"B, C on A's pattern in their own arrays (same), or other patterns (different); "
              f"fused ms: the expression's time)")
        heads = [f"`{c}` {k}" for c in FUSION_CASES for k in ("same", "different")]
        print("| matrix | nnz | " + " | ".join(heads) + " | `A * B + A` fused ms same |")
        print("|---|---:|" + "---:|" * (len(heads) + 1))
        for name in names:
            m = load_matrix(name)
            r = fusion_row(m, a.rounds, a.stat)
            cells = [f"{r[c + ' ' + k]:.2f}" for c in FUSION_CASES for k in ("same", "different")]
            print(f"| {name} | {m.nnz} | " + " | ".join(cells)
                  + f" | {r['A * B + A same ms']:.3f} |", flush=True)
    if a.scipy:
        cases = list(next(iter(table.values())))
        print(f"\nscipy.sparse time / scorch time (>= 1: scorch at least as fast; one thread; "
              f"{a.stat} over {a.rounds} rounds)")
        print("| matrix | " + " | ".join(f"`{c}`" for c in cases) + " |")
        print("|---|" + "---:|" * len(cases))
        for name, row in table.items():
            print(f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in cases) + " |")
        worst = {c: min(row[c] for row in table.values()) for c in cases}
        print("| **min** | " + " | ".join(f"{worst[c]:.2f}" for c in cases) + " |")


if __name__ == "__main__":
    main()
