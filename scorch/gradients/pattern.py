"""A sparse operand's pattern in gradient computations.

The gradient with respect to a sparse tensor is the gradient of its stored values, so it
lives on the tensor's pattern: same level arrays, new values. These helpers build pattern
factors (the pattern with all-one values, multiplied into a gradient einsum so the compiler
evaluates it only at stored entries), place a sparse result's values at a pattern's
positions when the compiler did not produce the pattern itself, and keep the re-formatted
(e.g. transposed) pattern of a tensor across backward steps: the pattern never changes, so
only the permutation of positions is kept and the current values are gathered through it.
"""
from __future__ import annotations

import weakref
from functools import lru_cache
from typing import Dict, Optional, Tuple

import torch

from ..formats import Format, LevelKind
from ..level_storage import Storage, materialized
from ..tensor_cache import TensorKeyedCache

__all__ = ["pattern_ones", "pattern_factor", "same_pattern", "shares_arrays",
           "values_on_pattern", "values_from_factor", "with_pattern_values", "reformatted",
           "reformat_cache_info", "diagonal", "from_diagonal", "located_format", "reformat_permutation",
           "permuted", "converted_partner"]


def _convert():
    from .._runtime import convert
    return convert


def _arrays(st: Storage) -> tuple:
    return tuple(a for lv in st.levels for a in (lv.pos, lv.crd))


def same_pattern(a: Storage, b: Storage) -> bool:
    """Same format, shape and level arrays (the same objects, or equal contents)."""
    if a is b or (a.levels is b.levels and a.shape == b.shape and a.format is b.format):
        return True   # one pattern's storages (``on_pattern``): an optimizer step's every op
    if a.format != b.format or a.shape != b.shape or a.nnz != b.nnz:
        return False
    return _equal_arrays(_arrays(a), _arrays(b))


def _equal_arrays(xs: tuple, ys: tuple) -> bool:
    """Level arrays pairwise the same objects, views of one memory, or equal in contents."""
    for x, y in zip(xs, ys):
        if x is y:
            continue
        if x is None or y is None:
            return False
        if x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.dtype == y.dtype:
            continue
        if x.shape != y.shape or not torch.equal(x.to(torch.int64), y.to(torch.int64)):
            return False
    return True


def shares_arrays(a: Storage, b: Storage) -> bool:
    """Same level arrays by identity or address (cheap; no content comparison)."""
    return a.shares_pattern(b)


def with_pattern_values(P: Storage, values: torch.Tensor) -> Storage:
    """``P``'s level arrays (shared) holding ``values`` (made contiguous: the gradient of
    ``values().sum()`` arrives as one 1 expanded over every entry, a stride-0 view that a
    kernel reading the array by its address would misread)."""
    return Storage(P.format, P.shape, P.levels, materialized(values).contiguous(), P.index_dtype)


#: the pattern's key array (and dtype) -> its ones
_ONES = TensorKeyedCache()


def pattern_ones(P: Storage, dtype: torch.dtype) -> Storage:
    """``P``'s pattern with every stored value 1: multiplied into an einsum, it restricts
    the einsum to ``P``'s stored entries. The ones are kept while the pattern lives (a
    backward step would otherwise allocate and fill nnz values for them). The Storage is
    ``P.on_pattern``: it carries ``P``'s plan signature where the dtypes agree, so the
    warm call in C takes the gradient's SDDMM (a Storage without one goes through the
    Python runner: 31 -> 25 us for a 20k-entry weight, K = 64). Only the values are kept:
    a kept Storage would hold ``P``'s arrays, the cache's own key, alive for good."""
    anchor = _key_array(P)
    if anchor is None:
        return with_pattern_values(P, torch.ones(P.nnz, dtype=dtype))
    ones = _ONES.get(anchor, dtype, P.nnz)
    if ones is None:
        ones = _ONES.put(anchor, torch.ones(P.nnz, dtype=dtype), dtype, P.nnz)
    return P.on_pattern(ones)


def _linear_keys(coords: torch.Tensor, shape, mode_order) -> torch.Tensor:
    """Row-major keys of (ndim, n) coordinates in the format's mode order: storage order
    sorts a (non-blocked) pattern by exactly these keys."""
    key = torch.zeros(coords.shape[1], dtype=torch.int64)
    total = 1
    for d in mode_order:
        total *= max(int(shape[d]), 1)
    if total >= 2**63:
        raise RuntimeError("scorch autograd: tensor too large to index its pattern with int64 keys")
    for d in mode_order:
        key.mul_(int(shape[d])).add_(coords[d])
    return key


def positions_in_pattern(P: Storage, coords: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """For (ndim, n) coordinates: their positions in ``P`` and a mask of those ``P`` stores.
    O((nnz + n) log nnz), vectorized."""
    order = P.format.mode_order
    pk = _linear_keys(_convert().coords(P), P.shape, order)
    rk = _linear_keys(coords, P.shape, order)
    perm = None
    if pk.numel() > 1 and not bool((pk[1:] > pk[:-1]).all()):
        pk, perm = torch.sort(pk)
    if pk.numel() == 0:
        return torch.zeros_like(rk), torch.zeros(rk.shape, dtype=torch.bool)
    pos = torch.searchsorted(pk, rk).clamp_(max=pk.numel() - 1)
    hit = pk[pos] == rk
    if perm is not None:
        pos = perm[pos]
    return pos, hit


def values_on_pattern(P: Storage, R: Storage, vals: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The values ``vals`` (default ``R.values``) of sparse result ``R`` (over ``P``'s
    dimensions, its entries a subset of ``P``'s) at ``P``'s positions; zero where ``R``
    stores nothing. Used only when the compiler's output is not ``P``'s pattern itself."""
    if vals is None:
        vals = R.values
    if shares_arrays(P, R):
        return vals
    pos, hit = positions_in_pattern(P, _convert().coords(R))
    if not bool(hit.all()):
        # positions a dense output level filled in: outside P, so their values are zero
        pos, vals = pos[hit], vals[hit]
    return torch.zeros(P.nnz, dtype=vals.dtype).index_add(0, pos, vals)


# --- re-formatted patterns kept across backward steps ----------------------------------

#: the pattern's key array -> {format: (storage of positions, permutation)}, while the
#: pattern's arrays are the same (stamp: their ids); the entry goes when the array is freed
_REFORMATTED = TensorKeyedCache()
_stats = {"hits": 0, "misses": 0, "content_hits": 0}


def _key_array(st: Storage) -> Optional[torch.Tensor]:
    for lv in reversed(st.levels):
        for a in (lv.crd, lv.pos):
            if a is not None:
                return a
    return None


def _reformat_entry(st: Storage, fmt: Format, build: bool = True) -> Optional[Tuple[Storage, torch.Tensor]]:
    """The converted pattern (values: source positions) and the permutation, kept per
    format while ``st``'s arrays live; None where a dense target level adds positions, or
    (``build=False``) where none is kept yet."""
    anchor = _key_array(st)
    if anchor is None:
        return None
    ids = tuple(id(a) for a in _arrays(st))
    per_format = _REFORMATTED.get(anchor, stamp=ids)
    if per_format is None:
        per_format = _REFORMATTED.put(anchor, {}, stamp=ids)
    # the same arrays can be seen through another view (a permute: other shape and dims),
    # so the view is part of the key, not only the target format
    key = (fmt, st.format, st.shape, tuple(lv.dim for lv in st.levels))
    got = per_format.get(key)
    if got is None:
        got = _recent_equal(st, key)
        if got is not None:
            _stats["content_hits"] += 1
            per_format[key] = got
            return got
        if not build:
            return None
        _stats["misses"] += 1
        idx = Storage(st.format, st.shape, st.levels, torch.arange(st.nnz, dtype=torch.int64),
                      st.index_dtype)
        conv = _convert().convert(idx, fmt)
        if conv.nnz != st.nnz:   # a target with dense levels fills in positions: no permutation
            return None
        got = per_format[key] = (conv, conv.values)
        _RECENT[key] = (_arrays(st), st.index_dtype, got)
        while len(_RECENT) > _RECENT_MAX:
            _RECENT.pop(next(iter(_RECENT)))
    else:
        _stats["hits"] += 1
    return got


#: (target format, format, shape, level dims) -> (the level arrays, their dtype, the converted
#: pattern and permutation) of the latest conversions: a pattern rebuilt every step on new arrays with
#: the same contents (BigBird's attention scores, made by the SDDMM each step) converts once
_RECENT: Dict[tuple, tuple] = {}
_RECENT_MAX = 4


def _recent_equal(st: Storage, key: tuple) -> Optional[Tuple[Storage, torch.Tensor]]:
    """The kept conversion of an earlier pattern equal to ``st``'s in content (arrays
    compared element by element: O(stored entries), far below a conversion)."""
    hit = _RECENT.get(key)
    if hit is None:
        return None
    arrays, index_dtype, got = hit
    if got[0].nnz != st.nnz or index_dtype != st.index_dtype or not _equal_arrays(arrays, _arrays(st)):
        return None
    return got


def reformatted(st: Storage, fmt: Format) -> Storage:
    """``st`` in format ``fmt`` (e.g. the transpose a gradient kernel reads), with the
    converted pattern and the permutation of positions kept for as long as ``st``'s level
    arrays live: a later call with new values only gathers them."""
    if fmt == st.format:
        return st
    return _through_entry(st, fmt, _reformat_entry(st, fmt))


def _through_entry(st: Storage, fmt: Format, got: Optional[Tuple[Storage, torch.Tensor]]) -> Storage:
    """``st`` in ``fmt`` through its kept conversion ``got`` (None: converted directly)."""
    if got is None:
        return _convert().convert(st, fmt)
    return through_permutation(st, got)


def through_permutation(st: Storage, kept: Tuple[Storage, torch.Tensor]) -> Storage:
    """``st``'s current values in the converted pattern of ``kept`` (``reformat_permutation``):
    one gather, reused while the values are unchanged."""
    conv, perm = kept
    return Storage(conv.format, conv.shape, conv.levels, _gathered(st.values, perm),
                   conv.index_dtype)


def inverse_permuted(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``out`` with ``out[perm] = values``: values on a converted pattern (``perm`` from
    ``reformat_permutation``) back at the source's positions, by a gather through the kept
    inverse (no scatter)."""
    return values.index_select(0, _inverse(perm))


#: a permutation -> (weak reference to the values, the gathered values), while the values'
#: version stays (stamp): a fixed operand (a GCN's adjacency) is gathered once, not every step
_GATHERED = TensorKeyedCache()


def _gathered(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``values[perm]``, reused while ``values`` is the same tensor, unchanged (its
    version counter moves with every in-place update, e.g. an optimizer step)."""
    hit = _GATHERED.get(perm, stamp=values._version)
    if hit is not None and hit[0]() is values:
        return hit[1]
    out = values.index_select(0, perm)   # (advanced indexing ``values[perm]``: 6x slower)
    _GATHERED.put(perm, (weakref.ref(values), out), stamp=values._version)
    return out


def pattern_factor(P: Storage, dtype: torch.dtype) -> Tuple[Storage, Optional[torch.Tensor]]:
    """The pattern factor for a gradient on ``P``: ``P``'s ones, or, for a pattern with
    coordinate levels (COO), the same entries with compressed levels (the compiler runs
    pattern kernels on those, not on coordinate levels) and the permutation from its
    positions to ``P``'s (None: ``P`` itself)."""
    kinds = P.format.levels
    if P.format.block is None and LevelKind.COORDINATE in kinds:
        fmt = Format(tuple(LevelKind.COMPRESSED if k is LevelKind.COORDINATE else k for k in kinds),
                     P.format.mode_order)
        got = _reformat_entry(P, fmt)
        if got is not None:
            conv, perm = got
            return pattern_ones(conv, dtype), perm
    return pattern_ones(P, dtype), None


def values_from_factor(P: Storage, Q: Storage, perm: Optional[torch.Tensor], R: Storage,
                       vals: torch.Tensor) -> torch.Tensor:
    """A gradient einsum's result ``R`` (values ``vals``), run with pattern factor ``Q``, as
    values at ``P``'s positions."""
    if perm is not None and shares_arrays(Q, R):
        return torch.zeros(P.nnz, dtype=vals.dtype).index_copy(0, perm, vals)
    return values_on_pattern(P, R, vals)


#: patterns converted once for a gradient's partner operand (``converted_partner``)
_PARTNERS = TensorKeyedCache()


def converted_partner(st: Storage, fmt: Format) -> Storage:
    """``st`` in ``fmt`` for an operand of a gradient einsum (``pattern.located_format``).
    Seen for the first time (a new batch each step), it is converted directly: building
    and keeping the permutation costs ~2.4x a conversion (64 x 784 MNIST batch: 142 vs
    59 us). Seen again (a fixed input), its conversion is kept (``reformatted``)."""
    anchor = _key_array(st)
    if anchor is None or fmt == st.format:
        return reformatted(st, fmt)
    got = _reformat_entry(st, fmt, build=False)
    if got is None:
        ids = tuple(id(a) for a in _arrays(st))
        if _PARTNERS.get(anchor, fmt, ids) is None:
            _PARTNERS.put(anchor, True, fmt, ids)
            return _convert().convert(st, fmt)
        got = _reformat_entry(st, fmt)
    return _through_entry(st, fmt, got)


def reformat_permutation(st: Storage, fmt: Format) -> Optional[Tuple[Storage, torch.Tensor]]:
    """``st``'s pattern converted to ``fmt`` (its values: positions in ``st``) and the
    permutation ``perm`` with ``converted values = st.values[perm]``, kept while ``st``'s
    arrays live (a fixed weight is converted once, later calls only gather); None where the
    target's dense levels add positions (no permutation)."""
    if fmt == st.format:
        return None
    return _reformat_entry(st, fmt)


#: a permutation -> its inverse, while it lives
_INVERSE = TensorKeyedCache()


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    inv = _INVERSE.get(perm)
    if inv is None:
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel(), dtype=perm.dtype)
        inv = _INVERSE.put(perm, inv)
    return inv


class _Permuted(torch.autograd.Function):
    """``values[perm]`` for a permutation ``perm`` (every position once, as kept by
    ``reformat_permutation``); the backward gathers through the kept inverse, where
    torch's indexing backward would scatter-add."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        ctx.perm = perm
        return values.index_select(0, perm)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return inverse_permuted(g, ctx.perm), None


def permuted(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``values[perm]`` for a permutation of positions, differentiable in ``values``."""
    if torch.is_grad_enabled() and values.requires_grad:
        return _Permuted.apply(values, perm)
    return values.index_select(0, perm)


def located_format(fmt: Format, shape: Tuple[int, ...], nnz: int, term: str,
                   pattern_vars: str, pattern_nnz: int) -> Optional[Format]:
    """The format in which a sparse factor (format ``fmt``, indexed by ``term``) of a
    gradient einsum on a pattern over ``pattern_vars`` (in the pattern's level order) is
    *located* rather than intersected: its dimensions over pattern variables as leading
    dense levels (in that order), the others compressed after them. The compiler then writes
    the gradient straight onto the pattern (every stored entry visited once, no entry
    skipped where the factor holds nothing), with no search for positions afterwards: for a
    sparse batch ``X`` through a sparse weight, ``X`` in CSC. None: nothing to change, or
    not possible without densifying (every dimension shared, or the dense levels would hold
    more slots than both operands' stored entries; one shared dimension is always fine, a
    CSC's column pointers)."""
    located, shared = _located(fmt, term, pattern_vars)
    if located is not None and len(shared) > 1:
        slots = 1
        for d in shared:
            slots *= max(int(shape[d]), 1)
        if slots > nnz + pattern_nnz:
            return None
    return located


@lru_cache(maxsize=1024)
def _located(fmt: Format, term: str, pattern_vars: str) -> Tuple[Optional[Format], Tuple[int, ...]]:
    """``located_format``'s format and the shared dimensions, before the size check (kept
    per format and subscripts: a training step asks again for every new batch)."""
    shared = tuple(sorted((d for d, v in enumerate(term) if v in pattern_vars),
                          key=lambda d: pattern_vars.index(term[d])))
    if not shared or len(shared) == len(term) or fmt.block is not None:
        return None, shared
    order = shared + tuple(d for d in fmt.mode_order if d not in shared)
    if order[:len(shared)] == fmt.mode_order[:len(shared)] and \
            all(k.full for k in fmt.levels[:len(shared)]):
        return None, shared   # already located (a CSC batch for a CSR weight's gradient)
    kinds = (LevelKind.DENSE,) * len(shared) + (LevelKind.COMPRESSED,) * (len(term) - len(shared))
    return Format(kinds, order), shared


def reformat_cache_info() -> Dict[str, int]:
    return {"patterns": len(_REFORMATTED), **_stats}


# --- a pattern read along a diagonal (a repeated index) ---------------------------------

def diagonal(P: Storage, labels: Tuple[str, ...], dtype: torch.dtype) -> Tuple[Storage, torch.Tensor, torch.Tensor]:
    """``P`` indexed by ``labels`` with a label repeated (``"ii"``): its stored entries
    whose coordinates agree wherever a label repeats, as an all-ones pattern over the
    distinct labels (first-appearance order, compressed levels), with the positions in
    ``P`` of those entries and, per position of the diagonal pattern, which of them it
    holds. O(nnz) coordinate work; the other entries of ``P`` take no part."""
    c = _convert().coords(P)
    first: Dict[str, int] = {}
    for d, label in enumerate(labels):
        first.setdefault(label, d)
    on_diagonal = torch.ones(P.nnz, dtype=torch.bool)
    for d, label in enumerate(labels):
        if first[label] != d:
            on_diagonal &= c[d] == c[first[label]]
    entries = torch.nonzero(on_diagonal).reshape(-1)
    kept = list(first.values())
    fmt = Format((LevelKind.COMPRESSED,) * len(kept), tuple(range(len(kept))))
    # entry numbers as values: the diagonal pattern's positions -> ``entries``
    Q = _convert().from_coords(c[kept][:, entries], torch.arange(entries.numel(), dtype=torch.int64),
                               [P.shape[d] for d in kept], fmt, sum_duplicates=False)
    ones = with_pattern_values(Q, torch.ones(Q.nnz, dtype=dtype))
    return ones, entries, Q.values


def from_diagonal(P: Storage, entries: torch.Tensor, which: torch.Tensor,
                  vals: torch.Tensor) -> torch.Tensor:
    """Values on the diagonal pattern (``diagonal``) as values at ``P``'s positions; 0 at
    the entries off the diagonal."""
    return torch.zeros(P.nnz, dtype=vals.dtype).index_copy(0, entries[which], vals)
