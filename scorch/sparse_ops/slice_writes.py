"""Out-of-place writes of a region: ``select_scatter``, ``slice_scatter``, ``diagonal_scatter``,
``index_copy``, ``index_fill`` with a non-zero value, ``put``, ``index_reduce``. Each names a
region of the input (a slice, a diagonal, the slices of an index) and what goes there (a
source tensor, a value).
On a sparse input the result is the input's stored entries outside the region plus the
source's entries moved into it (a sparse source: its stored ones; a dense one: all, as the
region is its size); cost follows those entries, never the input's dense size. A dense input
takes torch's own op with a sparse source made dense (the result is dense anyway). The values
are gathered, so the result is differentiable in the input's stored values and the source."""
from __future__ import annotations

import math
import numbers

import torch

from .._dispatch import register
from ..tensor_type import SparseTensor
from . import shape as _shape
from .shape import _coords
from .layout_ops import _dim
from .nonlinear import _sparse
from .positions import _entries, _last_of_each, index_put

__all__ = ["replace_region"]


def replace_region(t: SparseTensor, inside: torch.Tensor, coords: torch.Tensor,
                   values: torch.Tensor) -> SparseTensor:
    """``t`` with its stored entries where ``inside`` (a mask over them) dropped and the
    entries ``(coords, values)`` (unique positions, all inside the region) added."""
    from ..gradients.values import values_of
    keep = ~inside
    all_coords = torch.cat([_coords(t)[:, keep], coords], 1)
    all_values = torch.cat([values_of(t)[keep], values.to(t.dtype)])
    return _shape._build(all_coords, all_values, t.shape, _shape._unblocked(t._storage.format))


def _source(src: torch.Tensor, shape) -> tuple:
    """``src``'s entries (coordinates, values) in its own shape, checked against ``shape``."""
    if tuple(src.shape) != tuple(shape):
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = "
                           f"{list(src.shape)}, slice size = {list(shape)}")
    return _entries(src, tuple(shape))


def _dense_input(op, x, *args, **kwargs):
    """A dense input: torch's op with every sparse argument made dense (a dense result)."""
    args = [a.to_dense() if isinstance(a, SparseTensor) else a for a in args]
    return op(x, *args, **kwargs)


@register(torch.select_scatter)
def _select_scatter(input, src, dim, index):
    t = _sparse(input)
    if t is None:
        return _dense_input(torch.select_scatter, input, src, dim, index) if _sparse(src) is not None else NotImplemented
    d = _dim(dim, t.dim())
    i = int(index) % max(t.shape[d], 1) if -t.shape[d] <= index < t.shape[d] else None
    if i is None:
        raise IndexError(f"select_scatter: index {index} out of range for dimension {d} of size {t.shape[d]}")
    c, v = _source(src, t.shape[:d] + t.shape[d + 1:])
    moved = torch.cat([c[:d], torch.full((1, c.shape[1]), i, dtype=torch.int64), c[d:]])
    return replace_region(t, _coords(t)[d] == i, moved, v)


@register(torch.slice_scatter)
def _slice_scatter(input, src, dim=0, start=None, end=None, step=1):
    t = _sparse(input)
    if t is None:
        return _dense_input(torch.slice_scatter, input, src, dim, start, end, step) if _sparse(src) is not None else NotImplemented
    d = _dim(dim, t.dim())
    n = t.shape[d]
    lo, hi, st = slice(start, end, step).indices(n)
    if st <= 0:
        raise RuntimeError("slice step must be positive")
    count = len(range(lo, hi, st))
    c, v = _source(src, t.shape[:d] + (count,) + t.shape[d + 1:])
    moved = c.clone()
    moved[d] = lo + c[d] * st
    cd = _coords(t)[d]
    inside = (cd >= lo) & (cd < hi) & ((cd - lo) % st == 0)
    return replace_region(t, inside, moved, v)


@register(torch.diagonal_scatter)
def _diagonal_scatter(input, src, offset=0, dim1=0, dim2=1):
    t = _sparse(input)
    if t is None:
        return _dense_input(torch.diagonal_scatter, input, src, offset, dim1, dim2) if _sparse(src) is not None else NotImplemented
    d1, d2 = _dim(dim1, t.dim()), _dim(dim2, t.dim())
    if d1 == d2:
        raise RuntimeError("diagonal dimensions cannot be identical")
    n1, n2 = t.shape[d1], t.shape[d2]
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    rest = [k for k in range(t.dim()) if k not in (d1, d2)]
    c, v = _source(src, tuple(t.shape[k] for k in rest) + (length,))
    k = c[-1]
    moved = torch.zeros((t.dim(), c.shape[1]), dtype=torch.int64)
    for j, r in enumerate(rest):
        moved[r] = c[j]
    moved[d1], moved[d2] = (k, k + offset) if offset >= 0 else (k - offset, k)
    ct = _coords(t)
    return replace_region(t, ct[d2] - ct[d1] == offset, moved, v)


def _index_positions(index: torch.Tensor, n: int, name: str, dim: int,
                     negative: bool = True) -> torch.Tensor:
    """``index`` as positions in ``[0, n)``; a negative index counts from the end where
    torch's op allows that (``index_fill``; ``index_copy`` refuses it)."""
    idx = index.reshape(-1).to(torch.int64)
    if idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        least = -n if negative else 0
        if lo < least or hi >= n:
            raise IndexError(f"{name}_(): index {lo if lo < least else hi} is out of bounds for "
                             f"dimension {dim} with size {n}")
    return idx % max(n, 1)


@register(torch.index_copy, torch.Tensor.index_copy)
def _index_copy(input, dim, index, source):
    t = _sparse(input)
    if t is None:
        return _dense_input(torch.index_copy, input, dim, index, source) if _sparse(source) is not None else NotImplemented
    d = _dim(dim, t.dim()) if t.dim() else 0
    idx = _index_positions(index, t.shape[d] if t.dim() else 1, "index_copy", d, negative=False)
    shape = list(t.shape)
    if t.dim():
        shape[d] = idx.numel()
    c, v = _source(source, tuple(shape) if t.dim() else ())
    if t.dim() == 0:
        return NotImplemented
    # a repeated index: the last copy wins (as torch's CPU loop); O(index), not O(dim)
    _, last = _last_of_each(idx)
    wins = torch.zeros(idx.numel(), dtype=torch.bool)
    wins[last] = True
    keep = wins[c[d]]
    moved = c[:, keep].clone()
    moved[d] = idx[moved[d]]
    inside = torch.isin(_coords(t)[d], idx)
    return replace_region(t, inside, moved, v[keep])


@register(torch.index_reduce, torch.Tensor.index_reduce)
def _index_reduce(input, dim, index, source, reduce, *, include_self=True):
    """The slices ``index`` names, reduced with ``source``'s: those slices of the input made
    dense (as many as ``source`` has, at most), torch's own ``index_reduce`` on them, put
    back; the input's other slices keep their stored entries."""
    t = _sparse(input)
    if t is None:
        if _sparse(source) is None:
            return NotImplemented
        return _dense_input(torch.index_reduce, input, dim, index, source, reduce, include_self=include_self)
    if t.dim() == 0:
        return NotImplemented
    d = _dim(dim, t.dim())
    n = t.shape[d]
    idx = index.reshape(-1).to(torch.int64)
    if idx.numel() and bool(((idx < 0) | (idx >= n)).any()):     # (torch takes no negative index here)
        raise IndexError("index_reduce: index out of range in self")
    rows = torch.unique(idx)
    block = torch.index_select(t, d, rows).to_dense()
    src = source.to_dense() if isinstance(source, SparseTensor) else source
    out = block.index_reduce(d, torch.searchsorted(rows, idx), src, reduce, include_self=include_self)
    c, v = _entries(out, out.shape)
    moved = c.clone()
    moved[d] = rows[c[d]]
    return replace_region(t, torch.isin(_coords(t)[d], rows), moved, v)


@register(torch.Tensor.index_fill, torch.index_fill)
def _index_fill(x, dim, index, value):
    """The slices ``index`` along ``dim`` filled with ``value``: 0 keeps the pattern (the
    stored entries there become 0); another value stores every position of those slices
    (the result's entries, not the input's dense size)."""
    t = _sparse(x)
    v = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    if t is None or not isinstance(v, numbers.Number) or t.dim() == 0:
        return NotImplemented
    from ..gradients.values import from_values, values_of
    d = _dim(dim, t.dim())
    idx = torch.unique(_index_positions(index, t.shape[d], "index_fill", d))
    inside = torch.isin(_coords(t)[d], idx)
    if v == 0:
        vals = values_of(t)
        return from_values(t._storage, torch.where(inside, torch.zeros((), dtype=vals.dtype), vals))
    shape = list(t.shape)
    shape[d] = idx.numel()
    grid = torch.stack(torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij")).reshape(t.dim(), -1)
    grid[d] = idx[grid[d]]
    fill = value.to(t.dtype).expand(grid.shape[1]) if isinstance(value, torch.Tensor) \
        else torch.full((grid.shape[1],), v, dtype=t.dtype)
    return replace_region(t, inside, grid, fill)


@register(torch.Tensor.put, torch.put)
def _put(input, index, source, accumulate=False):
    """Flat positions ``index`` (row-major, negative from the end) take ``source``'s values
    (``accumulate``: added): ``index_put`` at those keys."""
    t = _sparse(input)
    if t is None or _sparse(source) is not None or _sparse(index) is not None or t.dim() == 0:
        return NotImplemented
    numel = math.prod(t.shape)
    keys = index.reshape(-1).to(torch.int64)
    if keys.numel():
        lo, hi = int(keys.min()), int(keys.max())
        if lo < -numel or hi >= numel:
            raise IndexError(f"put(): out of range: tried to access index "
                             f"{lo if lo < -numel else hi} on a tensor of {numel} elements")
    if source.numel() != keys.numel():
        raise RuntimeError(f"put: expected source and index to have the same number of elements, "
                           f"got {source.numel()} and {keys.numel()}")
    return index_put(t, keys % max(numel, 1), source.reshape(-1), bool(accumulate))
