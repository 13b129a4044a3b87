"""SpMV A/B measurements in one process, interleaved (issue 15, point 1-2): the call path
(``scorch.einsum``, ``A @ x``, ``torch.mv(A, x)``, the bare kernel) against scipy and torch
CSR, and the kernel variants the compiler chooses between (short-rows module with and
without 32-byte loop alignment, its stream form with and without the gather prefetch, the
vectorized module at 8 lanes and at the register width), each forced on.

    SCORCH_DATA_DIR=... python benchmarks/bench_spmv_paths.py               # 1 thread
    SCORCH_DATA_DIR=... python benchmarks/bench_spmv_paths.py --matrices bcspwr10 rmat19

Times are medians over ``--rounds`` rounds (rotating order) of CPU time per call of this
thread (``time.thread_time``: a neighbour's preemption does not count; at one thread it is
the call's cost), so figures taken on a shared machine compare, but do not replace, a quiet
run's wall-clock times.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kernels as K  # noqa: E402
import scorch  # noqa: E402
from scorch.tensor_compiler import build, codegen  # noqa: E402


def cpu_time_per_call(fn, budget: float = 0.03) -> float:
    fn()
    t0, n = time.thread_time(), 0
    while True:
        fn()
        n += 1
        dt = time.thread_time() - t0
        if dt > budget:
            return dt / n


def _forced(src: str, variant: str) -> str:
    """``src`` with chunk function ``variant`` chosen whatever the input (``run_chunk``: none
    of the others)."""
    lines = src.split("\n")
    for n, ln in enumerate(lines):
        if ln.startswith("        fn = run_chunk"):
            lines[n - 1] = "    if True:" if ln.strip() == f"fn = {variant}" else "    if False:"
    return "\n".join(lines)


def _variants(A, x):
    """The bare kernel modules: name -> module (all take the same argument list): the
    short-rows module's variants (plain, with 16-byte loop alignment, stream form, gather
    prefetch in the stream form) and the vectorized module at 8 lanes and at the target's
    register width."""
    Ax = scorch.from_scipy(A)
    s = scorch.explain("ij,j->i", Ax, torch.from_numpy(x)).schedule
    idx = {ap.id: torch.from_numpy(A.indices).dtype for ap in s.accesses if ap.sparse}
    vt = torch.from_numpy(A.data).dtype
    short = codegen.generate(s, vt, idx, scalar_inner=True)[0]
    vec = codegen.generate(s, vt, idx)[0]
    register = "\n".join(ln for ln in vec.split("\n") if not ln.startswith("# scorch-cflags:"))
    out = {"short (aligned)": build.load_kernel(_forced(short, "run_chunk")),
            "short (unaligned)": build.load_kernel(_forced(short, "run_chunk").replace(
                codegen.SHORT_ROWS_CFLAGS, "-fno-tree-vectorize")),
            "short + streams": build.load_kernel(_forced(short, "run_chunk_streams")),
            "short + streams + prefetch": build.load_kernel(_forced(short, "run_chunk_prefetch")),
            "short, two sums a row": build.load_kernel(_forced(short, "run_chunk_pairs")),
            "vectorized (8 lanes)": build.load_kernel(_forced(vec, "run_chunk")),
            "vectorized (register width)": build.load_kernel(_forced(register, "run_chunk"))}
    if "run_chunk_gathers" in short:  # the hardware-gather row loop (AVX-512 targets)
        out["short, gathered dots"] = build.load_kernel(_forced(short, "run_chunk_gathers"))
        out["short, gathered dots + streams"] = build.load_kernel(
            _forced(short, "run_chunk_gathers_streams"))
    if _X86:  # the same two with the CPU's vector gathers (the kernels are built without them)
        out["vectorized (8 lanes, hw gathers)"] = build.load_kernel(
            _with_flag(_forced(vec, "run_chunk"), "-mtune-ctrl=use_gather"))
        out["vectorized (register width, hw gathers)"] = build.load_kernel(
            _with_flag(_forced(register, "run_chunk"), "-mtune-ctrl=use_gather"))
    return out


_X86 = platform.machine().lower() in ("x86_64", "amd64")


def _with_flag(src: str, flag: str) -> str:
    """``src`` asking for one more compiler flag (``build.SOURCE_CFLAGS``): on its
    ``# scorch-cflags:`` line, or on a new one."""
    lines = src.split("\n")
    for n, ln in enumerate(lines):
        if ln.startswith("# scorch-cflags:"):
            lines[n] = f"{ln} {flag}"
            return "\n".join(lines)
    lines.insert(2, f"# scorch-cflags: {flag}")
    return "\n".join(lines)


def measure(name: str, rounds: int, dtype: str = "float32", index: str = "int32") -> None:
    A = K.load_matrix(name).astype(dtype)
    A.indptr, A.indices = A.indptr.astype(index), A.indices.astype(index)
    x = np.random.default_rng(0).standard_normal(A.shape[1]).astype(dtype)
    xt = torch.from_numpy(x)
    As, At = scorch.from_scipy(A), K._torch_csr(A)
    out = np.empty(A.shape[0], dtype)
    args = [A.shape[0], A.shape[1], A.indptr.ctypes.data, A.indices.ctypes.data,
            A.data.ctypes.data, 1, x.ctypes.data, out.ctypes.data, 1]
    calls = {"scipy": lambda: A @ x, "torch CSR": lambda: torch.mv(At, xt),
             "scorch.einsum": lambda: scorch.einsum("ij,j->i", As, xt),
             "A @ x": lambda: As @ xt, "torch.mv(A, x)": lambda: torch.mv(As, xt)}
    for label, mod in _variants(A, x).items():
        calls[f"kernel {label}"] = (lambda k: lambda: k(args, 1))(mod.kernel)
    ref = A @ x
    for label, fn in calls.items():
        r = fn()
        r = out if r is None else (r.numpy() if isinstance(r, torch.Tensor) else r)
        if not np.allclose(r, ref, rtol=1e-3, atol=1e-3):
            raise AssertionError(f"{name}: {label} differs from scipy")
    times = {k: [] for k in calls}
    for r in range(rounds):
        order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
        for k in order:
            times[k].append(cpu_time_per_call(calls[k]))
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    best = min(med["scipy"], med["torch CSR"])
    print(f"\n{K.describe_matrix(name)} ({A.nnz / max(1, A.shape[0]):.1f} a row)")
    for k, v in med.items():
        print(f"  {k:28s} {v:10.1f} us   best peer / this {best / v:5.2f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--matrices", nargs="+",
                   default=["bcspwr10", "4elt", "Groebner_id2003_aug", "rmat16", "uniform16"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--index", default="int32", choices=["int32", "int64"])
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for m in args.matrices:
        measure(m, args.rounds, args.dtype, args.index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
