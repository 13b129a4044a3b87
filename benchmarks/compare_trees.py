"""A/B of scorch's kernels between two checkouts, in one run on one machine.

    python benchmarks/compare_trees.py BEFORE_TREE AFTER_TREE [--threads 2] [--rounds 7]

Each tree gets a long-lived worker process (its checkout first on ``sys.path``, built
extensions in place or installed); the parent asks the two workers in turn, round after
round, to time the same case (operands from ``benchmarks/kernels.py``, seeded), so load from
other processes falls on both alike. A worker times warm ``scorch.einsum`` calls (the first
call compiles or loads the kernel and is checked against scipy) and reports the median of
its calls in that round. The table gives, per case, the median over rounds of each tree and
the ratio before / after (> 1: the after tree is faster); a refactor that should not change
speed should stay within noise of 1.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

WORKER = r"""
import json, statistics, sys, time, warnings
sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2])
warnings.filterwarnings("ignore")
import numpy as np, torch
import scorch
import kernels as K
torch.set_num_threads(int(sys.argv[3]))
built = {}
for line in sys.stdin:
    kernel, matrix, k, budget = json.loads(line)
    case = K.Case(kernel, matrix, k)
    if case.id not in built:
        built.clear()
        impl = K.make_impl(case, "scorch")
        ok, why = K.check(case, impl.to_host(impl.fn()))
        built[case.id] = impl
        if not ok:
            print(json.dumps({"error": why}), flush=True)
            continue
    fn = built[case.id].fn
    fn()
    times, t_end = [], time.perf_counter() + budget
    while True:
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
        if time.perf_counter() > t_end and len(times) >= 3:
            break
    print(json.dumps({"median": statistics.median(times), "file": scorch.__file__}), flush=True)
"""


def _worker(tree: Path, threads: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, str(tree), str(HERE), str(threads)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(tree))


def _ask(p: subprocess.Popen, req) -> dict:
    p.stdin.write(json.dumps(req) + "\n")
    p.stdin.flush()
    line = p.stdout.readline()
    if not line:
        raise RuntimeError("worker died")
    return json.loads(line)


DEFAULT_CASES = [("spmv", "G51", None), ("spmv", "4elt", None), ("spmv", "copter2", None),
                 ("spmm", "4elt", 32), ("spmm", "bcspwr10", 128), ("spmm", "copter2", 32),
                 ("sddmm", "4elt", 32), ("sddmm", "bcspwr10", 128),
                 ("spgemm", "4elt", None), ("spgemm", "bcspwr10", None)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.25, help="seconds of calls per worker per round")
    ap.add_argument("--cases", nargs="+", default=None, metavar="KERNEL:MATRIX[:K]",
                    help="e.g. spmm:copter2:32 (default: a fixed mix of the four kernels)")
    args = ap.parse_args()
    cases = DEFAULT_CASES if not args.cases else [
        (c.split(":")[0], c.split(":")[1], int(c.split(":")[2]) if c.count(":") == 2 else None)
        for c in args.cases]
    workers = {"before": _worker(args.before.resolve(), args.threads),
               "after": _worker(args.after.resolve(), args.threads)}
    rows = []
    try:
        for kernel, matrix, k in cases:
            got = {"before": [], "after": []}
            for r in range(args.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for name in order:
                    res = _ask(workers[name], [kernel, matrix, k, args.budget])
                    if "error" in res:
                        raise RuntimeError(f"{name} tree gave a wrong result on {kernel} {matrix}: {res['error']}")
                    got[name].append(res["median"])
            b, a = statistics.median(got["before"]), statistics.median(got["after"])
            rows.append((kernel, matrix, k, b, a, b / a))
            print(f"{kernel:6} {matrix:20} K={k!s:4}  before {b * 1e3:9.4f} ms  after {a * 1e3:9.4f} ms"
                  f"  ratio {b / a:5.2f}", flush=True)
    finally:
        for p in workers.values():
            p.stdin.close()
            p.wait(timeout=30)
    geo = math.exp(sum(math.log(r[5]) for r in rows) / len(rows))
    print(f"geometric mean before/after: {geo:.3f} over {len(rows)} cases, {args.threads} threads, "
          f"{args.rounds} interleaved rounds ({time.strftime('%Y-%m-%d %H:%M')})")


if __name__ == "__main__":
    main()
