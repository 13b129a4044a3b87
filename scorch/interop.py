"""Torch and scipy sparse layouts in and out of level storage, sharing arrays where the
layouts agree.

Which layouts map onto which formats, without copying the index or value arrays:

=====================  =============================================  ==========================
torch / scipy          scorch format                                  shared
=====================  =============================================  ==========================
COO (coalesced)        coordinate at every sparse dim (+ dense dims)   indices rows, values
CSR / csr              ``dc`` (+ dense levels: a hybrid CSR)          crow, col, values
CSC / csc              ``dc`` with mode order (1, 0) (+ dense levels)  ccol, row, values
BSR / bsr              ``dc`` with ``block=(b0, b1)``                 crow, col, values
BSC                    ``dc``, mode order (1, 0), blocked             ccol, row, values
scipy coo (canonical)  ``coo``                                        row, col, data
=====================  =============================================  ==========================

Imported storage keeps the source's index dtype (torch uses int64) so nothing is copied;
storage that scorch builds itself uses int32 where it fits.

Nothing imported is trusted: torch builds sparse tensors without checking them by default
(``check_invariants=False``) and scipy's arrays can be reassigned, and a kernel reading an
index out of range reads or writes out of bounds. Every import checks the arrays in one
O(nnz) pass (``scorch._runtime.validate``, about 0.7 ms per million entries of CSR): a
coordinate out of range, a decreasing, short or overlong pointer array, or a values array
of the wrong length is a ValueError naming the operand, the array, the entry and the value.
Unsorted or repeated coordinates, valid in torch and scipy, are sorted and summed into a
copy. For a torch tensor the verdict that its arrays can be read as they are is kept until
its version counter moves (its index arrays' aliases share the counter), so a warm einsum
pays only a lookup; a canonical copy is made again each call, as torch's ``coalesce`` is:
the tensors given to torch's constructor alias its arrays with version counters of their
own, so a copy kept would miss their writes.

Shared memory is written where no torch version counter sees it: through the numpy arrays
of a scipy matrix (``m.data *= 2``, ``m.sort_indices()``), a torch sparse tensor's
constructor arguments, or the tensors and arrays ``to_torch`` / ``to_scipy`` hand out over
scorch's own. Such arrays are marked ``tensor_cache.untracked``, so nothing scorch derives
from their contents (a kept transpose's gathered values, a pattern's conversion) is reused
unchecked. Writes through ``.values().numpy()`` are not seen (as torch's autograd does not
see them): after one, pass the tensor through ``scorch.sparse_tensor(A.to_scipy())`` or
write through torch (``A.values().mul_(2)``).
"""
from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch

from .conversion import dense_dim, hybrid_values
from .formats import Format, LevelKind, as_format
from .level_storage import Level, Storage, sorted_segment_keys
from .tensor_cache import TensorKeyedCache, untracked, version

__all__ = ["from_torch", "to_torch", "from_scipy", "to_scipy"]

_D, _C, _Q = LevelKind.DENSE, LevelKind.COMPRESSED, LevelKind.COORDINATE


def _convert():
    from ._runtime import convert
    return convert


def _validate():
    from ._runtime import validate
    return validate


def _index_pair(a: torch.Tensor, b: torch.Tensor):
    """pos and crd must share one index dtype; widen only when they differ."""
    if a.dtype != b.dtype:
        return a.to(torch.int64), b.to(torch.int64)
    return a, b


#: a torch sparse tensor whose arrays were checked canonical (read as they are) -> True, per
#: version counter (its arrays' aliases share it: an in-place op on the tensor or its
#: ``values()`` moves it)
_CHECKED = TensorKeyedCache()


def _layout_name(layout) -> str:
    return str(layout).replace("torch.", "")


def from_torch(x: torch.Tensor) -> Storage:
    """Storage viewing a torch sparse tensor's arrays (COO is coalesced first if needed).

    torch does not check the arrays of a sparse tensor by default (``check_invariants=False``),
    so they are checked here once per tensor (O(nnz), in ``scorch._runtime.validate``; the
    verdict is kept until the tensor's version counter moves): an index out of range, a
    malformed pointer array or a values array of the wrong length raise ValueError naming
    the problem; unsorted or repeated coordinates (valid in torch) are sorted and summed into
    a copy, made again each call (the module docstring says why). The arrays read as they
    are get marked ``untracked``."""
    layout = x.layout
    if x.device.type != "cpu":
        raise ValueError(f"sparse tensor on {x.device}: scorch works on CPU tensors")
    stamp = version(x)   # (read before the check: a write during it must miss next time)
    if _CHECKED.get(x, stamp=stamp) is None:
        canonical = _checked_torch(x, layout)
        if canonical is not None:
            return canonical
        _CHECKED.put(x, True, stamp=stamp)
    return _torch_storage(x, shared=True)


def _checked_torch(x: torch.Tensor, layout) -> Optional[Storage]:
    """Validate a torch sparse tensor's arrays: None when they can be used as they are, else
    the canonical Storage (sorted, duplicates summed) built from them."""
    validate = _validate()
    operand = f"a torch {_layout_name(layout)} tensor of shape {tuple(x.shape)}"
    if layout is torch.sparse_coo:
        indices, values = x._indices(), x._values()
        if not indices.is_contiguous():     # the runtime reads the rows flat
            flat = torch.sparse_coo_tensor(indices.contiguous(), values, x.shape,
                                           is_coalesced=x.is_coalesced(), check_invariants=False)
            return _checked_torch(flat, layout) or _torch_storage(flat)
        if values.shape[0] != indices.shape[1]:
            raise ValueError(f"{operand}: {values.shape[0]} values for {indices.shape[1]} "
                             f"coordinates")
        verdict = validate.coordinates(indices, tuple(x.shape), f"indices of {operand}",
                                       need_order=x.is_coalesced())
        if verdict == validate.CANONICAL and x.is_coalesced():
            return None
        if verdict == validate.CANONICAL:
            # not coalesced: torch coalesces it (safe now that the indices are in range);
            # the result is kept with the verdict, so repeated calls do not coalesce again
            return _torch_storage(x.coalesce())
        # flagged coalesced, but unsorted or repeated: rebuild unflagged and let torch sum
        redo = torch.sparse_coo_tensor(indices, values, x.shape, check_invariants=False)
        return _torch_storage(redo.coalesce())
    if layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        if x.dim() != 2 + (x.dense_dim() if layout in (torch.sparse_csr, torch.sparse_csc) else 0):
            # batched, or a hybrid BSR / BSC: read through torch's COO of it (a copy, kept
            # with this tensor's version like any checked import); a hybrid CSR / CSC is read
            # as it is (``dc`` then dense levels), so that it goes back to torch as one
            coo = x.to_sparse()
            st = _checked_torch(coo, torch.sparse_coo)
            return st if st is not None else _torch_storage(coo)
        rowwise = layout in (torch.sparse_csr, torch.sparse_bsr)
        pos, crd = (x.crow_indices(), x.col_indices()) if rowwise else \
            (x.ccol_indices(), x.row_indices())
        values = x.values()
        # torch accepts strided index arrays (``col[::2]``); the runtime reads them flat
        strided = not (pos.is_contiguous() and crd.is_contiguous())
        pos, crd = pos.contiguous(), crd.contiguous()
        outer, inner = (0, 1) if rowwise else (1, 0)
        grid = list(x.shape)
        if layout in (torch.sparse_bsr, torch.sparse_bsc):
            block = tuple(values.shape[1:3])
            if len(block) != 2 or min(block) <= 0 or x.shape[0] % block[0] or x.shape[1] % block[1]:
                raise ValueError(f"{operand}: blocks of shape {block} do not tile the tensor")
            grid = [x.shape[0] // block[0], x.shape[1] // block[1]]
        names = ("crow_indices", "col_indices") if rowwise else ("ccol_indices", "row_indices")
        verdict = validate.compressed(
            pos, crd, grid[outer], grid[inner], values.shape[0], operand, names[0], names[1],
            "column" if rowwise else "row")
        if values.shape[0] != crd.shape[0]:
            raise ValueError(f"{operand}: {values.shape[0]} values for {crd.shape[0]} "
                             f"{names[1]}")
        if verdict == validate.CANONICAL:   # the contiguous copies kept with the verdict
            return _compressed_storage(x, layout, pos, crd, values) if strided else None
        pos, crd, values = _canonical_segments(pos, crd, values, grid[outer], grid[inner])
        return _compressed_storage(x, layout, pos, crd, values)
    raise ValueError(f"not a torch sparse layout: {layout}")


def _canonical_segments(pos: torch.Tensor, crd: torch.Tensor, values: torch.Tensor,
                        outer: int, inner: int):
    """Every segment sorted with repeated coordinates summed (a copy; vectorised torch ops).
    ``values`` may have trailing block dimensions."""
    key, order = sorted_segment_keys(pos, crd, inner)
    uniq, slot = torch.unique_consecutive(key, return_inverse=True)
    vals = values.index_select(0, order)
    summed = torch.zeros((uniq.numel(),) + tuple(values.shape[1:]), dtype=values.dtype)
    if values.dtype == torch.bool:
        summed = summed.to(torch.uint8).index_add_(0, slot, vals.to(torch.uint8)).bool()
    else:
        summed.index_add_(0, slot, vals)
    row = torch.div(uniq, max(inner, 1), rounding_mode="floor")
    new_pos = torch.zeros(outer + 1, dtype=torch.int64)
    new_pos[1:] = torch.cumsum(torch.bincount(row, minlength=outer)[:outer], 0)
    new_crd = uniq - row * max(inner, 1)
    idx = pos.dtype
    return new_pos.to(idx), new_crd.to(idx), summed


def _torch_storage(x: torch.Tensor, shared: bool = False) -> Storage:
    """Storage over the arrays of a checked torch sparse tensor (no copy); ``shared``: the
    arrays are the user's tensor's, marked ``untracked``."""
    layout = x.layout
    if layout is torch.sparse_coo and not x.is_coalesced():
        x = x.coalesce()
    if shared:
        for a in torch_arrays(x):
            untracked(a)
    if layout is torch.sparse_coo:
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
    rowwise = layout in (torch.sparse_csr, torch.sparse_bsr)
    if rowwise:
        pos, crd = x.crow_indices(), x.col_indices()
    else:
        pos, crd = x.ccol_indices(), x.row_indices()
    return _compressed_storage(x, layout, pos, crd, x.values())


def _compressed_storage(x: torch.Tensor, layout, pos: torch.Tensor, crd: torch.Tensor,
                        values: torch.Tensor) -> Storage:
    pos, crd = _index_pair(pos, crd)
    rowwise = layout in (torch.sparse_csr, torch.sparse_bsr)
    outer, inner = (0, 1) if rowwise else (1, 0)
    if layout in (torch.sparse_bsr, torch.sparse_bsc):
        block = tuple(values.shape[1:3])
        grid = (x.shape[0] // block[0], x.shape[1] // block[1])
        levels = [Level(_D, outer, grid[outer]), Level(_C, inner, grid[inner], pos, crd),
                  Level(_D, 0, block[0], block_inner=True),
                  Level(_D, 1, block[1], block_inner=True)]
        fmt = Format("dc", (outer, inner), block)
    else:   # a hybrid's dense dims (values of shape (nnz, *dense)) as trailing dense levels
        dense = range(2, x.dim())
        levels = [Level(_D, outer, x.shape[outer]), Level(_C, inner, x.shape[inner], pos, crd),
                  *(Level(_D, d, x.shape[d]) for d in dense)]
        fmt = Format("dc" + "d" * len(dense), (outer, inner, *dense))
    return Storage(fmt, x.shape, levels, values.contiguous().reshape(-1), pos.dtype)


#: torch's one-time notice on the first compressed sparse tensor of a process
_BETA_NOTICE = r"Sparse \w+ tensor support is in beta state"


def _compressed_tensor(ctor, internal: bool, *args) -> torch.Tensor:
    if not internal:
        return ctor(*args, check_invariants=False)
    # a tensor scorch builds for its own use: torch's beta notice would be about a tensor
    # the user never made (and an error under ``python -W error``)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _BETA_NOTICE, UserWarning)
        return ctor(*args, check_invariants=False)


def to_torch(st: Storage, *, internal: bool = False) -> torch.Tensor:
    """The torch layout matching the format; other formats go through COO. Coordinates are
    sorted within rows (an ``einsum(..., sorted=False)`` result is sorted first).

    ``internal=True``: the tensor is scorch's own (a CSR factor handed to a torch kernel),
    not one the user asked for (``SparseTensor.to_torch()``): torch's "Sparse CSR tensor
    support is in beta state" warning is not shown for it.

    The user's tensor shares scorch's arrays, but writes through its ``values()`` (and
    index accessors) move only its own version counter: the shared arrays are marked
    ``untracked``."""
    out = _to_torch(st, internal)
    if not internal and out.layout is not torch.strided:
        for a in torch_arrays(out):   # (the memory scorch's arrays share with them)
            untracked(a)
    return out


def torch_arrays(x: torch.Tensor) -> tuple:
    """A torch sparse tensor's index and value arrays."""
    if x.layout is torch.sparse_coo:
        return x._indices(), x._values()
    if x.layout in (torch.sparse_csr, torch.sparse_bsr):
        return x.crow_indices(), x.col_indices(), x.values()
    return x.ccol_indices(), x.row_indices(), x.values()


def _to_torch(st: Storage, internal: bool) -> torch.Tensor:
    st = st.with_sorted_coordinates()
    fmt = st.format
    if fmt.is_dense and fmt.block is None:
        return _convert().to_dense(st)
    # torch's hybrid layouts (trailing dense levels: ``dcd`` is a CSR with a dense dim, ``qqd``
    # a COO whose values are (nnz, *dense)) go back as those, values reshaped (a view)
    dense = dense_dim(fmt)
    sparse = fmt.rank - dense
    if sparse == 2 and fmt.levels[:2] == (_D, _C):
        pos, crd = st.levels[1].pos, st.levels[1].crd
        rowwise = fmt.mode_order[:2] == (0, 1)
        if fmt.block is None:
            ctor = torch.sparse_csr_tensor if rowwise else torch.sparse_csc_tensor
            return _compressed_tensor(ctor, internal, pos, crd, hybrid_values(st, st.values), st.shape)
        ctor = torch.sparse_bsr_tensor if rowwise else torch.sparse_bsc_tensor
        values = st.values.reshape(-1, *fmt.block)
        return _compressed_tensor(ctor, internal, pos, crd, values, st.shape)
    coo_fmt = Format("q" * sparse + "d" * dense)
    if fmt != coo_fmt:
        st = _convert().convert(st, coo_fmt)
    indices = torch.stack([lv.crd.to(torch.int64) for lv in st.levels[:sparse]]) if sparse else \
        torch.zeros((0, st.nnz), dtype=torch.int64)
    return torch.sparse_coo_tensor(indices, hybrid_values(st, st.values), st.shape, is_coalesced=True,
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


def numpy_tensor(x: np.ndarray, name: str) -> torch.Tensor:
    """A numpy array as a tensor (shared where torch can): a byte-swapped array is made
    native first; types torch has none of (``longdouble``, strings, objects) are a
    TypeError naming ``name``."""
    kind, size = x.dtype.kind, x.dtype.itemsize
    if kind not in "biufc":
        raise TypeError(f"{name} must hold numbers, got a numpy array of dtype {x.dtype}")
    if (kind == "f" and size > 8) or (kind == "c" and size > 16):
        raise TypeError(f"{name}: numpy dtype {x.dtype} has no torch counterpart; convert it "
                        f"first (e.g. .astype(numpy.float64))")
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    return torch.from_numpy(np.ascontiguousarray(x)) if x.dtype != np.float16 \
        else torch.from_numpy(x.copy())


def _t(a: np.ndarray, name: str = "a scipy.sparse array") -> torch.Tensor:
    return numpy_tensor(a, name)


def from_scipy(m) -> Storage:
    """Storage sharing a scipy matrix/array's arrays where its layout is canonical (marked
    ``untracked``: scipy writes them in place, ``m.data *= 2``, ``m.sort_indices()``)."""
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
        rowwise = fmt_name in ("csr", "bsr")
        outer, inner = (0, 1) if rowwise else (1, 0)
        grid = shape
        if fmt_name == "bsr":
            block = tuple(int(b) for b in m.blocksize)
            grid = (shape[0] // block[0], shape[1] // block[1])
        operand = f"a scipy {fmt_name} matrix of shape {shape}"
        data = np.asarray(m.data)
        indptr, indices = _t(np.asarray(m.indptr)), _t(np.asarray(m.indices))
        verdict = _validate().compressed(
            indptr, indices, grid[outer], grid[inner], data.shape[0] if data.ndim else 0,
            operand, "indptr", "indices", "column" if rowwise else "row", exact=False)
        shared = verdict == _validate().CANONICAL
        if not shared:
            m = m.copy()
            m.sum_duplicates()  # sorts indices too; safe now that they are in range
        nnz = int(m.indptr[-1])
        pos, crd = _index_pair(_t(m.indptr), _t(m.indices[:nnz]))
        values = _t(m.data[:nnz]).reshape(-1)
        if shared:
            for a in (pos, crd, values):
                untracked(a)
        if fmt_name == "bsr":
            levels = [Level(_D, 0, grid[0]), Level(_C, 1, grid[1], pos, crd),
                      Level(_D, 0, block[0], block_inner=True),
                      Level(_D, 1, block[1], block_inner=True)]
            return Storage(Format("dc", (0, 1), block), shape, levels, values, pos.dtype)
        levels = [Level(_D, outer, shape[outer]), Level(_C, inner, shape[inner], pos, crd)]
        return Storage(Format("dc", (outer, inner)), shape, levels, values, pos.dtype)
    if fmt_name != "coo":
        m = m.tocoo()
    row, col, data = _t(m.row), _t(m.col), _t(m.data)
    if row.numel() != col.numel() or data.dim() != 1 or data.numel() != row.numel():
        raise ValueError(f"a scipy coo matrix of shape {shape}: row, col and data have "
                         f"{row.numel()}, {col.numel()} and {data.numel()} entries")
    verdict = _validate().coordinates(torch.stack([row.to(torch.int64), col.to(torch.int64)]),
                                      shape, f"row/col of a scipy coo matrix of shape {shape}")
    if verdict == _validate().CANONICAL:
        row, col = _index_pair(row, col)
        for a in (row, col, data):
            untracked(a)
        pos = torch.tensor([0, row.numel()], dtype=row.dtype)
        levels = [Level(_Q, 0, shape[0], pos, row), Level(_Q, 1, shape[1], None, col)]
        return Storage(Format("qq"), shape, levels, data, row.dtype)
    return _convert().from_coords(torch.stack([row.to(torch.int64), col.to(torch.int64)]),
                                  data, shape, Format("qq"))


def _lent(t: torch.Tensor) -> np.ndarray:
    """``t.numpy()``, with ``t``'s memory marked ``untracked``."""
    untracked(t)
    return t.numpy()


#: value types scipy.sparse computes with (float16 arrays it builds but cannot multiply)
_SCIPY_DTYPES = frozenset({torch.float32, torch.float64, torch.complex64, torch.complex128,
                           torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool})


def to_scipy(st: Storage, kind: str = "array"):
    """scipy.sparse ``*_array`` (or ``*_matrix`` with kind="matrix") sharing arrays (marked
    ``untracked``: scipy writes them in place)."""
    sp = _sp()
    if kind not in ("array", "matrix"):
        raise ValueError(f"to_scipy: kind must be 'array' or 'matrix', got {kind!r}")
    if st.values.dtype not in _SCIPY_DTYPES:
        raise TypeError(f"to_scipy: scipy.sparse does not compute with {st.values.dtype} values; "
                        f"convert the tensor first (e.g. .float())")
    if st.ndim != 2:
        if kind == "array" and hasattr(sp, "coo_array"):
            # scipy >= 1.13: n-d (and 1-d) COO arrays
            if st.format != Format("q" * st.ndim):
                st = _convert().convert(st, Format("q" * st.ndim))
            coords = tuple(_lent(lv.crd) for lv in st.levels)
            try:
                return sp.coo_array((_lent(st.values), coords), shape=st.shape, copy=False)
            except (TypeError, ValueError):
                pass
        raise ValueError(f"to_scipy: this scipy.sparse holds matrices (kind={kind!r}); this "
                         f"tensor has {st.ndim} dims")
    fmt = st.format
    cls = lambda name: getattr(sp, f"{name}_{kind}")  # noqa: E731
    if fmt.levels == (_D, _C):
        pos, crd = _lent(st.levels[1].pos), _lent(st.levels[1].crd)
        if fmt.block is not None:
            if fmt.mode_order != (0, 1):
                st = _convert().convert(st, Format("dc", (0, 1), fmt.block))
                pos, crd = _lent(st.levels[1].pos), _lent(st.levels[1].crd)
            data = _lent(st.values).reshape(-1, *fmt.block)
            return cls("bsr")((data, crd, pos), shape=st.shape, copy=False)
        name = "csr" if fmt.mode_order == (0, 1) else "csc"
        return cls(name)((_lent(st.values), crd, pos), shape=st.shape, copy=False)
    if fmt != Format("qq"):
        st = _convert().convert(st, Format("qq"))
    row, col = _lent(st.levels[0].crd), _lent(st.levels[1].crd)
    m = cls("coo")((_lent(st.values), (row, col)), shape=st.shape, copy=False)
    m.has_canonical_format = True
    return m
