"""The same generated kernel on the same operands, with the gathered dense factor (SDDMM's C
as n x K, SpMM's B) starting on a cache line or 16 bytes past one (where numpy's large
arrays start: the benchmark's operands come from numpy, torch's allocator aligns to 64):
rows of K = 32 float32 then span 3 cache lines instead of 2.

    SCORCH_DATA_DIR=../shared/data python alignment.py [--threads=2] sddmm_nk:random_uniform:32 ..."""
import sys, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")
import torch
import kernels as K
import ab_variants as AB


def at_offset(x: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of ``x`` (same strides) whose data starts ``offset`` bytes past a 64-byte line."""
    n = x.numel() * x.element_size()
    raw = torch.empty(n + 128, dtype=torch.uint8)
    skip = (offset - raw.data_ptr()) % 64
    flat = raw[skip:skip + n].view(x.dtype)
    out = torch.as_strided(flat, x.shape, x.stride())
    out.copy_(x)
    assert out.data_ptr() % 64 == offset
    return out


def timed(case, operands, threads, env=None):
    fn, _, _ = AB.kernel_call(case, operands, threads, env)
    return AB.median_time(fn, 0.5)


def run(spec: str, threads: int) -> None:
    case, base, gi = AB.gathered_case(spec, threads)
    best = {}
    variants = VARIANTS or {"": {}}
    for r in range(3):
        for off in (0, 16):
            operands = list(base)
            operands[gi] = at_offset(base[gi], off)
            for name, env in variants.items():
                t = timed(case, operands, threads, env)
                best[name, off] = min(best.get((name, off), 1e9), t)
    nnz = K.operands(case).A.nnz
    ref = best[next(iter(variants)), 0]
    print(f"{spec:30s} T={threads} ns/entry (time / first variant on a line): " + "  ".join(
        f"{name or 'kernel'} {'on a line' if off == 0 else '16 B past'} {t * 1e9 / nnz:5.2f} ({t / ref:.2f})"
        for (name, off), t in best.items()), flush=True)


VARIANTS = {}

if __name__ == "__main__":
    args = sys.argv[1:]
    threads = 1
    if args and args[0].startswith("--threads="):
        threads = int(args.pop(0).split("=")[1])
    while args and args[0].startswith("--variant="):
        name, _, env = args.pop(0).split("=", 1)[1].partition(":")
        VARIANTS[name] = dict(kv.split("=") for kv in env.split(",") if kv)
    for spec in args:
        run(spec, threads)
