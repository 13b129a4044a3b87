"""Ops along the dimension a format stores first, in time that follows the entries they
move: ``t[i]`` and ``t[a:b]`` (``select_outer``), ``index_select`` and ``t[index]``
(``gather_outer``: a minibatch of rows), and ``torch.cat`` of tensors of one format
(``cat_outer``).

The entries under a range of positions of a level are a contiguous range of positions at
every level below it (positions run level by level, ``scorch.level_storage``), so selecting
along the first stored level is a walk down the levels with a position range, asking each
level kind only what it can do (TACO's mode-format capabilities, as the compiler does):

* a ``full`` level (dense) maps parent positions ``[lo, hi)`` to ``[lo * n, hi * n)``;
* a level with ``pos`` maps them to ``[pos[lo], pos[hi])``;
* a level without ``pos`` (inside a coordinate run, a singleton) shares its parent's.

The result copies every level's arrays over its range (``pos`` rebased to 0; a copy, not a
view, so a few rows saved with ``torch.save`` do not carry the whole matrix's arrays), so
``A[i]`` of a CSR matrix reads one row's entries, not the whole matrix: the general ``getitem`` filters
every stored coordinate (2.4 ms for one row of a 1M-entry matrix, against microseconds).
An index tensor along that dimension walks the same way with position lists instead of
ranges: each selected parent's segment, in the order (and with the repeats) of the index.

Concatenation along that dimension is the same walk in reverse: each level's arrays one
after the other, ``pos`` shifted by the entries before (and a sparse first level's
coordinates by the extents before), with no coordinate rebuilt or sorted.

Formats this walk does not cover (blocked, unordered levels, a first level it cannot search)
decline with None, and the general path answers.
"""
from __future__ import annotations

import numbers
from typing import List, Optional, Tuple

import torch

from .._runtime import entries
from ..formats import Format
from ..gradients.values import from_values, values_of
from ..level_kinds.base import segment_positions
from ..level_storage import INT32_MAX, Level, Storage
from ..tensor_type import SparseTensor

__all__ = ["select_outer", "gather_outer", "cat_outer", "locate_entry", "stepped_range"]


def int_or_range(ix):
    """An index item as an int (a 0-d integer tensor too) or a unit-step slice; None for
    anything else."""
    if isinstance(ix, torch.Tensor) and ix.dim() == 0 and not (
            ix.dtype.is_floating_point or ix.dtype.is_complex or ix.dtype == torch.bool):
        ix = int(ix)
    if isinstance(ix, numbers.Integral) and not isinstance(ix, bool):
        return int(ix)
    if isinstance(ix, slice) and ix.step in (None, 1):
        return ix
    return None


def stepped_range(ix: slice, size: int) -> torch.Tensor:
    """The positions a slice takes along a dimension of ``size`` (int64; empty when its start
    is past its stop, where ``torch.arange`` would raise)."""
    start, stop, step = ix.indices(size)
    return torch.arange(start, max(stop, start), step)


def _outer_index(items: list, d0: int):
    """The index along ``d0`` (``int_or_range``) when every other item is a full slice."""
    for d, ix in enumerate(items):
        if d != d0 and not (isinstance(ix, slice) and ix == slice(None)):
            return None
    return int_or_range(items[d0])


def _root_range(level: Level, kind, start: int, stop: int) -> Optional[Tuple[int, int]]:
    """The positions of the first level whose coordinates lie in ``[start, stop)``."""
    if kind.full:
        return start, stop
    if level.pos is None or level.crd is None:
        return None
    lo, hi = int(level.pos[0]), int(level.pos[1])
    seg = level.crd[lo:hi]
    bounds = torch.searchsorted(seg, torch.tensor([start, stop], dtype=seg.dtype))
    return lo + int(bounds[0]), lo + int(bounds[1])


_FORMATS: dict = {}   # (kinds, mode order) -> Format (None: not a valid format)


def _format(kinds: tuple, mode_order: tuple) -> Optional[Format]:
    key = (kinds, mode_order)
    if key not in _FORMATS:
        try:
            _FORMATS[key] = Format(kinds, mode_order)
        except ValueError:
            _FORMATS[key] = None
    return _FORMATS[key]


def _walkable(st: Storage) -> bool:
    """Unblocked with every level's coordinates in order: what the walks rely on."""
    return st.format.block is None and all(lv.ordered and lv.kind.ordered for lv in st.levels)


def select_outer(t: SparseTensor, items: list) -> Optional[torch.Tensor]:
    """``t[items]`` (items as ``shape.getitem`` expands them) when it selects an int or a
    unit-step range along the first stored level's dimension and keeps every other
    dimension whole; None where the general path must answer."""
    st = t._storage
    fmt = st.format
    if len(items) != st.ndim or st.ndim == 0 or not _walkable(st):
        return None
    kinds = fmt.levels
    levels = st.levels
    d0 = levels[0].dim
    ix = _outer_index(items, d0)
    if ix is None:
        return None
    size = st.shape[d0]
    if isinstance(ix, int):
        if st.ndim < 2:
            return None                    # a 0-d result: the general path's dense scalar
        if not -size <= ix < size:
            raise IndexError(f"index {ix} is out of bounds for dimension {d0} with size {size}")
        start = ix % size
        stop = start + 1
    else:
        start, stop, _ = ix.indices(size)
        stop = max(stop, start)
    found = _root_range(levels[0], kinds[0], start, stop)
    if found is None:
        return None
    lo, hi = found
    if isinstance(ix, int) and hi - lo != 1 and kinds[1].full:
        return None     # an unstored slice under a dense level: the general path's zeros
    new_levels: List[Level] = []
    new_kinds = []
    if not isinstance(ix, int):
        new_kinds.append(kinds[0])
        if kinds[0].full:
            new_levels.append(Level(kinds[0], d0, stop - start))
        else:
            pos = torch.tensor([0, hi - lo], dtype=levels[0].pos.dtype)
            new_levels.append(Level(kinds[0], d0, stop - start, pos, levels[0].crd[lo:hi] - start))
    prev = None if isinstance(ix, int) else kinds[0]
    for k in range(1, len(levels)):
        lv, kind = levels[k], kinds[k]
        dim = lv.dim - 1 if isinstance(ix, int) and lv.dim > d0 else lv.dim
        if kind.full:
            lo, hi = lo * lv.size, hi * lv.size
            new_levels.append(Level(kind, dim, lv.size))
        else:
            if lv.pos is not None:
                ends = lv.pos.numpy()        # two reads: numpy's scalar indexing is ~10x torch's
                first, last = int(ends[lo]), int(ends[hi])
                if prev is None:   # the new root: one segment, however many parents it had
                    pos = torch.tensor([0, last - first], dtype=lv.pos.dtype)
                else:
                    pos = lv.pos[lo:hi + 1] - first
                lo, hi = first, last
            else:
                pos = None
            # a copy: a view would keep (and torch.save would write) the whole tensor's array
            crd = lv.crd[lo:hi].clone() if lv.crd is not None else None
            wants_pos = kind.has_pos(prev)
            if wants_pos and pos is None:      # a run's inner level that now heads it
                pos = torch.tensor([0, hi - lo], dtype=crd.dtype)
            elif not wants_pos and pos is not None:
                return None
            new_levels.append(Level(kind, dim, lv.size, pos, crd))
        new_kinds.append(kind)
        prev = kind
    new_fmt = _format(tuple(new_kinds), tuple(lv.dim for lv in new_levels))
    if new_fmt is None:
        return None
    shape = list(st.shape)
    if isinstance(ix, int):
        del shape[d0]
    else:
        shape[d0] = stop - start
    values = values_of(t)[lo:hi]
    # a view, as dense torch's slice (in-place writes reach t), where autograd is not
    # recording: it would not see a write through the pattern's detached alias, so there the
    # rows are a copy (which refuses in-place writes: ``tensor_type.refuse_write_to_copy``)
    if values.requires_grad and torch.is_grad_enabled():
        values = values.clone()
    pattern = Storage(new_fmt, shape, new_levels, values.detach(), st.index_dtype)
    return from_values(pattern, values)


def locate_entry(t: SparseTensor, items: list) -> Optional[torch.Tensor]:
    """``t[i, j, ...]`` with an int for every dimension: TACO's locate, a walk down the
    levels narrowing a range of positions (a full level computes the position, a level with
    ``pos`` opens its parent's segment, every stored level keeps the positions whose
    coordinate matches, found by a binary search in its sorted coordinates). O(levels x log
    segment) where the general path filters every stored entry. The 0-d value (a copy, on
    the autograd graph), or zero; None where the walk does not apply."""
    st = t._storage
    if len(items) != st.ndim or st.ndim == 0 or not _walkable(st):
        return None
    point = []
    for d, ix in enumerate(items):
        ix = int_or_range(ix)
        if not isinstance(ix, int):
            return None
        size = st.shape[d]
        if not -size <= ix < size:
            raise IndexError(f"index {ix} is out of bounds for dimension {d} with size {size}")
        point.append(ix % size)
    lo, hi = 0, 1
    for lv, kind in zip(st.levels, st.format.levels):
        c = point[lv.dim]
        if kind.full or lv.pos is not None:
            if hi - lo != 1:
                return None
            if kind.full:
                lo = lo * lv.size + c
                hi = lo + 1
                continue
            ends = lv.pos.numpy()
            lo, hi = int(ends[lo]), int(ends[lo + 1])
        if lv.crd is None:
            return None
        segment = lv.crd.numpy()[lo:hi]
        first = int(segment.searchsorted(c, "left"))
        last = int(segment.searchsorted(c, "right"))
        lo, hi = lo + first, lo + last
        if lo == hi:
            break
    values = values_of(t)
    if hi - lo > 1:
        return None
    return values[lo:hi].sum().to(values.dtype)


def cat_outer(tensors: List[SparseTensor], d: int, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """``torch.cat(tensors, d)`` when every tensor has one format (and index dtype) whose
    first level stores ``d``; None where the general path must answer."""
    stores = [x._storage for x in tensors]
    first = stores[0]
    fmt, index_dtype = first.format, first.index_dtype
    if first.levels[0].dim != d or not all(
            (st.format is fmt or st.format == fmt) and st.index_dtype == index_dtype
            and _walkable(st) for st in stores):
        return None
    kinds = fmt.levels
    sizes = [st.shape[d] for st in stores]
    extent = sum(sizes)
    new_levels: List[Level] = []
    # each tensor's position count at the level above (the root: one position each)
    counts = [1] * len(stores)
    for k, kind in enumerate(kinds):
        levels = [st.levels[k] for st in stores]
        size = extent if k == 0 else levels[0].size
        if kind.full:
            if k == 0:
                counts = sizes
            else:
                counts = [c * size for c in counts]
            new_levels.append(Level(kind, levels[0].dim, size))
            continue
        pos = None
        if levels[0].pos is not None:
            if k == 0:      # one root segment over everything
                ends = [int(lv.pos[1]) for lv in levels]
                pos = torch.tensor([0, sum(ends)], dtype=index_dtype)
            else:
                parts, shift = [levels[0].pos[:1]], 0
                for lv, c in zip(levels, counts):
                    parts.append(lv.pos[1:c + 1] + shift)
                    shift += int(lv.pos[c])
                pos = torch.cat(parts)
            counts = [int(lv.pos[c]) for lv, c in zip(levels, counts)]
        if k == 0:      # coordinates of the concatenated dimension move by the extents before
            offsets = [0]
            for n in sizes[:-1]:
                offsets.append(offsets[-1] + n)
            crd = torch.cat([lv.crd[:c] + off for lv, c, off in zip(levels, counts, offsets)])
        else:
            crd = torch.cat([lv.crd[:c] for lv, c in zip(levels, counts)])
        new_levels.append(Level(kind, levels[0].dim, size, pos, crd))
    if index_dtype == torch.int32 and max(extent, sum(counts)) > INT32_MAX:
        return None
    shape = list(first.shape)
    shape[d] = extent
    values = torch.cat([values_of(x)[:c].to(dtype) for x, c in zip(tensors, counts)])
    pattern = Storage(fmt, shape, new_levels, values.detach(), index_dtype)
    return from_values(pattern, values)


def gather_outer(t: SparseTensor, d: int, index: torch.Tensor) -> Optional[torch.Tensor]:
    """``t.index_select(d, index)`` (``index``: 1-D int64, in range, non-negative) when the
    format stores ``d`` first; None where the general path must answer."""
    st = t._storage
    fmt = st.format
    if fmt.block is not None or not st.ndim or st.levels[0].dim != d or not _walkable(st):
        return None
    kinds, levels = fmt.levels, st.levels
    first = levels[0]
    index_dtype = st.index_dtype
    m = index.numel()
    new_levels: List[Level] = []
    if kinds[0].full:
        parents = index
        new_levels.append(Level(kinds[0], d, m))
    else:
        if first.pos is None or first.crd is None:
            return None
        lo, hi = int(first.pos[0]), int(first.pos[1])
        seg = first.crd[lo:hi].to(torch.int64)
        # each index's run of positions (one or none on a compressed level; a coordinate
        # level heading a run repeats a coordinate once per entry below it)
        left = torch.searchsorted(seg, index)
        lengths = torch.searchsorted(seg, index, right=True) - left
        parents = segment_positions(left + lo, lengths)
        crd = torch.repeat_interleave(torch.arange(m, dtype=index_dtype), lengths)
        new_levels.append(Level(kinds[0], d, m, torch.tensor([0, crd.numel()], dtype=index_dtype),
                                crd))
    prev = kinds[0]
    for k in range(1, len(levels)):
        lv, kind = levels[k], kinds[k]
        if kind.full:
            parents = (parents[:, None] * lv.size + torch.arange(lv.size)).flatten()
            new_levels.append(Level(kind, lv.dim, lv.size))
        else:
            pos = None
            if lv.pos is not None:
                if not kind.has_pos(prev):
                    return None
                if k == len(levels) - 1 and lv.crd.dtype == lv.pos.dtype and not (
                        torch.is_grad_enabled() and t.requires_grad):
                    # the last level: its coordinates and values copied segment by segment
                    try:
                        pos, crd, values = entries.gather_segment_entries(lv.pos, lv.crd, st.values, parents)
                    except OverflowError:
                        return None
                    new_levels.append(Level(kind, lv.dim, lv.size, pos.to(index_dtype), crd))
                    shape = list(st.shape)
                    shape[d] = m
                    return SparseTensor(Storage(fmt, shape, new_levels, values, index_dtype))
                # the picked parents' segments, one after the other (one pass of the runtime)
                pos, parents = entries.gather_segments(lv.pos, parents)
                pos = pos.to(index_dtype)
            elif kind.has_pos(prev):
                return None
            new_levels.append(Level(kind, lv.dim, lv.size, pos, lv.crd.index_select(0, parents)))
        prev = kind
    if index_dtype == torch.int32 and max(m, parents.numel()) > INT32_MAX:
        return None
    shape = list(st.shape)
    shape[d] = m
    values = values_of(t).index_select(0, parents)   # (3x faster than [parents] on 1-d)
    pattern = Storage(fmt, shape, new_levels, values.detach(), index_dtype)
    return from_values(pattern, values)
