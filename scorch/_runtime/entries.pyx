# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Entry moves on a compressed level (``pos`` over parents, ``crd`` per entry) in one pass:
gathering the segments of some parents (a minibatch of CSR rows), keeping the entries a mask marks (``tril``, column ranges of CSR) or a table over the
coordinates picks (an index along CSR's columns), reversing segments (``flip`` of CSR /
CSC), re-splitting coordinates into another shape (``reshape``), and each segment's
first extreme with torch's rules (``argmax`` / ``max(dim)`` along CSR's rows).

Why: done with torch ops these take a mask-to-index pass, a running count over every entry,
and several int64 temporaries as long as the level (13-16 ms on 2M entries at one thread,
where scipy takes 1.5-6 ms); here each is one loop over the entries, writing the new
``pos`` / ``crd`` and the source position of each new entry (``take``). The values move
with one gather by ``take`` outside, so autograd records it as it does any index.
"""
from libc.math cimport isnan
from libc.stdint cimport int32_t, int64_t, intptr_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from typing import Optional

import torch

__all__ = ["select_entries", "gather_segments", "gather_segment_entries", "flip_segments", "interleave_segments", "resplit",
           "segment_arg_extreme"]

ctypedef fused idx_t:
    int32_t
    int64_t

ctypedef fused src_t:
    int32_t
    int64_t


cdef inline void* _ptr(t):
    return <void*><intptr_t>t.data_ptr()


cdef class _NewLevel:
    """A new level's ``pos`` (P parents) and ``crd`` (``count`` entries) in ``dtype``, and
    each entry's source position (int64), with their data pointers for the loops."""
    cdef readonly object pos, crd, take
    cdef void* pos_p
    cdef void* crd_p
    cdef int64_t* take_p

    def __cinit__(self, int64_t P, int64_t count, dtype):
        self.pos = torch.empty(P + 1, dtype=dtype)
        self.crd = torch.empty(count, dtype=dtype)
        self.take = torch.empty(count, dtype=torch.int64)
        self.pos_p, self.crd_p = _ptr(self.pos), _ptr(self.crd)
        self.take_p = <int64_t*>_ptr(self.take)


cdef int64_t _count_picked(src_t* crd, int64_t n, int64_t* table) noexcept nogil:
    cdef int64_t q, k = 0
    for q in range(n):
        k += table[crd[q]] >= 0
    return k


cdef void _select(idx_t* pos, int64_t P, src_t* crd, uint8_t* keep, int64_t* table, int64_t shift,
                  idx_t* new_pos, idx_t* new_crd, int64_t* take, int64_t count) noexcept nogil:
    """The entries ``keep`` marks (coordinate less ``shift``), or with ``table`` those it
    maps to a place >= 0 (that place their coordinate); ``count`` of them."""
    cdef int64_t p, q, c, k = 0
    new_pos[0] = 0
    if table == NULL:
        # no branch on ``keep``: every entry is written at k, which moves on only past a
        # kept one (half the entries kept at random: a mispredicted branch per entry);
        # k < count is false only after the last kept entry
        for p in range(P):
            for q in range(pos[p], pos[p + 1]):
                if k < count:
                    new_crd[k] = <idx_t>(crd[q] - shift)
                    take[k] = q
                k += keep[q] != 0
            new_pos[p + 1] = <idx_t>k
        return
    for p in range(P):
        for q in range(pos[p], pos[p + 1]):
            if table != NULL:
                c = table[crd[q]]
                if c < 0:
                    continue
            elif keep[q]:
                c = crd[q] - shift
            else:
                continue
            new_crd[k] = <idx_t>c
            take[k] = q
            k += 1
        new_pos[p + 1] = <idx_t>k


def select_entries(pos: torch.Tensor, crd: torch.Tensor, keep: Optional[torch.Tensor] = None,
                   int64_t shift=0, table: Optional[torch.Tensor] = None):
    """``(new_pos, new_crd, take)`` of the entries ``keep`` (bool, one per entry) marks, in
    order, their coordinates ``crd`` (int32 / int64, one per entry) less ``shift``; or, with
    ``table`` (int64, a slot per coordinate), those it maps to a place >= 0, that place
    their new coordinate. ``new_pos`` / ``new_crd`` in ``pos``'s dtype, ``take`` (each new
    entry's source) int64. Two passes: count, fill."""
    cdef int64_t P = pos.numel() - 1
    cdef int64_t n = crd.numel()
    pos, crd = pos.contiguous(), crd.contiguous()
    cdef void* pp = _ptr(pos)
    cdef void* cp = _ptr(crd)
    cdef uint8_t* kp = NULL
    cdef int64_t* tb = NULL
    cdef bint crd64 = crd.dtype == torch.int64
    cdef int64_t count
    if table is not None:
        table = table.contiguous()
        tb = <int64_t*>_ptr(table)
        with nogil:
            count = _count_picked(<int64_t*>cp, n, tb) if crd64 else _count_picked(<int32_t*>cp, n, tb)
    else:
        mask = keep.contiguous().view(torch.uint8)
        kp = <uint8_t*>_ptr(mask)
        count = int(keep.sum())
    cdef _NewLevel out = _NewLevel(P, count, pos.dtype)
    cdef bint pos64 = pos.dtype == torch.int64
    with nogil:
        if pos64:
            if crd64:
                _select(<int64_t*>pp, P, <int64_t*>cp, kp, tb, shift, <int64_t*>out.pos_p,
                        <int64_t*>out.crd_p, out.take_p, count)
            else:
                _select(<int64_t*>pp, P, <int32_t*>cp, kp, tb, shift, <int64_t*>out.pos_p,
                        <int64_t*>out.crd_p, out.take_p, count)
        elif crd64:
            _select(<int32_t*>pp, P, <int64_t*>cp, kp, tb, shift, <int32_t*>out.pos_p,
                    <int32_t*>out.crd_p, out.take_p, count)
        else:
            _select(<int32_t*>pp, P, <int32_t*>cp, kp, tb, shift, <int32_t*>out.pos_p,
                    <int32_t*>out.crd_p, out.take_p, count)
    return out.pos, out.crd, out.take


cdef int64_t _picked_total(idx_t* pos, int64_t* parents, int64_t m) noexcept nogil:
    cdef int64_t i, total = 0
    for i in range(m):
        total += pos[parents[i] + 1] - pos[parents[i]]
    return total


cdef void _gather(idx_t* pos, int64_t* parents, int64_t m, idx_t* new_pos, int64_t* take) noexcept nogil:
    cdef int64_t i, q, k = 0
    new_pos[0] = 0
    for i in range(m):
        for q in range(pos[parents[i]], pos[parents[i] + 1]):
            take[k] = q
            k += 1
        new_pos[i + 1] = <idx_t>k


cdef int64_t _picked(pos, parents):
    """The entries of the segments of ``pos`` (contiguous) at ``parents`` (contiguous int64)."""
    cdef void* pp = _ptr(pos)
    cdef int64_t* rp = <int64_t*>_ptr(parents)
    cdef int64_t m = parents.numel()
    cdef bint pos64 = pos.dtype == torch.int64
    with nogil:
        return _picked_total(<int64_t*>pp, rp, m) if pos64 else _picked_total(<int32_t*>pp, rp, m)


def gather_segments(pos: torch.Tensor, parents: torch.Tensor):
    """``(new_pos, take)``: the segments of ``pos`` at ``parents`` (int64, in range, in any
    order, repeats allowed) one after the other: the new level's ``pos`` (``pos``'s dtype)
    and the source position of each of its entries (int64). A minibatch of CSR rows."""
    cdef int64_t m = parents.numel()
    pos, parents = pos.contiguous(), parents.contiguous().to(torch.int64)
    cdef void* pp = _ptr(pos)
    cdef int64_t* rp = <int64_t*>_ptr(parents)
    cdef bint pos64 = pos.dtype == torch.int64
    cdef int64_t total = _picked(pos, parents)
    new_pos = torch.empty(m + 1, dtype=pos.dtype)
    take = torch.empty(total, dtype=torch.int64)
    cdef void* np_ = _ptr(new_pos)
    cdef int64_t* tp = <int64_t*>_ptr(take)
    with nogil:
        if pos64:
            _gather(<int64_t*>pp, rp, m, <int64_t*>np_, tp)
        else:
            _gather(<int32_t*>pp, rp, m, <int32_t*>np_, tp)
    return new_pos, take


cdef void _gather_entries(idx_t* pos, int64_t* parents, int64_t m, idx_t* crd, char* vals,
                          int64_t width, idx_t* new_pos, idx_t* new_crd, char* new_vals) noexcept nogil:
    cdef int64_t i, lo, n, k = 0
    new_pos[0] = 0
    for i in range(m):
        lo = pos[parents[i]]
        n = pos[parents[i] + 1] - lo
        memcpy(new_crd + k, crd + lo, n * sizeof(idx_t))
        memcpy(new_vals + k * width, vals + lo * width, n * width)
        k += n
        new_pos[i + 1] = <idx_t>k


def gather_segment_entries(pos: torch.Tensor, crd: torch.Tensor, values: torch.Tensor,
                           parents: torch.Tensor):
    """``(new_pos, new_crd, new_values)``: the segments of the last level at ``parents``
    (as :func:`gather_segments`) with their coordinates and values (one row of ``values``
    per entry, any dtype) copied along, segment by segment. What a minibatch of CSR rows
    costs where the values need no gradient: no position array, no separate gathers
    (10,000 of 200,000 rows of 10 entries: 0.54 -> ~0.2 ms; scipy 0.28)."""
    if crd.dtype != pos.dtype:
        raise ValueError("gather_segment_entries: pos and crd must have one dtype")
    cdef int64_t m = parents.numel()
    pos, crd, values = pos.contiguous(), crd.contiguous(), values.contiguous()
    parents = parents.contiguous().to(torch.int64)
    cdef void* pp = _ptr(pos)
    cdef int64_t* rp = <int64_t*>_ptr(parents)
    cdef bint pos64 = pos.dtype == torch.int64
    cdef int64_t total = _picked(pos, parents)
    if not pos64 and total > 2147483647:
        raise OverflowError("gather_segment_entries: the picked entries overflow int32 positions")
    cdef int64_t width = values.element_size()
    for extent in values.shape[1:]:
        width *= extent
    new_pos = torch.empty(m + 1, dtype=pos.dtype)
    new_crd = torch.empty(total, dtype=crd.dtype)
    new_values = torch.empty((total,) + tuple(values.shape[1:]), dtype=values.dtype)
    cdef void* np_ = _ptr(new_pos)
    cdef void* cp = _ptr(crd)
    cdef void* nc = _ptr(new_crd)
    cdef char* vp = <char*>_ptr(values)
    cdef char* nv = <char*>_ptr(new_values)
    with nogil:
        if pos64:
            _gather_entries(<int64_t*>pp, rp, m, <int64_t*>cp, vp, width, <int64_t*>np_, <int64_t*>nc, nv)
        else:
            _gather_entries(<int32_t*>pp, rp, m, <int32_t*>cp, vp, width, <int32_t*>np_, <int32_t*>nc, nv)
    return new_pos, new_crd, new_values


cdef void _flip(idx_t* pos, int64_t P, idx_t* crd, bint rows, bint cols, int64_t size,
                idx_t* new_pos, idx_t* new_crd, int64_t* take) noexcept nogil:
    cdef int64_t p, src, q, lo, hi, k = 0
    new_pos[0] = 0
    for p in range(P):
        src = P - 1 - p if rows else p
        lo, hi = pos[src], pos[src + 1]
        if cols:
            for q in range(hi - 1, lo - 1, -1):
                new_crd[k] = <idx_t>(size - 1 - crd[q])
                take[k] = q
                k += 1
        else:
            for q in range(lo, hi):
                new_crd[k] = crd[q]
                take[k] = q
                k += 1
        new_pos[p + 1] = <idx_t>k


def flip_segments(pos: torch.Tensor, crd: torch.Tensor, bint rows, bint cols, int64_t size):
    """``(new_pos, new_crd, take)`` of a compressed level with its segments in reverse order
    (``rows``) and / or each segment reversed with its coordinates mirrored in ``size``
    (``cols``); ``crd`` in ``pos``'s dtype."""
    cdef int64_t P = pos.numel() - 1
    cdef int64_t n = crd.numel()
    pos, crd = pos.contiguous(), crd.contiguous().to(pos.dtype)
    cdef _NewLevel out = _NewLevel(P, n, pos.dtype)
    cdef void* pp = _ptr(pos)
    cdef void* cp = _ptr(crd)
    cdef bint pos64 = pos.dtype == torch.int64
    with nogil:
        if pos64:
            _flip(<int64_t*>pp, P, <int64_t*>cp, rows, cols, size, <int64_t*>out.pos_p,
                  <int64_t*>out.crd_p, out.take_p)
        else:
            _flip(<int32_t*>pp, P, <int32_t*>cp, rows, cols, size, <int32_t*>out.pos_p,
                  <int32_t*>out.crd_p, out.take_p)
    return out.pos, out.crd, out.take


cdef void _interleave(idx_t** pos, idx_t** crd, int64_t* shift, int64_t* base, int m, int64_t P,
                      idx_t* new_pos, idx_t* new_crd, int64_t* take) noexcept nogil:
    cdef int64_t p, q, k = 0
    cdef int j
    new_pos[0] = 0
    for p in range(P):
        for j in range(m):
            for q in range(pos[j][p], pos[j][p + 1]):
                new_crd[k] = <idx_t>(crd[j][q] + shift[j])
                take[k] = base[j] + q
                k += 1
        new_pos[p + 1] = <idx_t>k


def interleave_segments(poses, crds, shifts):
    """``(new_pos, new_crd, take)``: compressed levels over the same P parents joined
    segment by segment, parent p's segment being operand 0's, then operand 1's, ... with
    operand j's coordinates shifted by ``shifts[j]`` (CSR matrices side by side); ``take``
    is each new entry's position in the operands' entries one after the other. One pass,
    no sort; every ``pos`` / ``crd`` in one dtype."""
    cdef int m = len(poses)
    cdef int64_t P = poses[0].numel() - 1
    dtype = poses[0].dtype
    poses = [x.contiguous() for x in poses]
    crds = [x.contiguous().to(dtype) for x in crds]
    cdef int64_t total = sum(int(c.numel()) for c in crds)
    cdef _NewLevel out = _NewLevel(P, total, dtype)
    cdef void** pp = <void**>malloc(m * sizeof(void*))
    cdef void** cp = <void**>malloc(m * sizeof(void*))
    cdef int64_t* sp = <int64_t*>malloc(m * sizeof(int64_t))
    cdef int64_t* bp = <int64_t*>malloc(m * sizeof(int64_t))
    cdef int j
    cdef int64_t base = 0
    cdef bint pos64 = dtype == torch.int64
    try:
        for j in range(m):
            pp[j], cp[j], sp[j], bp[j] = _ptr(poses[j]), _ptr(crds[j]), int(shifts[j]), base
            base += crds[j].numel()
        with nogil:
            if pos64:
                _interleave(<int64_t**>pp, <int64_t**>cp, sp, bp, m, P, <int64_t*>out.pos_p,
                            <int64_t*>out.crd_p, out.take_p)
            else:
                _interleave(<int32_t**>pp, <int32_t**>cp, sp, bp, m, P, <int32_t*>out.pos_p,
                            <int32_t*>out.crd_p, out.take_p)
    finally:
        free(pp); free(cp); free(sp); free(bp)
    return out.pos, out.crd, out.take


cdef void _resplit(int64_t* coords, int64_t n, int r, int64_t* old_shape, int rn,
                   int64_t* new_shape, idx_t* out) noexcept nogil:
    cdef int64_t q, lin, s, quot
    cdef int d
    for q in range(n):
        lin = 0
        for d in range(r):
            lin = lin * old_shape[d] + coords[d * n + q]
        for d in range(rn - 1, 0, -1):
            s = new_shape[d]
            quot = lin // s
            out[d * n + q] = <idx_t>(lin - quot * s)
            lin = quot
        if rn:
            out[q] = <idx_t>lin


def resplit(coords: torch.Tensor, old_shape, new_shape, dtype: torch.dtype) -> torch.Tensor:
    """The (len(new_shape), n) coordinates, in ``dtype``, of entries at ``coords`` ((r, n)
    int64) once the tensor of ``old_shape`` is read row-major as ``new_shape`` (same number
    of positions, below 2^63): the linear position, then one division a new dimension."""
    cdef int r = len(old_shape)
    cdef int rn = len(new_shape)
    cdef int64_t n = coords.shape[1] if coords.dim() == 2 else 0
    coords = coords.contiguous()
    old = torch.tensor([int(x) for x in old_shape] or [1], dtype=torch.int64)
    new = torch.tensor([max(int(x), 1) for x in new_shape] or [1], dtype=torch.int64)
    out = torch.empty((rn, n), dtype=dtype)
    cdef int64_t* cp = <int64_t*>_ptr(coords)
    cdef int64_t* op = <int64_t*>_ptr(old)
    cdef int64_t* np_ = <int64_t*>_ptr(new)
    cdef void* outp = _ptr(out)
    cdef bint wide = dtype == torch.int64
    if n == 0:
        return out
    with nogil:
        if wide:
            _resplit(cp, n, r, op, rn, np_, <int64_t*>outp)
        else:
            _resplit(cp, n, r, op, rn, np_, <int32_t*>outp)
    return out


ctypedef fused val_t:
    float
    double
    int32_t
    int64_t


cdef void _arg_extreme(idx_t* pos, int64_t P, idx_t* crd, val_t* vals, int64_t extent,
                       bint largest, int64_t nnz, int64_t* answer, int64_t* entry) noexcept nogil:
    cdef int64_t p, q, c, expected, gap, best_q, nan_q, zero_q, first_zero
    cdef val_t v, best
    cdef bint floating = val_t is float or val_t is double
    for p in range(P):
        expected, gap, best_q, nan_q, zero_q = 0, -1, -1, -1, -1
        best = 0
        for q in range(pos[p], pos[p + 1]):
            c = crd[q]
            if gap < 0 and c != expected:
                gap = expected                   # coordinates sorted: the first one skipped
            expected = c + 1
            v = vals[q]
            if floating and isnan(<double>v):
                if nan_q < 0:
                    nan_q = q
                continue
            if best_q < 0 or (v > best if largest else v < best):
                best, best_q = v, q
            if v == 0 and zero_q < 0:
                zero_q = q
        if gap < 0 and expected < extent:
            gap = expected
        if nan_q >= 0:                           # torch: the first NaN
            answer[p], entry[p] = crd[nan_q], nan_q
        elif gap >= 0 and (best_q < 0 or (best <= 0 if largest else best >= 0)):
            # an implicit zero is (one of) the extreme: the first zero, stored or not
            first_zero = crd[zero_q] if zero_q >= 0 else extent
            if zero_q >= 0 and first_zero < gap:
                answer[p], entry[p] = first_zero, zero_q
            else:
                answer[p], entry[p] = gap, nnz
        else:
            answer[p], entry[p] = crd[best_q], best_q


cdef void _arg_extreme_of(idx_t* pos, int64_t P, idx_t* crd, void* vals, int kind, int64_t extent,
                          bint largest, int64_t nnz, int64_t* answer, int64_t* entry) noexcept nogil:
    """``_arg_extreme`` for values of ``kind`` (0 float32, 1 float64, 2 int32, 3 int64)."""
    if kind == 0:
        _arg_extreme(pos, P, crd, <float*>vals, extent, largest, nnz, answer, entry)
    elif kind == 1:
        _arg_extreme(pos, P, crd, <double*>vals, extent, largest, nnz, answer, entry)
    elif kind == 2:
        _arg_extreme(pos, P, crd, <int32_t*>vals, extent, largest, nnz, answer, entry)
    else:
        _arg_extreme(pos, P, crd, <int64_t*>vals, extent, largest, nnz, answer, entry)


def segment_arg_extreme(pos: torch.Tensor, crd: torch.Tensor, vals: torch.Tensor, int64_t extent,
                        bint largest):
    """Per segment of a compressed level whose coordinates are sorted (a CSR row): torch's
    ``argmax`` / ``argmin`` over the ``extent`` positions (the first NaN; else the first
    extreme, an unstored position holding 0) and the stored entry there (``nnz`` for an
    unstored zero). ``vals``: float32 / float64 / int32 / int64. Returns (answer, entry)."""
    cdef int64_t P = pos.numel() - 1
    cdef int64_t nnz = vals.numel()
    pos, crd, vals = pos.contiguous(), crd.contiguous().to(pos.dtype), vals.contiguous()
    answer = torch.empty(P, dtype=torch.int64)
    entry = torch.empty(P, dtype=torch.int64)
    cdef void* pp = _ptr(pos)
    cdef void* cp = _ptr(crd)
    cdef void* vp = _ptr(vals)
    cdef int64_t* ap = <int64_t*>_ptr(answer)
    cdef int64_t* ep = <int64_t*>_ptr(entry)
    cdef int kind = {torch.float32: 0, torch.float64: 1, torch.int32: 2, torch.int64: 3}[vals.dtype]
    cdef bint pos64 = pos.dtype == torch.int64
    with nogil:
        if pos64:
            _arg_extreme_of(<int64_t*>pp, P, <int64_t*>cp, vp, kind, extent, largest, nnz, ap, ep)
        else:
            _arg_extreme_of(<int32_t*>pp, P, <int32_t*>cp, vp, kind, extent, largest, nnz, ap, ep)
    return answer, entry
