"""SDDMM with C as K x n against C as n x K, and the copy of C that the first makes, at
several thread counts (issue 15: on the 16-core Xeon, session 14, SDDMM K = 32 on copter2
with C as K x n scaled 3.13 -> 1.01 ms from 1 to 16 threads while the n x K form scaled 2.36
-> 0.35 ms: a part of ~0.7 ms that does not shrink with threads).

    SCORCH_DATA_DIR=... python benchmarks/bench_relayout_threads.py --threads 1 2 4 8 16

Wall-clock medians (ms) after warm-up; the copy is ``relayout.relayout`` as ``execute.run``
calls it (same threads rule, same scratch slot).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import kernels as K  # noqa: E402
from scorch.tensor_compiler import relayout as RL, threads as TH  # noqa: E402


def median_ms(fn, n: int = 20) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--matrices", nargs="+", default=["copter2", "4elt"])
    p.add_argument("--ks", nargs="+", type=int, default=[32, 128])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    args = p.parse_args(argv)
    print("| matrix | K | threads | SDDMM C K x n | SDDMM C n x K | copy of C | copy threads |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in args.matrices:
        for k in args.ks:
            kn = K.make_impl(K.Case("sddmm", m, k), "scorch")
            c = K._dense_c(K.operands(K.Case("sddmm", m, k)), "sddmm")
            nk = K.make_impl(K.Case("sddmm_nk", m, k), "scorch")
            for t in args.threads:
                torch.set_num_threads(t)
                TH.threads_for(1 << 30)
                time.sleep(0.2)         # let the load estimate see a whole window
                copy = median_ms(lambda: RL.relayout(c, (1, 0), (1, 0), TH.threads_for, 2))
                print(f"| {m} | {k} | {t} | {median_ms(kn.fn):.3f} | {median_ms(nk.fn):.3f} | "
                      f"{copy:.3f} | {TH.threads_for(c.numel())} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
