"""Each implementation on numpy-allocated vs torch-allocated dense operands, same process:
    SCORCH_DATA_DIR=../shared/data python peers_alignment.py THREADS sddmm_nk:G51:32 ..."""
import sys, time, statistics, warnings
warnings.filterwarnings("ignore")
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
import kernels as K
torch.set_num_threads(int(sys.argv[1]))
for spec in sys.argv[2:]:
    kernel, matrix, k = spec.split(":")
    case = K.Case(kernel, matrix, int(k))
    res = {}
    for mode in ("numpy", "torch", "numpy", "torch"):
        K.NUMPY_OPERANDS = mode == "numpy"
        K.operands.cache_clear()
        for impl in ("scorch", "torch_csr"):
            im = K.make_impl(case, impl)
            for _ in range(3): im.fn()
            ts, t_end = [], time.perf_counter() + 0.5
            while time.perf_counter() < t_end or len(ts) < 5:
                t0 = time.perf_counter(); im.fn(); ts.append(time.perf_counter() - t0)
            res[(impl, mode)] = min(res.get((impl, mode), 1e9), statistics.median(ts))
    print(f"{spec:30s} " + "  ".join(f"{i} {m} {t*1e3:.3f}" for (i, m), t in res.items())
          + f"   ratio numpy {res[('torch_csr','numpy')]/res[('scorch','numpy')]:.2f}x  torch-mem {res[('torch_csr','torch')]/res[('scorch','torch')]:.2f}x", flush=True)
