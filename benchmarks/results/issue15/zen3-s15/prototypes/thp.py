import mmap, statistics, sys, time
import numpy as np, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import kernels as kb
import scorch
torch.set_num_threads(1)
def huge(shape):
    n = int(np.prod(shape)) * 4
    size = (n + (2 << 20) - 1) // (2 << 20) * (2 << 20) + (2 << 20)
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.madvise(mmap.MADV_HUGEPAGE)
    buf = np.frombuffer(mm, dtype=np.uint8)
    off = (-buf.ctypes.data) % (2 << 20)
    a = buf[off:off + n].view(np.float32).reshape(shape)
    return a, mm
K = 128
for m in sys.argv[1].split(","):
    A = kb.load_matrix(m)
    rng = np.random.default_rng(0)
    S = scorch.from_scipy(A)
    B = torch.from_numpy(rng.standard_normal((A.shape[0], K), dtype=np.float32))
    Cn = rng.standard_normal((A.shape[1], K), dtype=np.float32)
    Ch, mm = huge(Cn.shape); Ch[:] = Cn
    C4 = torch.from_numpy(Cn); CH = torch.from_numpy(Ch)
    Acsr = torch.sparse_csr_tensor(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), torch.from_numpy(A.data), A.shape)
    fns = {"scorch4k": lambda: scorch.einsum("ij,ik,jk->ij", S, B, C4),
           "scorchHP": lambda: scorch.einsum("ij,ik,jk->ij", S, B, CH),
           "torch4k": lambda: torch.sparse.sampled_addmm(Acsr, B, C4.t(), beta=0),
           "torchHP": lambda: torch.sparse.sampled_addmm(Acsr, B, CH.t(), beta=0)}
    times = {k: [] for k in fns}
    for k, f in fns.items(): f()
    for r in range(5):
        for k, f in fns.items():
            for _ in range(3):
                t = time.perf_counter(); f(); times[k].append(time.perf_counter() - t)
    print(m, " ".join(f"{k}:{statistics.median(v)*1e3:.2f}ms({statistics.median(v)/A.nnz*1e9:.0f}ns)" for k, v in times.items()), flush=True)
    print(open("/proc/self/smaps_rollup").read().split("AnonHugePages:")[1].split("\n")[0])
