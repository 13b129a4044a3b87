"""The same generated kernel on the same operands, with the gathered dense factor (SDDMM's C
as n x K, SpMM's B) on 4 KiB pages or on 2 MiB transparent huge pages: the TLB cost of
random row gathers, and why a case's time moves 10-40 % from process to process here
(numpy asks for huge pages on arrays of 4 MB and more, torch's allocator does not; whether
the kernel grants them depends on free memory at the time).

    SCORCH_DATA_DIR=../shared/data python huge_pages.py sddmm_nk:random_uniform:32 ..."""
import mmap, statistics, sys, time, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")
import numpy as np, torch
import kernels as K
import ab_variants as AB
from scorch.tensor_compiler import build, codegen
from scorch.tensor_compiler.api import _keyed_operands, einsum_entry
from scorch.tensor_compiler.arguments import arg_table, arg_values
from scorch.tensor_compiler.allocate import empty_output
from scorch.tensor_compiler.execute import prepare_operands
from scorch.tensor_compiler.frontend import bind_sizes
from scorch.tensor_compiler.tiling import panel_for

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
    kernel, matrix, k = spec.split(":")
    case = K.Case(kernel, matrix, int(k))
    torch.set_num_threads(threads)
    base = AB.operands_of(case)
    gi = 1 if kernel in ("spmm", "spmv") else 2
    times = {}
    for huge in (False, True, False, True):
        operands = list(base)
        operands[gi] = on_pages(base[gi], huge)
        ops = _keyed_operands(tuple(operands))[0]
        entry = einsum_entry(case.equation, ops, None)
        sizes = bind_sizes(entry.operand_indices, [x.shape for x in ops])
        data = prepare_operands(entry, ops, sizes)
        idx = {ap.id: data[ap.id].index_dtype for ap in entry.schedule.accesses if ap.sparse}
        src, args = codegen.generate(entry.schedule, entry.value_dtype, idx)
        mod = build.load_kernel(src)
        plan = entry.schedule.output
        if plan.pattern >= 0:
            out = empty_output((data[plan.pattern].values.numel(),), entry.value_dtype)
        else:
            out = empty_output(tuple(sizes[v] for v in plan.memory_order), entry.value_dtype)
        argv = arg_values(arg_table(args, entry.schedule), data, sizes, out)
        panel = panel_for(entry, data, sizes)
        for _ in range(3):
            mod.kernel(argv, threads, panel)
        ts = []
        t_end = time.perf_counter() + 1.0
        while time.perf_counter() < t_end or len(ts) < 5:
            t0 = time.perf_counter(); mod.kernel(argv, threads, panel); ts.append(time.perf_counter() - t0)
        key = "huge" if huge else "4k"
        times.setdefault(key, []).append(statistics.median(ts))
        kb = huge_pages_of(operands[gi].data_ptr())
        times.setdefault(key + "_kb", []).append(kb)
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
