"""Ops that read or write a sparse tensor at given positions: ``gather``, ``take``,
``take_along_dim``, ``masked_select`` (reads: a dense result of the positions' size) and
``index_add``, ``scatter_add``, ``index_put``, ``masked_scatter`` (writes: the stored entries move to new
coordinates, or new ones are written, then an add). ``scatter`` and ``scatter_reduce`` write at every position of their index, the
implicit zeros included, so they are dense by nature (``dense_by_nature``).

Reads locate each requested position among the stored entries: both become row-major
int64 keys, the stored keys are sorted once (row-major formats already are) and
``searchsorted`` finds each request, O((nnz + positions) log nnz); a position not stored
reads 0. Writes move the stored coordinates (``c -> index[c]`` along ``dim``), build a sparse
tensor of the target's shape from them (duplicates summed) and add it to the target with
scorch's add, so the cost follows the stored entries, never the dense size. Every result is
differentiable in the stored values and in the dense operands, as torch's op."""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import torch

from .._dispatch import register
from ..formats import as_format
from ..gradients.values import from_coordinates, values_of
from ..tensor_type import SparseTensor, as_scorch
from ..broadcasting import broadcast_shapes
from .dims import checked_dim
from .shape import result_format

__all__ = ["values_at", "gather", "take", "take_along_dim", "masked_select", "index_add",
           "scatter_add", "index_keys", "index_put", "masked_scatter"]

#: largest dense size whose row-major positions are int64 keys with room to spare
_MAX_KEYS = 2**62


def _convert():
    from .._runtime import convert
    return convert


def _sparse(x) -> Optional[SparseTensor]:
    x = as_scorch(x)
    return x if isinstance(x, SparseTensor) else None


def _keyable(shape: Sequence[int]) -> bool:
    return math.prod(shape) <= _MAX_KEYS


def _strides(shape: Sequence[int]) -> list:
    """Row-major strides: the key of a coordinate is its dot product with these."""
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def _row_major_keys(coords: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    key = torch.zeros(coords.shape[1], dtype=torch.int64)
    for d, n in enumerate(shape):
        key.mul_(int(n)).add_(coords[d])
    return key


def _shadow(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero of ``shape`` that allocates nothing (stride 0): torch's op run on it checks the
    arguments (shapes, index dtype and bounds) exactly as on the real tensor, at the cost of
    the index alone."""
    return torch.zeros((), dtype=dtype).expand(tuple(shape))


def values_at(t: SparseTensor, keys: torch.Tensor) -> torch.Tensor:
    """``t``'s value at each row-major linear position of ``keys`` (any shape, each in
    ``[0, numel)``), 0 where ``t`` stores nothing: the one locate of this module. The stored
    keys are sorted unless the format keeps them row-major; each request is a binary search.
    Differentiable in the stored values (a gather; the misses read an appended 0)."""
    st = t._storage
    stored = _row_major_keys(_convert().coords(st), st.shape)
    perm = None
    if stored.numel() > 1 and not bool((stored[1:] > stored[:-1]).all()):
        stored, perm = torch.sort(stored)
    flat = keys.reshape(-1)
    nnz = stored.numel()
    if nnz:
        pos = torch.searchsorted(stored, flat).clamp_(max=nnz - 1)
        hit = stored[pos] == flat
        if perm is not None:
            pos = perm[pos]
        pos = torch.where(hit, pos, nnz)
    else:
        pos = torch.zeros_like(flat)
    vals = values_of(t)
    padded = torch.cat([vals, torch.zeros(1, dtype=vals.dtype)])
    return padded[pos].reshape(keys.shape)


def values_at_coordinates(t: SparseTensor, coords: torch.Tensor) -> torch.Tensor:
    """``t``'s value at each column of ``coords`` (one row per dimension of ``t``), 0 where
    ``t`` stores nothing (:func:`values_at` over their row-major keys)."""
    return values_at(t, _row_major_keys(coords, tuple(t.shape)))


# --- reads: a dense result of the requested positions ----------------------------------------

def _along(t: SparseTensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``gather`` with ``t``'s size-1 dims broadcast (``take_along_dim``): the result at
    position ``p`` reads ``t`` at ``p`` with ``index[p]`` along ``dim`` (modulo the size, as
    torch's ``take_along_dim``; ``gather``'s checks leave no index to wrap) and 0 along the
    dims where ``t`` has size 1. ``index`` has the result's shape."""
    shape = tuple(t.shape)
    strides = _strides(shape)
    if shape[dim]:
        index = index.remainder(shape[dim])
    key = index.to(torch.int64) * strides[dim]
    for k, n in enumerate(index.shape):
        if k != dim and shape[k] > 1:
            view = [1] * index.dim()
            view[k] = n
            key = key + torch.arange(n, dtype=torch.int64).view(view) * strides[k]
    return values_at(t, key)


def gather(t: SparseTensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``torch.gather(t, dim, index)``: dense, of ``index``'s shape."""
    torch.gather(_shadow(t.shape, t.dtype), dim, index)       # torch's argument checks
    return _along(t, checked_dim(dim, t.dim(), "gather"), index)


def take(t: SparseTensor, index: torch.Tensor) -> torch.Tensor:
    """``torch.take``: row-major positions of the flattened ``t``, negative from the end."""
    numel = math.prod(t.shape)
    torch.take(_shadow((numel,), t.dtype), index)
    return values_at(t, torch.where(index < 0, index + numel, index))


def take_along_dim(t: SparseTensor, index: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """``torch.take_along_dim``: with ``dim``, ``gather`` after broadcasting ``t`` and
    ``index`` on the other dims (the dense index is expanded to the result's shape);
    without, ``gather`` on the flattened ``t``."""
    if dim is None:
        numel = math.prod(t.shape)
        torch.take_along_dim(_shadow((numel,), t.dtype), index)
        return values_at(t, index.reshape(-1))
    shape = torch.take_along_dim(_shadow(t.shape, t.dtype), index, dim).shape
    return _along(t, checked_dim(dim, t.dim(), "take_along_dim"), index.expand(shape))


def _broadcast_coords(coords: torch.Tensor, shape: Sequence[int], out_shape: Sequence[int]) -> torch.Tensor:
    """Row-major sorted coordinates in ``shape`` -> those of the same positions broadcast to
    ``out_shape``, row-major sorted (a product with each broadcast dim's range)."""
    lead = len(out_shape) - len(shape)
    coords = torch.cat([torch.zeros((lead, coords.shape[1]), dtype=torch.int64), coords])
    shape = (1,) * lead + tuple(shape)
    for d, (n, m) in enumerate(zip(shape, out_shape)):
        if n != m:
            k = coords.shape[1]
            coords = coords.repeat_interleave(m, dim=1)
            coords[d] = torch.arange(m, dtype=torch.int64).repeat(k)
    return coords[:, torch.argsort(_row_major_keys(coords, out_shape))]


def masked_select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``torch.masked_select``: ``x`` at the True positions of ``mask``, row-major. The
    positions come from ``torch.nonzero(mask)``: a sparse mask's stored True entries, a
    dense mask's own scan; broadcast dims multiply them. ``x`` is read there (a sparse one
    located among its stored entries)."""
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    out_shape = tuple(broadcast_shapes(x.shape, mask.shape))
    coords = torch.nonzero(mask).t()
    if tuple(mask.shape) != out_shape:
        coords = _broadcast_coords(coords, tuple(mask.shape), out_shape)
    t = _sparse(x)
    if t is None:
        return x.expand(out_shape)[tuple(coords)]
    shape = tuple(t.shape)
    coords = coords[len(out_shape) - len(shape):]
    coords = torch.where(torch.tensor(shape)[:, None] == 1, 0, coords)     # x broadcast
    return values_at_coordinates(t, coords)


# --- writes: stored coordinates moved, then an add --------------------------------------------

def _entries(x: torch.Tensor, shape: Sequence[int]):
    """The coordinates (ndim, n) and values of ``x``'s entries inside ``shape``: a sparse
    ``x``'s stored ones (differentiable values), every position of a dense ``x``."""
    t = _sparse(x)
    if t is None:
        grids = torch.meshgrid(*[torch.arange(n, dtype=torch.int64) for n in shape], indexing="ij")
        coords = torch.stack(grids).reshape(len(shape), math.prod(shape))
        return coords, x[tuple(coords)]
    coords, vals = _convert().coords(t._storage), values_of(t)
    if tuple(shape) != tuple(t.shape):
        keep = (coords < torch.tensor(shape, dtype=torch.int64)[:, None]).all(0)
        coords, vals = coords[:, keep], vals[keep]
    return coords, vals


def _sparse_from(coords: torch.Tensor, values: torch.Tensor, like: torch.Tensor) -> SparseTensor:
    """The entries at ``coords`` (duplicates summed) as a sparse tensor of ``like``'s shape,
    in its format where ``like`` is sparse (so the add that follows is one union),
    differentiable in ``values``."""
    t = _sparse(like)
    fmt = result_format(t._storage.format) if t is not None else as_format("coo", like.dim())
    built = _convert().from_coords(coords, values.detach(), tuple(like.shape), fmt)
    if torch.is_grad_enabled() and values.requires_grad:
        return from_coordinates(built, coords, values)
    return SparseTensor(built)


def _check_write(name: str, self: torch.Tensor, index: torch.Tensor, dim: int, other: torch.Tensor) -> None:
    """What torch checks beyond shapes (those: torch's op on meta tensors): equal dtypes, an
    integer index inside ``self``'s size along ``dim``."""
    if name == "index_add" and self.dim() and other.dim() and (
            other.dim() != self.dim() or any(other.shape[k] != self.shape[k]
                                             for k in range(self.dim()) if k != dim % self.dim())):
        # (torch's meta index_add skips this check; its CPU kernel makes it)
        raise RuntimeError(f"index_add_(): source tensor shape must match self tensor shape, "
                           f"excluding the specified dimension. Got self.shape = "
                           f"{list(self.shape)} source.shape = {list(other.shape)}")
    if max(math.prod(a.shape) for a in (self, other)) < 1 << 56:
        meta = [torch.empty(a.shape, dtype=a.dtype, device="meta") for a in (self, index, other)]
        getattr(torch, name)(meta[0], dim, meta[1], meta[2])
    else:     # meta tensors' byte counts would overflow int64: torch's shape rules by hand
        d = dim % self.dim()
        if name == "index_add":
            ok = (index.dim() <= 1 and other.dim() == self.dim()
                  and other.shape[d] == index.numel()
                  and all(other.shape[k] == self.shape[k] for k in range(self.dim()) if k != d))
        else:
            ok = (index.dim() == self.dim() == other.dim()
                  and all(index.shape[k] <= other.shape[k] for k in range(self.dim()))
                  and all(index.shape[k] <= self.shape[k] for k in range(self.dim()) if k != d))
        if not ok:
            raise RuntimeError(f"{name}(): the shapes of self {tuple(self.shape)}, index "
                               f"{tuple(index.shape)} and source {tuple(other.shape)} do not "
                               f"match along dim {d}")
    if self.dtype != other.dtype:
        raise RuntimeError(f"{name}(): self ({self.dtype}) and {'source' if name == 'index_add' else 'src'} "
                           f"({other.dtype}) must have the same scalar type")
    if index.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"{name}(): Expected dtype int32/int64 for index")
    if index.numel():
        size = self.shape[dim]
        low, high = int(index.min()), int(index.max())
        if low < 0 or high >= size:
            raise RuntimeError(f"index {low if low < 0 else high} is out of bounds for dimension "
                               f"{dim % self.dim()} with size {size}")


def _index_moved(dim: int, index: torch.Tensor, source: torch.Tensor, alpha):
    """``index_add``'s writes: each entry of ``source`` at coordinate ``c`` goes to ``c`` with
    ``index[c[dim]]`` along ``dim``, its value times ``alpha``."""
    coords, vals = _entries(source, tuple(source.shape))
    coords = coords.clone()
    coords[dim] = index.reshape(-1).to(torch.int64)[coords[dim]]
    return coords, vals if alpha == 1 else vals * alpha


def _scatter_moved(dim: int, index: torch.Tensor, src: torch.Tensor):
    """``scatter_add``'s writes: each entry of ``src`` inside ``index``'s shape, at ``c``, goes
    to ``c`` with ``index[c]`` along ``dim``."""
    coords, vals = _entries(src, tuple(index.shape))
    target = index[tuple(coords)].to(torch.int64)
    coords = coords.clone()
    coords[dim] = target
    return coords, vals


def index_add(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor,
              alpha: numbers.Number = 1) -> torch.Tensor:
    """``torch.index_add``: ``self + alpha * moved`` with scorch's add (dense ``self``: dense;
    sparse ``self``: the union of the patterns)."""
    _check_write("index_add", self, index, dim, source)
    coords, vals = _index_moved(checked_dim(dim, self.dim(), "index_add"), index, source, alpha)
    return self + _sparse_from(coords, vals, self)


def scatter_add(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``torch.scatter_add``: ``self + moved``, only ``src``'s entries inside ``index``'s
    shape counted (as torch's, which reads ``src`` over ``index``'s shape)."""
    _check_write("scatter_add", self, index, dim, src)
    coords, vals = _scatter_moved(checked_dim(dim, self.dim(), "scatter_add"), index, src)
    return self + _sparse_from(coords, vals, self)


def index_keys(shape: Sequence[int], indices) -> Optional[torch.Tensor]:
    """The row-major keys of the positions ``x[indices]`` names in a tensor of ``shape``, for
    a tuple of ints and int tensors (broadcast together, as torch) over the leading dims: with
    fewer indices than dims, each indexed position takes every position of the trailing
    dims (``x[rows]``: whole rows), the keys' shape the index shape plus theirs; a bool mask
    stands for its positions. None for anything else (slices)."""
    if isinstance(indices, torch.Tensor):
        indices = (indices,)
    if not isinstance(indices, (tuple, list)):
        return None
    flat = []                  # a bool mask over k dims is its k position tensors, as torch's
    for ix in indices:
        if isinstance(ix, torch.Tensor) and ix.dtype == torch.bool and not isinstance(ix, SparseTensor):
            d = len(flat)
            if ix.dim() == 0 or tuple(ix.shape) != tuple(shape[d:d + ix.dim()]):
                return None    # torch's error, from the fallback
            flat.extend(ix.nonzero(as_tuple=True))
        else:
            flat.append(ix)
    indices = flat
    if not 0 < len(indices) <= len(shape):
        return None
    trailing = tuple(shape[len(indices):])
    parts = []
    for d, ix in enumerate(indices):
        if isinstance(ix, numbers.Integral) and not isinstance(ix, bool):
            ix = torch.tensor(int(ix))
        if not isinstance(ix, torch.Tensor) or ix.dtype not in (torch.int64, torch.int32) \
                or isinstance(ix, SparseTensor):
            return None
        n = shape[d]
        if bool(((ix < -n) | (ix >= n)).any()):
            raise IndexError(f"index out of range for dimension {d} with size {n}")
        parts.append(ix.to(torch.int64) % max(n, 1))
    parts = torch.broadcast_tensors(*parts)
    key = torch.zeros(parts[0].shape, dtype=torch.int64)
    for d, ix in enumerate(parts):
        key = key * shape[d] + ix
    if trailing:
        span = math.prod(trailing)
        key = key.reshape(key.shape + (1,) * len(trailing)) * span + \
            torch.arange(span, dtype=torch.int64).reshape(trailing)
    return key


def index_put(self: SparseTensor, keys: torch.Tensor, values: torch.Tensor,
              accumulate: bool) -> SparseTensor:
    """``self.index_put(indices, values)`` (out of place): the pattern grows by the written
    positions. ``accumulate``: ``self`` plus the written values (repeats summed); otherwise the
    stored entries at those positions are dropped first (a repeated position keeps one of
    its values, as torch leaves that order open)."""
    values = (values.to(self.dtype).expand(keys.shape) if isinstance(values, torch.Tensor)
              else torch.full(keys.shape, values, dtype=self.dtype)).reshape(-1)
    keys = keys.reshape(-1)
    shape = tuple(self.shape)
    if not accumulate:
        keys, first = _last_of_each(keys)
        values = values[first]
        stored_keys = _row_major_keys(_convert().coords(self._storage), shape)
        keep = ~torch.isin(stored_keys, keys)
        from .shape import _build
        kept = _build(_convert().coords(self._storage)[:, keep], values_of(self)[keep], shape,
                      self._storage.format if self._storage.format.block is None else None)
        self = kept
    coords = torch.stack(torch.unravel_index(keys, shape)) if keys.numel() else \
        torch.zeros((len(shape), 0), dtype=torch.int64)
    return self + _sparse_from(coords, values, self)


def masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``x.masked_scatter(mask, source)``: the True positions of ``mask`` (broadcast with
    ``x``), in row-major order, take ``source``'s first values. A sparse ``x`` is an
    ``index_put`` at those positions (its pattern grows by them); a dense ``x`` gets torch's
    own op with the positions and values read from a sparse mask or source."""
    # torch's checks of the dtypes (mask bool, source like x), on one element each
    torch.zeros(1, dtype=x.dtype).masked_scatter(torch.zeros(1, dtype=mask.dtype), torch.zeros(1, dtype=source.dtype))
    out_shape = tuple(broadcast_shapes(x.shape, mask.shape))
    coords = torch.nonzero(mask).t()
    if tuple(mask.shape) != out_shape:
        coords = _broadcast_coords(coords, tuple(mask.shape), out_shape)
    k = coords.shape[1]
    if source.numel() < k:
        raise RuntimeError("Number of elements of source < number of ones in mask")
    s = _sparse(source)
    values = values_at(s, torch.arange(k)) if s is not None else source.reshape(-1)[:k]
    t = _sparse(x)
    if t is None:
        return x.expand(out_shape).index_put(tuple(coords), values)
    if tuple(t.shape) != out_shape:
        t = t.expand(out_shape)
    return index_put(t, _row_major_keys(coords, out_shape), values, False)


def _last_of_each(keys: torch.Tensor):
    """The distinct keys and, for each, the position of its last occurrence."""
    order = torch.argsort(keys, stable=True)
    sorted_keys = keys[order]
    last = torch.ones_like(sorted_keys, dtype=torch.bool)
    if sorted_keys.numel() > 1:
        last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
    return sorted_keys[last], order[last]


# --- handlers --------------------------------------------------------------------------------

def _readable(t: Optional[SparseTensor], *dense) -> bool:
    """A sparse operand of rank >= 1 whose positions fit int64 keys, beside dense operands."""
    return (t is not None and t.dim() > 0 and _keyable(t.shape)
            and all(isinstance(d, torch.Tensor) and _sparse(d) is None for d in dense))


@register(torch.gather, torch.Tensor.gather)
def _gather(input, dim, index, *, sparse_grad=False, out=None):
    t = _sparse(input)
    if out is not None or not isinstance(dim, int) or not _readable(t, index):
        return NotImplemented
    return gather(t, dim, index)       # sparse_grad: a sparse input's gradient is sparse anyway


@register(torch.take, torch.Tensor.take)
def _take(input, index, *, out=None):
    t = _sparse(input)
    if out is not None or not _readable(t, index):
        return NotImplemented
    return take(t, index)


@register(torch.take_along_dim, torch.Tensor.take_along_dim)
def _take_along_dim(input, indices, dim=None, *, out=None):
    t = _sparse(input)
    if out is not None or not (dim is None or isinstance(dim, int)) or not _readable(t, indices):
        return NotImplemented
    return take_along_dim(t, indices, dim)


@register(torch.masked_select, torch.Tensor.masked_select)
def _masked_select(input, mask, *, out=None):
    x, m = _sparse(input), _sparse(mask)
    if out is not None or not isinstance(input, torch.Tensor) or not isinstance(mask, torch.Tensor):
        return NotImplemented
    if (x is None and m is None) or input.dim() == 0 or mask.dim() == 0:
        return NotImplemented
    if not _keyable(broadcast_shapes(input.shape, mask.shape)):
        return NotImplemented
    return masked_select(x if x is not None else input, m if m is not None else mask)


def _writable(self, index, other, dim, alpha=1) -> bool:
    """Some sparse operand among ``self`` and ``other`` (rank >= 1, int64-keyable), a dense
    index, an integer dim and an ``alpha`` that keeps the dtype."""
    s, o = _sparse(self), _sparse(other)
    if (s is None and o is None) or not all(isinstance(a, torch.Tensor) for a in (self, index, other)):
        return False
    if _sparse(index) is not None or not isinstance(dim, int) or self.dim() == 0 or other.dim() != self.dim():
        return False
    if self.dtype == torch.bool or not _keyable(self.shape) or not _keyable(other.shape):
        return False
    floating = self.dtype.is_floating_point or self.dtype.is_complex
    return isinstance(alpha, numbers.Number) and (floating or isinstance(alpha, numbers.Integral))


def _scorch(x):
    """``x`` with a torch sparse layout as a SparseTensor; anything else as it is."""
    t = _sparse(x)
    return x if t is None else t


@register(torch.index_add, torch.Tensor.index_add)
def _index_add(input, dim, index, source, *, alpha=1, out=None):
    if out is not None or not _writable(input, index, source, dim, alpha) or index.dim() > 1:
        return NotImplemented
    return index_add(_scorch(input), dim, index, _scorch(source), alpha)


@register(torch.scatter_add, torch.Tensor.scatter_add)
def _scatter_add(input, dim, index, src, *, out=None):
    if out is not None or not _writable(input, index, src, dim) or index.dim() != input.dim():
        return NotImplemented
    return scatter_add(_scorch(input), dim, index, _scorch(src))


def _in_place(self, coords: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """A dense ``self`` updated at ``coords`` (duplicates accumulate, in the entries' order),
    recorded by autograd on the dense tensor. Not ``index_put_(accumulate=True)``: torch's CPU
    kernel adds float repeats in parallel with atomics, so the bits changed from call to call
    at 2 threads; a 1-d ``index_add_`` at the row-major positions adds them one after another,
    in the order torch's own index_add_ / scatter_add_ do (the stored entries are row-major)."""
    if coords.shape[1]:
        keys = _row_major_keys(coords, self.shape)
        if self.is_contiguous():
            self.view(-1).index_add_(0, keys, vals)
        else:      # a strided view: its update goes through one contiguous copy (self is dense)
            self.copy_(self.contiguous().view(-1).index_add_(0, keys, vals).view(self.shape))
    return self


@register(torch.Tensor.index_add_)
def _index_add_(self, dim, index, source, *, alpha=1):
    if _sparse(self) is not None or not _writable(self, index, source, dim, alpha) or index.dim() > 1:
        return NotImplemented        # a sparse self: torch's in-place error
    source = _sparse(source)
    _check_write("index_add", self, index, dim, source)
    d = checked_dim(dim, self.dim(), "index_add_")
    return _in_place(self, *_index_moved(d, index, source, alpha))


@register(torch.Tensor.scatter_add_)
def _scatter_add_(self, dim, index, src):
    if _sparse(self) is not None or not _writable(self, index, src, dim) or index.dim() != self.dim():
        return NotImplemented
    src = _sparse(src)
    _check_write("scatter_add", self, index, dim, src)
    d = checked_dim(dim, self.dim(), "scatter_add_")
    return _in_place(self, *_scatter_moved(d, index, src))


@register(torch.masked_scatter, torch.Tensor.masked_scatter)
def _masked_scatter(input, mask, source):
    operands = (input, mask, source)
    if not all(isinstance(a, torch.Tensor) for a in operands) or all(_sparse(a) is None for a in operands):
        return NotImplemented
    if input.dim() == 0 or not _keyable(broadcast_shapes(input.shape, mask.shape)):
        return NotImplemented
    if mask.dim() == 0:                    # one flag for every position
        mask = _scorch(mask).expand(input.shape) if _sparse(mask) is None else mask.to_dense().expand(input.shape)
    return masked_scatter(_scorch(input), _scorch(mask), _scorch(source))
