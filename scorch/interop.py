"""Torch and scipy sparse layouts in and out of level storage, sharing arrays where the
layouts agree.

Which layouts map onto which formats, without copying the index or value arrays:

=====================  =============================================  ==========================
torch / scipy          scorch format                                  shared
=====================  =============================================  ==========================
COO (coalesced)        coordinate at every sparse dim (+ dense dims)   indices rows, values
CSR / csr              ``dc``                                         crow, col, values
CSC / csc              ``dc`` with mode order (1, 0)                  ccol, row, values
BSR / bsr              ``dc`` with ``block=(b0, b1)``                 crow, col, values
BSC                    ``dc``, mode order (1, 0), blocked             ccol, row, values
scipy coo (canonical)  ``coo``                                        row, col, data
=====================  =============================================  ==========================

Imported storage keeps the source's index dtype (torch uses int64) so nothing is copied;
storage that scorch builds itself uses int32 where it fits.
"""
from __future__ import annotations

import numpy as np
import torch

from .formats import Format, LevelKind, as_format
from .level_storage import Level, Storage

__all__ = ["from_torch", "to_torch", "from_scipy", "to_scipy"]

_D, _C, _Q = LevelKind.DENSE, LevelKind.COMPRESSED, LevelKind.COORDINATE


def _convert():
    from ._runtime import convert
    return convert


def _index_pair(a: torch.Tensor, b: torch.Tensor):
    """pos and crd must share one index dtype; widen only when they differ."""
    if a.dtype != b.dtype:
        return a.to(torch.int64), b.to(torch.int64)
    return a, b


def from_torch(x: torch.Tensor) -> Storage:
    """Storage viewing a torch sparse tensor's arrays (COO is coalesced first if needed)."""
    layout = x.layout
    if x.device.type != "cpu":
        raise ValueError(f"sparse tensor on {x.device}: scorch works on CPU tensors")
    if layout is torch.sparse_coo:
        if not x.is_coalesced():
            x = x.coalesce()
        indices, values = x._indices(), x._values()
        sparse_dims = indices.shape[0]
        dense_dims = x.dim() - sparse_dims
        nnz = values.shape[0]
        pos = torch.tensor([0, nnz], dtype=indices.dtype)
        levels = []
        for d in range(sparse_dims):
            levels.append(Level(_Q, d, x.shape[d], pos if d == 0 else None, indices[d]))
        for d in range(sparse_dims, x.dim()):
            levels.append(Level(_D, d, x.shape[d]))
        if sparse_dims == 0:
            raise ValueError("a torch COO tensor with no sparse dimensions: use it as dense")
        fmt = Format("q" * sparse_dims + "d" * dense_dims)
        return Storage(fmt, x.shape, levels, values.contiguous().reshape(-1), indices.dtype)
    if layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        if x.dim() != 2:
            raise ValueError(
                f"torch {layout} tensor with {x.dim()} dims: batched or hybrid compressed "
                f"layouts are read through COO; call .to_sparse() first")
        rowwise = layout in (torch.sparse_csr, torch.sparse_bsr)
        if rowwise:
            pos, crd = x.crow_indices(), x.col_indices()
        else:
            pos, crd = x.ccol_indices(), x.row_indices()
        pos, crd = _index_pair(pos, crd)
        values = x.values()
        outer, inner = (0, 1) if rowwise else (1, 0)
        if layout in (torch.sparse_bsr, torch.sparse_bsc):
            block = tuple(values.shape[1:3])
            grid = (x.shape[0] // block[0], x.shape[1] // block[1])
            levels = [Level(_D, outer, grid[outer]), Level(_C, inner, grid[inner], pos, crd),
                      Level(_D, 0, block[0], block_inner=True),
                      Level(_D, 1, block[1], block_inner=True)]
            fmt = Format("dc", (outer, inner), block)
        else:
            levels = [Level(_D, outer, x.shape[outer]), Level(_C, inner, x.shape[inner], pos, crd)]
            fmt = Format("dc", (outer, inner))
        return Storage(fmt, x.shape, levels, values.contiguous().reshape(-1), pos.dtype)
    raise ValueError(f"not a torch sparse layout: {layout}")


def to_torch(st: Storage) -> torch.Tensor:
    """The torch layout matching the format; other formats go through COO."""
    fmt = st.format
    if fmt.is_dense and fmt.block is None:
        return _convert().to_dense(st)
    if fmt.rank == 2 and fmt.levels == (_D, _C):
        pos, crd = st.levels[1].pos, st.levels[1].crd
        rowwise = fmt.mode_order == (0, 1)
        if fmt.block is None:
            ctor = torch.sparse_csr_tensor if rowwise else torch.sparse_csc_tensor
            return ctor(pos, crd, st.values, st.shape, check_invariants=False)
        ctor = torch.sparse_bsr_tensor if rowwise else torch.sparse_bsc_tensor
        values = st.values.reshape(-1, *fmt.block)
        return ctor(pos, crd, values, st.shape, check_invariants=False)
    coo_fmt = Format("q" * fmt.rank)
    if fmt != coo_fmt:
        st = _convert().convert(st, coo_fmt)
    indices = torch.stack([lv.crd.to(torch.int64) for lv in st.levels]) if st.levels else \
        torch.zeros((0, st.nnz), dtype=torch.int64)
    return torch.sparse_coo_tensor(indices, st.values, st.shape, is_coalesced=True,
                                   check_invariants=False)


# --- scipy ------------------------------------------------------------------------------

def _sp():
    import scipy.sparse as sp
    return sp


def is_scipy_sparse(x) -> bool:
    try:
        return _sp().issparse(x)
    except ImportError:  # pragma: no cover - scipy is a dependency
        return False


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def from_scipy(m) -> Storage:
    """Storage sharing a scipy matrix/array's arrays where its layout is canonical."""
    sp = _sp()
    if not sp.issparse(m):
        raise TypeError(f"from_scipy: expected a scipy.sparse matrix or array, got {type(m).__name__}")
    fmt_name = m.format
    shape = tuple(int(s) for s in m.shape)
    if len(shape) != 2:
        # scipy >= 1.13 has n-d COO arrays: read through coordinates
        coords = np.vstack(m.coords)
        return _convert().from_coords(_t(coords), _t(m.data), shape, as_format("coo", len(shape)))
    if fmt_name in ("csr", "csc", "bsr"):
        if not _is_canonical_compressed(m.indptr, m.indices):
            m = m.copy()
            m.sum_duplicates()  # also sorts indices; scipy's own canonicalisation
        pos, crd = _index_pair(_t(m.indptr), _t(m.indices))
        rowwise = fmt_name in ("csr", "bsr")
        outer, inner = (0, 1) if rowwise else (1, 0)
        values = _t(m.data).reshape(-1)
        if fmt_name == "bsr":
            block = tuple(int(b) for b in m.blocksize)
            grid = (shape[0] // block[0], shape[1] // block[1])
            levels = [Level(_D, 0, grid[0]), Level(_C, 1, grid[1], pos, crd),
                      Level(_D, 0, block[0], block_inner=True),
                      Level(_D, 1, block[1], block_inner=True)]
            return Storage(Format("dc", (0, 1), block), shape, levels, values, pos.dtype)
        levels = [Level(_D, outer, shape[outer]), Level(_C, inner, shape[inner], pos, crd)]
        return Storage(Format("dc", (outer, inner)), shape, levels, values, pos.dtype)
    if fmt_name != "coo":
        m = m.tocoo()
    row, col, data = _t(m.row), _t(m.col), _t(m.data)
    if m.has_canonical_format or _is_canonical_coo(m.row, m.col):
        row, col = _index_pair(row, col)
        pos = torch.tensor([0, row.numel()], dtype=row.dtype)
        levels = [Level(_Q, 0, shape[0], pos, row), Level(_Q, 1, shape[1], None, col)]
        return Storage(Format("qq"), shape, levels, data, row.dtype)
    return _convert().from_coords(torch.stack([row.to(torch.int64), col.to(torch.int64)]),
                                  data, shape, Format("qq"))


def _is_canonical_compressed(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Coordinates strictly increasing inside every segment (scipy's own flag is computed
    lazily and is not always set, so check; one vectorised pass)."""
    nnz = len(indices)
    if nnz < 2:
        return True
    inside = np.ones(nnz - 1, bool)
    starts = indptr[1:-1]
    starts = starts[(starts > 0) & (starts < nnz)]
    inside[starts - 1] = False
    return bool((np.diff(indices)[inside] > 0).all())


def _is_canonical_coo(row: np.ndarray, col: np.ndarray) -> bool:
    """Sorted row-major with no duplicates (one vectorised pass)."""
    if len(row) < 2:
        return True
    dr = np.diff(row)
    if (dr < 0).any():
        return False
    same_row = dr == 0
    return bool((np.diff(col)[same_row] > 0).all())


def to_scipy(st: Storage, kind: str = "array"):
    """scipy.sparse ``*_array`` (or ``*_matrix`` with kind="matrix") sharing arrays."""
    sp = _sp()
    if kind not in ("array", "matrix"):
        raise ValueError(f"to_scipy: kind must be 'array' or 'matrix', got {kind!r}")
    if st.ndim != 2:
        raise ValueError(f"to_scipy: scipy.sparse holds matrices; this tensor has {st.ndim} dims")
    fmt = st.format
    cls = lambda name: getattr(sp, f"{name}_{kind}")  # noqa: E731
    if fmt.levels == (_D, _C):
        pos, crd = st.levels[1].pos.numpy(), st.levels[1].crd.numpy()
        if fmt.block is not None:
            if fmt.mode_order != (0, 1):
                st = _convert().convert(st, Format("dc", (0, 1), fmt.block))
                pos, crd = st.levels[1].pos.numpy(), st.levels[1].crd.numpy()
            data = st.values.numpy().reshape(-1, *fmt.block)
            return cls("bsr")((data, crd, pos), shape=st.shape, copy=False)
        name = "csr" if fmt.mode_order == (0, 1) else "csc"
        return cls(name)((st.values.numpy(), crd, pos), shape=st.shape, copy=False)
    if fmt != Format("qq"):
        st = _convert().convert(st, Format("qq"))
    row, col = st.levels[0].crd.numpy(), st.levels[1].crd.numpy()
    m = cls("coo")((st.values.numpy(), (row, col)), shape=st.shape, copy=False)
    m.has_canonical_format = True
    return m
