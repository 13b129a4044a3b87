"""A sparse operand's pattern in gradient computations.

The gradient with respect to a sparse tensor is the gradient of its stored values, so it
lives on the tensor's pattern: same level arrays, new values. These helpers build pattern
factors (the pattern with all-one values, multiplied into a gradient einsum so the compiler
evaluates it only at stored entries), place a sparse result's values at a pattern's
positions when the compiler did not produce the pattern itself. The re-formatted (e.g.
transposed) patterns kept across backward steps live in ``scorch.kept_conversions`` (the
compiler keeps its transposes there too) and are re-exported here.
"""
from __future__ import annotations

import weakref
from functools import lru_cache
from typing import Dict, Optional, Tuple

import torch

from ..formats import Format, LevelKind
from ..level_storage import Storage, materialized
from ..tensor_cache import TensorKeyedCache
from ..kept_conversions import (_arrays, _convert, _equal_arrays, _key_array, _versions,  # noqa: F401
                                _reformat_entry, converted_partner, inverse_permuted, permuted,
                                reformat_cache_info, reformat_permutation, reformatted,
                                through_permutation)

__all__ = ["pattern_ones", "pattern_factor", "same_pattern", "shares_arrays",
           "values_on_pattern", "values_from_factor", "with_pattern_values", "reformatted",
           "reformat_cache_info", "diagonal", "from_diagonal", "located_format", "reformat_permutation",
           "permuted", "converted_partner", "through_permutation", "inverse_permuted"]


#: patterns found equal in contents, not in identity: ``b``'s key array -> weak references
#: to ``a``'s arrays, while both sides' arrays keep their versions. An optimizer's state
#: made by ``grad.clone()`` (SGD's momentum), ``torch.load`` or a deepcopy (an EMA model)
#: holds its own copy of the parameter's pattern, and every op of every step compared the
#: two in full: SGD with momentum 0.99 -> 41 ms a step at 2M entries, a resumed Adam 11x
#: slower than before its checkpoint
_EQUAL_CONTENTS = TensorKeyedCache()


def same_pattern(a: Storage, b: Storage) -> bool:
    """Same format, shape and level arrays (the same objects, or equal contents)."""
    if a is b or (a.levels is b.levels and a.shape == b.shape and a.format is b.format):
        return True   # one pattern's storages (``on_pattern``): an optimizer step's every op
    if a.format != b.format or a.shape != b.shape or a.nnz != b.nnz:
        return False
    xs, ys = _arrays(a), _arrays(b)
    anchor, mine = _key_array(b), tuple(x for x in xs if x is not None)
    stamp = (tuple(id(x) for x in mine), _versions(xs), _versions(ys))
    if anchor is not None:
        kept = _EQUAL_CONTENTS.get(anchor, stamp=stamp)
        if kept is not None and all(r() is x for r, x in zip(kept, mine)):
            return True
    if not _equal_arrays(xs, ys, _versions(ys)):
        return False
    if anchor is not None:
        _EQUAL_CONTENTS.put(anchor, tuple(weakref.ref(x) for x in mine), stamp=stamp)
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


def _positions_by_sorting(pk: torch.Tensor, rk: torch.Tensor) -> Optional[torch.Tensor]:
    """Where the queries ``rk`` (many, in random order: an edge list the pattern was built
    from) hold exactly the sorted keys ``pk``, with repeats: each query's position as the
    rank of its run after one sort (a random-order binary search per query took 10x the
    build: NotreDame's 1.5M edges 1.26 s). None where the keys differ (search instead)."""
    sorted_keys, query_order = torch.sort(rk)
    starts = torch.ones(rk.shape, dtype=torch.bool)
    torch.ne(sorted_keys[1:], sorted_keys[:-1], out=starts[1:])
    if int(starts.sum()) != pk.numel() or not torch.equal(sorted_keys[starts], pk):
        return None
    pos = torch.empty_like(rk)
    pos[query_order] = torch.cumsum(starts, 0) - 1
    return pos


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
    pos = _positions_by_sorting(pk, rk) if rk.numel() > 65536 else None
    if pos is not None:
        hit = torch.ones(rk.shape, dtype=torch.bool)
    else:
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
    values at ``P``'s positions. Where the kernel produced exactly ``Q``'s entries in new
    arrays (the usual case: the incoming gradient covers the pattern), its values are
    already in ``Q``'s order: an O(nnz) comparison of the level arrays instead of
    ``positions_in_pattern``'s int64 keys, sort and search (2M entries: 0.2 s and 3x the
    gradient's memory per kernel)."""
    if shares_arrays(Q, R) or _same_entries(Q, R):
        return vals if perm is None else torch.zeros(P.nnz, dtype=vals.dtype).index_copy(0, perm, vals)
    return values_on_pattern(P, R, vals)


def _same_entries(Q: Storage, R: Storage) -> bool:
    """``R`` stores ``Q``'s entries in ``Q``'s order: same format, shape and level arrays
    by contents (not kept: ``R`` is a fresh kernel result)."""
    return (R.nnz == Q.nnz and R.format == Q.format and tuple(R.shape) == tuple(Q.shape)
            and _equal_arrays(_arrays(Q), _arrays(R), _versions(_arrays(R))))


def located_format(fmt: Format, shape: Tuple[int, ...], nnz: int, term: str,
                   pattern_vars: str, pattern_nnz: int) -> Optional[Format]:
    """The format in which a sparse factor (format ``fmt``, indexed by ``term``) of a
    gradient einsum on a pattern over ``pattern_vars`` (in the pattern's level order) is
    *located* rather than intersected: its dimensions over pattern variables as leading
    dense levels (in that order), the others compressed after them. The compiler then writes
    the gradient straight onto the pattern (every stored entry visited once, no entry
    skipped where the factor holds nothing), with no search for positions afterwards: for a
    sparse batch ``X`` through a sparse weight, ``X`` in CSC. None: nothing to change, or
    not possible without densifying (the dense levels would hold more slots than both
    operands' stored entries; one shared dimension, a CSC's column pointers or a whole
    vector (``A.sum(0)``'s gradient read at each column), while they number at most 8 per
    stored entry or 4M)."""
    located, shared = _located(fmt, term, pattern_vars)
    if located is not None:
        slots = 1
        for d in shared:
            slots *= max(int(shape[d]), 1)
        entries = nnz + pattern_nnz
        # one shared dimension: its pointers (a CSC's columns) while they stay within a few
        # per stored entry or 4M; a 2^31-row DCSR partner would have needed 17 GB of them
        if slots > (entries if len(shared) > 1 else max(8 * entries, 1 << 22)):
            return None
    return located


@lru_cache(maxsize=1024)
def _located(fmt: Format, term: str, pattern_vars: str) -> Tuple[Optional[Format], Tuple[int, ...]]:
    """``located_format``'s format and the shared dimensions, before the size check (kept
    per format and subscripts: a training step asks again for every new batch)."""
    shared = tuple(sorted((d for d, v in enumerate(term) if v in pattern_vars),
                          key=lambda d: pattern_vars.index(term[d])))
    if not shared or fmt.block is not None:
        return None, shared
    order = shared + tuple(d for d in fmt.mode_order if d not in shared)
    if order[:len(shared)] == fmt.mode_order[:len(shared)] and \
            all(k.full for k in fmt.levels[:len(shared)]):
        return None, shared   # already located (a CSC batch for a CSR weight's gradient)
    kinds = (LevelKind.DENSE,) * len(shared) + (LevelKind.COMPRESSED,) * (len(term) - len(shared))
    return Format(kinds, order), shared


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
