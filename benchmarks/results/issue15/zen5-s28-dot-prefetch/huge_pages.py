"""The same generated kernel on the same operands, with the gathered dense factor (SDDMM's C
as n x K, SpMM's B) on 4 KiB pages or on 2 MiB transparent huge pages: the TLB cost of
random row gathers, and why a case's time moves 10-40 % from process to process here
(numpy asks for huge pages on arrays of 4 MB and more, torch's allocator does not; whether
the kernel grants them depends on free memory at the time).

    SCORCH_DATA_DIR=../shared/data python huge_pages.py sddmm_nk:random_uniform:32 ..."""
import mmap, sys, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")
import numpy as np, torch
import kernels as K
import ab_variants as AB

HUGE = 2 << 20


def huge_pages_of(ptr: int) -> int:
    """kB of the mapping holding ``ptr`` that sit on huge pages (/proc/self/smaps)."""
    cur = False
    for ln in open("/proc/self/smaps"):
        head = ln.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            cur = lo <= ptr < hi
        elif cur and ln.startswith("AnonHugePages:"):
            return int(ln.split()[1])
    return 0


def on_pages(x: torch.Tensor, huge: bool) -> torch.Tensor:
    """A contiguous copy of ``x`` (same strides) on 4 KiB pages or on huge pages."""
    nbytes = x.numel() * x.element_size()
    if not huge:
        out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)   # torch: no madvise
        out.copy_(x)
        return out
    m = mmap.mmap(-1, nbytes + 2 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    base = np.frombuffer(m, dtype=np.uint8)
    off = (-base.ctypes.data) % HUGE
    flat = torch.from_numpy(base[off:off + nbytes].view(np.float32 if x.dtype == torch.float32 else np.float64))
    out = torch.as_strided(flat, x.shape, x.stride())
    out.copy_(x)
    out._keep = m
    return out


def run(spec: str, threads: int) -> None:
    case, base, gi = AB.gathered_case(spec, threads)
    times = {}
    for huge in (False, True, False, True):
        operands = list(base)
        operands[gi] = on_pages(base[gi], huge)
        fn, _, _ = AB.kernel_call(case, operands, threads)
        times.setdefault("huge" if huge else "4k", []).append(AB.median_time(fn, 1.0))
        times.setdefault(("huge" if huge else "4k") + "_kb", []).append(huge_pages_of(operands[gi].data_ptr()))
    nnz = K.operands(case).A.nnz
    t4, th = min(times["4k"]), min(times["huge"])
    print(f"{spec:32s} T={threads} gathered {base[gi].numel() * base[gi].element_size() / 1e6:6.1f} MB: "
          f"4 KiB pages {t4 * 1e3:8.3f} ms ({t4 * 1e9 / nnz:5.2f} ns/e), huge pages {th * 1e3:8.3f} ms "
          f"({th * 1e9 / nnz:5.2f} ns/e; {max(times['huge_kb']) // 1024} MB on huge pages): {t4 / th:.2f}x", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    threads = 1
    if args and args[0].startswith("--threads="):
        threads = int(args.pop(0).split("=")[1])
    for spec in args:
        run(spec, threads)
