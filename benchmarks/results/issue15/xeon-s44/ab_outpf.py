"""Usage: python ab_outpf.py THREADS spmm:uniform16:128 sddmm_nk:bcspwr10:128 ...

A/B: SpMM register rows with the output row prefetched for writing D rows ahead."""
import sys, statistics
from pathlib import Path
HERE = Path(__file__).resolve().parent, re
sys.path.insert(0, str(HERE.parent / "zen5-s28-dot-prefetch"))
sys.path.insert(0, str(HERE.parents[2]))
import ab_variants as AB
import kernels as K
import torch
from scorch.tensor_compiler import build, codegen

orig_generate = codegen.generate
MODE = {"d": 0}

def patched_generate(*a, **k):
    src, args = orig_generate(*a, **k)
    d = MODE["d"]
    if not d:
        return src, args
    lines = src.split("\n")
    out = []
    decl = ('cdef extern from *:\n    """\n    #define scorch_prefetch_w(p) __builtin_prefetch((const void*)(p), 1, 3)\n    """\n'
            '    void scorch_prefetch_w(const void*) noexcept nogil\n')
    for n, ln in enumerate(lines):
        out.append(ln)
        m = re.match(r"^(\s*)oo_0 = c_i \* a\.out_st_i$", ln)
        if m and "run_chunk_w" in "".join(x for x in lines[max(0, n - 40):n] if x.startswith("cdef void run_chunk")):
            ind = m.group(1)
            # width from the function name
            fn = [x for x in lines[:n] if x.startswith("cdef void run_chunk_w")][-1]
            w = int(re.match(r"cdef void run_chunk_w(\d+)", fn).group(1))
            out.append(f"{ind}if c_i + {d} < chi:")
            for l in range(0, w, 16):
                out.append(f"{ind}    scorch_prefetch_w(a.out_vals + (c_i + {d}) * a.out_st_i + {l})")
    src = "\n".join(out)
    i = src.index("cdef struct Args")
    return src[:i] + decl + src[i:], args

codegen.generate = patched_generate
AB.codegen.generate = patched_generate

def run(spec, threads, rounds=7):
    kernel, matrix, k = spec.split(":")
    case = K.Case(kernel, matrix, int(k))
    torch.set_num_threads(threads)
    ops = AB.operands_of(case)
    calls = {}
    for d in (0, 1, 2, 4):
        MODE["d"] = d
        calls[d] = AB.kernel_call(case, ops, threads, {}, f"opf{d}")
    MODE["d"] = 0
    ref = None
    for d, (fn, out, src) in calls.items():
        fn(); got = out.clone()
        if d: assert "scorch_prefetch_w(a.out_vals" in src, d
        if ref is None: ref = got
        else: assert (got - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    times = {d: [] for d in calls}
    for r in range(rounds):
        for d, (fn, _, _) in calls.items():
            times[d].append(AB.median_time(fn))
    med = {d: statistics.median(v) for d, v in times.items()}
    print(f"{spec:28s} T={threads} " + "  ".join(f"d={d} {med[d]*1e3:8.3f} ms ({med[0]/med[d]:.3f}x)" for d in med), flush=True)

for spec in sys.argv[2:]:
    run(spec, int(sys.argv[1]))
