"""Writes through torch's indexing: ``x[index] = value`` and ``x.index_put_(indices, value)``
on a sparse ``x``, for every index ``x[index]`` can read (ints, slices, None, Ellipsis, bool
masks over any leading dims, index tensors) and any value (a number, a dense or sparse
tensor broadcast to ``x[index]``'s shape).

One rule places every write: the entries ``x[index]`` selects are found by reading
``x[index]`` from a tensor on ``x``'s pattern whose values are the entries' own positions
(``getitem``, which follows the stored entries: a whole row of a 10^7-column matrix costs its
stored entries, not 10^7 keys). Each selected stored entry takes the value at its place in
``x[index]``; a selected position ``x`` does not store can only take 0 (it already reads 0),
anything else would grow the pattern, so it raises, naming the count (in-place ops keep the
pattern; the out-of-place ``index_put`` grows it). The values are written in place, so views
and optimizers see them; under autograd the write is recorded as torch's in-place ops are.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

import torch

from .._dispatch import register
from ..broadcasting import broadcast_shapes
from ..gradients.optimizer_step import values_level
from ..gradients.values import from_values, values_of
from ..tensor_type import SparseTensor, with_values
from .in_place import record_in_place, write_values
from .positions import _keyable, _row_major_keys, _sparse, index_keys, index_put, values_at
from .shape import index_items

__all__ = ["selected_entries", "write_items", "put_within_pattern", "index_put_tuple"]


def _convert():
    from .._runtime import convert
    return convert


def _index_tuple(index) -> tuple:
    return index if isinstance(index, tuple) else (index,)


def selected_entries(x: SparseTensor, index) -> Tuple[torch.Tensor, torch.Tensor, torch.Size]:
    """The stored entries ``x[index]`` selects: their positions in ``x``'s (flattened)
    values, their coordinates in ``x[index]`` (one column each) and ``x[index]``'s shape. An
    entry selected twice (a repeated index) appears twice."""
    from .shape import getitem
    mask = _sparse_mask(x, index)
    if mask is not None:
        return _selected_by_sparse_mask(x, mask)
    values = x._storage.values
    ids = with_values(x, torch.arange(1, values.numel() + 1).reshape(values.shape))
    picked = getitem(ids, index)
    if isinstance(picked, SparseTensor):
        st = picked._storage
        found = st.values.reshape(-1) if st.format.block is None else None
        if found is None:                                  # blocked: read through coordinates
            picked = picked.to_format("coo")
            st = picked._storage
            found = st.values.reshape(-1)
        coords = _convert().coords(st)
        stored = found != 0                                # an unstored block position
        return found[stored] - 1, coords[:, stored], picked.shape
    flat = picked.reshape(-1)
    at = torch.nonzero(flat).reshape(-1)
    coords = torch.stack(torch.unravel_index(at, picked.shape)) if picked.dim() else \
        at.new_zeros((0, at.numel()))
    return flat[at] - 1, coords, picked.shape


def _sparse_mask(x: SparseTensor, index) -> Optional[SparseTensor]:
    """``index`` when it is a sparse bool mask of ``x``'s shape (alone or in a 1-tuple)."""
    items = _index_tuple(index)
    if len(items) == 1 and isinstance(items[0], SparseTensor) and items[0].dtype == torch.bool \
            and tuple(items[0].shape) == tuple(x.shape):
        return items[0]
    return None


def _selected_by_sparse_mask(x: SparseTensor, mask: SparseTensor):
    """``x[mask]`` for a sparse bool mask: the True positions in row-major order (one
    sorted list of keys), each stored entry of ``x`` found among them by a binary search."""
    m = mask._storage
    true_keys = _row_major_keys(_convert().coords(m), mask.shape)[m.values.reshape(-1) != 0]
    true_keys = torch.sort(true_keys).values
    stored = _row_major_keys(_convert().coords(x._storage), x.shape)
    at = torch.searchsorted(true_keys, stored).clamp_max(max(true_keys.numel() - 1, 0))
    hit = true_keys[at] == stored if true_keys.numel() else \
        torch.zeros_like(stored, dtype=torch.bool)
    ids = torch.nonzero(hit).reshape(-1)
    return ids, at[hit].reshape(1, -1), torch.Size([true_keys.numel()])


def _values_at(value: torch.Tensor, coords: torch.Tensor, shape, dtype) -> Tuple[torch.Tensor, int]:
    """``value`` broadcast to ``shape``: its elements at ``coords``, and how many of its
    positions hold a non-zero in all (to see whether a write would grow the pattern)."""
    if isinstance(value, SparseTensor):
        if tuple(value.shape) != tuple(shape):
            value = value.to_dense()          # broadcast: a dense operand by nature
        else:
            vals = values_at(value, _row_major_keys(coords, shape)) if coords.shape[1] else \
                value._storage.values.new_zeros(0)
            return vals.to(dtype), int(torch.count_nonzero(value._storage.values))
    try:
        fits = broadcast_shapes(value.shape, shape) == tuple(shape)
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(value.shape)} cannot be "
                           f"broadcast to indexing result of shape {list(shape)}")
    full = value.expand(shape)
    spread = math.prod(shape) // value.numel() if value.numel() else 0
    return full[tuple(coords)].to(dtype), int(torch.count_nonzero(value)) * spread


def _grown_error(name: str, value, count: int) -> RuntimeError:
    what = f"{value}" if isinstance(value, numbers.Number) else "non-zero values"
    return RuntimeError(
        f"scorch: in-place '{name}' would write {what} at {count} position(s) the sparse "
        f"tensor does not store (in-place ops keep the pattern); use the out-of-place form "
        f"(e.g. x.index_put(...), torch.where) or write 0")


def _plan(name: str, x: SparseTensor, index, value, strict: bool = True):
    """The entries to write and what they take: ``(ids, new)``, ``new`` a tensor (one per
    id, in ``x``'s dtype) or a number. A write that would grow the pattern raises
    (``strict``) or gives None."""
    ids, coords, shape = selected_entries(x, index)
    if isinstance(value, torch.Tensor) and value.dim() == 0 \
            and not isinstance(value, SparseTensor) and not value.requires_grad:
        value = value.item()
    if isinstance(value, numbers.Number):
        missing = math.prod(shape) - ids.numel()
        if value != 0 and missing > 0 and not values_level():
            if not strict:
                return None
            raise _grown_error(name, value, missing)
        return ids, value
    new, nonzero = _values_at(value, coords, shape, x.dtype)
    missing = nonzero - int(torch.count_nonzero(new))
    if missing > 0 and not values_level():
        if not strict:
            return None
        raise _grown_error(name, value, missing)
    return ids, new


def write_items(name: str, x: SparseTensor, index, value, accumulate: bool = False) -> SparseTensor:
    """``x[index] = value`` (``accumulate``: ``+=``, repeated positions adding up) on
    ``x``'s stored values, in place; ``x`` itself is returned."""
    if isinstance(value, torch.Tensor) and value.requires_grad and torch.is_grad_enabled():
        return record_in_place(x, value, lambda s, o: _written(name, s, index, o, accumulate),
                               _store)
    ids, new = _plan(name, x, index, value)
    return _write(x, ids, new, accumulate)


def put_within_pattern(x: SparseTensor, index, value, accumulate: bool) -> Optional[SparseTensor]:
    """``x.index_put(...)`` out of place where the written positions that ``x`` does not
    store all take 0: ``x``'s pattern with the values written (cost: the selected stored
    entries; the general path lists every indexed position). None where the pattern would
    grow, or where autograd is in play (the general path records it)."""
    if torch.is_grad_enabled() and (x.requires_grad or (
            isinstance(value, torch.Tensor) and value.requires_grad)):
        return None
    plan = _plan("index_put", x, index, value, strict=False)
    if plan is None:
        return None
    return _write(with_values(x, x._storage.values.clone()), *plan, accumulate)


def _write(x: SparseTensor, ids: torch.Tensor, new, accumulate: bool) -> SparseTensor:
    if isinstance(new, numbers.Number):
        new = torch.full((ids.numel(),), new, dtype=x.dtype)

    def out_of_place(v: torch.Tensor) -> torch.Tensor:
        return v.reshape(-1).index_put((ids,), new, accumulate=accumulate).reshape(v.shape)

    def mutate(v: torch.Tensor) -> torch.Tensor:
        return v.view(-1).index_put_((ids,), new, accumulate=accumulate)
    return write_values(x, mutate, out_of_place)


def _written(name: str, s: SparseTensor, index, value, accumulate: bool) -> SparseTensor:
    """``s`` with ``s[index] = value`` applied, out of place and differentiably in both (the
    op ``record_in_place`` replays for the backward)."""
    ids, new = _plan(name, s, index, value)
    if isinstance(new, numbers.Number):
        new = torch.full((ids.numel(),), new, dtype=s.dtype)
    v = values_of(s)
    out = v.reshape(-1).index_put((ids,), new.to(v.dtype), accumulate=accumulate).reshape(v.shape)
    return from_values(s._storage, out)


def _store(s: SparseTensor, result: SparseTensor) -> SparseTensor:
    s._storage.values.copy_(result._storage.values)
    return s


def index_put_tuple(indices) -> Optional[tuple]:
    """``index_put_``'s indices as an index ``x[...]`` reads (None: a whole dim)."""
    if isinstance(indices, torch.Tensor):
        return (indices,)
    if not isinstance(indices, (tuple, list)):
        return None
    return tuple(slice(None) if ix is None else ix for ix in indices)


# --- registration ---------------------------------------------------------------------------

@register(torch.Tensor.__setitem__)
def _setitem(x, index, value):
    if not isinstance(x, SparseTensor):
        return NotImplemented          # a dense x (``d[i] = S``): torch's, with S's dense values
    return write_items("__setitem__", x, index_items(index), value)


@register(torch.Tensor.index_put_)
def _index_put_(x, indices, values, accumulate=False):
    index = index_put_tuple(indices)
    if not isinstance(x, SparseTensor) or index is None:
        return NotImplemented
    return write_items("index_put_", x, index, values, accumulate)


@register(torch.index_put, torch.Tensor.index_put)
def _index_put(input, indices, values, accumulate=False):
    """Out of place: within the pattern where nothing grows (``put_within_pattern``), else
    the pattern grows by the written positions (``positions.index_put``)."""
    t = _sparse(input)
    if t is None or t.dim() == 0 or not _keyable(t.shape) or isinstance(values, SparseTensor):
        return NotImplemented
    index = index_put_tuple(indices)
    kept = put_within_pattern(t, index, values, accumulate) if index is not None else None
    if kept is not None:
        return kept
    keys = index_keys(t.shape, indices)
    if keys is None:
        return NotImplemented                  # slices and masks: the fallback's
    if isinstance(values, torch.Tensor) and \
            broadcast_shapes(values.shape, keys.shape) != keys.shape:
        return NotImplemented
    return index_put(t, keys, values, accumulate)
