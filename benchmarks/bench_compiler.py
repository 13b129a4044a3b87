"""Compiler figures (a benchmark, not a timed test).

* cold compile: median seconds to compile a never-seen kernel (fresh SCORCH_CACHE_DIR,
  distinct expressions), measured as first call minus a warm call; target <= 2.0 s;
* warm call: a 4x4 SpMM through ``scorch.einsum`` (and through the compiler entry point)
  versus ``torch.mm(csr, dense)`` on the same input in the same run; target <= 2x.

Run: ``python benchmarks/bench_compiler.py``
"""
import os
import statistics
import sys
import tempfile
import time

os.environ["SCORCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="scorch-bench-")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import warnings  # noqa: E402

import torch  # noqa: E402

import scorch  # noqa: E402

import scorch.tensor_compiler as C
from scorch.tensor_compiler import build as _build  # noqa: E402

# the C warm-call module is not a kernel: loaded from the install-time copy first (else it
# compiles once, ~15 s, inside the first timed compile)
from scorch.tensor_compiler import fastcall as _fastcall  # noqa: E402
_fastcall.load()
# never-seen kernels: the install-time prebuilt kernels must not answer
_build.PREBUILT_DIR = _build.Path(os.devnull)
warnings.filterwarnings("ignore")


def timeit(f, n=20000, reps=5):
    for _ in range(200):
        f()
    best = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best.append((time.perf_counter() - t) / n)
    return statistics.median(best)


def cold_compiles():
    g = torch.Generator().manual_seed(0)
    cases = [
        ("ij,jk->ik", [(40, 30), (30, 20)], ["csr", None]),
        ("ij,ik,kj->ij", [(40, 30), (40, 8), (8, 30)], ["csr", None, None]),
        ("ij,jk->ik", [(40, 30), (30, 20)], ["csr", "csr"]),
        ("ijk,k->ij", [(10, 12, 14), (14,)], ["csf", None]),
        ("ij,j->i", [(40, 30), (30,)], ["coo", None]),
        ("ij,ij->ij", [(40, 30), (40, 30)], ["dcsr", "csr"]),
        ("bd,ndh,bn->bh", [(16, 8), (4, 8, 6), (16, 4)], [None, None, "coo"]),
    ]
    times = []
    for eq, shapes, fmts in cases:
        ops = []
        for s, f in zip(shapes, fmts):
            x = torch.randn(s, generator=g) * (torch.rand(s, generator=g) < 0.3)
            ops.append(x if f is None else scorch.sparse_tensor(x, format=f))
        t0 = time.perf_counter()
        scorch.einsum(eq, *ops)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        scorch.einsum(eq, *ops)
        warm = time.perf_counter() - t0
        times.append(first - warm)
        print(f"  cold compile {eq:16s} {str(fmts):28s} {first - warm:6.3f} s")
    return statistics.median(times)


def warm_spmm():
    x = torch.tensor([[1.0, 0, 2, 0], [0, 0, 3, 0], [4, 5, 0, 0], [0, 0, 0, 6]])
    d = torch.randn(4, 4)
    csr = x.to_sparse_csr()
    s = scorch.sparse_tensor(x, format="csr")
    st = s._storage
    assert torch.allclose(scorch.einsum("ij,jk->ik", s, d), torch.mm(csr, d))
    t_torch = timeit(lambda: torch.mm(csr, d))
    t_api = timeit(lambda: scorch.einsum("ij,jk->ik", s, d))
    t_core = timeit(lambda: C.einsum("ij,jk->ik", st, d))
    return t_torch, t_api, t_core


if __name__ == "__main__":
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    med = cold_compiles()
    print(f"cold compile median: {med:.3f} s (target <= 2.0 s)")
    t_torch, t_api, t_core = warm_spmm()
    print(f"warm 4x4 SpMM: torch.mm(csr, dense) {t_torch * 1e6:.2f} us | scorch.einsum {t_api * 1e6:.2f} us "
          f"({t_api / t_torch:.2f}x) | compiler entry {t_core * 1e6:.2f} us ({t_core / t_torch:.2f}x) "
          f"(target <= 2x)")
