"""Conversions of a pattern kept across calls: the pattern never changes, so its
re-formatted copy (a transpose a kernel reads, a gradient's partner operand) and the
permutation of positions are kept while the source's level arrays live, and a later call
with new values only gathers them (one ``index_select``, no sort). The compiler's
transposed operands (``tensor_compiler.execute``) and the gradients (``gradients.pattern``)
both come here."""
from __future__ import annotations

import weakref
from typing import Dict, Optional, Tuple

import torch

from .formats import Format
from .level_storage import Storage
from .tensor_cache import TensorKeyedCache

__all__ = ["reformatted", "through_permutation", "inverse_permuted", "converted_partner",
           "reformat_permutation", "permuted", "reformat_cache_info"]


def _convert():
    from ._runtime import convert
    return convert


def _arrays(st: Storage) -> tuple:
    return tuple(a for lv in st.levels for a in (lv.pos, lv.crd))


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
    # one entry per set of arrays on the anchor: the attention scores (the pattern's
    # arrays under dense heads) and the pattern itself share its crd array, and one entry
    # stamped by either set's ids made each step's two views evict each other (every
    # lookup then fell to the O(stored entries) content comparison)
    ids = tuple(id(a) for a in _arrays(st))
    per_format = _REFORMATTED.get(anchor, ids, stamp=ids)
    if per_format is None:
        per_format = _REFORMATTED.put(anchor, {}, ids, stamp=ids)
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
    return _gather(values, _inverse(perm))


#: a permutation -> (weak reference to the values, the gathered values), while the values'
#: version stays (stamp): a fixed operand (a GCN's adjacency) is gathered once, not every step
_GATHERED = TensorKeyedCache()


def _gathered(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``values[perm]``, reused while ``values`` is the same tensor, unchanged (its
    version counter moves with every in-place update, e.g. an optimizer step)."""
    hit = _GATHERED.get(perm, stamp=values._version)
    if hit is not None and hit[0]() is values:
        return hit[1]
    out = _gather(values, perm)   # (advanced indexing ``values[perm]``: 6x slower)
    _GATHERED.put(perm, (weakref.ref(values), out), stamp=values._version)
    return out


#: patterns converted once for a gradient's partner operand (``converted_partner``)
_PARTNERS = TensorKeyedCache()


def converted_partner(st: Storage, fmt: Format) -> Storage:
    """``st`` in ``fmt`` for an operand a kernel reads re-formatted (a gradient einsum's
    partner, ``pattern.located_format``; a transpose a compiled plan reads). Seen for the first time (a new batch each step), it is converted directly: building
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
        return _gather(values, perm)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return inverse_permuted(g, ctx.perm), None


def permuted(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``values[perm]`` for a permutation of positions, differentiable in ``values``."""
    if torch.is_grad_enabled() and values.requires_grad:
        return _Permuted.apply(values, perm)
    return _gather(values, perm)


def reformat_cache_info() -> Dict[str, int]:
    return {"patterns": len(_REFORMATTED), **_stats}


# --- gathers through a permutation ---------------------------------------------------------

#: a permutation -> (k, the permutation of its blocks) where it moves blocks of k consecutive
#: positions together, else (1, None)
_BLOCKS = TensorKeyedCache()


def _gather(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``values[perm]``, by blocks where ``perm`` moves whole blocks: a pattern transposed
    over dense levels (attention heads under the pattern, 'dcdd') keeps each entry's block
    of values together, and gathering 16-byte blocks is ~8x faster than single values
    (2.3M values: 7.4 -> 0.9 ms, 1 thread)."""
    got = _BLOCKS.get(perm)
    if got is None:
        got = _BLOCKS.put(perm, _blocks(perm))
    k, blocks = got
    if k == 1 or values.dim() != 1 or values.requires_grad:   # (a dtype view is not differentiable)
        return values.index_select(0, perm)
    wide = _WIDE.get(k * values.element_size())
    if wide is not None and values.is_contiguous():
        # one element of a wider type per block: torch's 1-D gather (a 2-D one copies each
        # 16-byte row on its own: 1.7 against 0.9 ms for 580k blocks)
        try:
            return values.view(wide).index_select(0, blocks).view(values.dtype)
        except RuntimeError:    # a storage offset off the wider type's alignment
            pass
    return values.reshape(-1, k).index_select(0, blocks).reshape(-1)


#: bytes of a block -> a type of that size to gather it as one element
_WIDE = {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


def _blocks(perm: torch.Tensor) -> Tuple[int, Optional[torch.Tensor]]:
    """The largest block size k (16, 8, 4, 2) such that ``perm`` moves aligned blocks of k
    consecutive positions as wholes, and the permutation of those blocks."""
    n = perm.numel()
    for k in (16, 8, 4, 2):
        if n % k or n < 2 * k:
            continue
        rows = perm.view(-1, k)
        first = rows[:, 0]
        if bool((first % k == 0).all()) and \
                bool((rows == first[:, None] + torch.arange(k, dtype=perm.dtype)).all()):
            return k, torch.div(first, k, rounding_mode="floor")
    return 1, None
