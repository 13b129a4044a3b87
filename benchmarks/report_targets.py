"""Kernels built for each ISA target, side by side in one process, against torch CSR.

For every case (SpMV, SpMM K = 8/16/32/128, SDDMM K = 32/128 by default) and matrix, the
same scorch einsum runs with kernels generated and built for each target
(``scorch.tensor_compiler.target``: the native build, ``-march=native``, and e.g. ``avx2``,
``-march=haswell`` with 32-byte vectors), interleaved round by round with ``torch.mm`` /
``torch.mv`` / ``sampled_addmm`` on a torch CSR (int32) copy; the median of the rounds is
reported as torch's time over scorch's (> 1: scorch faster). On an AVX-512 machine torch's
MKL still uses AVX-512 while the avx2 kernels do not, so their ratio is a pessimistic
stand-in for an AVX2-only machine.

    python benchmarks/report_targets.py                       # 1 thread, native vs avx2
    python benchmarks/report_targets.py --targets native avx2 sse --threads 2 \\
        --matrices copter2 4elt --kernels spmm:32 spmm:128

Writes a markdown table to stdout (and to ``--out`` when given).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels as K  # noqa: E402

import torch  # noqa: E402

from scorch.tensor_compiler import target as T  # noqa: E402

DEFAULT_CASES = ["spmv", "spmm:8", "spmm:16", "spmm:32", "spmm:128", "sddmm:32", "sddmm:128"]
DEFAULT_MATRICES = ["copter2", "4elt", "Groebner_id2003_aug", "bcspwr10", "NotreDame_www"]


def _time(fn: Callable[[], object], budget: float) -> float:
    """Median seconds per call over calls filling ``budget`` seconds (at least 3)."""
    ts = []
    end = time.perf_counter() + budget
    while len(ts) < 3 or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _case(spec: str, matrix: str) -> K.Case:
    kernel, _, k = spec.partition(":")
    return K.Case(kernel, matrix, int(k) if k else None)


def measure(case: K.Case, targets: List[str], rounds: int, budget: float) -> Dict[str, float]:
    """Seconds per call of torch CSR and of scorch for each target (median of rounds)."""
    peer = K.make_impl(case, "torch_csr")
    ours = K.make_impl(case, "scorch")
    for name in targets:            # compile (untimed) and check every target's kernel
        T.set_target(name)
        ok, msg = K.check(case, K._host_generic(ours.fn()))
        if not ok:
            raise AssertionError(f"{case.id} target {name}: {msg}")
    times: Dict[str, List[float]] = {"torch_csr": []}
    for name in targets:
        times[name] = []
    for _ in range(rounds):
        peer.fn()
        times["torch_csr"].append(_time(peer.fn, budget))
        for name in targets:
            T.set_target(name)
            ours.fn()                # the first call after a switch refills the warm table
            times[name].append(_time(ours.fn, budget))
    T.set_target(None)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--targets", nargs="+", default=["native", "avx2"])
    p.add_argument("--kernels", nargs="+", default=DEFAULT_CASES,
                   help="kernel[:K] items, e.g. spmm:32 spmv sddmm:128")
    p.add_argument("--matrices", nargs="+", default=DEFAULT_MATRICES)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.03, help="seconds of calls per round")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    K.set_threads(args.threads)
    names = [T.target_named(t).name + ("" if t != "native" and not T.target_named(t).native
                                       else " (native)") for t in args.targets]
    head = ("| case | matrix | torch CSR ms | " + " | ".join(f"{n} ms" for n in names) + " | "
            + " | ".join(f"{n} vs torch" for n in names) + " |")
    lines = [f"Targets side by side, {args.threads} thread(s), medians of {args.rounds} "
             f"interleaved rounds (`python benchmarks/{Path(__file__).name} "
             f"{' '.join(sys.argv[1:] if argv is None else argv)}`)", "", head,
             "|" + "---|" * (3 + 2 * len(names))]
    print("\n".join(lines), flush=True)
    ratios: Dict[str, Dict[str, List[float]]] = {}
    for spec in args.kernels:
        for m in args.matrices:
            case = _case(spec, m)
            r = measure(case, args.targets, args.rounds, args.budget)
            base = r["torch_csr"]
            cells = [f"{r[t] * 1e3:.3f}" for t in args.targets]
            rel = [base / r[t] for t in args.targets]
            for t, x in zip(args.targets, rel):
                ratios.setdefault(spec, {}).setdefault(t, []).append(x)
            line = (f"| {spec} | {m} | {base * 1e3:.3f} | " + " | ".join(cells) + " | "
                    + " | ".join(f"{x:.2f}x" for x in rel) + " |")
            lines.append(line)
            print(line, flush=True)
    lines += ["", "| case | " + " | ".join(f"{n} geomean vs torch" for n in names) + " |",
              "|" + "---|" * (1 + len(names))]
    for spec, per in ratios.items():
        lines.append(f"| {spec} | " + " | ".join(
            f"{float(np.exp(np.mean(np.log(per[t])))):.2f}x" for t in args.targets) + " |")
    print("\n".join(lines[-len(ratios) - 2:]))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
