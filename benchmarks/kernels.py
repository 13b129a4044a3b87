"""Shared case definitions for the standard-kernel benchmarks (paper Section 5.4, App. E.1).

Used by ``bench_kernels.py`` (pytest-benchmark) and ``report_kernels.py`` (one-process report).

A *case* is (kernel, K, matrix). Kernels, all float32:

* ``spmv``            y = A x                    scorch: ``einsum("ij,j->i", A, x)``
* ``spmm`` K          Y = A X, X is n x K        scorch: ``einsum("ij,jk->ik", A, X)``
* ``spgemm``          A @ A^T (A truncated to square when it is not; A^T given as CSR)
                                                 scorch: ``einsum("ij,jk->ik", A, AT)``
* ``sddmm`` K         S = A * (B @ C), B m x K, C K x n (row-major), sparse like A
                                                 scorch: ``einsum("ij,ik,kj->ij", A, B, C)``
* ``sddmm_nk`` K      the same with C arriving as the transpose of an n x K row-major
                      array (``C = CT.t()``): the layout the kernel reads along k

Implementations (each gets the same operands; conversions happen outside the timed call):

* ``scorch``     scorch CSR operands (``scorch.from_scipy``, arrays shared with scipy)
* ``torch_csr``  torch.sparse CSR, int32 indices (MKL path: no index conversion):
                 ``torch.mv``, ``torch.mm``, ``csr @ csr``, ``torch.sparse.sampled_addmm``
                 (beta=0; its values are then multiplied by A's values in place, because
                 sampled_addmm samples B @ C on A's pattern but ignores A's values)
* ``torch_csr64`` the same with int64 indices (torch's default CSR index type)
* ``torch_coo``  torch.sparse COO (coalesced, int64): ``torch.mv``, ``torch.sparse.mm``;
                 SDDMM has no COO kernel in torch (sampled_addmm is CSR-only; the dense
                 route A * (B @ C) forms the m x n product), so that peer is unavailable
* ``scipy``      scipy.sparse CSR: ``A @ x``, ``A @ X``, ``A @ AT``; SDDMM as a row-wise
                 gather-dot ``np.einsum('ij,ij->i', B[rows], CT[cols]) * A.data`` with
                 ``CT = C.T`` made contiguous outside the timed call. Single-threaded.

Threads: ``set_threads(n)`` calls ``torch.set_num_threads(n)``; scorch kernels follow
``torch.get_num_threads()``, torch (OpenMP + MKL) too; scipy/numpy here are single-threaded.
"""
from __future__ import annotations

import functools
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import scorch  # noqa: E402
import scorch.datasets  # noqa: E402

try:  # `from torch import *` in scorch/__init__ binds scorch.tensor_compiler to torch.compiler until
    import scorch.tensor_compiler  # noqa: E402,F401  the real submodule is imported (then einsum works)
except Exception:  # noqa: BLE001  (compiler not there yet: scorch rows record the error)
    pass

__all__ = [
    "Case", "Impl", "Unavailable", "KERNELS", "KERNEL_LABELS", "IMPLS", "IMPL_LABELS",
    "MATRICES_QUICK", "MATRICES_MAIN", "MATRICES_EXTRA", "MATRICES_ALL", "RANDOM_MATRIX",
    "cases", "skip_reason", "spgemm_flops", "load_matrix", "operands", "make_impl", "reference", "check", "bytes_moved",
    "set_threads", "describe_matrix", "full_run_requested", "default_matrices",
]

# --------------------------------------------------------------------------- matrices

RANDOM_MATRIX = "random_uniform"  # n = 100,000, 1e6 uniformly placed nonzeros, seed 0
#: seeded synthetic matrices ``rmat<s>`` / ``uniform<s>``: 2^s x 2^s, 10 entries a row on
#: average (``uniform21``: the issue's 2M x 2M with 20M entries); R-MAT with the Graph500
#: probabilities (0.57, 0.19, 0.19, 0.05): a power-law graph
SYNTHETIC_SCALES = range(16, 22)
SYNTHETIC = [f"{kind}{s}" for kind in ("rmat", "uniform") for s in SYNTHETIC_SCALES]
MATRICES_SYNTHETIC_QUICK = ["rmat16", "uniform16", "rmat18", "uniform18"]
MATRICES_QUICK = ["bcspwr10", "4elt", "Groebner_id2003_aug"]
MATRICES_MAIN = ["NotreDame_www", "mdual", "copter2", "4elt", "bcspwr10", "Groebner_id2003_aug",
                 RANDOM_MATRIX]
MATRICES_EXTRA = ["Franz6_id1959_aug", "arrow_spqr_46500", "G51"]
MATRICES_ALL = MATRICES_MAIN + MATRICES_EXTRA

KERNELS: Dict[str, List[Optional[int]]] = {
    "spmv": [None],
    "spmm": [32, 128],
    "spgemm": [None],
    "sddmm": [32, 128],
    "sddmm_nk": [32, 128],
}
KERNEL_LABELS = {"spmv": "SpMV", "spmm": "SpMM", "spgemm": "SpGEMM", "sddmm": "SDDMM",
                 "sddmm_nk": "SDDMM(C nxK)"}
EQUATIONS = {"spmv": "ij,j->i", "spmm": "ij,jk->ik", "spgemm": "ij,jk->ik",
             "sddmm": "ij,ik,kj->ij", "sddmm_nk": "ij,ik,kj->ij"}
IMPLS = ["scorch", "torch_csr", "torch_csr64", "torch_coo", "scipy"]
IMPL_LABELS = {"scorch": "scorch", "torch_csr": "torch CSR", "torch_csr64": "torch CSR64",
               "torch_coo": "torch COO", "scipy": "scipy"}
#: the peers a ratio is taken against (the fastest of them)
PEERS = ("torch_csr", "torch_csr64", "scipy")


def full_run_requested() -> bool:
    return os.environ.get("SCORCH_BENCH_FULL", "") not in ("", "0", "false", "False")


def default_matrices() -> List[str]:
    """Quick set unless SCORCH_BENCH_FULL=1 (then every matrix, extras included)."""
    return list(MATRICES_ALL if full_run_requested() else MATRICES_QUICK)


def _random_uniform(n: int = 100_000, nnz: int = 1_000_000, seed: int = 0) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    lin = np.unique(rng.integers(0, n * n, size=nnz + nnz // 100, dtype=np.int64))
    while lin.size < nnz:  # (practically never: ~50 collisions expected)
        lin = np.unique(np.concatenate([lin, rng.integers(0, n * n, size=nnz, dtype=np.int64)]))
    lin = np.sort(rng.choice(lin, size=nnz, replace=False))
    rows, cols = lin // n, lin % n
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    vals = rng.random(nnz, dtype=np.float32) + np.float32(0.5)
    return sp.csr_array((vals, cols.astype(np.int32), indptr), shape=(n, n))


def _csr_from_coords(n: int, rows: np.ndarray, cols: np.ndarray, rng) -> sp.csr_array:
    """A canonical n x n float32 CSR from coordinates (duplicates dropped), values in [0.5, 1.5)."""
    lin = np.unique(rows.astype(np.int64) * n + cols)
    r, c = lin // n, lin % n
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    vals = rng.random(lin.size, dtype=np.float32) + np.float32(0.5)
    return sp.csr_array((vals, c.astype(np.int32), indptr), shape=(n, n))


def synthetic_matrix(name: str) -> sp.csr_array:
    """``rmat<s>`` / ``uniform<s>`` (see SYNTHETIC): seeded by the name, vectorized."""
    kind, scale = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):])
    n, m = 1 << scale, 10 << scale
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if kind == "uniform":
        return _csr_from_coords(n, rng.integers(0, n, m), rng.integers(0, n, m), rng)
    if kind != "rmat":
        raise ValueError(f"unknown synthetic matrix {name!r}")
    rows = np.zeros(m, dtype=np.int64)
    cols = np.zeros(m, dtype=np.int64)
    for bit in range(scale):     # each level picks a quadrant: a, b, c, d = .57, .19, .19, .05
        u = rng.random(m, dtype=np.float32)
        rows |= (u >= 0.76).astype(np.int64) << bit
        cols |= ((u >= 0.57) & (u < 0.76) | (u >= 0.95)).astype(np.int64) << bit
    perm = rng.permutation(n)    # scatter the hubs (R-MAT puts them all at low indices)
    return _csr_from_coords(n, perm[rows], perm[cols], rng)


def is_synthetic(name: str) -> bool:
    return name.rstrip("0123456789") in ("rmat", "uniform") and name[-1:].isdigit()


@functools.lru_cache(maxsize=4)
def load_matrix(name: str) -> sp.csr_array:
    """The matrix as a canonical (sorted, no duplicates) float32 scipy CSR array."""
    if name == RANDOM_MATRIX:
        m = _random_uniform()
    elif is_synthetic(name):
        m = synthetic_matrix(name)
    else:
        m = scorch.datasets.load_matrix(name)
    m = sp.csr_array(m, dtype=np.float32)
    m.sum_duplicates()
    m.sort_indices()
    return m


def describe_matrix(name: str) -> str:
    m = load_matrix(name)
    return f"{name}: {m.shape[0]:,} x {m.shape[1]:,}, {m.nnz:,} nnz"


# --------------------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    kernel: str
    matrix: str
    k: Optional[int] = None

    @property
    def label(self) -> str:
        base = KERNEL_LABELS[self.kernel]
        return base if self.k is None else f"{base} K={self.k}"

    @property
    def id(self) -> str:
        return f"{self.kernel}{'' if self.k is None else self.k}-{self.matrix}"

    @property
    def equation(self) -> str:
        return EQUATIONS[self.kernel]


# SpGEMM cases whose A @ A^T needs more multiplications than this are skipped: their output
# is too large to hold several times over (NotreDame_www: 4.2e8 multiplications, 2.9e8 output
# entries, ~20 GB across the implementations and the reference; arrow_spqr_46500 has a dense
# row and column, so A @ A^T is dense: 2.2e9 entries).
SPGEMM_MAX_FLOPS = float(os.environ.get("SCORCH_BENCH_SPGEMM_MAX_FLOPS", 1e8))


@functools.lru_cache(maxsize=None)
def spgemm_flops(matrix: str) -> int:
    """Multiplications in A @ A^T (A truncated to square) = sum_j nnz(column j)^2."""
    A = load_matrix(matrix)
    s = min(A.shape)
    A = A[:s, :s] if A.shape[0] != A.shape[1] else A
    c = np.bincount(A.indices, minlength=A.shape[1]).astype(np.int64)
    return int((c * c).sum())


def skip_reason(case: Case) -> Optional[str]:
    if case.kernel == "spgemm" and spgemm_flops(case.matrix) > SPGEMM_MAX_FLOPS:
        return (f"A @ A^T needs {spgemm_flops(case.matrix):.2g} multiplications "
                f"(> SCORCH_BENCH_SPGEMM_MAX_FLOPS = {SPGEMM_MAX_FLOPS:.2g}): output too large "
                "to hold for every implementation")
    return None


def cases(kernels: Optional[Sequence[str]] = None, matrices: Optional[Sequence[str]] = None,
          ks: Optional[Sequence[int]] = None, with_skipped: bool = False) -> List[Case]:
    """The cases, in kernel, K, matrix order; cases with a ``skip_reason`` are left out
    unless ``with_skipped``."""
    kernels = list(kernels or KERNELS)
    matrices = list(matrices or default_matrices())
    for kname in kernels:
        if kname not in KERNELS:
            raise ValueError(f"unknown kernel {kname!r}; choose from {list(KERNELS)}")
    out = []
    for kname in kernels:
        for k in KERNELS[kname]:
            if ks and k is not None and k not in ks:
                continue
            for m in matrices:
                c = Case(kname, m, k)
                if with_skipped or skip_reason(c) is None:
                    out.append(c)
    return out


def set_threads(n: int) -> None:
    torch.set_num_threads(int(n))


# --------------------------------------------------------------------------- operands

class Unavailable(Exception):
    """This implementation has no kernel for this case (not an error: a gap in the peer)."""


@dataclass
class Operands:
    case: Case
    A: sp.csr_array                      # the sparse operand (square-truncated for spgemm)
    B: Optional[sp.csr_array] = None     # spgemm: A^T as canonical CSR
    x: Optional[np.ndarray] = None       # spmv vector / spmm matrix (n x K)
    Bd: Optional[np.ndarray] = None      # sddmm B (m x K)
    Cd: Optional[np.ndarray] = None      # sddmm C (K x n)
    rows: Optional[np.ndarray] = None    # sddmm: row index of each stored entry

    @property
    def shape(self) -> Tuple[int, int]:
        return self.A.shape


def _seed(case: Case) -> int:
    return zlib.crc32(case.id.encode())


#: dense operands live in torch's memory (64-byte aligned, as a PyTorch user's tensors are)
#: unless SCORCH_BENCH_NUMPY_OPERANDS is set: then in numpy's, whose large arrays start 16
#: bytes past a cache line, so a row of 32 float32 spans 3 lines instead of 2 (sessions
#: before 28 measured that way; scorch's gathered-row kernels ran 8-43 % slower on it,
#: ``results/issue15/zen5-s28-dot-prefetch/alignment_t1.txt``)
NUMPY_OPERANDS = os.environ.get("SCORCH_BENCH_NUMPY_OPERANDS", "") not in ("", "0", "false", "False")


def _dense(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array in torch's memory (numpy's, with NUMPY_OPERANDS)."""
    if NUMPY_OPERANDS:
        return np.ascontiguousarray(a)
    return torch.from_numpy(np.ascontiguousarray(a)).clone().numpy()


@functools.lru_cache(maxsize=1)
def operands(case: Case) -> Operands:
    """Operands of a case, deterministic (seeded by the case id). Only the latest case is
    kept alive (the big SDDMM operands are hundreds of MB)."""
    A = load_matrix(case.matrix)
    rng = np.random.default_rng(_seed(case))
    m, n = A.shape
    if case.kernel == "spmv":
        return Operands(case, A, x=_dense(rng.standard_normal(n, dtype=np.float32)))
    if case.kernel == "spmm":
        return Operands(case, A, x=_dense(rng.standard_normal((n, case.k), dtype=np.float32)))
    if case.kernel == "spgemm":
        if m != n:  # paper E.1: truncate non-square matrices to square
            s = min(m, n)
            A = sp.csr_array(A[:s, :s])
            A.sum_duplicates()
            A.sort_indices()
        B = sp.csr_array(A.T.tocsr())
        B.sum_duplicates()
        B.sort_indices()
        return Operands(case, A, B=B)
    if case.kernel in ("sddmm", "sddmm_nk"):
        rows = np.repeat(np.arange(m, dtype=np.int32), np.diff(A.indptr))
        return Operands(case, A, Bd=_dense(rng.standard_normal((m, case.k), dtype=np.float32)),
                        Cd=_dense(rng.standard_normal((case.k, n), dtype=np.float32)), rows=rows)
    raise ValueError(case.kernel)


def _torch_csr(M: sp.csr_array, index_dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.sparse_csr_tensor(torch.from_numpy(M.indptr).to(index_dtype),
                                   torch.from_numpy(M.indices).to(index_dtype),
                                   torch.from_numpy(M.data), size=M.shape,
                                   check_invariants=False)


def _dense_c(ops: Operands, kernel: str) -> torch.Tensor:
    """SDDMM's C (K x n): row-major, or (sddmm_nk) the transpose of an n x K array."""
    if kernel == "sddmm_nk":
        return torch.from_numpy(_dense(ops.Cd.T)).t()
    return torch.from_numpy(ops.Cd)


def _torch_coo(M: sp.csr_array) -> torch.Tensor:
    c = M.tocoo()
    idx = torch.from_numpy(np.vstack([c.row, c.col]).astype(np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(c.data.copy()), size=M.shape,
                                   is_coalesced=True, check_invariants=False)


# --------------------------------------------------------------------------- implementations

@dataclass
class Impl:
    """``fn()`` is the timed call; ``to_host(result)`` turns its result into a numpy array
    (dense outputs) or a scipy CSR array (sparse outputs) for checking."""
    name: str
    fn: Callable[[], Any]
    to_host: Callable[[Any], Any]
    api: str = ""


def _host_generic(r: Any) -> Any:
    if isinstance(r, scorch.SparseTensor):
        return sp.csr_array(r.to_scipy())
    if isinstance(r, torch.Tensor):
        if r.layout == torch.strided:
            return r.detach().numpy()
        if r.layout == torch.sparse_coo:
            r = r.coalesce()
            i = r.indices().numpy()
            return sp.csr_array(sp.coo_array((r.values().numpy(), (i[0], i[1])), shape=r.shape))
        if r.layout == torch.sparse_csr:
            return sp.csr_array((r.values().numpy(), r.col_indices().numpy(),
                                 r.crow_indices().numpy()), shape=r.shape)
        return _host_generic(r.to_sparse_coo())
    if sp.issparse(r):
        return sp.csr_array(r)
    return np.asarray(r)


def make_impl(case: Case, impl: str) -> Impl:
    """Build implementation ``impl`` for ``case`` (operand conversion happens here, untimed).

    Raises ``Unavailable`` when the peer has no such kernel; any other exception (e.g. the
    scorch compiler rejecting the einsum) propagates to the caller."""
    ops = operands(case)
    A, kernel = ops.A, case.kernel
    host = _host_generic

    if impl == "scorch":
        eq = case.equation
        As = scorch.from_scipy(A)
        if kernel in ("spmv", "spmm"):
            X = torch.from_numpy(ops.x)
            return Impl(impl, lambda: scorch.einsum(eq, As, X), host, f'einsum("{eq}")')
        if kernel == "spgemm":
            Bs = scorch.from_scipy(ops.B)
            return Impl(impl, lambda: scorch.einsum(eq, As, Bs), host, f'einsum("{eq}")')
        Bt, Ct = torch.from_numpy(ops.Bd), _dense_c(ops, kernel)
        return Impl(impl, lambda: scorch.einsum(eq, As, Bt, Ct), host, f'einsum("{eq}")')

    if impl in ("torch_csr", "torch_csr64"):
        At = _torch_csr(A, torch.int64 if impl == "torch_csr64" else torch.int32)
        if kernel == "spmv":
            x = torch.from_numpy(ops.x)
            return Impl(impl, lambda: torch.mv(At, x), host, "torch.mv(csr, x)")
        if kernel == "spmm":
            X = torch.from_numpy(ops.x)
            return Impl(impl, lambda: torch.mm(At, X), host, "torch.mm(csr, X)")
        if kernel == "spgemm":
            Bt = _torch_csr(ops.B, At.crow_indices().dtype)
            return Impl(impl, lambda: At @ Bt, host, "csr @ csr")
        Bt, Ct = torch.from_numpy(ops.Bd), _dense_c(ops, kernel)
        avals = At.values()

        def sddmm():
            r = torch.sparse.sampled_addmm(At, Bt, Ct, beta=0.0)
            r.values().mul_(avals)  # sampled_addmm ignores A's values; S = A * (B @ C)
            return r
        return Impl(impl, sddmm, host, "sparse.sampled_addmm(csr, B, C, beta=0) * A.values")

    if impl == "torch_coo":
        if kernel in ("sddmm", "sddmm_nk"):
            raise Unavailable("torch has no COO SDDMM (sampled_addmm is CSR-only)")
        Ac = _torch_coo(A)
        if kernel == "spmv":
            x = torch.from_numpy(ops.x)
            return Impl(impl, lambda: torch.mv(Ac, x), host, "torch.mv(coo, x)")
        if kernel == "spmm":
            X = torch.from_numpy(ops.x)
            return Impl(impl, lambda: torch.sparse.mm(Ac, X), host, "torch.sparse.mm(coo, X)")
        Bc = _torch_coo(ops.B)
        return Impl(impl, lambda: torch.sparse.mm(Ac, Bc), host, "torch.sparse.mm(coo, coo)")

    if impl == "scipy":
        if kernel in ("spmv", "spmm"):
            x = ops.x
            return Impl(impl, lambda: A @ x, host, "A @ x" if kernel == "spmv" else "A @ X")
        if kernel == "spgemm":
            B = ops.B
            return Impl(impl, lambda: A @ B, host, "A @ AT")
        # sddmm: CT = C.T made contiguous outside the timed call; sddmm_nk: C arrives so
        Bd, CT, rows, cols, data = (ops.Bd, _dense_c(ops, kernel).t().contiguous().numpy(),
                                    ops.rows, A.indices, A.data)
        indptr, shape = A.indptr, A.shape

        def sddmm():
            return np.einsum("ij,ij->i", Bd[rows], CT[cols]) * data

        def to_host(v):
            return sp.csr_array((np.asarray(v), cols, indptr), shape=shape)
        return Impl(impl, sddmm, to_host, "einsum('ij,ij->i', B[rows], CT[cols]) * A.data")

    raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLS}")


# --------------------------------------------------------------------------- checking

@functools.lru_cache(maxsize=1)
def reference(case: Case) -> Any:
    """float64 reference result: numpy array (dense outputs) or scipy CSR (sparse outputs)."""
    ops = operands(case)
    A64 = ops.A.astype(np.float64)
    if case.kernel in ("spmv", "spmm"):
        return A64 @ ops.x.astype(np.float64)
    if case.kernel == "spgemm":
        r = sp.csr_array(A64 @ ops.B.astype(np.float64))
        r.sum_duplicates()
        return r
    # sddmm, chunked so the gathered rows stay small
    A = ops.A
    out = np.empty(A.nnz, dtype=np.float64)
    B64, CT64 = ops.Bd.astype(np.float64), ops.Cd.T.astype(np.float64)
    step = max(1, (1 << 24) // max(1, case.k))
    for s in range(0, A.nnz, step):
        e = min(A.nnz, s + step)
        out[s:e] = np.einsum("ij,ij->i", B64[ops.rows[s:e]], CT64[A.indices[s:e]])
    out *= A.data
    return sp.csr_array((out, A.indices, A.indptr), shape=A.shape)


def check(case: Case, host_result: Any, rtol: float = 1e-4) -> Tuple[bool, str]:
    """Compare a host result with the float64 reference: the largest absolute error must be
    within ``rtol`` times the largest reference magnitude (float32 accumulation-order slack).
    Returns (ok, message)."""
    ref = reference(case)
    if sp.issparse(ref):
        if not sp.issparse(host_result):
            return False, f"expected a sparse result, got {type(host_result).__name__}"
        if host_result.shape != ref.shape:
            return False, f"shape {host_result.shape} != {ref.shape}"
        diff = sp.csr_array(host_result.astype(np.float64) - ref)
        err = float(np.abs(diff.data).max()) if diff.nnz else 0.0
        scale = float(np.abs(ref.data).max()) if ref.nnz else 1.0
    else:
        if sp.issparse(host_result):
            host_result = host_result.toarray()
        host_result = np.asarray(host_result)
        if host_result.shape != ref.shape:
            return False, f"shape {host_result.shape} != {ref.shape}"
        if not np.all(np.isfinite(host_result)):
            return False, "non-finite values"
        err = float(np.abs(host_result.astype(np.float64) - ref).max()) if ref.size else 0.0
        scale = float(np.abs(ref).max()) if ref.size else 1.0
    scale = scale or 1.0
    ok = err <= rtol * scale
    return ok, f"max abs err {err:.3g} (scale {scale:.3g})"


# --------------------------------------------------------------------------- traffic model

def _csr_bytes(M: sp.csr_array) -> int:
    return M.indptr.nbytes + M.indices.nbytes + M.data.nbytes


def bytes_moved(case: Case, out_nnz: Optional[int] = None) -> int:
    """Bytes that must move at least once: the sparse operands' index arrays and values,
    the dense operands read, and the output written (SpGEMM: the output CSR with int32
    indices, nnz from the reference; SDDMM: output values only, the pattern is A's)."""
    ops = operands(case)
    A = ops.A
    m, n = A.shape
    f = 4  # float32
    if case.kernel == "spmv":
        return _csr_bytes(A) + n * f + m * f
    if case.kernel == "spmm":
        return _csr_bytes(A) + (n + m) * case.k * f
    if case.kernel == "spgemm":
        if out_nnz is None:
            out_nnz = reference(case).nnz
        return _csr_bytes(A) + _csr_bytes(ops.B) + (m + 1) * 4 + out_nnz * (4 + f)
    return _csr_bytes(A) + (m + n) * case.k * f + A.nnz * f
