"""Ops along a matrix's second stored level. ``A[:, j]`` and ``A[:, a:b]`` when that level
holds the indexed dimension (a column of CSR, a row of CSC, the same for DCSR / DCSC / COO):
one comparison pass over that level's coordinates and a gather of the kept entries
(``filter_inner``). ``torch.cat`` along that dimension (CSR matrices side by side): each
row's segments placed one after the other, no coordinate sorted (``cat_inner``).

The general ``getitem`` builds every entry's coordinates, masks them and rebuilds a storage
(12 ms for a column of a 2M-entry CSR matrix; torch's COO select takes 3.6). Here the kept
entries' positions come from the coordinates alone, their parent coordinates from a
search in the first level's ``pos`` (or its own ``crd`` for COO), and a unit-step slice keeps
the format with ``pos`` rebuilt from the per-parent counts.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import as_format
from ..gradients.values import from_values, values_of
from .._runtime.entries import interleave_segments
from ..level_storage import INT32_MAX, Level, Storage
from ..tensor_type import SparseTensor
from .outer_level import int_or_range, stepped_range

__all__ = ["filter_inner", "cat_inner", "dense_compressed", "keep_entries", "entry_parents", "flip_dense_compressed"]


def _parent_positions(inner: Level, kept: torch.Tensor) -> torch.Tensor:
    """Each kept entry's first-level position (int64)."""
    if inner.pos is None:            # a coordinate run (COO): one position for both levels
        return kept
    return torch.searchsorted(inner.pos.to(torch.int64), kept, right=True) - 1


def dense_compressed(st: Storage) -> bool:
    """A 2-d storage with a dense first level and an ordered compressed second one (CSR,
    CSC): the ops here work on its ``pos`` / ``crd`` arrays directly."""
    return (st.ndim == 2 and st.format.block is None and st.levels[0].kind.full
            and st.levels[1].pos is not None and st.levels[1].crd is not None
            and not st.levels[1].kind.full and all(lv.ordered for lv in st.levels))


def keep_entries(t: SparseTensor, keep: Optional[torch.Tensor] = None, size: Optional[int] = None,
                 shift: int = 0, table: Optional[torch.Tensor] = None,
                 reorder: bool = False) -> SparseTensor:
    """Entries of a ``dense_compressed`` matrix in its format, differentiable in the values:
    those ``keep`` marks, their second-level coordinates less ``shift``; or, with
    ``table`` (int64, a slot per coordinate), those it maps to a place >= 0, that place
    their coordinate (``reorder``: the table does not keep their order, so each row's picked
    entries are sorted after). ``size``: the second level's new extent. One pass of the
    runtime writes the new ``pos`` / ``crd`` and each kept entry's source; the values are
    one gather from there."""
    from .._runtime import entries
    st = t._storage
    first, inner = st.levels
    index_dtype = st.index_dtype
    size = inner.size if size is None else size
    pos = inner.pos.to(index_dtype)
    new_pos, new_crd, take = entries.select_entries(pos, inner.crd, keep, shift, table)
    if reorder:                   # the picked coordinates came out of order within a row
        row = entry_parents(new_pos, new_crd.numel()).to(torch.int64)
        order = torch.argsort(row * max(size, 1) + new_crd.to(torch.int64))
        new_crd, take = new_crd.index_select(0, order), take.index_select(0, order)
    return _with_entries(t, new_pos, new_crd, take, size)


def _with_entries(t: SparseTensor, new_pos: torch.Tensor, new_crd: torch.Tensor,
                  take: torch.Tensor, size: int) -> SparseTensor:
    """A ``dense_compressed`` matrix in t's format with the second level ``new_pos`` /
    ``new_crd`` (extent ``size``) and values gathered from t's at ``take``."""
    st = t._storage
    first, inner = st.levels
    index_dtype = st.index_dtype
    values = values_of(t).index_select(0, take)   # (3x faster than [take] on 1-d)
    shape = list(st.shape)
    shape[inner.dim] = size
    levels = [Level(first.kind, first.dim, first.size),
              Level(inner.kind, inner.dim, size, new_pos.to(index_dtype), new_crd.to(index_dtype))]
    return from_values(Storage(st.format, shape, levels, values.detach(), index_dtype), values)


def entry_parents(pos: torch.Tensor, count: int) -> torch.Tensor:
    """Each of ``count`` entries' segment under ``pos`` (the runtime's parallel expansion,
    in ``pos``'s dtype; ``torch.repeat_interleave`` takes ~10x longer on 2M entries)."""
    from .._runtime import convert
    return convert._k_expand_pos(pos.contiguous(), pos.numel() - 1, count)


def filter_inner(t: SparseTensor, items: list) -> Optional[torch.Tensor]:
    """``t[items]`` for a 2-d ``t`` when ``items`` keeps the first stored dimension whole and
    takes an int, a unit-step slice or (CSR / CSC) a stepped slice or a 1-d index without
    repeats of the second;
    None where the general path answers."""
    st = t._storage
    fmt = st.format
    if st.ndim != 2 or fmt.block is not None or len(items) != 2:
        return None
    first, inner = st.levels
    kinds = fmt.levels
    if inner.kind.full or inner.crd is None or not all(
            lv.ordered and lv.kind.ordered for lv in st.levels):
        return None
    d0, d1 = first.dim, inner.dim
    if not (isinstance(items[d0], slice) and items[d0] == slice(None)):
        return None
    if inner.pos is None and first.crd is None:
        return None              # a singleton under a dense level: the general path answers
    item = items[d1]
    if (isinstance(item, list) or (isinstance(item, torch.Tensor) and item.dim() == 1)):
        if kinds[0].full and inner.pos is not None:
            return _pick_columns(t, item)
        if inner.pos is None:
            return _pick_coo_columns(t, item)
    if isinstance(item, slice) and item.step is not None and item.step > 1:
        if not (kinds[0].full and inner.pos is not None):
            return None
        return _pick_columns(t, stepped_range(item, st.shape[d1]))   # ``A[:, ::2]``
    ix = int_or_range(items[d1])
    size = st.shape[d1]
    crd = inner.crd
    if isinstance(ix, int):
        if not -size <= ix < size:
            raise IndexError(f"index {ix} is out of bounds for dimension {d1} with size {size}")
        keep = crd == (ix % size)
        start = None
    elif isinstance(ix, slice):
        start, stop, _ = ix.indices(size)
        stop = max(stop, start)
        keep = (crd >= start) & (crd < stop)
    else:
        return None
    if start is not None and kinds[0].full and inner.pos is not None:   # CSR / CSC
        return keep_entries(t, keep, size=stop - start, shift=start)
    kept = keep.nonzero().flatten()
    parents = _parent_positions(inner, kept)
    rows = parents if kinds[0].full else first.crd[parents].to(torch.int64)
    values = values_of(t)[kept]
    index_dtype = st.index_dtype
    if start is None:               # one column: a 1-d sparse vector over the first dimension
        coo = as_format("coo", 1)
        level = Level(coo.levels[0], 0, st.shape[d0],
                      torch.tensor([0, kept.numel()], dtype=index_dtype), rows.to(index_dtype))
        return from_values(Storage(coo, (st.shape[d0],), [level], values.detach(), index_dtype),
                           values)
    new_crd = (crd[kept] - start).to(index_dtype)
    shape = list(st.shape)
    shape[d1] = stop - start
    if inner.pos is None:           # COO: the kept entries' coordinate pairs
        levels = [Level(kinds[0], d0, first.size, torch.tensor([0, kept.numel()], dtype=index_dtype),
                        first.crd[kept]),
                  Level(kinds[1], d1, stop - start, None, new_crd)]
    else:
        return None                 # DCSR / DCSC: rows left empty would have to go
    out = Storage(fmt, shape, levels, values.detach(), index_dtype)
    return from_values(out, values)


_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _pick_columns(t: SparseTensor, item) -> Optional[torch.Tensor]:
    """``t[:, index]`` of CSR (``t[index]`` of CSC) for a 1-d index naming no coordinate
    twice (a sampled subgraph's nodes, in any order): a table over the dimension gives each
    stored coordinate its place in the index (-1: not picked), one pass keeps the picked
    entries, and where the index is not increasing each row's picked entries are sorted
    after (cost: the stored entries plus a sort of the picked ones). 3 columns of a
    2M-entry matrix: 36 -> 4 ms. An index with repeats: ``_pick_repeated``. None for any
    other index (the general path answers)."""
    st = t._storage
    found = _picked_places(st, item)
    if found is None:
        return None
    ix, table, increasing, repeated = found
    if ix.numel() == 0:
        return keep_entries(t, torch.zeros(st.nnz, dtype=torch.bool), size=0)
    if repeated:
        return _pick_repeated(t, ix, st.shape[st.levels[1].dim])   # a coordinate picked twice
    return keep_entries(t, size=ix.numel(), table=table, reorder=not increasing)


def _picked_places(st: Storage, item) -> Optional[tuple]:
    """For ``_pick_columns`` / ``_pick_coo_columns``: the index as int64, a table over the
    second stored dimension giving each coordinate its place in the index (-1: not picked),
    whether the index increases and whether it names a coordinate twice; None where the
    general path must answer (negative or out-of-range indices: its errors; another dtype; a
    dimension far beyond the entries)."""
    size = st.shape[st.levels[1].dim]
    ix = item if isinstance(item, torch.Tensor) else torch.as_tensor(item)
    if ix.dim() != 1 or ix.dtype not in _INDEX_DTYPES or size > 4 * st.nnz + (1 << 16):
        return None
    ix = ix.to(torch.int64)
    if ix.numel() and (int(ix.min()) < 0 or int(ix.max()) >= size):
        return None
    increasing = ix.numel() < 2 or bool((ix[1:] > ix[:-1]).all())
    table = torch.full((size,), -1, dtype=torch.int64)
    place = torch.arange(ix.numel())
    table[ix] = place
    repeated = not increasing and not bool((table[ix] == place).all())
    return ix, table, increasing, repeated


def _pick_coo_columns(t: SparseTensor, item) -> Optional[torch.Tensor]:
    """``t[:, index]`` of a COO matrix (either mode order) for a 1-d index naming no
    coordinate twice: one table lookup per stored entry keeps the picked ones (their rows
    stay in order; an index that does not increase sorts them by (row, place) after). The
    general path joined on a sort of every entry: NotreDame, 16 columns 64 -> ~5 ms."""
    st = t._storage
    first, inner = st.levels
    found = _picked_places(st, item)
    if found is None:
        return None
    ix, table, increasing, repeated = found
    if repeated:
        return None                          # a coordinate picked twice: the general path
    place = table[inner.crd.to(torch.int64)]
    kept = (place >= 0).nonzero().flatten()
    rows, cols = first.crd[kept], place[kept]
    if not increasing:
        order = torch.sort(rows.to(torch.int64) * max(ix.numel(), 1) + cols, stable=True)[1]
        kept, rows, cols = kept[order], rows[order], cols[order]
    values = values_of(t)[kept]
    index_dtype = st.index_dtype
    shape = list(st.shape)
    shape[inner.dim] = ix.numel()
    levels = [Level(first.kind, first.dim, first.size,
                    torch.tensor([0, kept.numel()], dtype=first.pos.dtype), rows),
              Level(inner.kind, inner.dim, ix.numel(), None, cols.to(index_dtype))]
    return from_values(Storage(st.format, shape, levels, values.detach(), index_dtype), values)


def _pick_repeated(t: SparseTensor, ix: torch.Tensor, size: int) -> SparseTensor:
    """``_pick_columns`` for an index that names some coordinates more than once: the
    stored entries whose coordinate is picked (one pass of the runtime, through a table of
    each coordinate's first place in the index sorted), each copied once per place it has
    there, then each row's copies sorted by place. Cost: the stored entries, then the
    picked copies and a sort of them; the general path's join of every coordinate pair had
    taken 20-40x scipy's time."""
    from .._runtime import entries
    st = t._storage
    inner = st.levels[1]
    order = torch.argsort(ix, stable=True)
    count = torch.bincount(ix, minlength=size)
    start = torch.cumsum(count, 0) - count               # where a coordinate's places begin
    table = torch.where(count > 0, start, -1)
    kept_pos, first_place, kept = entries.select_entries(inner.pos.to(st.index_dtype),
                                                         inner.crd, None, 0, table)
    first_place = first_place.to(torch.int64)
    copies = count.index_select(0, inner.crd.index_select(0, kept).to(torch.int64))
    ends = torch.cumsum(copies, 0)
    take = torch.repeat_interleave(kept, copies)          # per copy: its stored entry
    within = torch.arange(take.numel()) - torch.repeat_interleave(ends - copies, copies)
    place = order[torch.repeat_interleave(first_place, copies) + within]
    new_pos = torch.cat([ends.new_zeros(1), ends])[kept_pos.to(torch.int64)]
    row = entry_parents(new_pos, take.numel()).to(torch.int64)
    sort = torch.argsort(row * ix.numel() + place)
    return _with_entries(t, new_pos, place.index_select(0, sort), take.index_select(0, sort),
                         ix.numel())


def cat_inner(tensors, d: int, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """``torch.cat(tensors, d)`` of matrices of one format with a dense first level and a
    compressed second one storing ``d`` (CSR along columns, CSC along rows): row ``r`` of
    the result is row ``r`` of each operand in turn, its coordinates shifted by the
    extents before: one pass of the runtime's ``interleave_segments`` (O(nnz), no sort;
    the scatter of places it replaces took 5-17x scipy's hstack); None where the general
    path answers."""
    stores = [x._storage for x in tensors]
    first = stores[0]
    fmt, index_dtype = first.format, first.index_dtype
    if not dense_compressed(first) or first.levels[1].dim != d:
        return None
    for st in stores:
        if not (st.format is fmt or st.format == fmt) or st.index_dtype != index_dtype or \
                not dense_compressed(st):
            return None
    rows = first.levels[0].size
    total = sum(st.nnz for st in stores)
    extent = sum(st.shape[d] for st in stores)
    if index_dtype == torch.int32 and max(total, extent) > INT32_MAX:
        return None
    shifts = [0]
    for st in stores[:-1]:
        shifts.append(shifts[-1] + st.shape[d])
    starts, crd, take = interleave_segments(
        [st.levels[1].pos.to(index_dtype) for st in stores],
        [st.levels[1].crd for st in stores], shifts)
    values = torch.cat([values_of(x).to(dtype) for x in tensors]).index_select(0, take)
    shape = list(first.shape)
    shape[d] = extent
    levels = [Level(fmt.levels[0], first.levels[0].dim, rows),
              Level(fmt.levels[1], d, extent, starts, crd)]
    return from_values(Storage(fmt, shape, levels, values.detach(), index_dtype), values)


def flip_dense_compressed(t: SparseTensor, dims) -> Optional[torch.Tensor]:
    """``torch.flip`` of a ``dense_compressed`` matrix: flipping the first level reverses
    the order of its segments, flipping the second reverses each segment and mirrors its
    coordinates; both are one gather of the entries (no sort). None where the general path
    answers."""
    st = t._storage
    if not dense_compressed(st):
        return None
    from .._runtime.entries import flip_segments
    first, inner = st.levels
    new_pos, crd, take = flip_segments(inner.pos.to(st.index_dtype), inner.crd, first.dim in dims,
                                       inner.dim in dims, inner.size)
    values = values_of(t).index_select(0, take)
    index_dtype = st.index_dtype
    levels = [Level(first.kind, first.dim, first.size),
              Level(inner.kind, inner.dim, inner.size, new_pos, crd)]
    return from_values(Storage(st.format, st.shape, levels, values.detach(), index_dtype), values)
