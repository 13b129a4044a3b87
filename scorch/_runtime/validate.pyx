# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Checks of index arrays that come from outside scorch (torch and scipy sparse tensors).

torch builds sparse tensors without checking them (``check_invariants=False`` is its
default) and scipy lets anyone assign ``indices``; a kernel reading an out-of-range
coordinate reads or writes out of bounds. Every check here is one O(nnz) pass without the
GIL, over int32 or int64 arrays, and stops at the first problem; the caller (``interop``)
raises the error with the position, the value and the operand's name, and keeps the
verdict per tensor so a warm call pays nothing.

Results:

* ``compressed``: ``CANONICAL`` (sorted, unique coordinates in every segment) or
  ``UNSORTED`` (valid, but a segment is unsorted or repeats a coordinate: the caller sorts
  and sums), else raises ValueError.
* ``coordinates``: the same for a coordinate list read in lexicographic order.
"""
from libc.stdint cimport int32_t, int64_t

import torch

ctypedef fused idx_t:
    int32_t
    int64_t

CANONICAL = 0
UNSORTED = 1


cdef inline void* _ptr(t):
    return <void*><size_t>t.data_ptr()


cdef int64_t _pos_bad(const idx_t* pos, int64_t n, int64_t* what) noexcept nogil:
    """First i where pos[i] < pos[i-1] (what = 1), else -1."""
    cdef int64_t i
    for i in range(1, n):
        if pos[i] < pos[i - 1]:
            what[0] = 1
            return i
    return -1


cdef int64_t _crd_bad(const idx_t* pos, const idx_t* crd, int64_t P, int64_t size,
                      int* unsorted) noexcept nogil:
    """First q with crd[q] outside [0, size), else -1; sets unsorted when some segment is
    not strictly increasing."""
    cdef int64_t p, q, lo, hi
    cdef idx_t c, prev
    cdef int uns = 0
    for p in range(P):
        lo = pos[p]
        hi = pos[p + 1]
        prev = -1
        for q in range(lo, hi):
            c = crd[q]
            if c < 0 or c >= size:
                unsorted[0] = uns
                return q
            if c <= prev:
                uns = 1
            prev = c
    unsorted[0] = uns
    return -1


cdef int64_t _range_bad(const idx_t* crd, int64_t n, int64_t size) noexcept nogil:
    cdef int64_t q
    for q in range(n):
        if crd[q] < 0 or crd[q] >= size:
            return q
    return -1


cdef int _lex_unsorted(idx_t** rows, int m, int64_t n) noexcept nogil:
    """1 when the columns of the m x n coordinate list are not strictly increasing in
    lexicographic order (unsorted or a repeated coordinate)."""
    cdef int64_t q
    cdef int d
    for q in range(1, n):
        for d in range(m):
            if rows[d][q] < rows[d][q - 1]:
                return 1
            if rows[d][q] > rows[d][q - 1]:
                break
        else:
            return 1
    return 0


def _index_tensor(t, str name, str operand):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} of {operand} is not a tensor ({type(t).__name__})")
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} of {operand} has dtype {t.dtype}; index arrays must be "
                         f"int32 or int64")
    if t.dim() != 1:
        raise ValueError(f"{name} of {operand} must be 1-d, got shape {tuple(t.shape)}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} of {operand} is on {t.device}, not the CPU")
    return t.contiguous()


def compressed(pos, crd, int64_t outer, int64_t inner, int64_t nvalues, str operand,
               str pos_name="pos", str crd_name="crd", str crd_what="coordinate",
               bint exact=True) -> int:
    """Check one compressed level over ``outer`` parents and ``inner`` coordinates:
    ``pos`` has outer + 1 entries, starts at 0, never decreases and ends at most at
    ``len(crd)`` (exactly, with ``exact``) and at ``nvalues``; every ``crd`` entry of a
    segment lies in [0, inner). Returns CANONICAL or UNSORTED; raises ValueError naming
    ``operand`` otherwise."""
    pos = _index_tensor(pos, pos_name, operand)
    crd = _index_tensor(crd, crd_name, operand)
    if pos.dtype != crd.dtype:   # checked as the wider type, as interop then reads them
        pos, crd = pos.to(torch.int64), crd.to(torch.int64)
    cdef int64_t n = pos.numel()
    if n != outer + 1:
        raise ValueError(f"{pos_name} has {n} entries, expected {outer + 1} (one more than "
                         f"the {outer} rows it indexes) (operand {operand})")
    cdef int64_t first = int(pos[0])
    cdef int64_t last = int(pos[n - 1])
    cdef int64_t ncrd = crd.numel()
    if first != 0:
        raise ValueError(f"{pos_name}[0] is {first}, expected 0 (operand {operand})")
    if last > ncrd or (exact and last != ncrd):
        raise ValueError(f"{pos_name}[-1] is {last} but {crd_name} has {ncrd} entries "
                         f"(operand {operand})")
    if last > nvalues:
        raise ValueError(f"{pos_name}[-1] is {last} but there are only {nvalues} values "
                         f"(operand {operand})")
    cdef int64_t what = 0, bad
    cdef int unsorted = 0
    cdef bint is64 = pos.dtype == torch.int64
    cdef void* pp = _ptr(pos)
    cdef void* cp = _ptr(crd)
    with nogil:
        if is64:
            bad = _pos_bad(<int64_t*>pp, n, &what)
        else:
            bad = _pos_bad(<int32_t*>pp, n, &what)
    if bad >= 0:
        raise ValueError(f"{pos_name} decreases at entry {bad} ({int(pos[bad - 1])} then "
                         f"{int(pos[bad])}) (operand {operand})")
    with nogil:
        if is64:
            bad = _crd_bad(<int64_t*>pp, <int64_t*>cp, outer, inner, &unsorted)
        else:
            bad = _crd_bad(<int32_t*>pp, <int32_t*>cp, outer, inner, &unsorted)
    if bad >= 0:
        raise ValueError(f"{crd_what} index {int(crd[bad])} out of range for size {inner} at "
                         f"entry {bad} of {crd_name} (operand {operand})")
    return UNSORTED if unsorted else CANONICAL


def coordinates(indices, shape, str operand, bint need_order=True) -> int:
    """Check a (ndim, n) coordinate list against ``shape``: every coordinate in range.
    With ``need_order`` also report whether the columns are strictly increasing in
    lexicographic order (CANONICAL) or not (UNSORTED: sort and sum)."""
    if not isinstance(indices, torch.Tensor) or indices.dim() != 2:
        raise ValueError(f"indices of {operand} must be a 2-d tensor")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices of {operand} have dtype {indices.dtype}; expected int32 or int64")
    cdef int m = indices.shape[0]
    cdef int64_t n = indices.shape[1]
    cdef int64_t bad, size
    cdef int d
    rows = [indices[d].contiguous() for d in range(m)]
    cdef bint is64 = indices.dtype == torch.int64
    cdef void* row
    for d in range(m):
        size = shape[d]
        row = _ptr(rows[d])
        with nogil:
            if is64:
                bad = _range_bad(<int64_t*>row, n, size)
            else:
                bad = _range_bad(<int32_t*>row, n, size)
        if bad >= 0:
            raise ValueError(f"index {int(rows[d][bad])} out of range for size {size} in "
                             f"dimension {d} at entry {bad} (operand {operand})")
    if not need_order or m == 0 or n < 2:
        return CANONICAL
    cdef int64_t* ptrs[64]
    if m > 64:
        raise ValueError(f"{operand} has {m} sparse dimensions; at most 64 are supported")
    rows = [r.to(torch.int64) for r in rows]
    for d in range(m):
        ptrs[d] = <int64_t*>_ptr(rows[d])
    cdef int uns
    with nogil:
        uns = _lex_unsorted(ptrs, m, n)
    return UNSORTED if uns else CANONICAL
