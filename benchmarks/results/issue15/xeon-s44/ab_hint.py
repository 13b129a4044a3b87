"""Usage: python ab_hint.py THREADS spmm:uniform16:128 sddmm_nk:bcspwr10:128 ...

A/B: the gathered rows' prefetch hint (locality 3 = T0, 2 = T1, 1 = T2) in SpMM / SDDMM kernels."""
import sys, statistics
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "zen5-s28-dot-prefetch"))
sys.path.insert(0, str(HERE.parents[2]))
import ab_variants as AB
import kernels as K
import torch
from scorch.tensor_compiler import codegen

orig_generate = codegen.generate
MODE = {"loc": 3}
MACRO = "#define scorch_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)"

def patched_generate(*a, **k):
    src, args = orig_generate(*a, **k)
    if MODE["loc"] != 3:
        assert MACRO in src
        src = src.replace(MACRO, MACRO[:-2] + f"{MODE['loc']})")
    return src, args

codegen.generate = patched_generate
AB.codegen.generate = patched_generate

def run(spec, threads, rounds=7):
    kernel, matrix, k = spec.split(":")
    case = K.Case(kernel, matrix, int(k))
    torch.set_num_threads(threads)
    ops = AB.operands_of(case)
    calls = {}
    for loc in (3, 2, 1):
        MODE["loc"] = loc
        calls[loc] = AB.kernel_call(case, ops, threads, {}, f"hint{loc}")
    MODE["loc"] = 3
    ref = None
    for d, (fn, out, src) in calls.items():
        fn(); got = out.clone()
        if ref is None: ref = got
        else: assert (got - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    times = {d: [] for d in calls}
    for r in range(rounds):
        for d, (fn, _, _) in calls.items():
            times[d].append(AB.median_time(fn))
    med = {d: statistics.median(v) for d, v in times.items()}
    print(f"{spec:28s} T={threads} " + "  ".join(f"T{3-d} {med[d]*1e3:8.3f} ms ({med[3]/med[d]:.3f}x)" for d in med), flush=True)

for spec in sys.argv[2:]:
    run(spec, int(sys.argv[1]))
