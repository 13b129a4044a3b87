"""Shape ops on sparse tensors. They move coordinates, never values through a dense copy, and
cost follows the stored entries of the result (no array as long as a dimension unless the
format has a dense level there).

* ``permute``, ``transpose``/``swapaxes``, ``t``, ``.T``, ``.mT`` (also at the ATen level):
  views, only the mode order of the same level arrays changes.
* ``unsqueeze``: a view too: a dense level of size 1 is put in front of the levels (positions
  are unchanged), so the format is kept with one more level.
* ``squeeze``: drops size-1 dense levels without a copy where that leaves a valid format;
  otherwise rebuilds the format minus the squeezed levels from the coordinates.
* ``reshape``/``view``/``flatten``/``unflatten``: linearised coordinates in int64, re-split for
  the new shape; the result is COO (a new rank has no natural counterpart of the old format).
* ``cat``/``stack``: coordinates offset along the dimension; the result has the first
  operand's format (unblocked). With a dense operand the result is dense, as torch gives.
* indexing (``t[...]``: integers, slices with positive steps, negative indices, ``...``,
  ``None``, 1-D integer index tensors (several broadcast together), boolean masks over one or
  more dimensions) and ``index_select``: a filter over the coordinates plus a sorted join of
  the coordinate tuples with the index tensors (linearised in int64). The result keeps the input's format
  when the rank is unchanged, else COO. An index that leaves no dimension gives a 0-d
  dense tensor, as torch. ``F.embedding`` with a sparse table is ``index_select`` of its rows.
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .._dispatch import register, register_aten
from ..formats import Format, LevelKind, as_format
from ..gradients.values import from_values, values_of, view_of
from ..level_kinds.base import segment_positions
from ..level_storage import Level, Storage, index_dtype_for
from ..tensor_type import SparseTensor, as_scorch, carry_grad_flag as _carried, is_sparse_operand, numpy_as_tensor, permute_view
from .dims import checked_dim
from .inner_level import cat_inner, filter_inner
from .outer_level import (cat_outer, gather_outer, int_or_range, locate_entry, select_outer,
                          stepped_range)

__all__ = ["reshape", "flatten", "unflatten", "unsqueeze", "squeeze", "squeeze_dims", "cat",
           "stack", "getitem", "index_select", "embedding"]

aten = torch.ops.aten


def _convert():
    from .._runtime import convert  # compiled extension, imported on first use
    return convert


def _coords(t: SparseTensor) -> torch.Tensor:
    return _convert().coords(t._storage)


def _coords_of(st: Storage) -> torch.Tensor:
    """(ndim, nnz) int64 coordinates of a storage's entries, in storage order."""
    return _convert().coords(st)


def _build(coords: torch.Tensor, values: torch.Tensor, shape: Sequence[int],
           fmt: Optional[Format] = None) -> torch.Tensor:
    """A sparse tensor of ``shape`` from unique coordinates (COO unless ``fmt``); a 0-d shape
    gives the dense scalar (the sum of at most one entry).

    The storage is built over entry numbers, not values: the result's values are then one
    gather of ``values`` (``values`` itself comes from gathers of the input's values, taken
    with ``values_of``), so the whole value path is plain torch indexing, differentiable as
    it stands: the backward is the matching index_add over stored entries, never dense."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return values.sum().to(values.dtype)
    fmt = as_format("coo", len(shape)) if fmt is None else result_format(fmt)
    # entry k is stored as k + 1, so the zeros a dense level fills in read entry 0: a zero
    number = torch.arange(1, values.numel() + 1, dtype=torch.int64)
    st = _convert().from_coords(coords, number, shape, fmt, sum_duplicates=False)
    padded = torch.cat([values.new_zeros(1), values])
    return from_values(st, padded.index_select(0, st.values))


def _unblocked(fmt: Format) -> Format:
    return fmt if fmt.block is None else Format(fmt.levels, fmt.mode_order)


def result_format(fmt: Format) -> Format:
    """An input's format for a result whose entries a parent holds may change (a slice,
    a triangle, a concatenation): unblocked, and each singleton level (exactly one entry
    per parent) as the compressed level a computed one is (``output_kind``). Built in the
    singleton format with 0 or 2 entries a row, such a result had been read past its
    arrays by every kernel (wrong sums, a segfault)."""
    levels = tuple(k.output_kind() if k is LevelKind.SINGLETON else k for k in fmt.levels)
    if fmt.block is None and levels == tuple(fmt.levels):
        return fmt
    return Format(levels, fmt.mode_order)


def _dim(d: int, rank: int, name: str = "dim") -> int:
    return checked_dim(d, rank, argument=name)


# --- permute / transpose / t (views) -----------------------------------------------------------

@register(torch.permute, torch.Tensor.permute)
def _permute(t, *dims):
    if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
        dims = tuple(dims[0])
    if not isinstance(t, SparseTensor):
        return NotImplemented
    n = t.dim()
    dims = tuple(d % n if n else d for d in dims)
    if sorted(dims) != list(range(n)):
        raise RuntimeError(f"permute: dims {dims} are not a permutation of 0..{n - 1}")
    return permute_view(t, dims)


@register(torch.transpose, torch.Tensor.transpose, torch.swapaxes, torch.Tensor.swapaxes,
          torch.swapdims, torch.Tensor.swapdims)
def _transpose(t, dim0, dim1):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    n = t.dim()
    dims = list(range(n))
    a, b = _dim(dim0, n, "dim0"), _dim(dim1, n, "dim1")
    dims[a], dims[b] = dims[b], dims[a]
    return permute_view(t, dims)


@register(torch.t, torch.Tensor.t)
def _t(t):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    if t.dim() > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {t.dim()}D")
    return t if t.dim() < 2 else permute_view(t, (1, 0))


@register(torch.Tensor.T.__get__)
def _T(t):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    return permute_view(t, tuple(range(t.dim() - 1, -1, -1)))


@register(torch.Tensor.mT.__get__)
def _mT(t):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    if t.dim() < 2:
        raise RuntimeError(f"tensor.mT is only supported on matrices or batches of matrices. "
                           f"Got {t.dim()}-D tensor.")
    return _transpose(t, -2, -1)


def _aten_view_result(result, t):
    """An ATen view op must return a new tensor object (torch refuses its input back): an
    identity view (``view`` to the same shape, ``squeeze`` of no size-1 dim) is a fresh
    wrapper of the same storage."""
    return SparseTensor(t._storage) if result is t else result


@register_aten(aten.t.default)
def _aten_t(t):
    return _aten_view_result(_t(t), t)


@register_aten(aten.transpose.int)
def _aten_transpose(t, dim0, dim1):
    return _aten_view_result(_transpose(t, dim0, dim1), t)


@register_aten(aten.permute.default)
def _aten_permute(t, dims):
    return _aten_view_result(_permute(t, dims), t)


# --- unsqueeze / squeeze -----------------------------------------------------------------------

def unsqueeze(t: SparseTensor, dim: int) -> SparseTensor:
    """A size-1 dimension at ``dim``: a dense level of size 1 in front of the levels (its only
    position is the root's, so the other levels' arrays are shared unchanged)."""
    r = t.dim()
    dim = _dim(dim, r + 1)
    if t._storage.format.block is not None:
        t = t.to_format(_unblocked(t._storage.format))   # differentiable: a permutation
    st = t._storage
    shift = [d + 1 if d >= dim else d for d in range(r)]
    levels = [Level(LevelKind.DENSE, dim, 1)] + [
        Level(lv.kind, shift[lv.dim], lv.size, lv.pos, lv.crd, lv.block_inner, lv.ordered)
        for lv in st.levels]
    fmt = Format((LevelKind.DENSE,) + st.format.levels,
                 (dim,) + tuple(shift[m] for m in st.format.mode_order))
    shape = st.shape[:dim] + (1,) + st.shape[dim:]
    return view_of(Storage(fmt, shape, levels, st.values, st.index_dtype), values_of(t))


def _drop_dims_format(fmt: Format, dims: Sequence[int]) -> Optional[Format]:
    keep = [k for k, m in enumerate(fmt.mode_order) if m not in dims]
    if not keep:
        return None
    remap = {}
    for d in range(fmt.rank):
        if d not in dims:
            remap[d] = d - sum(1 for x in dims if x < d)
    return Format([fmt.levels[k] for k in keep], [remap[fmt.mode_order[k]] for k in keep])


def squeeze_dims(t: SparseTensor, dims: Sequence[int]) -> torch.Tensor:
    """``t`` without the size-1 dimensions ``dims`` (a 0-d dense tensor when none is left)."""
    dims = sorted(set(dims))
    if not dims:
        return t
    for d in dims:
        if t.shape[d] != 1:
            raise RuntimeError(f"squeeze: dimension {d} has size {t.shape[d]}, not 1")
    if t._storage.format.block is not None:
        t = t.to_format(_unblocked(t._storage.format))   # differentiable: a permutation
    st = t._storage
    values = values_of(t)
    fmt = _drop_dims_format(st.format, dims)
    shape = tuple(s for d, s in enumerate(st.shape) if d not in dims)
    if fmt is None:
        return values.sum().to(st.dtype)
    kinds = st.format.levels
    drop = [k for k, lv in enumerate(st.levels) if lv.dim in dims]
    # a dense size-1 level can be dropped in place unless it separates two coordinate levels
    # (the second one heads its own run and carries pos)
    in_place = all(kinds[k] is LevelKind.DENSE and not (
        0 < k < len(kinds) - 1 and kinds[k - 1] is LevelKind.COORDINATE
        and kinds[k + 1] is LevelKind.COORDINATE) for k in drop)
    if in_place:
        remap = {d: d - sum(1 for x in dims if x < d) for d in range(st.ndim) if d not in dims}
        levels = [Level(lv.kind, remap[lv.dim], lv.size, lv.pos, lv.crd, lv.block_inner, lv.ordered)
                  for k, lv in enumerate(st.levels) if k not in drop]
        return view_of(Storage(fmt, shape, levels, st.values, st.index_dtype), values)
    c = _convert().coords(st)
    keep = [d for d in range(st.ndim) if d not in dims]
    return _build(c[keep], values, shape, fmt)


def squeeze(t: SparseTensor, dim=None) -> torch.Tensor:
    r = t.dim()
    if dim is None:
        dims = [d for d in range(r) if t.shape[d] == 1]
    else:
        dims = [dim] if isinstance(dim, numbers.Integral) else list(dim)
        dims = [_dim(d, r) for d in dims]
        dims = [d for d in dims if r and t.shape[d] == 1]
    if r == 0:
        return t
    return squeeze_dims(t, dims)


@register(torch.unsqueeze, torch.Tensor.unsqueeze)
def _unsqueeze(t, dim):
    return unsqueeze(t, dim) if isinstance(t, SparseTensor) else NotImplemented


@register(torch.squeeze, torch.Tensor.squeeze)
def _squeeze(t, dim=None):
    return squeeze(t, dim) if isinstance(t, SparseTensor) else NotImplemented


@register_aten(aten.unsqueeze.default)
def _aten_unsqueeze(t, dim):
    return unsqueeze(t, dim)


@register_aten(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _aten_squeeze(t, dim=None):
    return _aten_view_result(squeeze(t, dim), t)


# --- reshape / view / flatten / unflatten ---------------------------------------------------------

def _resolve_shape(shape, numel: int, old: Tuple[int, ...]) -> Tuple[int, ...]:
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    if any(s < -1 for s in shape):
        raise RuntimeError(f"invalid shape dimension {min(shape)}")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or numel % rest:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // rest
    if math.prod(shape) != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel} "
                           f"(the sparse tensor has shape {old})")
    return tuple(shape)


def reshape(t: SparseTensor, shape: Sequence[int]) -> torch.Tensor:
    """The same entries at their row-major linear positions in the new shape (int64
    arithmetic: fine for dimensions beyond 2^31 while the total size stays below 2^63)."""
    old = tuple(t.shape)
    numel = math.prod(old)
    new = _resolve_shape(shape, numel, old)
    if new == old:
        # a view of the same entries, a new tensor as torch's: autograd's identity-aliasing
        # (``x.view_as(x)`` of an input a Function returns, a full backward hook's) gives
        # the view a grad_fn, which the input itself, a leaf, must not get
        return _carried(t, view_of(t._storage, values_of(t)))
    if numel >= 2 ** 63:
        raise RuntimeError(f"reshape: the tensor of shape {old} has more than 2^63 positions")
    st = t._storage
    if st.format.block is None and st.format.mode_order == tuple(range(st.ndim)) and new and \
            all(lv.ordered and lv.kind.ordered for lv in st.levels):
        return _reshape_in_order(t, new)
    c = _convert().coords(st)
    lin = torch.zeros(c.shape[1], dtype=torch.int64)
    for d, s in enumerate(old):
        lin = lin * s + c[d]
    out = torch.empty((len(new), c.shape[1]), dtype=torch.int64)
    for d in range(len(new) - 1, -1, -1):
        s = new[d]
        if s:
            out[d] = torch.remainder(lin, s)
            lin = torch.div(lin, s, rounding_mode="floor")
    return _build(out, values_of(t), new)


def _reshape_in_order(t: SparseTensor, new: Tuple[int, ...]) -> torch.Tensor:
    """``reshape`` of a storage kept in row-major order (CSR, COO, CSF in dimension order):
    the entries' linear positions stay increasing, so their new coordinates are already a
    sorted COO: one pass re-splits them (``_runtime.entries.resplit``), the levels are
    those coordinates, and the values stay where they are (no sort, no gather)."""
    from .._runtime.entries import resplit
    st = t._storage
    nnz = st.nnz
    index_dtype = index_dtype_for(new, nnz)
    split = resplit(_convert().coords(st), st.shape, new, index_dtype)
    fmt = as_format("coo", len(new))
    levels = [Level(fmt.levels[0], 0, new[0], torch.tensor([0, nnz], dtype=index_dtype), split[0])]
    levels += [Level(fmt.levels[d], d, new[d], None, split[d]) for d in range(1, len(new))]
    values = values_of(t)
    return from_values(Storage(fmt, new, levels, values.detach(), index_dtype), values)


def flatten(t: SparseTensor, start_dim: int = 0, end_dim: int = -1) -> torch.Tensor:
    r = t.dim()
    if r == 0:
        return reshape(t, (1,))
    a, b = _dim(start_dim, r, "start_dim"), _dim(end_dim, r, "end_dim")
    if a > b:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    s = tuple(t.shape)
    return reshape(t, s[:a] + (math.prod(s[a:b + 1]),) + s[b + 1:])


def unflatten(t: SparseTensor, dim: int, sizes: Sequence[int]) -> torch.Tensor:
    r = t.dim()
    d = _dim(dim, r)
    sizes = [int(x) for x in sizes]
    if -1 in sizes:
        rest = math.prod(x for x in sizes if x != -1)
        if rest == 0 or t.shape[d] % rest:
            raise RuntimeError(f"unflatten: sizes {sizes} do not divide dimension {d} of size "
                               f"{t.shape[d]}")
        sizes[sizes.index(-1)] = t.shape[d] // rest
    if math.prod(sizes) != t.shape[d]:
        raise RuntimeError(f"unflatten: provided sizes {sizes} don't multiply up to the size of "
                           f"dim {d} ({t.shape[d]}) in the input tensor")
    s = tuple(t.shape)
    return reshape(t, s[:d] + tuple(sizes) + s[d + 1:])


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        return tuple(shape[0])
    return tuple(shape)


@register(torch.reshape, torch.Tensor.reshape)
def _reshape(t, *shape):
    return reshape(t, _shape_args(shape)) if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor.view)
def _view(t, *shape):
    if not isinstance(t, SparseTensor) or (len(shape) == 1 and isinstance(shape[0], torch.dtype)):
        return NotImplemented
    return reshape(t, _shape_args(shape))


@register(torch.Tensor.view_as, torch.Tensor.reshape_as)
def _view_as(t, other):
    return reshape(t, tuple(other.shape)) if isinstance(t, SparseTensor) else NotImplemented


@register(torch.flatten, torch.Tensor.flatten)
def _flatten(t, start_dim=0, end_dim=-1):
    return flatten(t, start_dim, end_dim) if isinstance(t, SparseTensor) else NotImplemented


@register(torch.unflatten, torch.Tensor.unflatten)
def _unflatten(t, dim, sizes):
    return unflatten(t, dim, sizes) if isinstance(t, SparseTensor) else NotImplemented


@register_aten(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _aten_view(t, shape):
    return _aten_view_result(reshape(t, shape), t)


@register_aten(aten.slice.Tensor)
def _aten_slice(t, dim=0, start=None, end=None, step=1):
    """``aten.slice`` (what ``torch.diff`` and other composite ops slice with): indexing."""
    d = checked_dim(dim, t.dim()) if t.dim() else 0
    return getitem(t, (slice(None),) * d + (slice(start, end, step),))


# --- cat / stack ------------------------------------------------------------------------------

def cat(tensors: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """Sparse with sparse: coordinates offset along ``dim``, in the first operand's format.
    A dense operand makes the result dense (as torch), built with torch.cat."""
    tensors = [as_scorch(x) for x in tensors]
    if not tensors:
        raise RuntimeError("cat(): expected a non-empty list of Tensors")
    dtype = tensors[0].dtype
    for x in tensors[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    if not all(isinstance(x, SparseTensor) for x in tensors):
        dense = [x.to_dense() if isinstance(x, SparseTensor) else x for x in tensors]
        return torch.cat(dense, dim)
    r = tensors[0].dim()
    d = _dim(dim, r)
    for n, x in enumerate(tensors):
        if x.dim() != r:
            raise RuntimeError(f"cat(): tensor {n} has {x.dim()} dimensions, expected {r}")
        for k in range(r):
            if k != d and x.shape[k] != tensors[0].shape[k]:
                raise RuntimeError(f"cat(): sizes of tensors must match except in dimension "
                                   f"{d}: expected size {tensors[0].shape[k]} but got size "
                                   f"{x.shape[k]} for tensor number {n} in the list")
    outer = cat_outer(tensors, d, dtype)   # one format, along its first level: arrays joined
    if outer is None:
        outer = cat_inner(tensors, d, dtype)   # CSR side by side: rows' segments placed
    if outer is not None:
        return outer
    coords, values, offset = [], [], 0
    for x in tensors:
        c = _coords(x)
        if offset:
            c[d] += offset
        coords.append(c)
        values.append(values_of(x).to(dtype))
        offset += x.shape[d]
    shape = list(tensors[0].shape)
    shape[d] = offset
    return _build(torch.cat(coords, 1), torch.cat(values), shape,
                  _unblocked(tensors[0].format))


def stack(tensors: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    tensors = [as_scorch(x) for x in tensors]
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    for n, x in enumerate(tensors):
        if tuple(x.shape) != tuple(tensors[0].shape):
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(tensors[0].shape)} at entry 0 and {list(x.shape)} at "
                               f"entry {n}")
    d = _dim(dim, tensors[0].dim() + 1)
    if not all(isinstance(x, SparseTensor) for x in tensors):
        dense = [x.to_dense() if isinstance(x, SparseTensor) else x for x in tensors]
        return torch.stack(dense, d)
    return cat([unsqueeze(x, d) for x in tensors], d)


def _tensor_list_has_sparse(tensors) -> bool:
    return isinstance(tensors, (list, tuple)) and any(is_sparse_operand(x) for x in tensors)


@register(torch.cat, torch.concat, torch.concatenate)
def _cat(tensors, dim=0, *, out=None, axis=None):
    if not _tensor_list_has_sparse(tensors):
        return NotImplemented
    if out is not None:
        raise RuntimeError("cat: out= is not supported with sparse operands")
    return cat(tensors, dim if axis is None else axis)


@register(torch.stack)
def _stack(tensors, dim=0, *, out=None):
    if not _tensor_list_has_sparse(tensors):
        return NotImplemented
    if out is not None:
        raise RuntimeError("stack: out= is not supported with sparse operands")
    return stack(tensors, dim)


# --- indexing -----------------------------------------------------------------------------------

def _index_tensor(ix, size: int, dim: int, check: bool = True) -> torch.Tensor:
    """A 1-D int64 index tensor (bool masks become the positions they select); ``check``:
    its bounds checked and negative indices wrapped now (else by :func:`_in_bounds`)."""
    if not isinstance(ix, torch.Tensor):
        # an empty list indexes nothing (torch reads it as int64, not as float)
        ix = torch.as_tensor(ix) if len(ix) else torch.zeros(0, dtype=torch.int64)
    if is_sparse_operand(ix):
        raise IndexError("indexing with a sparse index tensor is not supported")
    if ix.dtype == torch.bool:
        if ix.shape[0] != size:
            raise IndexError(f"The shape of the mask [{ix.shape[0]}] at index {dim} does not "
                             f"match the shape of the indexed tensor [{size}] at index {dim}")
        return torch.nonzero(ix).reshape(-1)
    if ix.dtype.is_floating_point or ix.dtype.is_complex:
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    if ix.dim() > 1:
        raise IndexError("only 1-D index tensors are supported on a sparse tensor")
    ix = ix.reshape(-1)
    if ix.dtype != torch.int64:
        ix = ix.to(torch.int64)
    return _in_bounds(ix, size, dim) if check else ix


def _in_bounds(ix: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """``ix`` (1-D int64) with negative indices wrapped; an index out of bounds raises."""
    if not ix.numel():
        return ix
    lo, hi = (int(v) for v in torch.aminmax(ix))
    if lo < -size or hi >= size:
        bad = lo if lo < -size else hi
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")
    return torch.where(ix < 0, ix + size, ix) if lo < 0 else ix


def _join(coord: torch.Tensor, index: torch.Tensor):
    """For each stored entry, every position ``k`` with ``index[k] == coord``: returns
    (entry of each match, k of each match); sorted by entry. O(nnz log len + matches): the
    per-entry work is one binary search (two where ``index`` repeats a value), and only the
    matched entries are expanded."""
    sorted_ix, perm = torch.sort(index, stable=True)
    if sorted_ix.numel() == 0 or coord.numel() == 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    lo = torch.searchsorted(sorted_ix, coord, right=False)
    if bool((sorted_ix[1:] > sorted_ix[:-1]).all()):      # no value twice: 0 or 1 match each
        entry = torch.nonzero(sorted_ix[lo.clamp(max=sorted_ix.numel() - 1)] == coord).reshape(-1)
        return entry, perm[lo[entry]]
    counts = torch.searchsorted(sorted_ix, coord, right=True) - lo
    hit = torch.nonzero(counts).reshape(-1)
    counts, lo = counts[hit], lo[hit]
    return torch.repeat_interleave(hit, counts), perm[segment_positions(lo, counts)]


def _expand_index(index, rank: int) -> list:
    if not isinstance(index, tuple):
        index = (index,)
    consumed = sum(0 if (i is None or i is Ellipsis) else
                   (i.dim() if isinstance(i, torch.Tensor) and i.dtype == torch.bool else 1)
                   for i in index)
    ellipses = sum(1 for i in index if i is Ellipsis)    # by identity: `in` would call
    if ellipses > 1:                                       # a tensor's == (a torch op each)
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > rank:
        raise IndexError(f"too many indices for tensor of dimension {rank}")
    out = []
    for i in index:
        if i is Ellipsis:
            out.extend([slice(None)] * (rank - consumed))
        else:
            out.append(i)
    if not ellipses:
        out.extend([slice(None)] * (rank - consumed))
    return out


def _bool_scalar(ix) -> Optional[bool]:
    if isinstance(ix, bool):
        return ix
    if isinstance(ix, torch.Tensor) and ix.dim() == 0 and ix.dtype == torch.bool \
            and not is_sparse_operand(ix):
        return bool(ix)
    return None


def _with_bool_scalars(t: SparseTensor, items: tuple) -> torch.Tensor:
    """``t[index]`` where ``index`` holds bool scalars: torch reads ``True`` as a new dim of
    size 1 (``None``) and ``False`` as one of size 0."""
    if any(isinstance(i, (torch.Tensor, list)) and _bool_scalar(i) is None for i in items):
        raise IndexError("indexing a sparse tensor with a bool scalar and index tensors "
                         "together is not supported")
    flags = [_bool_scalar(i) for i in items]
    out = getitem(t, tuple(None if f is not None else i for i, f in zip(items, flags)))
    consumed = sum(1 for i, f in zip(items, flags)
                   if f is None and i is not None and i is not Ellipsis)
    position = 0
    for i, f in zip(items, flags):
        if f is False:
            out = getitem(out, (slice(None),) * position + (slice(0, 0),))
        if i is Ellipsis:
            position += t.dim() - consumed
        elif f is not None or i is None or isinstance(i, slice):
            position += 1
    return out


def _nd_index(ix) -> bool:
    return isinstance(ix, torch.Tensor) and ix.dim() > 1 and ix.dtype != torch.bool \
        and not is_sparse_operand(ix)


def _with_nd_index(t: SparseTensor, items: tuple) -> torch.Tensor:
    """``t[...]`` with index tensors whose broadcast shape has 2 or more dims (a batch of
    lookups, ``t[rows[:, None], cols]``): the indices broadcast and flattened, the lookup's
    dim then unflattened where torch puts it (in place when the index tensors are adjacent,
    ints between them allowed; first when a slice, ``None`` or ``...`` separates them)."""
    tensors = [j for j, i in enumerate(items) if isinstance(i, torch.Tensor) and i.dim() > 0]
    if any(items[j].dtype == torch.bool or is_sparse_operand(items[j]) for j in tensors) \
            or any(isinstance(i, (list, tuple)) for i in items):
        raise IndexError("index tensors of 2 or more dims on a sparse tensor go with ints, "
                         "slices, None, ... and other integer index tensors, not with bool "
                         "masks, lists or sparse indices")
    try:
        shape = torch.broadcast_shapes(*(items[j].shape for j in tensors))
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together "
                         f"with shapes {[list(items[j].shape) for j in tensors]}") from None
    if len(items) == 2 and tensors == [0, 1] and items[0].dim() == 2 and items[0].shape[1] == 1 \
            and items[1].dim() <= 2 and (items[1].dim() == 1 or items[1].shape[0] == 1):
        # ``t[rows[:, None], cols]`` (a subgraph): rows, then columns of those, one pass each
        # over their entries, not a lookup per position of the k1 x k2 grid
        return getitem(getitem(t, items[0].reshape(-1)), (slice(None), items[1].reshape(-1)))
    flat = list(items)
    for j in tensors:
        flat[j] = items[j].expand(shape).reshape(-1)
    out = getitem(t, tuple(flat))
    first, last = tensors[0], tensors[-1]
    if any(i is None or i is Ellipsis or isinstance(i, slice) for i in items[first:last + 1]):
        position = 0
    else:
        consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
        position = sum(t.dim() - consumed if i is Ellipsis else
                       1 if (i is None or isinstance(i, slice)) else 0 for i in items[:first])
    new = tuple(out.shape[:position]) + tuple(shape) + tuple(out.shape[position + 1:])
    return reshape(out, new) if isinstance(out, SparseTensor) else out.reshape(new)


def _lone_index(items: list, d: int) -> bool:
    """Whether ``items[d]`` is a 1-d index (tensor or list) and no other item is one."""
    def is_index(i):
        return isinstance(i, list) or (isinstance(i, torch.Tensor) and i.dim() == 1 and
                                       i.dtype != torch.bool and not is_sparse_operand(i))
    return is_index(items[d]) and not any(
        isinstance(i, (list, tuple, torch.Tensor)) for k, i in enumerate(items) if k != d)


def _outer_first(t: SparseTensor, items: list) -> Optional[torch.Tensor]:
    """``t[i, j]``, ``t[a:b, idx]``, ``t[::2]``: an int or range along the first stored level
    taken first (a walk reading only its entries), the other items then applied to that
    part alone, so ``A[i, j]`` of CSR costs one row, not every stored entry. torch places
    index tensors the same with or without that item (an int selects before them)."""
    st = t._storage
    if len(items) != st.ndim or st.ndim < 2 or st.format.block is not None:
        return None
    d0 = st.levels[0].dim
    others_whole = all(isinstance(i, slice) and i == slice(None)
                       for d, i in enumerate(items) if d != d0)
    ix = items[d0]
    rows = None     # a minibatch of rows: each one's segment gathered
    if isinstance(ix, slice) and ix.step is not None and ix.step > 1:
        rows = stepped_range(ix, st.shape[d0])                       # ``A[::2]``
    elif _lone_index(items, d0) and not others_whole:                # ``A[rows, ::2]``
        rows = _index_tensor(ix, st.shape[d0], d0)
    if rows is not None:
        part = gather_outer(t, d0, rows)
        if part is None or others_whole:
            return part
        return getitem(part, tuple(slice(None) if d == d0 else i for d, i in enumerate(items)))
    first = int_or_range(ix)
    if first is None or first == slice(None) or others_whole:
        return None
    part = select_outer(t, [first if d == d0 else slice(None) for d in range(st.ndim)])
    if part is None:
        return None
    rest = [i for d, i in enumerate(items) if d != d0] if isinstance(first, int) else \
        [slice(None) if d == d0 else i for d, i in enumerate(items)]
    return getitem(part, tuple(rest))


def index_items(index) -> tuple:
    """``index`` as a tuple of items, index tensors checked as torch checks them: a uint8
    tensor is a mask (torch's deprecated byte mask: the same warning, then a bool mask), and
    only int64, int32, uint8 and bool tensors index (int8, int16: torch's error)."""
    items = index if isinstance(index, tuple) else (index,)
    items = tuple(numpy_as_tensor(i) for i in items)   # numpy index arrays, as torch's parser
    if not any(isinstance(i, torch.Tensor) and i.dtype not in (torch.int64, torch.int32, torch.bool)
               for i in items):
        return items
    out = []
    for i in items:
        if isinstance(i, torch.Tensor) and not is_sparse_operand(i):
            if i.dtype == torch.uint8:
                warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a "
                              "dtype torch.bool instead.", UserWarning, stacklevel=3)
                i = i.bool()
            elif i.dtype not in (torch.int64, torch.int32, torch.bool):
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        out.append(i)
    return tuple(out)


def getitem(t: SparseTensor, index) -> torch.Tensor:
    """``t[index]`` over the stored entries."""
    items = index = index_items(index)
    if any(_bool_scalar(i) is not None for i in items):
        return _with_bool_scalars(t, items)
    if any(_nd_index(i) for i in items):
        return _with_nd_index(t, items)
    st = t._storage
    rank = st.ndim
    items = _expand_index(index, rank)
    outer = locate_entry(t, items)   # an int for every dim: a search down the levels
    if outer is None:
        outer = select_outer(t, items)   # along the first stored level: its entries only
    if outer is None:
        outer = _outer_first(t, items)
    if outer is None and st.ndim and st.format.block is None and len(items) == st.ndim:
        d0 = st.levels[0].dim
        ix = items[d0]
        if (isinstance(ix, (list, torch.Tensor)) and not is_sparse_operand(ix)
                and (not isinstance(ix, torch.Tensor) or ix.dim() == 1)
                and all(d == d0 or (isinstance(i, slice) and i == slice(None))
                        for d, i in enumerate(items))):
            # an index (a minibatch of rows) along the first stored level: their entries only
            outer = gather_outer(t, d0, _index_tensor(ix, st.shape[d0], d0))
    if outer is None:
        outer = filter_inner(t, items)   # a column of CSR: one pass over the column indices
    if outer is not None:
        return outer
    c = _convert().coords(st)
    values = values_of(t)
    keep = None                       # mask over the entries
    out_rows: List[Tuple[str, object]] = []   # ("row", tensor) / ("zero", None) / ("adv", None)
    out_shape: List[int] = []
    adv: List[Tuple[int, torch.Tensor]] = []   # (input dim, 1-D index tensor) per tensor index
    kinds: List[str] = []             # per item: "tensor", "int" or "other" (placement rule)
    d = 0
    for ix in items:
        kinds.append("tensor" if isinstance(ix, (torch.Tensor, list, tuple)) and not (
            isinstance(ix, torch.Tensor) and ix.dim() == 0 and ix.dtype != torch.bool)
            else "int" if isinstance(ix, (numbers.Integral, torch.Tensor)) else "other")
        if ix is None:
            out_rows.append(("zero", None))
            out_shape.append(1)
            continue
        size = st.shape[d]
        if isinstance(ix, torch.Tensor) and ix.dim() == 0 and ix.dtype != torch.bool \
                and not ix.dtype.is_floating_point:
            ix = int(ix)
        if isinstance(ix, bool):
            raise IndexError("indexing a sparse tensor with a bool scalar is not supported")
        if isinstance(ix, numbers.Integral):
            i = int(ix)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
            i %= size
            m = c[d] == i
            keep = m if keep is None else keep & m
        elif isinstance(ix, slice):
            if ix.step is not None and ix.step <= 0:
                raise ValueError("step must be greater than zero")
            start, stop, step = ix.indices(size)
            n = len(range(start, stop, step))
            row = c[d]
            m = (row >= start) & (row < stop)
            if step != 1:
                m &= torch.remainder(row - start, step) == 0
            keep = m if keep is None else keep & m
            out_rows.append(("row", torch.div(row - start, step, rounding_mode="floor")
                             if step != 1 else row - start))
            out_shape.append(n)
        elif isinstance(ix, torch.Tensor) and ix.dtype == torch.bool and (
                ix.dim() > 1 or is_sparse_operand(ix)):
            # a mask over several dimensions (or a sparse one): the index tensors of its
            # True positions
            m = ix.dim()
            if tuple(ix.shape) != tuple(st.shape[d:d + m]):
                raise IndexError(f"The shape of the mask {list(ix.shape)} at index {d} does not "
                                 f"match the shape of the indexed tensor {list(st.shape)}")
            nz = torch.nonzero(ix)
            for j in range(m):
                adv.append((d + j, nz[:, j].contiguous()))
            if len(adv) == m:
                out_rows.append(("adv", None))
                out_shape.append(0)
            d += m
            continue
        elif isinstance(ix, (torch.Tensor, list, tuple)):
            adv.append((d, _index_tensor(ix, size, d, check=False)))
            if len(adv) == 1:   # all index tensors together give one output dimension
                out_rows.append(("adv", None))
                out_shape.append(0)
        else:
            raise IndexError(f"unsupported index {ix!r} for a sparse tensor")
        d += 1
    # as torch: index tensors are bounds-checked only where the selection is not empty
    # (``X[..., 0:0, [5]]`` of an extent-1 last dimension is an empty result, no error)
    empty = 0 in st.shape or any(n == 0 for (kind, _), n in zip(out_rows, out_shape) if kind == "row")
    adv = [(k, ix if empty else _in_bounds(ix, st.shape[k], k)) for k, ix in adv]
    if keep is not None:
        sel = torch.nonzero(keep).reshape(-1)
        c, values = c[:, sel], values[sel]
        out_rows = [(k, r[sel] if k == "row" else r) for k, r in out_rows]
    adv_out = None
    if adv:
        at = next(n for n, (kind, _) in enumerate(out_rows) if kind == "adv")
        lengths = {ix.numel() for _, ix in adv} - {1}
        if len(lengths) > 1:
            raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together "
                             f"with lengths {sorted(ix.numel() for _, ix in adv)}")
        length = lengths.pop() if lengths else 1
        # several index tensors select coordinate tuples: join on the tuple linearised in int64
        entry_key = torch.zeros(c.shape[1], dtype=torch.int64)
        index_key = torch.zeros(length, dtype=torch.int64)
        for dim, ix in adv:
            entry_key = entry_key * st.shape[dim] + c[dim]
            index_key = index_key * st.shape[dim] + ix.expand(length)
        entry, k = _join(entry_key, index_key)
        c, values = c[:, entry], values[entry]
        out_rows = [(kind, r[entry] if kind == "row" else r) for kind, r in out_rows]
        adv_out = k
        out_shape[at] = length
        # torch (numpy) rule: index tensors separated by a slice or None put their dimension
        # first; ints between them keep them adjacent
        where = [n for n, kind in enumerate(kinds) if kind == "tensor"]
        if any(kinds[n] == "other" for n in range(where[0], where[-1] + 1)):
            out_rows.insert(0, out_rows.pop(at))
            out_shape.insert(0, out_shape.pop(at))
    n = values.numel()
    rows = []
    for kind, r in out_rows:
        if kind == "row":
            rows.append(r)
        elif kind == "zero":
            rows.append(torch.zeros(n, dtype=torch.int64))
        else:
            rows.append(adv_out)
    coords = torch.stack(rows) if rows else torch.empty((0, n), dtype=torch.int64)
    fmt = None
    if len(out_shape) == rank and all(kind != "zero" for kind, _ in out_rows):
        fmt = _unblocked(st.format)   # same dimensions in the same order
    return _build(coords, values, out_shape, fmt)


def index_select(t: SparseTensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    d = _dim(dim, t.dim())
    if not isinstance(index, torch.Tensor) or index.dim() > 1 or index.dtype not in (
            torch.int64, torch.int32):
        raise IndexError("index_select(): index must be a 0-D or 1-D int64 or int32 tensor")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= t.shape[d]):
        bad = int(index.min()) if int(index.min()) < 0 else int(index.max())
        raise IndexError(f"index_select(): index {bad} is out of bounds for dimension {d} with "
                         f"size {t.shape[d]} (index_select takes no negative indices)")
    return getitem(t, (slice(None),) * d + (index.reshape(-1),))


def embedding(index: torch.Tensor, weight: SparseTensor) -> torch.Tensor:
    """``F.embedding`` with a sparse table: the selected rows (``index_select``), reshaped to
    ``index.shape + (dim,)``; differentiable in the table's stored values."""
    if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int64, torch.int32):
        raise IndexError("embedding(): indices must be an int64 or int32 tensor")
    if weight.dim() != 2:
        raise ValueError(f"embedding(): weight must be 2-D, got shape {tuple(weight.shape)}")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= weight.shape[0]):
        raise IndexError("index out of range in self")      # torch's (no negative indices)
    rows = index_select(weight, 0, index.reshape(-1))
    return rows if index.dim() == 1 else reshape(rows, (*index.shape, weight.shape[1]))


@register(F.embedding)
def _embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
               scale_grad_by_freq=False, sparse=False):
    # max_norm renormalizes the looked-up rows in place first (``aten_ops``, on the stored
    # values, as torch's F.embedding under no_grad); scale_grad_by_freq rescales the
    # gradient: the fallback's; padding_idx only stops that row's gradient: the same
    # forward without one
    if padding_idx is not None and isinstance(weight, torch.Tensor) and not (
            -weight.shape[0] <= padding_idx < weight.shape[0]):
        raise AssertionError("Padding_idx must be within num_embeddings")    # torch's check
    if (not isinstance(weight, SparseTensor) or scale_grad_by_freq
            or (padding_idx is not None and weight.requires_grad)):
        return NotImplemented
    if max_norm is not None:
        with torch.no_grad():
            torch.embedding_renorm_(weight, input, max_norm, norm_type)
    return embedding(input, weight)


def embedding_bag(index: torch.Tensor, weight: SparseTensor, offsets: Optional[torch.Tensor],
                  mode: str, per_sample_weights: Optional[torch.Tensor],
                  include_last_offset: bool, padding_idx: Optional[int]) -> torch.Tensor:
    """``F.embedding_bag`` (``sum`` / ``mean``; ``max``: ``_bag_max``) with a sparse table: a sparse bag x lookup
    matrix (the per-sample weights, or 1 / the bag's size) times the looked-up rows, one
    sparse product; differentiable in the table's stored values and the sample weights."""
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= weight.shape[0]):
        raise RuntimeError(f"embedding_bag: Expected idx >= 0 && idx < num_embeddings, but "
                           f"found an index out of [0, {weight.shape[0]})")
    if index.dim() == 2:
        bags, per_bag = index.shape
        bag = torch.arange(bags).repeat_interleave(per_bag)
        flat = index.reshape(-1)
    else:
        flat = index.reshape(-1)
        starts = offsets.to(torch.int64)
        if starts.numel() and int(starts[0]) != 0:
            raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the "
                               f"mini-batch has to start from position 0. However, got "
                               f"{int(starts[0])}")
        if starts.numel() and int(starts[-1]) > flat.numel():
            raise RuntimeError(f"offsets[-1] can not be greater than input's length "
                               f"({flat.numel()}), but got offsets[-1] of {int(starts[-1])}")
        if include_last_offset and starts.numel():
            # the last offset ends the last bag (CSR's meaning; with a last offset short of
            # the input, invalid input, torch's own kernels disagree by mode and dtype)
            flat = flat[:int(starts[-1])]
            if per_sample_weights is not None:
                per_sample_weights = per_sample_weights.reshape(-1)[:int(starts[-1])]
        bags = starts.numel() - 1 if include_last_offset else starts.numel()
        ends = torch.cat([starts[1:], torch.tensor([flat.numel()])])[:bags]
        bag = torch.repeat_interleave(torch.arange(bags), (ends - starts[:bags]).clamp_min(0))
    weights = per_sample_weights.reshape(-1) if per_sample_weights is not None else \
        torch.ones(flat.numel(), dtype=weight.dtype)
    if padding_idx is not None:
        weights = torch.where(flat == padding_idx % weight.shape[0], torch.zeros((), dtype=weights.dtype), weights)
    if mode == "mean":
        counted = (flat != padding_idx % weight.shape[0]) if padding_idx is not None else torch.ones_like(flat, dtype=torch.bool)
        size = torch.zeros(bags, dtype=weight.dtype).index_add_(0, bag, counted.to(weight.dtype))
        weights = weights / size.clamp_min(1)[bag]
    if mode == "max":
        return _bag_max(weight, flat, bag, bags, padding_idx)
    lookup = torch.stack([bag, torch.arange(flat.numel())])
    select = _build(lookup, weights, (bags, flat.numel()), as_format("csr", 2))
    return select @ index_select(weight, 0, flat)


def _bag_max(weight: SparseTensor, flat: torch.Tensor, bag: torch.Tensor, bags: int,
             padding_idx: Optional[int]) -> torch.Tensor:
    """``mode="max"``: per bag and column, the largest of the looked-up rows' entries, an
    unstored 0 counted where a row stores nothing there (an empty bag gives 0, the
    ``padding_idx`` rows are skipped, as torch). From the looked-up rows' stored entries: one
    sort by (bag, column, value descending, lookup order) picks each winner; the value is
    gathered from the stored values, so the gradient reaches the picked entry as torch's
    (the first row holding the maximum)."""
    if padding_idx is not None:
        keep = flat != padding_idx % weight.shape[0]
        flat, bag = flat[keep], bag[keep]
    width = weight.shape[1]
    rows = index_select(weight, 0, flat)
    coords = _convert().coords(rows._storage)
    vals = values_of(rows)
    lookup, col = coords[0], coords[1]
    group = bag[lookup] * width + col
    plain = vals.detach()
    order = torch.argsort(lookup, stable=True)
    order = order[torch.argsort(-plain[order], stable=True)]
    order = order[torch.argsort(group[order], stable=True)]
    g = group[order]
    first = torch.ones(g.numel(), dtype=torch.bool)
    first[1:] = g[1:] != g[:-1]
    won, g = order[first], g[first]
    stored = torch.bincount(group, minlength=bags * width)[g]
    size = torch.bincount(bag, minlength=bags)[torch.div(g, width, rounding_mode="floor")]
    # a group with fewer stored entries than rows in its bag also holds 0: it wins over negatives
    best = torch.where((stored < size) & (plain[won] < 0), vals.new_zeros(()), vals[won])
    out = torch.zeros(bags * width, dtype=weight.dtype).index_put((g,), best)
    return out.reshape(bags, width)


@register(F.embedding_bag)
def _embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False,
                   mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False,
                   padding_idx=None):
    # max_norm and scale_grad_by_freq: the fallback's (as are max mode's per-sample weights:
    # torch's error)
    if (not isinstance(weight, SparseTensor) or weight.dim() != 2 or mode not in ("sum", "mean", "max")
            or (mode != "sum" and per_sample_weights is not None)
            or max_norm is not None or scale_grad_by_freq or isinstance(input, SparseTensor)
            or (input.dim() == 1) == (offsets is None) or input.dim() not in (1, 2)):
        return NotImplemented
    return embedding_bag(input, weight, offsets, mode, per_sample_weights, include_last_offset,
                         padding_idx)


@register(torch.Tensor.__getitem__)
def _getitem(t, index):
    return getitem(t, index) if isinstance(t, SparseTensor) else NotImplemented


@register(torch.index_select, torch.Tensor.index_select)
def _index_select(t, dim, index, *, out=None):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    if out is not None:
        raise RuntimeError("index_select: out= is not supported with sparse operands")
    return index_select(t, dim, index)
