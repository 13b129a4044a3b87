"""One-process table of the conversion benchmarks: scorch next to the faster of torch and scipy.

    python benchmarks/report_conversions.py [--repeats 9] [--threads 2] [--out benchmarks/results]

Same cases and inputs as bench_conversions.py. Every implementation's result is checked first;
then the implementations of a case are timed round-robin (one call of each per round, after
a warm-up round) so that load from other processes hits all of them alike, and the median
of the rounds is reported. Ratio = best peer time / scorch time (>= 1 means scorch is at
least as fast as the faster peer). Writes conversions.md and conversions.json to --out.

The machine may be shared: before each case the script waits (up to --quiet-wait s) until
other processes use less than 0.3 cores, measures how many cores they used while the case
ran, and flags rows measured under load (their ratios say little about the code).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_conversions as B  # noqa: E402


QUIET = 0.3  # cores used by other processes below which a measurement counts as quiet


def _busy_ticks() -> int:
    """CPU ticks spent by everyone (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)


def _own_ticks() -> int:
    with open("/proc/self/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


class ForeignLoad:
    """Cores used by other processes since ``start()`` (0 where /proc is missing)."""

    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def start(self) -> "ForeignLoad":
        try:
            self.t0, self.busy0, self.own0 = time.monotonic(), _busy_ticks(), _own_ticks()
        except OSError:
            self.busy0 = None
        return self

    def cores(self) -> float:
        dt = time.monotonic() - self.t0
        if self.busy0 is None or dt <= 0:
            return 0.0
        return max(0.0, (_busy_ticks() - self.busy0 - (_own_ticks() - self.own0)) / self.hz / dt)


def wait_quiet(max_wait: float) -> float:
    deadline = time.monotonic() + max_wait
    while True:
        m = ForeignLoad().start()
        time.sleep(0.5)
        load = m.cores()
        if load < QUIET or time.monotonic() >= deadline:
            return load


def time_case(case: B.Case, repeats: int):
    fns = {impl: B.prepare(case, impl) for impl in B.IMPLS}
    for impl, fn in fns.items():
        B.check(case, impl, fn())  # also the warm-up round
    samples = {impl: [] for impl in fns}
    for _ in range(repeats):
        for impl, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[impl].append(time.perf_counter() - t0)
    return {impl: float(np.median(s)) for impl, s in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9, help="timed rounds per case (median; >= 7)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("-k", default="", help="only cases whose id contains this text")
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="seconds to wait per case for other processes to go quiet")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = []
    for case in B.CASES:
        if args.k not in case.id:
            continue
        wait_quiet(args.quiet_wait)
        meter = ForeignLoad().start()
        try:
            t = time_case(case, max(args.repeats, 7))
        except FileNotFoundError as e:
            print(f"skip {case.id}: {e}", file=sys.stderr)
            continue
        foreign = meter.cores()
        peer = min(("torch", "scipy"), key=lambda p: t[p])
        rows.append(dict(case=case.id, scorch_ms=t["scorch"] * 1e3, torch_ms=t["torch"] * 1e3,
                         scipy_ms=t["scipy"] * 1e3, best_peer=peer,
                         ratio=t[peer] / t["scorch"], foreign_cores=foreign))
        r = rows[-1]
        print(f"{r['case']:<28} scorch {r['scorch_ms']:9.3f} ms  torch {r['torch_ms']:9.3f}  "
              f"scipy {r['scipy_ms']:9.3f}  ratio {r['ratio']:.2f}  other load {foreign:.2f} cores",
              file=sys.stderr)
    lines = [f"Conversions, median of {max(args.repeats, 7)} interleaved rounds, "
             f"torch.set_num_threads({args.threads}), {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, load average {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}",
             "",
             "| conversion | scorch (ms) | torch (ms) | scipy (ms) | best peer (ms) | peer / scorch "
             "| other processes (cores) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        best = min(r["torch_ms"], r["scipy_ms"])
        lines.append(f"| {r['case']} | {r['scorch_ms']:.3f} | {r['torch_ms']:.3f} | {r['scipy_ms']:.3f} | "
                     f"{best:.3f} ({r['best_peer']}) | {r['ratio']:.2f} | {r['foreign_cores']:.2f}"
                     f"{' (under load)' if r['foreign_cores'] >= QUIET else ''} |")
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "conversions.md").write_text(table + "\n")
    (out / "conversions.json").write_text(json.dumps(dict(threads=args.threads, rows=rows), indent=1))


if __name__ == "__main__":
    main()
