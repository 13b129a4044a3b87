"""In-process A/B of kernel variants: each variant's kernel is generated (codegen constants
patched per variant) and run on the same operands in the same process, interleaved, so
page placement (which moves a case 10-30 % from process to process on this VM) falls on
every variant alike.

    SCORCH_DATA_DIR=../shared/data python ab_variants.py --threads 1 \
        --cases sddmm_nk:copter2:128 spmm:G51:128 ...

Variants are listed in VARIANTS below (name -> {module attribute: value})."""
import argparse, os, statistics, sys, time, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
warnings.filterwarnings("ignore")
import numpy as np, torch
import scorch
import kernels as K
from scorch.tensor_compiler import build, codegen
from scorch.tensor_compiler.api import _keyed_operands, einsum_entry
from scorch.tensor_compiler.arguments import arg_table, arg_values
from scorch.tensor_compiler.allocate import empty_output
from scorch.tensor_compiler.execute import prepare_operands
from scorch.tensor_compiler.frontend import bind_sizes
from scorch.tensor_compiler.schedule import pattern_suffix
from scorch.tensor_compiler.tiling import panel_for
from scorch.tensor_compiler.lower import facts as F
import scorch.tensor_compiler.lower.loops as LOOPS

VARIANTS = {}


def patched(settings):
    """Set codegen constants (in ``lower.facts`` and in ``lower.loops`` where it imported
    them by name); returns the old values."""
    saved = {k: getattr(F, k) if hasattr(F, k) else getattr(LOOPS, k) for k in settings}
    for k, v in settings.items():
        for mod in (F, LOOPS):
            if hasattr(mod, k):
                setattr(mod, k, v)
    return saved


def operands_of(case):
    ops = K.operands(case)
    As = scorch.from_scipy(ops.A)
    if case.kernel in ("spmv", "spmm"):
        return [As, torch.from_numpy(ops.x)]
    return [As, torch.from_numpy(ops.Bd), K._dense_c(ops, case.kernel)]


def kernel_call(case, operands, nthreads, settings=None, name="ab"):
    """The generated kernel of ``case`` on ``operands`` as a call with its arguments bound
    (codegen constants ``settings`` patched while it is generated; ``SCORCH_*`` keys are
    set as environment variables instead): returns (call, output tensor, source)."""
    settings = dict(settings or {})
    ops = _keyed_operands(tuple(operands))[0]
    entry = einsum_entry(case.equation, ops, None)
    sizes = bind_sizes(entry.operand_indices, [x.shape for x in ops])
    data = prepare_operands(entry, ops, sizes)
    idx = {ap.id: data[ap.id].index_dtype for ap in entry.schedule.accesses if ap.sparse}
    env = {k: settings.pop(k) for k in [k for k in settings if k.startswith("SCORCH_")]}
    for k, v in env.items():
        os.environ[k] = str(v)
    saved = patched(settings)
    try:
        src, args = codegen.generate(entry.schedule, entry.value_dtype, idx)
    finally:
        patched(saved)
        for k in env:
            os.environ.pop(k)
    mod = build.load_kernel(src, name_hint="ab_" + name)
    out_plan = entry.schedule.output
    if out_plan.pattern >= 0:
        P = data[out_plan.pattern]
        out = empty_output((P.values.numel() * int(np.prod([sizes[v] for v in pattern_suffix(entry.schedule)] or [1])),),
                           entry.value_dtype)
    else:
        out = empty_output(tuple(sizes[v] for v in out_plan.memory_order), entry.value_dtype)
    argv = arg_values(arg_table(args, entry.schedule), data, sizes, out)
    panel = panel_for(entry, data, sizes)
    keep = (out, data, ops, operands)   # the kernel reads and writes these by address

    def call(_keep=keep):
        mod.kernel(argv, nthreads, panel)
    return call, out, src


def median_time(fn, budget: float = 0.15) -> float:
    """Median seconds of ``fn()`` over at least ``budget`` seconds (and 3 calls), warm."""
    fn()
    t_end, ts = time.perf_counter() + budget, []
    while time.perf_counter() < t_end or len(ts) < 3:
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def gathered_case(spec: str, nthreads: int):
    """``KERNEL:MATRIX:K`` -> (case, its operands, the position of the operand whose rows
    the kernel gathers: SpMM's B, SDDMM's C), with ``nthreads`` set."""
    kernel, matrix, k = spec.split(":")
    case = K.Case(kernel, matrix, int(k))
    torch.set_num_threads(nthreads)
    return case, operands_of(case), 1 if kernel in ("spmm", "spmv") else 2


def run_case(case, nthreads, rounds, variants):
    torch.set_num_threads(nthreads)
    operands = operands_of(case)
    calls = {name: kernel_call(case, operands, nthreads, settings, name) for name, settings in variants.items()}
    ref = None
    for name, (fn, out, _) in calls.items():
        fn()
        got = out.clone()
        if ref is None:
            ref = got
        else:
            err = (got - ref).abs().max().item() / max(1e-30, ref.abs().max().item())
            assert err < 1e-4, (name, err)
    times = {n: [] for n in calls}
    for r in range(rounds):
        for name, (fn, _, _) in calls.items():
            times[name].append(median_time(fn))
    med = {n: statistics.median(v) for n, v in times.items()}
    base = next(iter(med))
    nnz = K.operands(case).A.nnz
    print(f"{case.kernel:9s} {case.matrix:20s} K={case.k:<4} T={nthreads} " + "  ".join(
        f"{n} {med[n] * 1e3:8.4f} ms ({med[n] * 1e9 / nnz:5.2f} ns/e, {med[base] / med[n]:.3f}x)" for n in med), flush=True)
    return {n: med[base] / med[n] for n in med}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--variants", nargs="+", default=None, help="NAME:ATTR=VALUE,ATTR=VALUE")
    a = ap.parse_args()
    variants = {}
    for spec in a.variants:
        name, _, rest = spec.partition(":")
        variants[name] = {k: eval(v, globals()) for k, v in (kv.split("=", 1) for kv in rest.split(",") if kv)}
    ratios = {n: [] for n in variants}
    for c in a.cases:
        kernel, matrix, k = c.split(":")
        r = run_case(K.Case(kernel, matrix, int(k)), a.threads, a.rounds, variants)
        for n in r:
            ratios[n].append(r[n])
    for n, v in ratios.items():
        print(f"{n}: geomean vs first {np.exp(np.mean(np.log(v))):.3f} (min {min(v):.3f}, max {max(v):.3f})")


if __name__ == "__main__":
    main()
