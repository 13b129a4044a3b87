"""Standard-kernel report: scorch vs torch.sparse (CSR, COO) vs scipy, in one process.

    python benchmarks/report_kernels.py                       # every matrix, 1 and 2 threads
    python benchmarks/report_kernels.py --quick               # 3 SuiteSparse + 4 synthetic
    SCORCH_TARGET=avx2 python benchmarks/report_kernels.py --quick --out benchmarks/results/avx2
    python benchmarks/report_kernels.py --threads 2 --kernels spmm sddmm --matrices 4elt mdual

Writes ``benchmarks/results/kernels.md`` (table, per-kernel geometric means, targets, STREAM
bandwidth of this machine), ``kernels.json`` (raw numbers) and ``kernels.png`` (ratio plot).

Method: for every case (kernel, K, matrix) the operands are built once; at each thread count
each implementation is called once and its result checked against a float64 reference (a
wrong result is timed but gets no ratio; this first call also compiles scorch's kernel), and
once more as warm-up. Then the implementations are timed in >= 7 interleaved rounds (rotating
order; a fast call is repeated within a round, up to 15x, to fill ~0.7 s per implementation),
so load from other processes falls on every peer alike; the time is the median of all timed
calls. Calls over 1 s take part in 3 rounds; a case whose first and warm-up calls both take
over ``--max-call`` seconds is not timed further and the faster of the two is reported,
marked ``(1x)``.
Threads via ``torch.set_num_threads``; scorch and torch follow it; scipy is single-threaded
(measured at every thread count all the same, as a noise check).
"best peer" = the fastest of torch CSR (int32 and int64 indices) and scipy; ratio = best
peer / scorch (> 1: scorch faster). scorch GB/s = the bytes that must move
(``kernels.bytes_moved``: for SpMV values + indices + x once + y once, the compulsory
traffic) / scorch's median; "of STREAM" = that over this machine's STREAM bandwidth at the
same thread count (the better of copy and triad). Matrices: the SuiteSparse set and seeded
R-MAT / uniform matrices of 2^16 to 2^21 rows (``kernels.SYNTHETIC``). The kernels are
built for ``scorch.tensor_compiler.target.current()`` (``SCORCH_TARGET``), named in the
report.

The machine is shared: before each case the script waits (up to ``--quiet-wait`` s) until
other processes use < 0.3 cores, and it records the CPU time other processes used while the
case was measured; rows measured under load are flagged.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kernels as K  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# targets (issue 15): geometric mean over matrices (all K pooled) of best-peer / scorch
TARGETS = {"spmm": 2.0, "sddmm": 2.0, "sddmm_nk": 2.0, "spgemm": 1.5, "spmv": 1.2}
MIN_CASE_TARGET = 0.9
FLAG_LOAD = 0.3  # cores used by other processes during a case that flag its rows


# --------------------------------------------------------------------------- machine load

def _proc_busy_ticks() -> int:
    with open("/proc/stat") as f:
        parts = f.readline().split()
    v = [int(x) for x in parts[1:]]
    # user nice system idle iowait irq softirq steal
    return v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)


def _self_ticks() -> int:
    with open("/proc/self/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)


class LoadMeter:
    """CPU cores used by *other* processes over a window (from /proc; 0 where unavailable)."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.start()

    def start(self):
        try:
            self.t0, self.b0, self.s0 = time.monotonic(), _proc_busy_ticks(), _self_ticks()
        except OSError:
            self.t0, self.b0, self.s0 = time.monotonic(), None, None

    def foreign_cores(self) -> float:
        if self.b0 is None:
            return 0.0
        dt = time.monotonic() - self.t0
        if dt <= 0:
            return 0.0
        return max(0.0, (_proc_busy_ticks() - self.b0 - (_self_ticks() - self.s0)) / self.hz / dt)


def wait_quiet(max_wait: float, threshold: float = FLAG_LOAD, window: float = 0.5) -> float:
    """Wait until other processes use < threshold cores (or max_wait passes); return the last
    reading."""
    deadline = time.monotonic() + max_wait
    while True:
        m = LoadMeter()
        time.sleep(window)
        load = m.foreign_cores()
        if load < threshold or time.monotonic() >= deadline:
            return load


# --------------------------------------------------------------------------- timing

def short_error(e: BaseException, n: int = 90) -> str:
    msg = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    return msg if len(msg) <= n else msg[: n - 3] + "..."


# --------------------------------------------------------------------------- STREAM

def stream(n: int = 1 << 25, reps: int = 8, threads=(1, 2)) -> List[Dict[str, Any]]:
    """STREAM-style copy (b = a) and triad (a = b + s c) on float64 arrays of n elements
    (256 MiB each by default, far larger than L3). GB/s with STREAM's byte counting (copy
    2 words/element, triad 3), best of reps; write-allocate traffic would add one word."""
    out = []
    a = torch.empty(n, dtype=torch.float64).fill_(1.0)
    b = torch.empty(n, dtype=torch.float64).fill_(2.0)
    c = torch.empty(n, dtype=torch.float64).fill_(0.5)
    word = 8
    saved = torch.get_num_threads()
    for t in threads:
        torch.set_num_threads(t)
        for name, fn, words in (("copy", lambda: b.copy_(a), 2),
                                ("triad", lambda: torch.add(b, c, alpha=3.0, out=a), 3)):
            fn()
            best = min(_timeit(fn) for _ in range(reps))
            out.append({"impl": f"torch, {t} thread{'s' if t > 1 else ''}", "op": name, "threads": t,
                        "gbs": words * word * n / best / 1e9, "ms": best * 1e3})
    torch.set_num_threads(saved)
    an, bn = a.numpy(), b.numpy()
    np.copyto(bn, an)
    best = min(_timeit(lambda: np.copyto(bn, an)) for _ in range(reps))
    out.append({"impl": "numpy, 1 thread", "op": "copy", "gbs": 2 * word * n / best / 1e9,
                "ms": best * 1e3})
    del a, b, c
    return out


def _timeit(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# --------------------------------------------------------------------------- running

def run_case(case: K.Case, threads: List[int], impls: List[str], args) -> List[Dict[str, Any]]:
    """Rows (one per thread count) for one case."""
    built: Dict[str, Any] = {}
    for impl in impls:
        try:
            built[impl] = K.make_impl(case, impl)
        except K.Unavailable as e:
            built[impl] = ("n/a", str(e))
        except Exception as e:  # noqa: BLE001  (scorch not ready / unsupported: record it)
            built[impl] = ("error", short_error(e))
            if args.verbose:
                traceback.print_exc()
    rows = []
    for t in threads:
        K.set_threads(t)
        meter = LoadMeter()
        row = {"kernel": case.kernel, "k": case.k, "label": case.label, "matrix": case.matrix,
               "threads": t, "cells": {}}
        timed: Dict[str, Any] = {}
        for impl in impls:
            b = built[impl]
            if isinstance(b, tuple):
                row["cells"][impl] = {"status": b[0], "msg": b[1]}
                continue
            cell, t_est = _check_and_warm(case, b, args)
            row["cells"][impl] = cell
            if t_est is not None:
                timed[impl] = (b, t_est, cell)
        _interleaved(timed, args)
        for cell in row["cells"].values():
            times = cell.pop("times", None)
            if times:
                cell["ms"] = statistics.median(times) * 1e3
                cell["min_ms"] = min(times) * 1e3
                cell["runs"] = 0 if cell.get("single") else len(times)
            elif cell.get("status") in ("ok", "wrong"):
                cell.update(status="error", msg=cell.get("msg", "no timing"))
        row["foreign_load"] = meter.foreign_cores()
        _derive(case, row)
        rows.append(row)
    return rows


def _check_and_warm(case: K.Case, impl: K.Impl, args):
    """First call (result checked against the reference; may include a kernel compile),
    then one warm-up call. Returns (cell, t_est); t_est is None when no more runs follow."""
    base = {"api": impl.api, "times": []}
    gc.collect()
    try:
        t = time.perf_counter()
        first = impl.fn()
        t_first = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001
        if args.verbose:
            traceback.print_exc()
        return dict(base, status="error", msg=short_error(e)), None
    try:
        host = impl.to_host(first)
        ok, msg = K.check(case, host)
        out_nnz = getattr(host, "nnz", None)
        del host
    except Exception as e:  # noqa: BLE001
        ok, msg, out_nnz = False, "check failed: " + short_error(e), None
    del first
    cell = dict(base, status="ok" if ok else "wrong", msg=msg, out_nnz=out_nnz)
    try:   # the warm-up call (the first may have compiled the kernel: that alone is no reason
        t = time.perf_counter()   # to time a case once)
        impl.fn()
        t_est = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001
        return dict(base, status="error", msg=short_error(e)), None
    if min(t_first, t_est) >= args.max_call:
        cell.update(times=[min(t_first, t_est)], single=True)
        return cell, None
    return cell, t_est


def _interleaved(timed: Dict[str, Any], args) -> None:
    """Time the implementations in interleaved rounds (a rotating order; each round calls
    each implementation a few times back to back), so load from other processes falls on
    every peer alike. >= args.runs rounds; calls slower than args.slow take part in 3."""
    if not timed:
        return
    rounds = max(1, args.runs)
    per_round = args.target / rounds
    reps = {n: (1 if te >= args.slow else int(min(15, max(1, per_round / max(te, 1e-9)))))
            for n, (_, te, _) in timed.items()}
    names = list(timed)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            impl, te, cell = timed[n]
            if cell["status"] == "error" or (te >= args.slow and r >= 3):
                continue
            gc.collect(0)
            for _ in range(reps[n]):
                try:
                    t = time.perf_counter()
                    impl.fn()
                    cell["times"].append(time.perf_counter() - t)
                except Exception as e:  # noqa: BLE001
                    cell.update(status="error", msg=short_error(e), times=[])
                    break


def _ms(cell) -> Optional[float]:
    return cell["ms"] if cell and cell.get("status") == "ok" else None


def _derive(case: K.Case, row: Dict[str, Any]) -> None:
    c = row["cells"]
    peers = {p: _ms(c.get(p)) for p in K.PEERS}
    peers = {p: v for p, v in peers.items() if v is not None}
    row["best_peer"] = min(peers, key=peers.get) if peers else None
    row["best_peer_ms"] = peers[row["best_peer"]] if peers else None
    s = _ms(c.get("scorch"))
    row["scorch_ms"] = s
    row["ratio"] = (row["best_peer_ms"] / s) if (s and row["best_peer_ms"]) else None
    row["ratio_torch_csr"] = (peers["torch_csr"] / s) if (s and "torch_csr" in peers) else None
    row["ratio_torch_csr64"] = (peers["torch_csr64"] / s) if (s and "torch_csr64" in peers) else None
    row["scorch_gbs"] = (K.bytes_moved(case) / (s * 1e-3) / 1e9) if s else None
    pm = row["best_peer_ms"]
    row["peer_gbs"] = (K.bytes_moved(case) / (pm * 1e-3) / 1e9) if pm else None


def stream_gbs(streams: List[Dict[str, Any]], threads: int) -> Optional[float]:
    """This machine's STREAM bandwidth at ``threads`` (the better of copy and triad)."""
    got = [x["gbs"] for x in streams if x.get("threads") == threads]
    return max(got) if got else None


def bw_fraction(row: Dict[str, Any], streams: List[Dict[str, Any]], key: str = "scorch_gbs") -> Optional[float]:
    """The row's bandwidth (``scorch_gbs`` or ``peer_gbs``) over STREAM's at its thread count."""
    bw = stream_gbs(streams, row["threads"])
    return row[key] / bw if (row.get(key) and bw) else None


def geomean(xs: List[float]) -> Optional[float]:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


# --------------------------------------------------------------------------- report

def _fmt_ms(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _cell_text(cell) -> str:
    if cell is None:
        return ""
    st = cell["status"]
    if st == "ok":
        return _fmt_ms(cell["ms"]) + (" (1x)" if cell.get("runs") == 0 else "")
    if st == "wrong":
        return f"{_fmt_ms(cell['ms'])} WRONG ({cell['msg']})"
    if st == "n/a":
        return "n/a: no kernel"
    return f"ERR {cell['msg']}"


def summarize(rows: List[Dict[str, Any]], threads_for_targets: int = 2) -> Dict[str, Any]:
    summary: Dict[str, Any] = {"per_kernel": {}, "per_label": {}, "targets": {}}
    t_rows = [r for r in rows if r["threads"] == threads_for_targets]
    if not t_rows:
        threads_for_targets = max(r["threads"] for r in rows)
        t_rows = [r for r in rows if r["threads"] == threads_for_targets]
    summary["threads"] = threads_for_targets
    for kname in K.KERNELS:
        kr = [r for r in t_rows if r["kernel"] == kname]
        if not kr:
            continue
        ratios = [r["ratio"] for r in kr if r["ratio"]]
        g = geomean(ratios)
        summary["per_kernel"][kname] = {"geomean": g, "n": len(ratios), "cases": len(kr),
                                        "geomean_vs_torch_csr": geomean(
                                            [r["ratio_torch_csr"] for r in kr])}
        for lab in sorted({r["label"] for r in kr},
                          key=lambda lb: next(r["k"] or 0 for r in kr if r["label"] == lb)):
            lr = [r["ratio"] for r in kr if r["label"] == lab and r["ratio"]]
            summary["per_label"][lab] = {"geomean": geomean(lr), "n": len(lr),
                                         "cases": sum(1 for r in kr if r["label"] == lab)}
        tgt = TARGETS[kname]
        holds = g is not None and len(ratios) == len(kr) and g >= tgt
        summary["targets"][kname] = {"target": tgt, "geomean": g, "holds": holds,
                                     "complete": len(ratios) == len(kr)}
    all_ratios = [(r["ratio"], r) for r in t_rows if r["ratio"]]
    if all_ratios:
        mn, mr = min(all_ratios, key=lambda x: x[0])
        summary["min_case"] = {"ratio": mn, "case": f"{mr['label']} {mr['matrix']}"}
    else:
        summary["min_case"] = None
    quiet = [(r["ratio"], r) for r in t_rows
             if r["ratio"] and r.get("foreign_load", 0) < FLAG_LOAD]
    if quiet:
        mn, mr = min(quiet, key=lambda x: x[0])
        summary["min_case_quiet"] = {"ratio": mn, "case": f"{mr['label']} {mr['matrix']}",
                                     "n": len(quiet)}
    else:
        summary["min_case_quiet"] = None
    summary["flagged"] = sum(1 for r in t_rows if r.get("foreign_load", 0) >= FLAG_LOAD)
    missing = sum(1 for r in t_rows if not r["ratio"])
    summary["min_case_holds"] = bool(all_ratios) and missing == 0 and \
        min(x for x, _ in all_ratios) >= MIN_CASE_TARGET
    summary["missing"] = missing
    return summary


def _summary_lines(L: List[str], summary: Dict[str, Any]) -> None:
    t = summary["threads"]
    L.append(f"## Summary at {t} threads (geometric mean over matrices)\n")
    L.append("| kernel | geomean best-peer/scorch | geomean torch-CSR/scorch | cases with a ratio "
             "| target | holds |")
    L.append("|---|---:|---:|---:|---:|---|")
    for kname, s in summary["per_kernel"].items():
        tg = summary["targets"][kname]
        g = f"{s['geomean']:.2f}x" if s["geomean"] else "-"
        gt = f"{s['geomean_vs_torch_csr']:.2f}x" if s["geomean_vs_torch_csr"] else "-"
        holds = "yes" if tg["holds"] else ("no" if tg["complete"] else "no (incomplete)")
        L.append(f"| {K.KERNEL_LABELS[kname]} | {g} | {gt} | {s['n']}/{s['cases']} | "
                 f">= {tg['target']}x | {holds} |")
    L.append("")
    L.append("Per kernel and K:\n")
    for lab, s in summary["per_label"].items():
        g = f"{s['geomean']:.2f}x" if s["geomean"] else "-"
        L.append(f"- {lab}: {g} ({s['n']}/{s['cases']} cases)")
    mc = summary["min_case"]
    L.append("")
    if mc:
        L.append(f"Minimum single-case ratio at {t} threads: **{mc['ratio']:.2f}x** "
                 f"({mc['case']}); target >= {MIN_CASE_TARGET}x: "
                 f"{'holds' if summary['min_case_holds'] else 'does not hold'}"
                 + (f" ({summary['missing']} cases without a ratio)"
                    if summary["missing"] else ""))
        mq = summary.get("min_case_quiet")
        if summary.get("flagged"):
            L.append("")
            L.append(f"{summary['flagged']} of the {t}-thread rows ran while other processes "
                     f"used >= {FLAG_LOAD} cores (`~`); minimum over the other rows: "
                     + (f"{mq['ratio']:.2f}x ({mq['case']})" if mq else "none"))
    else:
        L.append(f"No scorch ratios at {t} threads ({summary['missing']} cases without a "
                 "ratio): targets cannot be checked yet.")
    L.append("")
    L.append("Targets (issue 15, every thread count, geometric mean over matrices, peer = "
             "the fastest of torch CSR int32/int64 and scipy): SpMV >= 1.2x, SpMM >= 2x, SDDMM "
             ">= 2x (both layouts of C), SpGEMM >= 1.5x, no single case < 0.9x.\n")


def write_markdown(path: Path, rows, summary, streams, meta, args) -> None:
    L: List[str] = []
    L.append("# Standard kernels: scorch vs torch.sparse vs scipy\n")
    L.append(f"Generated by `python benchmarks/report_kernels.py {' '.join(meta['argv'])}` "
             f"on {meta['date']}.\n")
    if not meta.get("complete", True):
        L.append("**Partial: the run is still going (or was interrupted).**\n")
    L.append(f"- machine: {meta['cpu']}, {meta['cores']} cores; torch {meta['torch']}, "
             f"scipy {meta['scipy']}, numpy {meta['numpy']}; scorch at git {meta['git']}; "
             f"kernels built for target **{meta.get('target', '?')}**")
    L.append("- float32 everywhere; times are medians (ms) of the timed calls: >= 7 "
             "interleaved rounds per implementation after a checked first call and a warm-up "
             "(3 rounds for calls over 1 s; `(1x)`: first and warm-up calls both over "
             "--max-call s, not repeated, the faster of the two); every result was checked against a "
             "float64 reference before timing (`WRONG`: timed, no ratio)")
    L.append("- dense operands (x, X, B, C) are " + (
        # (runs before session 28 saved no such field: theirs were numpy's)
        "numpy arrays (16 bytes past a cache line)" if meta.get("dense_operands", "numpy") == "numpy"
        else "in torch's memory (64-byte aligned, as a PyTorch user's tensors are)")
        + ", the same arrays for every implementation")
    L.append("- ratio = best peer / scorch, best peer = the fastest of torch CSR (int32 and "
             "int64 indices) and scipy (> 1: scorch is faster); torch COO is shown for "
             "context only")
    L.append("- scipy (and the numpy gather-dot SDDMM) is single-threaded: its rows at 2 "
             "threads repeat the same work (a noise check)")
    L.append("- torch CSR uses int32 indices (MKL's native type); SDDMM peer is "
             "`torch.sparse.sampled_addmm(A, B, C, beta=0)` followed by an in-place multiply "
             "of its values by A's values (sampled_addmm ignores A's values); SpGEMM is "
             "A @ A^T with A truncated to square (paper App. E.1), A^T given to every "
             "implementation as CSR")
    L.append("- torch COO has no SDDMM kernel (sampled_addmm is CSR-only; the dense route "
             "forms the m x n product): `n/a`")
    L.append("- scorch GB/s = bytes that must move (index arrays + values + dense operands "
             "read + output written; SpGEMM output counted as CSR with int32 indices, SDDMM "
             "output as values only) / scorch time. Compare with the STREAM numbers below; "
             "small matrices fit in L2/L3 and can exceed DRAM bandwidth")
    L.append(f"- `~` after the matrix: other processes used >= {FLAG_LOAD} cores while the "
             "case ran (shared machine): treat that row as noisy\n")

    L.append("## Matrices\n")
    for name in meta["matrices"]:
        L.append(f"- {name}")
    L.append("")
    if meta.get("skipped"):
        L.append("Cases left out:\n")
        for sk in meta["skipped"]:
            L.append(f"- {sk}")
        L.append("")

    L.append("## Results\n")
    L.append("| kernel | matrix | threads | scorch ms | torch CSR ms | torch CSR64 ms | torch COO ms "
             "| scipy ms | best peer | ratio best-peer/scorch | scorch GB/s | of STREAM | peer GB/s |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        c = r["cells"]
        flag = " ~" if r.get("foreign_load", 0) >= FLAG_LOAD else ""
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        L.append("| " + " | ".join([
            r["label"], r["matrix"] + flag, str(r["threads"]),
            _cell_text(c.get("scorch")), _cell_text(c.get("torch_csr")),
            _cell_text(c.get("torch_csr64")), _cell_text(c.get("torch_coo")), _cell_text(c.get("scipy")),
            K.IMPL_LABELS.get(r["best_peer"], "-") if r["best_peer"] else "-", ratio,
            f"{r['scorch_gbs']:.1f}" if r["scorch_gbs"] else "-",
            f"{bw_fraction(r, streams):.0%}" if bw_fraction(r, streams) else "-",
            f"{r['peer_gbs']:.1f}" if r["peer_gbs"] else "-",
        ]) + " |")
    L.append("")

    for t in sorted({r["threads"] for r in rows}):
        _summary_lines(L, summarize(rows, t) if t != summary["threads"] else summary)
    spmv = [r for r in rows if r["kernel"] == "spmv" and r.get("scorch_gbs")]
    if spmv and streams:
        L.append("## SpMV: fraction of the compulsory-traffic limit\n")
        L.append("Bytes that must move (values + indices + row pointers + x once + y once) / "
                 "time, over this machine's STREAM bandwidth at the same thread count (goal: "
                 ">= 60 % on large matrices; small ones run from cache and can exceed 100 %).\n")
        L.append("| matrix | threads | MB moved | scorch of STREAM | best peer of STREAM |")
        L.append("|---|---:|---:|---:|---:|")
        for r in spmv:
            fr, fp = bw_fraction(r, streams), bw_fraction(r, streams, "peer_gbs")
            L.append(f"| {r['matrix']} | {r['threads']} | "
                     f"{K.bytes_moved(K.Case('spmv', r['matrix'])) / 1e6:.1f} | "
                     f"{fr:.0%} | " + (f"{fp:.0%}" if fp else "-") + " |")
        L.append("")
    if streams:
        L.append("## Machine bandwidth (STREAM-style)\n")
        L.append("float64 arrays of 2^25 elements (256 MiB each, L3 is 32 MiB), best of 8; "
                 "STREAM byte counting (copy 16 B/element, triad 24 B/element; with "
                 "write-allocate the hardware moves 1.5x and 1.33x that).\n")
        L.append("| implementation | op | GB/s | ms |")
        L.append("|---|---|---:|---:|")
        for s in streams:
            L.append(f"| {s['impl']} | {s['op']} | {s['gbs']:.1f} | {s['ms']:.1f} |")
        L.append("")

    apis = {}
    for r in rows:
        for impl, cell in r["cells"].items():
            if cell.get("api"):
                apis.setdefault((r["kernel"], impl), cell["api"])
    if apis:
        L.append("## Calls timed\n")
        for (kname, impl), api in sorted(apis.items()):
            L.append(f"- {K.KERNEL_LABELS[kname]}, {K.IMPL_LABELS[impl]}: `{api}`")
        L.append("")
    path.write_text("\n".join(L) + "\n")


def plot(path: Path, rows, summary) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install -e '.[bench]'): no plot"
    labels = []
    for r in rows:
        if r["label"] not in labels:
            labels.append(r["label"])
    threads = sorted({r["threads"] for r in rows})
    matrices = []
    for r in rows:
        if r["matrix"] not in matrices:
            matrices.append(r["matrix"])
    ncol = min(4, len(labels))
    nrow = math.ceil(len(labels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.6 * nrow), squeeze=False)
    any_ratio = any(r["ratio"] for r in rows)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(1, len(threads))
    for ax, lab in zip(axes.flat, labels):
        kname = next(r["kernel"] for r in rows if r["label"] == lab)
        for ti, t in enumerate(threads):
            vals = []
            for m in matrices:
                rr = [r for r in rows if r["label"] == lab and r["matrix"] == m
                      and r["threads"] == t]
                vals.append(rr[0]["ratio"] if rr and rr[0]["ratio"] else np.nan)
            xs = np.arange(len(matrices)) + (ti - (len(threads) - 1) / 2) * width
            vals = np.asarray(vals, dtype=float)
            ax.bar(xs, vals - 1.0, bottom=1.0, width=width, color=colors[ti % len(colors)],
                   label=f"{t} thread{'s' if t > 1 else ''}")  # bars grow from 1.0
        ax.axhline(1.0, color="black", linewidth=1)
        ax.axhline(TARGETS[kname], color="green", linewidth=1, linestyle="--",
                   label=f"target {TARGETS[kname]}x")
        ax.axhline(MIN_CASE_TARGET, color="red", linewidth=0.8, linestyle=":")
        _matrix_axis(ax, lab, matrices, "best peer / scorch")
        if not any_ratio:
            ax.text(0.5, 0.5, "no scorch results", transform=ax.transAxes, ha="center")
            ax.set_ylim(0.1, 10)
        ax.legend(fontsize=6)
    _finish(plt, fig, axes, len(labels), path,
            "scorch speedup over the fastest of torch.sparse CSR (int32, int64) and scipy (log scale)")
    return None


def _matrix_axis(ax, title: str, matrices, ylabel: str) -> None:
    """A panel with one tick per matrix on a log scale."""
    ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xticks(np.arange(len(matrices)))
    ax.set_xticklabels(matrices, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)


def _finish(plt, fig, axes, used: int, path, title: str) -> None:
    """Blank the unused panels, title, write the PNG."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bandwidth(path: Path, rows, streams) -> None:
    """Fraction of STREAM bandwidth per matrix and thread count, one panel per kernel label:
    scorch's bars, the best peer's as dots."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = list(dict.fromkeys(r["label"] for r in rows))
    matrices = list(dict.fromkeys(r["matrix"] for r in rows))
    threads = sorted({r["threads"] for r in rows})
    ncol = min(4, len(labels))
    nrow = math.ceil(len(labels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.6 * nrow), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(1, len(threads))
    for ax, lab in zip(axes.flat, labels):
        for ti, t in enumerate(threads):
            mine, peer = [], []
            for m in matrices:
                rr = [r for r in rows if r["label"] == lab and r["matrix"] == m and r["threads"] == t]
                mine.append((bw_fraction(rr[0], streams) or np.nan) if rr else np.nan)
                peer.append((bw_fraction(rr[0], streams, "peer_gbs") or np.nan) if rr else np.nan)
            xs = np.arange(len(matrices)) + (ti - (len(threads) - 1) / 2) * width
            c = colors[ti % len(colors)]
            ax.bar(xs, mine, width=width, color=c, label=f"scorch, {t} thr")
            ax.plot(xs, peer, "o", color="black", markersize=3,
                    label="best peer" if ti == 0 else None)
        ax.axhline(0.6, color="green", linewidth=1, linestyle="--", label="60 %")
        ax.axhline(1.0, color="black", linewidth=0.8)
        _matrix_axis(ax, lab, matrices, "of STREAM bandwidth")
        ax.legend(fontsize=6)
    _finish(plt, fig, axes, len(labels), path,
            "bytes that must move / time, over STREAM at the same thread count (log)")


def _meta(argv, matrices) -> Dict[str, Any]:
    import scipy
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import subprocess
        git = subprocess.run(["git", "-C", str(K.REPO), "log", "-1", "--format=%h %s"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        git = "?"
    return {"argv": argv, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu,
            "cores": os.cpu_count(), "torch": torch.__version__, "scipy": scipy.__version__,
            "numpy": np.__version__, "git": git,
            "dense_operands": "numpy" if K.NUMPY_OPERANDS else "torch",
            "matrices": [K.describe_matrix(m) for m in matrices]}


def render(path: Path, args) -> int:
    """Markdown and plots from a saved ``kernels.json`` (into ``args.out``)."""
    saved = json.loads(path.read_text())
    rows, streams, meta = saved["rows"], saved["stream"], saved["meta"]
    summary = summarize(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_markdown(args.out / "kernels.md", rows, summary, streams, meta, args)
    if not args.no_plot and not plot(args.out / "kernels.png", rows, summary) and streams:
        plot_bandwidth(args.out / "kernels_bandwidth.png", rows, streams)
    print(f"wrote {args.out / 'kernels.md'} from {path}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--kernels", nargs="+", default=list(K.KERNELS), choices=list(K.KERNELS))
    p.add_argument("--matrices", nargs="+", default=None,
                   help=f"default: all ({', '.join(K.MATRICES_ALL)} and {', '.join(K.SYNTHETIC)})")
    p.add_argument("--quick", action="store_true",
                   help=f"only {', '.join(K.MATRICES_QUICK + K.MATRICES_SYNTHETIC_QUICK)}")
    p.add_argument("--impls", nargs="+", default=list(K.IMPLS), choices=K.IMPLS)
    p.add_argument("--runs", type=int, default=7,
                   help="interleaved timing rounds (>= 1 timed call each) per implementation")
    p.add_argument("--target", type=float, default=0.7,
                   help="seconds of timed calls per implementation and case (fast calls are "
                        "repeated within a round up to 15x to fill it)")
    p.add_argument("--slow", type=float, default=1.0,
                   help="seconds above which a call gets only 3 timed runs")
    p.add_argument("--max-call", type=float, default=20.0,
                   help="seconds above which a first call is not repeated (its time is "
                        "reported, marked 1x)")
    p.add_argument("--quiet-wait", type=float, default=20.0,
                   help="seconds to wait per case for other processes to go quiet")
    p.add_argument("--retries", type=int, default=1,
                   help="passes that re-measure rows taken under foreign load")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--from-json", type=Path, default=None,
                   help="write the markdown and plots again from a run's kernels.json (an "
                        "interrupted run keeps its finished cases there)")
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.from_json is not None:
        return render(args.from_json, args)

    matrices = args.matrices or (K.MATRICES_QUICK + K.MATRICES_SYNTHETIC_QUICK if args.quick
                                 else K.MATRICES_ALL + K.SYNTHETIC)
    unknown = [m for m in matrices if m != K.RANDOM_MATRIX and not K.is_synthetic(m)
               and m not in K.scorch.datasets.MATRICES]
    if unknown:
        p.error(f"unknown matrices {unknown}")
    args.out.mkdir(parents=True, exist_ok=True)
    saved_threads = torch.get_num_threads()

    streams = []
    if not args.no_stream:
        wait_quiet(args.quiet_wait)
        streams = stream(threads=tuple(args.threads))
        for s in streams:
            print(f"STREAM {s['impl']:18s} {s['op']:5s} {s['gbs']:6.1f} GB/s", flush=True)

    rows: List[Dict[str, Any]] = []
    all_cases = K.cases(args.kernels, matrices)
    t_start = time.monotonic()

    def measure_case(i, case, threads):
        load_before = wait_quiet(args.quiet_wait)
        t0 = time.monotonic()
        case_rows = run_case(case, threads, args.impls, args)
        for r in case_rows:
            cells = "  ".join(f"{K.IMPL_LABELS[k]}={_cell_text(v)[:60]}"
                              for k, v in r["cells"].items())
            ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
            print(f"[{i}/{len(all_cases)}] {r['label']:12s} {r['matrix']:20s} "
                  f"T={r['threads']}  {cells}  ratio={ratio}  "
                  f"load={r['foreign_load']:.2f}/{load_before:.2f}  "
                  f"({time.monotonic() - t0:.1f}s)", flush=True)
        K.operands.cache_clear()
        K.reference.cache_clear()
        gc.collect()
        return case_rows

    meta = _meta(argv, matrices)
    from scorch.tensor_compiler.target import current
    tg = current()
    meta["target"] = tg.name + (" (native)" if tg.native else "")
    meta["skipped"] = [f"{c.label} {c.matrix}: {K.skip_reason(c)}"
                       for c in K.cases(args.kernels, matrices, with_skipped=True)
                       if K.skip_reason(c)]
    md = args.out / "kernels.md"

    def write(final: bool) -> Dict[str, Any]:
        summary = summarize(rows)
        meta["complete"] = final
        write_markdown(md, rows, summary, streams, meta, args)
        (args.out / "kernels.json").write_text(json.dumps(
            {"meta": meta, "rows": rows, "summary": summary, "stream": streams}, indent=1,
            default=str))
        return summary

    for i, case in enumerate(all_cases, 1):
        rows.extend(measure_case(i, case, args.threads))
        write(final=False)  # partial results survive an interrupted run
    # shared machine: measure again the rows that ran while other processes were busy and
    # keep, per row, the measurement taken under the least foreign load
    for attempt in range(args.retries):
        loaded = [r for r in rows if r["foreign_load"] >= FLAG_LOAD]
        if not loaded:
            break
        print(f"retry {attempt + 1}/{args.retries}: {len(loaded)} rows measured under load",
              flush=True)
        by_case: Dict[K.Case, List[int]] = {}
        for r in loaded:
            by_case.setdefault(K.Case(r["kernel"], r["matrix"], r["k"]), []).append(r["threads"])
        for i, (case, ths) in enumerate(by_case.items(), 1):
            for new in measure_case(i, case, sorted(ths)):
                j = next(j for j, r in enumerate(rows) if r["kernel"] == new["kernel"]
                         and r["k"] == new["k"] and r["matrix"] == new["matrix"]
                         and r["threads"] == new["threads"])
                if new["foreign_load"] < rows[j]["foreign_load"]:
                    rows[j] = new
    torch.set_num_threads(saved_threads)
    print(f"total {time.monotonic() - t_start:.0f}s", flush=True)

    summary = write(final=True)
    if not args.no_plot:
        msg = plot(args.out / "kernels.png", rows, summary)
        if msg:
            print(msg)
        elif streams:
            plot_bandwidth(args.out / "kernels_bandwidth.png", rows, streams)

    print(f"\nwrote {md}")
    t = summary["threads"]
    for kname, tg in summary["targets"].items():
        g = f"{tg['geomean']:.2f}x" if tg["geomean"] else "n/a"
        print(f"target {K.KERNEL_LABELS[kname]:6s} >= {tg['target']}x at {t} threads: "
              f"geomean {g} -> {'HOLDS' if tg['holds'] else 'does not hold'}"
              + ("" if tg["complete"] else " (incomplete)"))
    mc = summary["min_case"]
    print(f"target min single case >= {MIN_CASE_TARGET}x: "
          + (f"{mc['ratio']:.2f}x ({mc['case']})" if mc else "n/a")
          + f" -> {'HOLDS' if summary['min_case_holds'] else 'does not hold'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
