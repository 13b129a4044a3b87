"""Conversions of a pattern kept across calls: the pattern never changes, so its
re-formatted copy (a transpose a kernel reads, a gradient's partner operand) and the
permutation of positions are kept while the source's level arrays live, and a later call
with new values only gathers them (one ``index_select``, no sort). The compiler's
transposed operands (``tensor_compiler.execute``) and the gradients (``gradients.pattern``)
both come here."""
from __future__ import annotations

import weakref
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np
import torch

from .formats import Format, compressed, dense
from .level_storage import Level, Storage
from .tensor_cache import TensorKeyedCache, version
from .tensor_compiler.allocate import empty_output

__all__ = ["reformatted", "through_permutation", "inverse_permuted", "converted_partner",
           "reformat_permutation", "permuted", "reformat_cache_info", "seen_again",
           "switched_top_level"]


def _convert():
    from ._runtime import convert
    return convert


def _arrays(st: Storage) -> tuple:
    return tuple(a for lv in st.levels for a in (lv.pos, lv.crd))


def _versions(arrays: tuple) -> tuple:
    return tuple(-1 if a is None else version(a) for a in arrays)


def _equal_arrays(xs: tuple, ys: tuple, versions: tuple) -> bool:
    """Level arrays ``ys`` equal to ``xs`` as they were when their ``versions`` were read:
    pairwise the same objects or views of one memory not written since, or other memory
    equal in contents."""
    for x, y, v in zip(xs, ys, versions):
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if x is y or (x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.dtype == y.dtype):
            # (v < 0: read from memory without a version, ``untracked``: only now, by the
            # caller comparing two patterns; a conversion kept of it keeps a copy, compared
            # below, ``_keep_recent``)
            if v < 0 or version(y) == v:
                continue
            return False        # written in place since: what was converted is gone
        if x.shape != y.shape or not _same_contents(x, y):
            return False
    return True


def _same_contents(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal index arrays of one shape (a kept transpose of ``untracked`` arrays compares
    every call): their bytes (``memcmp``), else numpy's comparison (3x torch.equal's speed,
    40k int32: 12 against 37 us)."""
    if x.dtype != y.dtype:
        return torch.equal(x.to(torch.int64), y.to(torch.int64))
    same = _same_bytes(x, y)
    if same is not None:
        return same
    try:
        return bool(np.array_equal(x.numpy(), y.numpy()))
    except (RuntimeError, TypeError):   # (no numpy form: a fake tensor, a dtype numpy lacks)
        return torch.equal(x, y)


def _memcmp():
    """The C library's ``memcmp`` (ctypes releases the GIL around it), or None."""
    global _MEMCMP
    if _MEMCMP is None:
        try:
            import ctypes
            f = ctypes.CDLL(None).memcmp
            f.restype, f.argtypes = ctypes.c_int, (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
            _MEMCMP = f
        except (OSError, AttributeError, TypeError):   # no C library by that name (Windows)
            _MEMCMP = False
    return _MEMCMP or None


_MEMCMP = None


def _same_bytes(x: torch.Tensor, y: torch.Tensor) -> Optional[bool]:
    """Whether two contiguous CPU arrays of one shape and dtype hold the same bytes (704k
    float32 values: 61 us, numpy's comparison 83, torch.equal 344); None where that cannot
    be asked (strided, a fake or meta tensor, no ``memcmp``)."""
    f = _memcmp()
    if (f is None or x.shape != y.shape or x.dtype != y.dtype or x.device.type != "cpu"
            or y.device.type != "cpu" or not x.is_contiguous() or not y.is_contiguous()):
        return None
    try:
        n = x.numel() * x.element_size()
        return n == 0 or x.data_ptr() == y.data_ptr() or f(x.data_ptr(), y.data_ptr(), n) == 0
    except (RuntimeError, NotImplementedError):   # no storage to point at (a fake tensor)
        return None


# --- a top level switched between compressed and dense --------------------------------

def switched_top_level(st: Storage, fmt: Format) -> Optional[Storage]:
    """``st`` in ``fmt`` where the two differ only in the first level's kind, compressed
    against dense (DCSR <-> CSR, DCSC <-> CSC, a CSF's top level) over a compressed second
    level: only the second level's ``pos`` is rebuilt (O(the top level's extent), no pass
    over the entries), the rest of the arrays and the values are shared. A kernel that
    must locate a row of a DCSR operand reads it so (``work_estimate.dense_top_reads``),
    and a DCSR result is produced as CSR and compressed here (``schedule``): the runtime's
    general conversion walks every entry (4elt's square, 289k entries: 1.0 ms, here 0.09;
    its DCSR -> CSR 0.4 ms, here 0.1, then kept while the arrays live). None for any
    other pair of formats."""
    src = st.format
    if (fmt.block is not None or src.block is not None or fmt.mode_order != src.mode_order
            or len(fmt.levels) < 2 or fmt.levels[1:] != src.levels[1:]
            or fmt.levels[1] is not compressed or {src.levels[0], fmt.levels[0]} != {compressed, dense}):
        return None
    top, below = st.levels[0], st.levels[1]
    idt = st.index_dtype
    if fmt.levels[0] is dense:
        # an operand read so is usually read again (a solver's matrix, a graph): the rebuilt
        # level is kept while the source's arrays live unchanged
        # (memory without a version, ``tensor_cache.untracked``, is rebuilt every call)
        arrays = _arrays(st)
        versions = _versions(arrays)
        stamp = (tuple(id(a) for a in arrays), versions)
        kept = _DENSE_TOPS.get(top.crd, fmt, stamp)
        if kept is None:
            kept = _dense_top_levels(st)
            if min(versions) >= 0:
                _DENSE_TOPS.put(top.crd, kept, fmt, stamp)
        return Storage(fmt, st.shape, kept, st.values, idt)
    # the rows whose segment is not empty, and their segments' starts (numpy: torch's
    # nonzero took 6x as long at 1M rows)
    whole = below.pos.numpy()
    rows = np.flatnonzero(whole[1:] != whole[:-1])
    starts = np.empty(rows.size + 1, dtype=whole.dtype)
    np.take(whole, rows, out=starts[:-1])
    starts[-1] = whole[-1]
    new_top = Level(compressed, top.dim, top.size, torch.tensor([0, rows.size], dtype=idt),
                    torch.from_numpy(rows.astype(whole.dtype)))
    levels = [new_top, Level(below.kind, below.dim, below.size, torch.from_numpy(starts), below.crd,
                             below.block_inner, below.ordered)] + list(st.levels[2:])
    return Storage(fmt, st.shape, levels, st.values, idt)


#: a compressed top level's source array -> the levels read with it dense, per format
_DENSE_TOPS = TensorKeyedCache()


def _dense_top_levels(st: Storage) -> list:
    """``switched_top_level``'s levels of ``st`` with its compressed top level dense."""
    top, below = st.levels[0], st.levels[1]
    # the stored rows' segment lengths scattered to their coordinates, prefix-summed (of
    # the top level's one segment: a view may keep more in its arrays)
    n, lo, hi = top.size, int(top.pos[0]), int(top.pos[1])
    seg = below.pos[lo:hi + 1]
    pos = torch.zeros(n + 1, dtype=st.index_dtype)
    if hi > lo:
        pos[1:].scatter_(0, top.crd[lo:hi].to(torch.int64), seg.diff())
    pos[0] = seg[0]
    pos = torch.cumsum(pos, 0, dtype=st.index_dtype)
    return [Level(dense, top.dim, n), Level(below.kind, below.dim, below.size, pos, below.crd,
                                            below.block_inner, below.ordered)] + list(st.levels[2:])


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
    arrays = _arrays(st)
    ids = tuple(id(a) for a in arrays)
    # ... and stamped by the arrays' versions: torch's ``copy_`` into a CSR tensor rewrites
    # its index arrays in place (a sampling buffer refilled each step), same objects, new
    # pattern; the version counter is how that shows
    stamp = (ids, _versions(arrays))
    per_format = _REFORMATTED.get(anchor, ids, stamp=stamp)
    if per_format is None:
        per_format = _REFORMATTED.put(anchor, {}, ids, stamp=stamp)
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
        conv = _sharing_nothing_with(conv, st)
        got = per_format[key] = (conv, conv.values)
        _keep_recent(key, st, got, stamp[1])
    else:
        _stats["hits"] += 1
    return got


#: (target format, format, shape, level dims) -> (the level arrays, their dtype, the converted
#: pattern and permutation) of the latest conversions: a pattern rebuilt every step on new arrays with
#: the same contents (BigBird's attention scores, made by the SDDMM each step) converts once
_RECENT: Dict[tuple, tuple] = {}
_RECENT_MAX = 4
#: what the kept conversions may hold after their sources are freed (the source's arrays, the
#: converted pattern and its permutation): a big matrix used in transposed products stayed
#: in memory after ``del A`` (621 MB for four 6M-entry matrices). A pattern over this
#: converts again each time it is rebuilt.
_RECENT_BYTES = 64 << 20


def _bytes(arrays) -> int:
    return sum(a.numel() * a.element_size() for a in arrays if a is not None)


def _keep_recent(key: tuple, st: Storage, got: Tuple[Storage, torch.Tensor], versions: tuple) -> None:
    """Keep ``got``, converted from ``st``'s arrays as they were at ``versions`` (read before
    the conversion: a write during it must not count as seen). An ``untracked`` array (its
    versions never repeat: scipy's, a torch layout's) is kept as a copy, so a later call
    compares contents with what was converted."""
    arrays = tuple(a.clone() if a is not None and v < 0 else a for a, v in zip(_arrays(st), versions))
    size = _bytes(arrays) + got[0].nbytes()      # (the permutation is got[0]'s values)
    _RECENT.pop(key, None)
    if size > _RECENT_BYTES:
        return
    _RECENT[key] = (arrays, st.index_dtype, got, size, versions)
    total = sum(e[3] for e in _RECENT.values())
    while len(_RECENT) > _RECENT_MAX or total > _RECENT_BYTES:
        total -= _RECENT.pop(next(iter(_RECENT)))[3]


def _sharing_nothing_with(conv: Storage, st: Storage) -> Storage:
    """``conv`` with copies of the level arrays it shares with ``st``: a conversion may keep
    a source array as it is (COO -> CSR keeps the column array, the cache's anchor), and the
    kept entry would then hold its own key alive for good (every COO operand of a product
    stayed in memory, ~1 MB a 30k-entry matrix)."""
    mine = {a.untyped_storage().data_ptr() for a in _arrays(st) if a is not None and a.numel()}

    def own(a):
        return a.clone() if a is not None and a.numel() and \
            a.untyped_storage().data_ptr() in mine else a
    levels, copied = [], False
    for lv in conv.levels:
        pos, crd = own(lv.pos), own(lv.crd)
        if pos is lv.pos and crd is lv.crd:
            levels.append(lv)
        else:
            copied = True
            levels.append(Level(lv.kind, lv.dim, lv.size, pos, crd, lv.block_inner, lv.ordered))
    return Storage(conv.format, conv.shape, levels, conv.values, conv.index_dtype) if copied else conv


def _recent_equal(st: Storage, key: tuple) -> Optional[Tuple[Storage, torch.Tensor]]:
    """The kept conversion of an earlier pattern equal to ``st``'s in content (arrays
    compared element by element: O(stored entries), far below a conversion)."""
    hit = _RECENT.get(key)
    if hit is None:
        return None
    arrays, index_dtype, got, _, versions = hit
    if got[0].nnz != st.nnz or index_dtype != st.index_dtype or \
            not _equal_arrays(arrays, _arrays(st), versions):
        return None
    return got


def reformatted(st: Storage, fmt: Format) -> Storage:
    """``st`` in format ``fmt`` (e.g. the transpose a gradient kernel reads), with the
    converted pattern and the permutation of positions kept for as long as ``st``'s level
    arrays live: a later call with new values only gathers them."""
    if fmt == st.format:
        return st
    switched = switched_top_level(st, fmt)
    if switched is not None:
        return switched
    return _through_entry(st, fmt, _reformat_entry(st, fmt))


def _through_entry(st: Storage, fmt: Format, got: Optional[Tuple[Storage, torch.Tensor]]) -> Storage:
    """``st`` in ``fmt`` through its kept conversion ``got`` (None: converted directly)."""
    if got is None:
        return _convert().convert(st, fmt)
    return through_permutation(st, got)


#: a permutation -> the Storage of its last gathered values (``through_permutation``)
_THROUGH = TensorKeyedCache()


def through_permutation(st: Storage, kept: Tuple[Storage, torch.Tensor]) -> Storage:
    """``st``'s current values in the converted pattern of ``kept`` (``reformat_permutation``):
    one gather, reused while the values are unchanged, and the same Storage object then (a
    warm runner checks its cached signature and pointers, ``tensor_compiler.runner``)."""
    conv, perm = kept
    vals = _gathered(st.values, perm)
    stamp = (id(vals), id(conv))
    hit = _THROUGH.get(perm, stamp=stamp)
    if hit is not None and hit.values is vals and hit.levels is conv.levels:
        return hit
    out = Storage(conv.format, conv.shape, conv.levels, vals, conv.index_dtype)
    _THROUGH.put(perm, out, stamp=stamp)
    return out


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
    version counter moves with every in-place update, e.g. an optimizer step; values
    without one, ``untracked`` or inference tensors, are gathered every call)."""
    # the version is read before the gather: an update landing during it (another thread's
    # optimizer step; index_select releases the GIL) must not count as seen
    v = version(values)
    if v < 0:
        return _gathered_by_content(values, perm)
    hit = _GATHERED.get(perm, stamp=v)
    if hit is not None and hit[0]() is values:
        return hit[1]
    out = _gather(values, perm)   # (advanced indexing ``values[perm]``: 6x slower)
    _GATHERED.put(perm, (weakref.ref(values), out), stamp=v)
    return out


#: ``perm`` -> (values, the copy they were gathered from, the gathered values), for values
#: without a version counter
_GATHERED_COPIES = TensorKeyedCache()


def _gathered_by_content(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``values[perm]`` for values no version counter follows (``untracked``: a scipy
    matrix's, a torch layout's; inference tensors): reused while they equal the copy the
    kept result was gathered from. The comparison reads the values in order, the gather
    at random: a scipy-built operand's ``A.t() @ X`` (copter2, 704k entries) paid 1.6 ms a
    call for the gather, ~0.2 ms for the comparison."""
    hit = _GATHERED_COPIES.get(perm)
    if hit is not None and hit[0]() is values and _same_values(values, hit[1]):
        return hit[2]
    copy = values.clone()         # gathered from the copy: a write meanwhile is not seen
    out = _gather(copy, perm)
    _GATHERED_COPIES.put(perm, (weakref.ref(values), copy, out))
    return out


def _same_values(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal values of one dtype: bit for bit where ``memcmp`` reads them (contiguous:
    ``-0.0`` differs from ``0.0``, a NaN equals itself), else as numbers
    (``_same_contents``; a NaN never equal: gathered again)."""
    return x.shape == y.shape and x.dtype == y.dtype and _same_contents(x, y)


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
    switched = switched_top_level(st, fmt)
    if switched is not None:
        return switched
    got = _reformat_entry(st, fmt, build=False)
    if got is None:
        ids = tuple(id(a) for a in _arrays(st))
        if _PARTNERS.get(anchor, fmt, ids) is None:
            _PARTNERS.put(anchor, True, fmt, ids)
            return _convert().convert(st, fmt)
        got = _reformat_entry(st, fmt)
    return _through_entry(st, fmt, got)


#: patterns a plan with a reuse alternative has run on, and how often (``seen_again``)
_SIGHTED = TensorKeyedCache()

#: calls on a pattern before ``seen_again`` says it is reused: its conversion, kept at the
#: switch, costs several calls (CSC ``A @ X``, 3000^2, 0.5 %, K = 32, 1 thread: ~0.7 ms
#: against 0.09 per call), so a pattern used twice never pays it and one used three
#: times or more (a training loop's adjacency, a solver's matrix) pays it once
REUSED_AFTER = 2


def seen_again(st: Storage) -> bool:
    """Whether ``st``'s pattern (the same level arrays) was seen here at least
    :data:`REUSED_AFTER` times before; counts this sighting. A plan whose transposed order
    pays only with the transpose kept (``planner.reuse_entry``) switches to it then."""
    anchor = _key_array(st)
    if anchor is None:
        return False
    ids = tuple(id(a) for a in _arrays(st))
    count = _SIGHTED.get(anchor, None, ids) or 0
    if count >= REUSED_AFTER:
        return True
    _SIGHTED.put(anchor, count + 1, None, ids)
    return False


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

#: a permutation -> its :class:`BlockMove`
_BLOCKS = TensorKeyedCache()


class BlockMove(NamedTuple):
    """How a permutation moves values: aligned blocks of ``k`` consecutive positions as
    wholes (``blocks``: the permutation of the blocks; k = 1: no blocks), and then, where
    ``transpose``, the blocks' matrix (blocks x k) transposed: a pattern over dense levels
    (attention heads, 'dcdd') re-formatted with those levels first ('dccc', the gradient's
    output-first copy) moves each entry's heads to k rows."""
    k: int
    blocks: Optional[torch.Tensor]
    transpose: bool = False


_NO_BLOCKS = BlockMove(1, None)


def _gather(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``values[perm]``, by blocks where ``perm`` moves whole blocks (:class:`BlockMove`).
    Blocks up to 16 bytes are gathered as one element of a wider type (2.3M values: 7.4 ->
    0.9 ms, 1 thread), longer ones a memcpy each (32 heads, 9.2M values in 128-byte blocks:
    78 ms value by value, 19 as 64-byte rows through torch's 2-D gather, 6.8 ms), and a
    transposing move gathers its blocks, then transposes them (the same 9.2M values with
    the heads first: 75 -> ~15 ms)."""
    move = _BLOCKS.get(perm)
    if move is None:
        move = _BLOCKS.put(perm, _block_move(perm))
    k, blocks = move.k, move.blocks
    if (k == 1 or values.dim() != 1 or values.requires_grad   # (a dtype view is not differentiable)
            or (move.transpose and k * values.element_size() < TRANSPOSE_MIN_BYTES)):
        return values.index_select(0, perm)
    if move.transpose:
        from .tensor_compiler.relayout import transposed
        from .tensor_compiler.threads import threads_for
        return transposed(_gather_blocks(values, blocks, k).view(-1, k), threads_for).view(-1)
    return _gather_blocks(values, blocks, k)


def _gather_blocks(values: torch.Tensor, blocks: torch.Tensor, k: int) -> torch.Tensor:
    """``values.view(-1, k)[blocks].view(-1)``."""
    wide = _WIDE.get(k * values.element_size())
    if values.is_contiguous():
        if wide is None:   # (a big fresh buffer from numpy: huge pages, fewer faults)
            return _convert()._k_gather_blocks(blocks, values, k,
                                               empty_output((blocks.numel() * k,), values.dtype))
        # one element of a wider type per block: torch's 1-D gather (a 2-D one copies each
        # 16-byte row on its own: 1.7 against 0.9 ms for 580k blocks)
        try:
            return values.view(wide).index_select(0, blocks).view(values.dtype)
        except RuntimeError:    # a storage offset off the wider type's alignment
            pass
    return values.reshape(-1, k).index_select(0, blocks).reshape(-1)


#: a transposing move's blocks are gathered and transposed from this many bytes a block; a
#: gather value by value is as fast below (BigBird's pattern, n = 4096, 1 thread, heads
#: first: 8 heads 9.7 vs 9.5 ms, 16 heads 17 vs 64 ms, 32 heads 29 vs 194 ms)
TRANSPOSE_MIN_BYTES = 64

#: bytes of a block -> a type of that size to gather it as one element
_WIDE = {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}

#: the longest block looked for (values); 4 KB of float32
_MAX_BLOCK = 1024


def _block_move(perm: torch.Tensor) -> BlockMove:
    """:class:`BlockMove` of ``perm``: blocks (:func:`_blocks`), else blocks transposed,
    else none."""
    k, blocks = _blocks(perm)
    if k > 1:
        return BlockMove(k, blocks)
    n = perm.numel()
    if n < 4:
        return _NO_BLOCKS
    # transposed blocks: row h of perm viewed as (k, m) is row 0 plus h, so the block size
    # is n / m for the first position m holding perm[0] + 1
    at = (perm == perm[0] + 1).nonzero()
    if at.numel() != 1:
        return _NO_BLOCKS
    m = int(at[0, 0])
    if m == 0 or n % m or n // m > _MAX_BLOCK:
        return _NO_BLOCKS
    k = n // m
    blocks = _aligned_blocks(perm.view(k, m).t(), k)
    return _NO_BLOCKS if blocks is None else BlockMove(k, blocks, True)


def _blocks(perm: torch.Tensor) -> Tuple[int, Optional[torch.Tensor]]:
    """The largest block size k such that ``perm`` moves aligned blocks of k consecutive
    positions as wholes, and the permutation of those blocks: the length of ``perm``'s
    first run of consecutive positions (the dense levels' block under a pattern: heads
    times batch), else the largest divisor of it that fits."""
    n = perm.numel()
    if n < 4:
        return 1, None
    head = perm[:_MAX_BLOCK + 1]
    steps = (head[1:] - head[:-1]) != 1
    run = int(steps.int().argmax()) + 1 if bool(steps.any()) else head.numel()
    for k in range(run, 1, -1):   # (the first run may span blocks that happen to follow)
        if run % k or n % k or n < 2 * k:
            continue
        blocks = _aligned_blocks(perm.view(-1, k), k)
        if blocks is not None:
            return k, blocks
    return 1, None


def _aligned_blocks(rows: torch.Tensor, k: int) -> Optional[torch.Tensor]:
    """The block numbers where every row of ``rows`` (blocks x k, any strides) is an
    aligned block of k consecutive positions, else None."""
    first = rows[:, 0]
    if bool((first % k == 0).all()) and \
            bool((rows == first[:, None] + torch.arange(k, dtype=rows.dtype)).all()):
        return torch.div(first, k, rounding_mode="floor")
    return None
