# cython: language_level=3, boundscheck=False, wraparound=True, cdivision=True, initializedcheck=False
"""Conversions between level formats, in one level-by-level algorithm.

Every conversion is the same three steps, driven only by the level kinds of the two formats
(TACO's mode-format view), never by format names:

1. *Decode* the source into one coordinate array per target level, in the source's storage
   order (a dense tensor is scanned in the target's level order instead, so it arrives sorted).
   Arrays that the source already holds at the granularity of its values (the crd of its last
   levels) are used as they are, not copied.
2. *Sort* stably by the target levels, LSD style: a key suffix that is already in order (known
   from the two formats, or checked in one early-exit pass) costs nothing; each remaining level
   is a parallel counting sort (a linear transpose for CSR -> CSC), or a stable comparison sort
   when the level is far larger than the number of entries.
3. *Build* the target levels top-down from "entry offsets" (for every position of the level
   built so far, the range of sorted entries below it): a dense level splits each range by
   coordinate, a compressed level or coordinate run keeps the distinct coordinates of each
   range, and the values of each final position are reduced from its range (duplicates summed,
   positions that only a dense level creates get zero). When the entries are known to be
   unique, the last sparse level is the sorted keys themselves and ``pos`` is the offsets array,
   so a sorted COO -> CSR only computes ``pos``.

All loops run without the GIL; the ones that touch every entry are split over
``torch.get_num_threads()`` OpenMP threads.
"""
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, intptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy
from cython.parallel cimport prange
from openmp cimport omp_get_wtime

from typing import List, Optional, Sequence, Tuple

import math
import numbers
import os
import time

import numpy as np
import torch

from scorch.formats import Format, LevelKind
from scorch.level_storage import INT32_MAX, Level, Storage, index_dtype_for, level_kinds, level_sizes, run_heads

__all__ = ["from_coords", "from_dense", "to_dense", "convert", "coords"]

cdef extern from "pack_nonzeros.h" namespace "scorch" nogil:
    void pack_row_f32(const float* row, int64_t m, int64_t q, int64_t end, int32_t* crd, float* val)
    void pack_row_f64(const double* row, int64_t m, int64_t q, int64_t end, int32_t* crd, double* val)

ctypedef fused idx_t:
    int32_t
    int64_t

# a second index type, for kernels that read one index type and write another
ctypedef fused kdx_t:
    int32_t
    int64_t

ctypedef float complex cfloat
ctypedef double complex cdouble

# value types that can be summed (bool is uint8_t and ORed)
ctypedef fused num_t:
    float
    double
    int32_t
    int64_t
    uint8_t
    cfloat
    cdouble

# element types of a dense tensor, for the nonzero test (uint16_t = float16/bfloat16 bits)
ctypedef fused scan_t:
    float
    double
    int8_t
    uint8_t
    int16_t
    uint16_t
    int32_t
    int64_t
    cfloat
    cdouble

cdef struct b16:
    uint64_t lo
    uint64_t hi

# element types that values are moved as (by size: bool/int8 ... complex128)
ctypedef fused mv_t:
    uint8_t
    uint16_t
    uint32_t
    uint64_t
    b16

_DENSE, _COMPRESSED, _COORDINATE = LevelKind.DENSE, LevelKind.COMPRESSED, LevelKind.COORDINATE
_DENSE_COMPRESSED = (_DENSE, _COMPRESSED)

# how values are reduced: dtypes without a native sum are summed in a wider type and cast back
_WIDEN = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.int8: torch.int64,
          torch.int16: torch.int64, torch.uint8: torch.int64, torch.uint16: torch.int64,
          torch.uint32: torch.int64, torch.uint64: torch.int64}
_NATIVE_SUM = (torch.float32, torch.float64, torch.int32, torch.int64, torch.bool,
               torch.complex64, torch.complex128)
_SCAN_AS = {torch.float32: 0, torch.float64: 1, torch.int8: 2, torch.uint8: 3, torch.bool: 3,
            torch.int16: 4, torch.float16: 5, torch.bfloat16: 5,
            torch.int32: 6, torch.int64: 7,
            torch.complex64: 8, torch.complex128: 9}


cdef inline void* _ptr(t):
    return <void*><intptr_t>t.data_ptr()


cdef inline int _threads():
    return max(1, torch.get_num_threads())


cdef int _NCPU = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


cdef double _start_at[64]  # when each thread of the last instrumented region began its chunk


cdef void _started(int t) noexcept nogil:
    if t < 64:
        _start_at[t] = omp_get_wtime()


cdef inline int64_t _lo(int64_t n, int t, int T) noexcept nogil:
    return (n * t) // T


# ----------------------------------------------------------------------------------------
# kernels (nogil); every one that takes idx_t works for int32 and int64 index arrays
# ----------------------------------------------------------------------------------------

cdef void _split_by_pos(idx_t* pos, int64_t P, int T, int64_t* bounds) noexcept nogil:
    """Parent ranges with about equal numbers of children, one per thread."""
    cdef int64_t n = pos[P], lo, hi, mid, want
    cdef int t
    bounds[0] = 0
    bounds[T] = P
    for t in range(1, T):
        want = _lo(n, t, T)
        lo = bounds[t - 1]
        hi = P
        while lo < hi:  # first parent whose children start at or after ``want``
            mid = (lo + hi) // 2
            if pos[mid] < want:
                lo = mid + 1
            else:
                hi = mid
        bounds[t] = lo


cdef inline void _expand_chunk(idx_t* pos, int64_t lo, int64_t hi, idx_t* owner) noexcept nogil:
    cdef int64_t p, q
    for p in range(lo, hi):
        for q in range(pos[p], pos[p + 1]):
            owner[q] = <idx_t>p


cdef void _expand_pos(idx_t* pos, int64_t P, idx_t* owner, int64_t* bounds, int T) noexcept nogil:
    """owner[q] = p for every q in pos[p]:pos[p+1] (the parent of each child position)."""
    cdef int t
    _split_by_pos(pos, P, T, bounds)
    for t in prange(T, schedule='static', chunksize=1, num_threads=T):
        _started(t)
        _expand_chunk(pos, bounds[t], bounds[t + 1], owner)


cdef inline void _count_chunk(idx_t* key, int64_t lo, int64_t hi, idx_t* h) noexcept nogil:
    cdef int64_t i
    for i in range(lo, hi):
        h[key[i]] += 1


cdef inline void _dest_chunk(idx_t* key, int64_t lo, int64_t hi, idx_t* h, idx_t* dest) noexcept nogil:
    cdef int64_t i
    cdef idx_t b
    for i in range(lo, hi):
        b = key[i]
        dest[i] = h[b]
        h[b] += 1


cdef void _offsets(idx_t* hist, int64_t s, int T, idx_t* offsets) noexcept nogil:
    """Bucket starts, and turn the per-thread histograms into per-thread write offsets."""
    cdef int64_t b, run = 0
    cdef int t
    cdef idx_t c
    for b in range(s):
        offsets[b] = <idx_t>run
        for t in range(T):
            c = hist[t * s + b]
            hist[t * s + b] = <idx_t>run
            run += c
    offsets[s] = <idx_t>run


cdef void _counting_sort(idx_t* key, int64_t n, int64_t s, idx_t* hist, idx_t* offsets, idx_t* dest,
                         int T) noexcept nogil:
    """Stable counting sort: per-thread histograms of contiguous chunks, then each thread
    writes the destinations of its chunk from its own running offsets."""
    cdef int t
    for t in prange(T, schedule='static', chunksize=1, num_threads=T):
        _started(t)
        _count_chunk(key, _lo(n, t, T), _lo(n, t + 1, T), hist + t * s)
    _offsets(hist, s, T, offsets)
    for t in prange(T, schedule='static', chunksize=1, num_threads=T):
        _dest_chunk(key, _lo(n, t, T), _lo(n, t + 1, T), hist + t * s, dest)


cdef inline void _scatter_chunk(idx_t* dest, int64_t lo, int64_t hi, mv_t* src, mv_t* out) noexcept nogil:
    cdef int64_t i
    for i in range(lo, hi):
        out[dest[i]] = src[i]


cdef void _scatter(idx_t* dest, int64_t n, mv_t* src, mv_t* out, int T) noexcept nogil:
    """out[dest[i]] = src[i]."""
    cdef int t
    for t in prange(T, schedule='static', chunksize=1, num_threads=T):
        _scatter_chunk(dest, _lo(n, t, T), _lo(n, t + 1, T), src, out)


cdef inline void _tcount_chunk(idx_t* pos, idx_t* crd, int64_t lo, int64_t hi, idx_t* h) noexcept nogil:
    cdef int64_t q
    for q in range(pos[lo], pos[hi]):
        h[crd[q]] += 1


cdef inline void _tfill_chunk(idx_t* pos, idx_t* crd, idx_t* rowmap, int64_t lo, int64_t hi, mv_t* vals,
                              idx_t* h, idx_t* rows_out, mv_t* vals_out) noexcept nogil:
    cdef int64_t p, q
    cdef idx_t r, c, d
    for p in range(lo, hi):
        r = rowmap[p] if rowmap != NULL else <idx_t>p
        for q in range(pos[p], pos[p + 1]):
            c = crd[q]
            d = h[c]
            h[c] = d + 1
            rows_out[d] = r
            vals_out[d] = vals[q]


cdef void _transpose(idx_t* pos, idx_t* crd, idx_t* rowmap, int64_t P, int64_t s, mv_t* vals,
                     idx_t* hist, int64_t* bounds, idx_t* offsets, idx_t* rows_out, mv_t* vals_out,
                     int T) noexcept nogil:
    """Counting-sort transpose of a compressed level under P parents (scipy's csr_tocsc, split
    over threads by rows): the child coordinates become buckets, the parent coordinate
    (``rowmap[p]``, or p itself) and the value move into bucket order."""
    cdef int t
    _split_by_pos(pos, P, T, bounds)
    for t in prange(T, schedule='static', chunksize=1, num_threads=T):
        _started(t)
        _tcount_chunk(pos, crd, bounds[t], bounds[t + 1], hist + t * s)
    _offsets(hist, s, T, offsets)
    for t in prange(T, schedule='static', chunksize=1, num_threads=T):
        _tfill_chunk(pos, crd, rowmap, bounds[t], bounds[t + 1], vals, hist + t * s, rows_out, vals_out)


cdef int64_t _unsorted_at(idx_t** keys, int m, int64_t n, bint strict) noexcept nogil:
    """First i whose key tuple sorts before entry i-1 (or equals it, when ``strict``);
    n when the whole sequence is in order."""
    cdef int64_t i
    cdef int j
    cdef idx_t a, b
    for i in range(1, n):
        for j in range(m):
            a = keys[j][i - 1]
            b = keys[j][i]
            if a < b:
                break
            if a > b:
                return i
        else:
            if strict:
                return i
    return n


cdef bint _sorted_within(idx_t** keys, int m, int64_t n, idx_t* last) noexcept nogil:
    """Whether, among the entries of each value of keys[0], the tuples keys[1:m] come in
    order (ties allowed); ``last`` holds each group's latest tuple plus one, m - 1 entries a
    group, zeroed (unset) on entry."""
    cdef int64_t i, base
    cdef int j
    cdef idx_t a, b
    for i in range(n):
        base = <int64_t>keys[0][i] * (m - 1)
        for j in range(1, m):
            a = last[base + j - 1]
            b = keys[j][i] + 1
            if a < b:
                break
            if a > b:
                return False
        for j in range(1, m):
            last[base + j - 1] = keys[j][i] + 1
    return True


cdef inline int64_t _next_row_start(kdx_t* key, int64_t n, int64_t i) noexcept nogil:
    """First entry at or after i whose key differs from key[i-1] (n if none); keys sorted."""
    cdef int64_t lo = i, hi = n, mid
    if i <= 0 or i >= n:
        return min(max(i, 0), n)
    cdef kdx_t r = key[i - 1]
    while lo < hi:
        mid = (lo + hi) // 2
        if key[mid] <= r:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline void _root_chunk(kdx_t* key, int64_t lo, int64_t hi, int64_t n, int64_t s, bint first,
                             idx_t* pos) noexcept nogil:
    """pos[c] = first entry with key >= c, for the rows that the entries lo:hi start or that
    lie in an empty gap before the entry after hi (every row after the last key, for the last
    chunk; the rows before key[0], for the first). The chunk starts and ends on a row boundary.
    Walked backwards, so the row start is simply the last store to pos[key[i]] (no branch on
    row boundaries); only the empty-row gaps branch."""
    cdef int64_t i, c, b
    cdef int64_t nxt = key[hi] if hi < n else s + 1
    for i in range(hi - 1, lo - 1, -1):
        b = key[i]
        pos[b] = <idx_t>i
        if b + 1 < nxt:
            for c in range(b + 1, nxt):
                pos[c] = <idx_t>(i + 1)
        nxt = b
    if first:
        for c in range(nxt):
            pos[c] = 0


cdef void _dense_root(kdx_t* key, int64_t n, int64_t s, idx_t* pos, int T) noexcept nogil:
    """pos[c] = first entry with key >= c (c = 0..s), for sorted keys under a single parent: the
    row pointer of a sorted COO, in one pass over the entries split into T contiguous ranges
    that begin and end on row boundaries (every pos slot is written by exactly one thread)."""
    cdef int t
    cdef int64_t c
    cdef int64_t bounds[65]
    if n == 0:
        for c in range(s + 1):
            pos[c] = 0
        return
    bounds[0] = 0
    bounds[T] = n
    for t in range(1, T):
        bounds[t] = max(bounds[t - 1], _next_row_start(key, n, _lo(n, t, T)))
    if T == 1:
        _started(0)
        _root_chunk(key, 0, n, n, s, True, pos)
        return
    for t in prange(T, schedule='static', chunksize=1, num_threads=T):
        _started(t)
        _root_chunk(key, bounds[t], bounds[t + 1], n, s, t == 0, pos)


cdef void _dense_split(idx_t* eoff, int64_t P, idx_t* key, int64_t s, idx_t* out, int T) noexcept nogil:
    """Split every parent's entry range by the coordinate of a dense level."""
    cdef int64_t p, c, i, end
    for p in prange(P, schedule='guided', num_threads=T):
        i = eoff[p]
        end = eoff[p + 1]
        for c in range(s):
            out[p * s + c] = <idx_t>i
            while i < end and key[i] == c:
                i = i + 1
    out[P * s] = eoff[P]


cdef inline bint _differs(idx_t** keys, int m, int64_t i) noexcept nogil:
    cdef int j
    for j in range(m):
        if keys[j][i] != keys[j][i - 1]:
            return True
    return False


cdef void _distinct_count(idx_t* eoff, int64_t P, idx_t** keys, int m, idx_t* pos, int T) noexcept nogil:
    """pos[p+1] = number of distinct key tuples in parent p's range (then a prefix sum)."""
    cdef int64_t p, i, cnt, run
    for p in prange(P, schedule='guided', num_threads=T):
        cnt = 0
        if eoff[p + 1] > eoff[p]:
            cnt = 1
            for i in range(eoff[p] + 1, eoff[p + 1]):
                if _differs(keys, m, i):
                    cnt = cnt + 1
        pos[p + 1] = <idx_t>cnt
    pos[0] = 0
    run = 0
    for p in range(P):
        run += pos[p + 1]
        pos[p + 1] = <idx_t>run


cdef void _distinct_fill(idx_t* eoff, int64_t P, idx_t** keys, int m, idx_t* pos,
                         idx_t** crds, idx_t* out, int T) noexcept nogil:
    """Write each distinct tuple's coordinates and the start of its entry range."""
    cdef int64_t p, i, q
    cdef int j
    for p in prange(P, schedule='guided', num_threads=T):
        q = pos[p]
        for i in range(eoff[p], eoff[p + 1]):
            if i == eoff[p] or _differs(keys, m, i):
                for j in range(m):
                    crds[j][q] = keys[j][i]
                out[q] = <idx_t>i
                q = q + 1
    out[pos[P]] = eoff[P]


cdef void _reduce(idx_t* eoff, int64_t count, num_t* vals, num_t* out, int T) noexcept nogil:
    """out[q] = sum of the values in q's entry range (OR for bool; 0 when empty). The sum
    starts from the first value, not from 0: a lone -0.0 stays -0.0 (0.0 + -0.0 is +0.0,
    and 1 / the entry would be +inf where dense torch gives -inf)."""
    cdef int64_t q, i, lo, hi
    cdef num_t acc
    for q in prange(count, schedule='static', num_threads=T):
        lo = eoff[q]
        hi = eoff[q + 1]
        if lo == hi:
            out[q] = 0
            continue
        acc = vals[lo]
        for i in range(lo + 1, hi):
            if num_t is uint8_t:
                acc = acc | vals[i]
            else:
                acc = acc + vals[i]
        out[q] = acc


cdef inline bint _nonzero(scan_t v) noexcept nogil:
    if scan_t is cfloat or scan_t is cdouble:
        return v.real != 0 or v.imag != 0
    elif scan_t is uint16_t:
        return (v & 0x7fff) != 0
    else:
        return v != 0


cdef void _scan_count(scan_t* x, int64_t rows, int64_t* rstart, int64_t m, int64_t stride,
                      int64_t* cnt, int T) noexcept nogil:
    """Nonzeros of every row of a strided view (pass 1 of the dense -> sparse scan)."""
    cdef int64_t r, j, c
    cdef scan_t* row
    for r in prange(rows, schedule='static', num_threads=T):
        row = x + rstart[r]
        c = 0
        if stride == 1:   # contiguous rows: a branch-free count the C compiler vectorizes
            for j in range(m):
                c = c + _nonzero(row[j])
        else:
            for j in range(m):
                c = c + _nonzero(row[j * stride])
        cnt[r] = c


cdef void _scan_fill(scan_t* x, int64_t rows, int64_t* rstart, int64_t m, int64_t stride,
                     int64_t* off, idx_t* inner, scan_t* vals, int T) noexcept nogil:
    """Pass 2: the last-level coordinate and the value of every nonzero, in storage order.
    Branch-free (every element is written at the next free slot, which advances only past
    a nonzero: no mispredicted branch per element at 20-50 % fill), and a row stops at its
    last nonzero (its count from pass 1), so no slot past the row's own is touched.
    Contiguous float / double rows with 32-bit coordinates go a vector at a time
    (``pack_nonzeros.h``), 2-3x faster than the element loop."""
    cdef int64_t r, j, q, end
    cdef scan_t* row
    cdef scan_t v
    # contiguous rows of float / double: eight (four) elements at a time (pack_nonzeros.h)
    if idx_t is int32_t:
        if scan_t is float:
            if stride == 1:
                for r in prange(rows, schedule='static', num_threads=T):
                    pack_row_f32(x + rstart[r], m, off[r], off[r + 1], inner, vals)
                return
        elif scan_t is double:
            if stride == 1:
                for r in prange(rows, schedule='static', num_threads=T):
                    pack_row_f64(x + rstart[r], m, off[r], off[r + 1], inner, vals)
                return
    for r in prange(rows, schedule='static', num_threads=T):
        row = x + rstart[r]
        q = off[r]
        end = off[r + 1]
        j = 0
        while q < end:
            v = row[j * stride]
            inner[q] = <idx_t>j
            vals[q] = v
            q = q + _nonzero(v)
            j = j + 1


cdef void _rows_key(int64_t* off, int64_t rows, int64_t div, int64_t size, idx_t* key, int T) noexcept nogil:
    """key of an outer level for every nonzero: (row // div) % size, repeated over the row."""
    cdef int64_t r, q, c
    for r in prange(rows, schedule='static', num_threads=T):
        c = (r // div) % size
        for q in range(off[r], off[r + 1]):
            key[q] = <idx_t>c


cdef void _place(idx_t* pos, idx_t* crd, int64_t P, int64_t* off, int64_t stride,
                 int64_t* out, bint singleton, int T) noexcept nogil:
    """Offsets into the dense result, one sparse level down (top-down to_dense)."""
    cdef int64_t p, q
    if singleton:
        for q in prange(P, schedule='static', num_threads=T):
            out[q] = off[q] + crd[q] * stride
    else:
        for p in prange(P, schedule='guided', num_threads=T):
            for q in range(pos[p], pos[p + 1]):
                out[q] = off[p] + crd[q] * stride


cdef void _place_dense(int64_t P, int64_t s, int64_t* off, int64_t stride, int64_t* out, int T) noexcept nogil:
    cdef int64_t p, c
    for p in prange(P, schedule='static', num_threads=T):
        for c in range(s):
            out[p * s + c] = off[p] + c * stride


# ----------------------------------------------------------------------------------------
# typed dispatch (Python level; one call per kernel, not per entry)
# ----------------------------------------------------------------------------------------

cdef inline bint _is64(t):
    return t.dtype == torch.int64


# SCORCH_ADAPTIVE_THREADS=0 keeps torch.get_num_threads() threads even on a busy machine
# (for measurements that want the parallel code path whatever the load)
cdef bint _ADAPTIVE = os.environ.get("SCORCH_ADAPTIVE_THREADS", "1") != "0"
cdef int _busy_others = 0
cdef double _slow_until = 0.0


cdef bytes _read_proc(str path):
    # os.open/os.read: half the cost of open() for these small /proc files
    cdef int fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


cdef double _CLK_TCK = <double>os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100.0
cdef double _win_t = -1.0
cdef double _win_busy = 0.0, _win_self = 0.0


def _cpu_ticks():
    """(busy ticks of the whole machine, CPU ticks of this process) from /proc."""
    v = _read_proc("/proc/stat").split(b"\n", 1)[0].split()[1:]
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy
    # (steal too: a core the hypervisor gave away is not ours)
    busy = int(v[0]) + int(v[1]) + int(v[2]) + int(v[5]) + int(v[6]) + (int(v[7]) if len(v) > 7 else 0)
    st = _read_proc("/proc/self/stat")
    f = st[st.rindex(b")") + 2:].split()
    return busy, int(f[11]) + int(f[12])


cdef int _runnable_others():
    """Cores that other processes kept busy over the last window (at least 0.1 s): the
    machine's busy CPU time minus this process's own, per elapsed time, rounded so that a
    neighbour using 0.7 of a core counts as one. CPU time, not a snapshot of runnable
    threads: this process's own OpenMP workers, spinning or asleep at the instant of a
    snapshot, made the count flip between calls. 0 where /proc cannot be read."""
    global _win_t, _win_busy, _win_self, _busy_others
    cdef double now = time.monotonic()
    if now - _win_t < 0.1:
        return _busy_others
    try:
        busy, own = _cpu_ticks()
    except (OSError, ValueError, IndexError):
        _busy_others = 0
        return 0
    if _win_t >= 0:
        others = ((busy - _win_busy) - (own - _win_self)) / ((now - _win_t) * _CLK_TCK)
        _busy_others = max(0, <int>(others + 0.3))
    _win_t, _win_busy, _win_self = now, busy, own
    return _busy_others


cdef void _note_start_lag(int T):
    """After a parallel region of T threads: a worker that began its chunk long after the
    first one had to wait for a core (a neighbour was running), so use one thread for the
    next half second. This catches bursty neighbours that a /proc snapshot misses."""
    global _slow_until
    if T < 2:
        return
    cdef double lo = _start_at[0], hi = _start_at[0]
    cdef int t
    for t in range(1, min(T, 64)):
        lo = min(lo, _start_at[t])
        hi = max(hi, _start_at[t])
    if hi - lo > 2e-4:
        _slow_until = time.monotonic() + 0.5


cdef int _team(int64_t work):
    """Threads worth waking for ``work`` entries. Small arrays stay on one thread, because
    waking a second one costs more than it saves. So does an oversubscribed machine: every
    parallel region ends in a barrier, and a worker that has to wait for a core costs a
    scheduler time slice (milliseconds, 10-20x the conversion itself) -- OpenMP's own
    dynamic mode (OMP_DYNAMIC) makes the same call from the load average."""
    if work < 100_000:
        return 1
    cdef int T = _threads()
    if T == 1 or not _ADAPTIVE:
        return T
    if time.monotonic() < _slow_until:
        return 1
    cdef int free_cores = _NCPU - _runnable_others()
    return max(1, min(T, free_cores))


def _k_expand_pos(pos, int64_t P, int64_t count):
    owner = torch.empty(count, dtype=pos.dtype)
    cdef int T = _team(count)
    cdef int64_t bounds[65]
    T = min(T, 64)
    if _is64(pos):
        _expand_pos(<int64_t*>_ptr(pos), P, <int64_t*>_ptr(owner), bounds, T)
    else:
        _expand_pos(<int32_t*>_ptr(pos), P, <int32_t*>_ptr(owner), bounds, T)
    _note_start_lag(T)
    return owner


def _k_counting_sort(key, int64_t s):
    """Destinations of a stable counting sort of ``key`` (values < s) and the bucket starts."""
    cdef int64_t n = key.numel()
    cdef int T = _team(n)
    dest = torch.empty(n, dtype=key.dtype)
    offsets = torch.empty(s + 1, dtype=key.dtype)
    cdef void* hist = calloc(max(1, T * s), key.element_size())
    if hist == NULL:
        raise MemoryError("counting sort histogram")
    try:
        if _is64(key):
            _counting_sort(<int64_t*>_ptr(key), n, s, <int64_t*>hist, <int64_t*>_ptr(offsets),
                           <int64_t*>_ptr(dest), T)
        else:
            _counting_sort(<int32_t*>_ptr(key), n, s, <int32_t*>hist, <int32_t*>_ptr(offsets),
                           <int32_t*>_ptr(dest), T)
    finally:
        free(hist)
    _note_start_lag(T)
    return dest, offsets


cdef void _scatter_any(idx_t* dest, int64_t n, void* src, void* out, int isz, int T) noexcept nogil:
    if isz == 4:
        _scatter(dest, n, <uint32_t*>src, <uint32_t*>out, T)
    elif isz == 8:
        _scatter(dest, n, <uint64_t*>src, <uint64_t*>out, T)
    elif isz == 2:
        _scatter(dest, n, <uint16_t*>src, <uint16_t*>out, T)
    elif isz == 1:
        _scatter(dest, n, <uint8_t*>src, <uint8_t*>out, T)
    else:
        _scatter(dest, n, <b16*>src, <b16*>out, T)


def _k_scatter(dest, src):
    out = torch.empty_like(src)
    cdef int64_t n = src.numel()
    cdef int T = _team(n)
    cdef int isz = src.element_size()
    if _is64(dest):
        _scatter_any(<int64_t*>_ptr(dest), n, _ptr(src), _ptr(out), isz, T)
    else:
        _scatter_any(<int32_t*>_ptr(dest), n, _ptr(src), _ptr(out), isz, T)
    return out


cdef void _gather_blocks(idx_t* blocks, int64_t nb, char* src, char* out, int64_t width,
                         int T) noexcept nogil:
    """Block ``b`` of ``out`` (``width`` bytes) is block ``blocks[b]`` of ``src``."""
    cdef int64_t b
    for b in prange(nb, schedule='static', num_threads=T):
        memcpy(out + b * width, src + blocks[b] * width, width)


def _k_gather_blocks(blocks, src, int64_t k, out):
    """``out[:] = src.view(-1, k)[blocks].view(-1)`` for contiguous ``src`` and ``out``: one
    memcpy per block (torch's 2-D index_select copies each row through its iterator, ~35 ns
    per 64-byte block; a pattern's values transposed over 32 attention heads move 128-byte
    blocks)."""
    cdef int64_t nb = blocks.numel()
    cdef int64_t width = k * src.element_size()
    if out.numel() != nb * k or out.dtype != src.dtype or not out.is_contiguous():
        raise ValueError("gather_blocks: out must be contiguous, of src's dtype, blocks x k values")
    cdef int T = _team(nb * k)
    if _is64(blocks):
        _gather_blocks(<int64_t*>_ptr(blocks), nb, <char*>_ptr(src), <char*>_ptr(out), width, T)
    else:
        _gather_blocks(<int32_t*>_ptr(blocks), nb, <char*>_ptr(src), <char*>_ptr(out), width, T)
    _note_start_lag(T)
    return out


cdef void _transpose_any(idx_t* pos, idx_t* crd, idx_t* rowmap, int64_t P, int64_t s, void* vals,
                         idx_t* hist, int64_t* bounds, idx_t* offsets, idx_t* rows_out, void* vals_out,
                         int isz, int T) noexcept nogil:
    if isz == 4:
        _transpose(pos, crd, rowmap, P, s, <uint32_t*>vals, hist, bounds, offsets, rows_out, <uint32_t*>vals_out, T)
    elif isz == 8:
        _transpose(pos, crd, rowmap, P, s, <uint64_t*>vals, hist, bounds, offsets, rows_out, <uint64_t*>vals_out, T)
    elif isz == 2:
        _transpose(pos, crd, rowmap, P, s, <uint16_t*>vals, hist, bounds, offsets, rows_out, <uint16_t*>vals_out, T)
    elif isz == 1:
        _transpose(pos, crd, rowmap, P, s, <uint8_t*>vals, hist, bounds, offsets, rows_out, <uint8_t*>vals_out, T)
    else:
        _transpose(pos, crd, rowmap, P, s, <b16*>vals, hist, bounds, offsets, rows_out, <b16*>vals_out, T)


cdef void _rows_to_dense(idx_t* pos, idx_t* crd, int64_t rows, mv_t* vals, int64_t rstride,
                         int64_t cstride, mv_t* out, int T) noexcept nogil:
    """A (dense, compressed) matrix's entries written into a dense buffer of zeros: row
    ``r``'s entry at column ``c`` goes to ``out[r * rstride + c * cstride]``."""
    cdef int64_t r, q
    for r in prange(rows, schedule='guided', num_threads=T):
        for q in range(pos[r], pos[r + 1]):
            out[r * rstride + crd[q] * cstride] = vals[q]


cdef void _rows_to_dense_any(idx_t* pos, idx_t* crd, int64_t rows, void* vals, int64_t rstride,
                             int64_t cstride, void* out, int isz, int T) noexcept nogil:
    if isz == 4:
        _rows_to_dense(pos, crd, rows, <uint32_t*>vals, rstride, cstride, <uint32_t*>out, T)
    elif isz == 8:
        _rows_to_dense(pos, crd, rows, <uint64_t*>vals, rstride, cstride, <uint64_t*>out, T)
    elif isz == 2:
        _rows_to_dense(pos, crd, rows, <uint16_t*>vals, rstride, cstride, <uint16_t*>out, T)
    elif isz == 1:
        _rows_to_dense(pos, crd, rows, <uint8_t*>vals, rstride, cstride, <uint8_t*>out, T)
    else:
        _rows_to_dense(pos, crd, rows, <b16*>vals, rstride, cstride, <b16*>out, T)


def _k_rows_to_dense(lv, int64_t rows, vals, int64_t rstride, int64_t cstride, out):
    cdef int64_t n = vals.numel()
    cdef int T = _team(n)
    cdef int isz = vals.element_size()
    if n == 0:
        return
    if _is64(lv.crd):
        _rows_to_dense_any(<int64_t*>_ptr(lv.pos), <int64_t*>_ptr(lv.crd), rows, _ptr(vals), rstride,
                           cstride, _ptr(out), isz, T)
    else:
        _rows_to_dense_any(<int32_t*>_ptr(lv.pos), <int32_t*>_ptr(lv.crd), rows, _ptr(vals), rstride,
                           cstride, _ptr(out), isz, T)


def _k_transpose(pos, crd, rowmap, int64_t P, int64_t s, vals):
    """(bucket starts, parent coordinate per entry, values) of a compressed level sorted by
    its own coordinate; pos/crd/rowmap share one index dtype."""
    cdef int64_t n = crd.numel()
    cdef int T = min(_team(n), 64)
    cdef int64_t bounds[65]
    offsets = torch.empty(s + 1, dtype=crd.dtype)
    rows = torch.empty(n, dtype=crd.dtype)
    out = torch.empty_like(vals)
    cdef void* hist = calloc(max(1, T * s), crd.element_size())
    if hist == NULL:
        raise MemoryError("transpose histogram")
    cdef void* rm = NULL if rowmap is None else _ptr(rowmap)
    cdef int isz = vals.element_size()
    try:
        if _is64(crd):
            _transpose_any(<int64_t*>_ptr(pos), <int64_t*>_ptr(crd), <int64_t*>rm, P, s, _ptr(vals),
                           <int64_t*>hist, bounds, <int64_t*>_ptr(offsets), <int64_t*>_ptr(rows),
                           _ptr(out), isz, T)
        else:
            _transpose_any(<int32_t*>_ptr(pos), <int32_t*>_ptr(crd), <int32_t*>rm, P, s, _ptr(vals),
                           <int32_t*>hist, bounds, <int32_t*>_ptr(offsets), <int32_t*>_ptr(rows),
                           _ptr(out), isz, T)
    finally:
        free(hist)
    _note_start_lag(T)
    return offsets, rows, out


cdef class _PtrList:
    """A C array of the data pointers of some index tensors (kept alive by ``refs``)."""
    cdef void** p
    cdef object refs

    def __cinit__(self, tensors):
        self.refs = list(tensors)
        self.p = <void**>calloc(max(1, len(self.refs)), sizeof(void*))
        for j, t in enumerate(self.refs):
            self.p[j] = _ptr(t)

    def __dealloc__(self):
        free(self.p)


def _k_unsorted_at(keys, bint strict=False):
    """First entry out of lexicographic order of ``keys`` (len(keys[0]) when sorted)."""
    if not keys:
        return 0
    cdef _PtrList pl = _PtrList(keys)
    cdef int m = len(keys)
    cdef int64_t n = keys[0].numel()
    if _is64(keys[0]):
        return _unsorted_at(<int64_t**>pl.p, m, n, strict)
    return _unsorted_at(<int32_t**>pl.p, m, n, strict)


def _k_sorted_within(keys, int64_t s):
    """Whether the entries are in order by keys[1:] within each group of equal keys[0] (whose
    values are below ``s``): then one stable pass on keys[0] sorts them all (rows moved as
    wholes: a flip, a roll, rows picked in any order). The groups' last tuples live in
    calloc'd memory: the pages a failing check never reaches (random input fails within a
    few entries) are never touched, so the check costs the entries it reads."""
    cdef int m = len(keys)
    cdef int64_t n = keys[0].numel()
    if m < 2 or n == 0:
        return True
    cdef _PtrList pl = _PtrList([k.contiguous() for k in keys])
    cdef bint wide = _is64(keys[0])
    cdef void* last = calloc(max(1, s * (m - 1)), 8 if wide else 4)
    if last == NULL:
        raise MemoryError("sorted-within check")
    cdef bint ok
    with nogil:
        if wide:
            ok = _sorted_within(<int64_t**>pl.p, m, n, <int64_t*>last)
        else:
            ok = _sorted_within(<int32_t**>pl.p, m, n, <int32_t*>last)
    free(last)
    return ok


def _k_dense_level(eoff, int64_t P, key, int64_t s, out_dtype=None, int threads=0):
    """Entry offsets below a dense level of size s under P parents (pos of the level after it);
    for P == 1 the result may have another index dtype than ``key`` (``out_dtype``).
    ``threads`` > 0 fixes the team size of the P == 1 kernel (tests)."""
    cdef int64_t n = key.numel()
    cdef int T
    if P == 1:
        T = min(threads if threads > 0 else _team(n), 64)
        out = torch.empty(s + 1, dtype=key.dtype if out_dtype is None else out_dtype)
        if _is64(key):
            if _is64(out):
                _dense_root(<int64_t*>_ptr(key), n, s, <int64_t*>_ptr(out), T)
            else:
                _dense_root(<int64_t*>_ptr(key), n, s, <int32_t*>_ptr(out), T)
        elif _is64(out):
            _dense_root(<int32_t*>_ptr(key), n, s, <int64_t*>_ptr(out), T)
        else:
            _dense_root(<int32_t*>_ptr(key), n, s, <int32_t*>_ptr(out), T)
        _note_start_lag(T)
        return out
    T = _team(n + P * s)
    out = torch.empty(P * s + 1, dtype=key.dtype)
    if _is64(key):
        _dense_split(<int64_t*>_ptr(eoff), P, <int64_t*>_ptr(key), s, <int64_t*>_ptr(out), T)
    else:
        _dense_split(<int32_t*>_ptr(eoff), P, <int32_t*>_ptr(key), s, <int32_t*>_ptr(out), T)
    return out


def _k_distinct(eoff, int64_t P, keys):
    """pos, crd per level of the run, and the entry offsets of the new positions."""
    cdef int T = _team(eoff[P].item() + P)
    cdef int m = len(keys)
    cdef _PtrList pk = _PtrList(keys)
    dt = eoff.dtype
    pos = torch.empty(P + 1, dtype=dt)
    if _is64(eoff):
        _distinct_count(<int64_t*>_ptr(eoff), P, <int64_t**>pk.p, m, <int64_t*>_ptr(pos), T)
    else:
        _distinct_count(<int32_t*>_ptr(eoff), P, <int32_t**>pk.p, m, <int32_t*>_ptr(pos), T)
    count = int(pos[P])
    crds = [torch.empty(count, dtype=dt) for _ in range(m)]
    out = torch.empty(count + 1, dtype=dt)
    cdef _PtrList pc = _PtrList(crds)
    if _is64(eoff):
        _distinct_fill(<int64_t*>_ptr(eoff), P, <int64_t**>pk.p, m, <int64_t*>_ptr(pos),
                       <int64_t**>pc.p, <int64_t*>_ptr(out), T)
    else:
        _distinct_fill(<int32_t*>_ptr(eoff), P, <int32_t**>pk.p, m, <int32_t*>_ptr(pos),
                       <int32_t**>pc.p, <int32_t*>_ptr(out), T)
    return pos, crds, out


cdef void _reduce_any(void* eoff, bint e64, int64_t count, num_t* vals, num_t* out, int T) noexcept nogil:
    if e64:
        _reduce(<int64_t*>eoff, count, vals, out, T)
    else:
        _reduce(<int32_t*>eoff, count, vals, out, T)


cdef _reduce_typed(eoff, int64_t count, vals, out, int T):
    cdef void* ep = _ptr(eoff)
    cdef bint e64 = _is64(eoff)
    cdef void* vp = _ptr(vals)
    cdef void* op = _ptr(out)
    dt = vals.dtype
    if dt == torch.float32: _reduce_any(ep, e64, count, <float*>vp, <float*>op, T)
    elif dt == torch.float64: _reduce_any(ep, e64, count, <double*>vp, <double*>op, T)
    elif dt == torch.int32: _reduce_any(ep, e64, count, <int32_t*>vp, <int32_t*>op, T)
    elif dt == torch.int64: _reduce_any(ep, e64, count, <int64_t*>vp, <int64_t*>op, T)
    elif dt == torch.bool: _reduce_any(ep, e64, count, <uint8_t*>vp, <uint8_t*>op, T)
    elif dt == torch.complex64: _reduce_any(ep, e64, count, <cfloat*>vp, <cfloat*>op, T)
    else: _reduce_any(ep, e64, count, <cdouble*>vp, <cdouble*>op, T)


def _k_reduce(eoff, int64_t count, vals):
    """Values of ``count`` positions from their entry ranges (sum of duplicates, zero fill)."""
    dt = vals.dtype
    if dt not in _NATIVE_SUM:
        wide = _WIDEN.get(dt)
        if wide is None:
            raise TypeError(f"values of dtype {dt} cannot be summed")
        return _k_reduce(eoff, count, vals.to(wide)).to(dt)
    out = torch.empty(count, dtype=dt)
    _reduce_typed(eoff, count, vals.contiguous(), out, _team(count + vals.numel()))
    return out


cdef void _scan_any(scan_t* x, int64_t rows, int64_t* rs, int64_t m, int64_t stride, int64_t* cnt,
                    int64_t* off, void* inner, bint w64, void* vals, bint fill, int T) noexcept nogil:
    if not fill:
        _scan_count(x, rows, rs, m, stride, cnt, T)
    elif w64:
        _scan_fill(x, rows, rs, m, stride, off, <int64_t*>inner, <scan_t*>vals, T)
    else:
        _scan_fill(x, rows, rs, m, stride, off, <int32_t*>inner, <scan_t*>vals, T)


cdef _scan_typed(int kind, x, int64_t rows, rstart, int64_t m, int64_t stride, cnt, off, inner, vals,
                 bint fill, int T):
    """Pass 1 (count, ``fill`` False) or 2 (fill) of the dense scan, for the element type
    ``kind`` (see _SCAN_AS)."""
    cdef int64_t* rs = <int64_t*>_ptr(rstart)
    cdef int64_t* cp = <int64_t*>_ptr(cnt)
    cdef int64_t* op = <int64_t*>_ptr(off) if fill else NULL
    cdef void* xp = _ptr(x)
    cdef void* vp = _ptr(vals) if fill else NULL
    cdef void* ip = _ptr(inner) if fill else NULL
    cdef bint w64 = fill and _is64(inner)
    if kind == 0: _scan_any(<float*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    elif kind == 1: _scan_any(<double*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    elif kind == 2: _scan_any(<int8_t*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    elif kind == 3: _scan_any(<uint8_t*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    elif kind == 4: _scan_any(<int16_t*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    elif kind == 5: _scan_any(<uint16_t*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    elif kind == 6: _scan_any(<int32_t*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    elif kind == 7: _scan_any(<int64_t*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    elif kind == 8: _scan_any(<cfloat*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)
    else: _scan_any(<cdouble*>xp, rows, rs, m, stride, cp, op, ip, w64, vp, fill, T)


def _k_rows_key(off, int64_t rows, int64_t div, int64_t size, dtype):
    key = torch.empty(int(off[rows]), dtype=dtype)
    cdef int T = _team(key.numel())
    if dtype == torch.int64:
        _rows_key(<int64_t*>_ptr(off), rows, div, size, <int64_t*>_ptr(key), T)
    else:
        _rows_key(<int64_t*>_ptr(off), rows, div, size, <int32_t*>_ptr(key), T)
    return key


def _k_place(lv, int64_t P, int64_t count, off, int64_t stride):
    out = torch.empty(count, dtype=torch.int64)
    cdef int T = _team(count)
    cdef bint single = lv.pos is None
    if lv.kind is _DENSE:
        _place_dense(P, lv.size, <int64_t*>_ptr(off), stride, <int64_t*>_ptr(out), T)
        return out
    pos = lv.crd if single else lv.pos
    crd = lv.crd
    if _is64(crd):
        _place(<int64_t*>_ptr(pos), <int64_t*>_ptr(crd), P, <int64_t*>_ptr(off), stride,
               <int64_t*>_ptr(out), single, T)
    else:
        _place(<int32_t*>_ptr(pos), <int32_t*>_ptr(crd), P, <int64_t*>_ptr(off), stride,
               <int64_t*>_ptr(out), single, T)
    return out


# ----------------------------------------------------------------------------------------
# the level-by-level algorithm
# ----------------------------------------------------------------------------------------

def _level_counts(st: Storage) -> List[int]:
    """Position count of every level of ``st`` (count[k] = positions of level k)."""
    counts, P = [], 1
    for lv in st.levels:
        if lv.kind is _DENSE:
            P = P * lv.size
        elif lv.pos is not None:
            P = int(lv.pos[P]) if lv.pos.numel() > P else 0
        counts.append(P)
    return counts


def _decode(st: Storage, dtype: torch.dtype, bint keep=False) -> List[torch.Tensor]:
    """Coordinate of every stored value at every level of ``st``, in storage order (``keep``:
    a level's crd stays in the source's index dtype instead of ``dtype``).

    Works bottom-up with the position of each value at the current level (``anc``), so a
    level whose positions are the values' own (the last level, and coordinate levels of the
    last run) hands over its ``crd`` without a copy."""
    counts = _level_counts(st)
    L = len(st.levels)
    n = counts[-1] if L else 1
    out: List[Optional[torch.Tensor]] = [None] * L
    anc = None  # position of each value at level k; None = the identity
    for k in range(L - 1, -1, -1):
        lv = st.levels[k]
        parents = counts[k - 1] if k else 1
        if lv.kind is _DENSE:
            a = anc if anc is not None else torch.arange(n, dtype=dtype)
            if parents == 1:
                out[k] = a
                anc = torch.zeros(n, dtype=dtype) if k else None
            else:
                out[k] = torch.remainder(a, lv.size)
                anc = torch.div(a, lv.size, rounding_mode="floor")
            continue
        crd = lv.crd if keep else lv.crd.to(dtype)
        out[k] = crd if anc is None else crd.index_select(0, anc)
        if lv.pos is not None and k:
            owner = _k_expand_pos(lv.pos.to(dtype), parents, counts[k])
            anc = owner if anc is None else owner.index_select(0, anc)
    return out


def _keys_from_levels(lc: Sequence[torch.Tensor], src: Storage, fmt: Format,
                      shape: Sequence[int], dtype: torch.dtype):
    """Coordinates per target level from coordinates per source level (block aware); also
    the source level each target key is (None where blocks differ and it is recomputed)."""
    sizes = level_sizes(shape, fmt)
    sblk, tblk = src.format.block, fmt.block
    where = {(lv.dim, lv.block_inner): k for k, lv in enumerate(src.levels)}
    keys, origin = [], []
    for d, s, inner in sizes:
        sb = sblk[d] if sblk else 1
        tb = tblk[d] if tblk else 1
        if sb == tb and (d, inner) in where:
            k = where[(d, inner)]
            keys.append(lc[k])
            origin.append(k)
            continue
        full = lc[where[(d, False)]].to(torch.int64)
        if (d, True) in where:
            full = full * sb + lc[where[(d, True)]]
        part = torch.remainder(full, tb) if inner else torch.div(full, tb, rounding_mode="floor")
        keys.append(part.to(dtype))
        origin.append(None)
    return keys, origin


def _work_dtype(shape: Sequence[int], fmt: Format, n: int) -> torch.dtype:
    """Index type of the working arrays: int32 when even the largest possible result fits."""
    bound = 1
    for kind, (_, s, _) in zip(level_kinds(fmt), level_sizes(shape, fmt)):
        bound = bound * s if kind is _DENSE else min(bound * s, n)
    return index_dtype_for(shape, max(n, bound))


def _sort(keys: List[torch.Tensor], values: torch.Tensor, sizes: Sequence[int], need: int,
          keep_first: bool):
    """Stable LSD sort of the entries by keys[0:need] (keys[need:] already in order).

    Returns the sorted keys and values and, when the last pass was a counting sort on key
    0, its bucket starts (then keys[0] is left unsorted unless ``keep_first``)."""
    n = values.numel()
    offsets0 = None
    for k in range(need - 1, -1, -1):
        s = sizes[k]
        if s <= 4 * n + (1 << 16):
            dest, offsets = _k_counting_sort(keys[k], s)
            drop_own = k == 0 and not keep_first
            keys = [keys[j] if (j == k and drop_own) else _k_scatter(dest, keys[j])
                    for j in range(len(keys))]
            values = _k_scatter(dest, values)
            offsets0 = offsets if k == 0 else None
            if drop_own:
                keys[0] = None
        else:
            perm = torch.sort(keys[k], stable=True).indices
            keys = [key.index_select(0, perm) for key in keys]
            values = values.index_select(0, perm)
            offsets0 = None
    return keys, values, offsets0


def _build(shape: Sequence[int], fmt: Format, keys: List[Optional[torch.Tensor]], values: torch.Tensor,
           n_input: int, unique: bool, start: int = 0, eoff=None, parents: int = 1,
           offsets0=None) -> Storage:
    """Build the levels ``start:`` of ``fmt`` from entries sorted by level coordinates.

    ``eoff`` gives, for each of the ``parents`` positions above level ``start``, where its
    entries begin (None at the root). ``offsets0`` are the bucket starts of a counting sort
    on level 0 (so keys[0] may be None)."""
    kinds = level_kinds(fmt)
    sizes = level_sizes(shape, fmt)
    L = len(kinds)
    n = values.numel()
    # keys may still have the source's index dtype (int64 from torch): the kernels that need
    # one index dtype get them in wdt; the dense root and the last unique level read them as is
    wdt = _work_dtype(shape, fmt, n)
    root = start == 0 and eoff is None
    built = [(None, None)] * L  # levels above ``start`` are dense
    k = start
    while k < L:
        kind = kinds[k]
        s = sizes[k][1]
        if root and (kind is not _DENSE or offsets0 is None) and not (kind is _DENSE and parents == 1):
            eoff = torch.tensor([0, n], dtype=wdt)
        elif eoff is None and not root:  # every position so far holds one entry
            eoff = torch.arange(parents + 1, dtype=wdt)
        root = False
        if kind is _DENSE:
            if k == L - 1 and parents > 1 and eoff is not None and not (k == 0 and offsets0 is not None):
                # a dense last level under many parents (``cd``, ``cdd``): scatter the values
                # to parent * s + coordinate instead of building parents * s + 1 entry
                # offsets (an index per dense position, beyond what the format stores)
                values = _scatter_dense_last(eoff, parents, keys[k], s, values)
                eoff = None
                parents *= s
                built[k] = (None, None)
                k += 1
                continue
            if k == 0 and offsets0 is not None:
                eoff = offsets0
            else:  # (a single parent needs no entry offsets)
                eoff = _k_dense_level(eoff, parents, keys[k] if parents == 1 else keys[k].to(wdt), s, wdt)
            parents *= s
            built[k] = (None, None)
            k += 1
            continue
        end = k + 1
        if kind is _COORDINATE:
            while end < L and kinds[end] is _COORDINATE:
                end += 1
        if k == 0 and offsets0 is not None and keys[0] is None:  # compressed root from the bucket starts
            nonempty = torch.nonzero(offsets0[1:] != offsets0[:-1]).reshape(-1)
            crds = [nonempty.to(wdt)]
            eoff = torch.cat([offsets0[:-1][nonempty], offsets0[-1:]])
            parents = nonempty.numel()
            pos = torch.tensor([0, parents], dtype=wdt)
        elif unique and end == L:
            pos, crds, eoff = eoff, keys[k:end], None
            parents = n
        else:
            pos, crds, eoff = _k_distinct(eoff, parents, [key.to(wdt) for key in keys[k:end]])
            parents = crds[0].numel()
        for j in range(k, end):
            built[j] = (pos if j == k else None, crds[j - k])
        k = end
    count = parents
    vals = values if eoff is None else _k_reduce(eoff, count, values)
    idx = index_dtype_for(shape, max(count, n_input))
    levels = [Level(kind, d, s, _as_index(pos, idx), _as_index(crd, idx), inner)
              for (d, s, inner), kind, (pos, crd) in zip(sizes, kinds, built)]
    return Storage(fmt, shape, levels, vals, idx)


def _scatter_dense_last(eoff, int64_t parents, key, int64_t s, values):
    """Values of a dense last level: entry i (of parent p, by ``eoff``) lands at p * s +
    key[i]; repeated coordinates are summed (ORed for bool), unstored positions are zero.
    Memory: one int64 per entry, none per dense position."""
    cdef int64_t n = values.numel()
    owner = _k_expand_pos(eoff, parents, n).to(torch.int64)
    where = owner * s + key.to(torch.int64)
    dt = values.dtype
    if dt == torch.bool:
        out = torch.zeros(parents * s, dtype=torch.bool)
        out[where[values]] = True
        return out
    wide = dt if dt in _NATIVE_SUM else _WIDEN.get(dt)
    if wide is None:
        raise TypeError(f"values of dtype {dt} cannot be summed")
    out = torch.zeros(parents * s, dtype=wide)
    out.index_add_(0, where, values.to(wide))
    return out if wide == dt else out.to(dt)


cdef _as_index(t, idx):
    if t is None or (t.dtype == idx and t.is_contiguous()):
        return t
    return t.to(idx).contiguous()


def _assemble(shape, fmt: Format, keys: List[torch.Tensor], values: torch.Tensor, n_input: int,
              need: int, unique: bool, reject_duplicates: bool = False) -> Storage:
    """Sort by the first ``need`` keys where the data is not already in order, then build."""
    kinds = level_kinds(fmt)
    sizes = [s for _, s, _ in level_sizes(shape, fmt)]
    if need > 0 and _k_unsorted_at(keys) == values.numel():
        need = 0    # already in level order (a reshape's or a selection's entries): no sort
    while need > 0 and _k_unsorted_at(keys[need - 1:]) == values.numel():
        need -= 1
    if need > 1 and sizes[0] * (len(keys) - 1) <= 4 * values.numel() + (1 << 16) \
            and _k_sorted_within(keys, sizes[0]):
        need = 1    # whole groups out of place, each in order inside: one counting pass
    keep_first = kinds[0] is _COORDINATE or reject_duplicates
    keys, values, offsets0 = _sort(keys, values, sizes, need, keep_first)
    if reject_duplicates:
        at = _k_unsorted_at(keys, True)
        if at < values.numel():
            dup = [int(k[at]) for k in keys]
            raise ValueError(f"indices has a duplicate coordinate (level coordinates {dup}) and "
                             f"sum_duplicates=False")
        unique = True
    return _build(shape, fmt, keys, values, n_input, unique, offsets0=offsets0)


# ----------------------------------------------------------------------------------------
# public functions
# ----------------------------------------------------------------------------------------

def _check_shape(shape) -> Tuple[int, ...]:
    if isinstance(shape, torch.Size):
        return tuple(int(s) for s in shape)
    try:
        items = list(shape)
    except TypeError:
        raise ValueError(f"size must be a sequence of non-negative ints, got {shape!r}") from None
    out = []
    for d, s in enumerate(items):
        if isinstance(s, torch.Tensor) and s.numel() == 1:
            s = s.item()
        if isinstance(s, float) and math.isnan(s):
            raise ValueError(f"size[{d}] is NaN; sizes must be non-negative ints")
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise ValueError(f"size[{d}] = {s!r} is not an int")
        if s < 0:
            raise ValueError(f"size[{d}] = {s} is negative")
        out.append(int(s))
    return tuple(out)


def _check_format(fmt: Format, shape: Sequence[int]) -> None:
    if not isinstance(fmt, Format):
        raise ValueError(f"format must be a scorch.Format, got {fmt!r}")
    if fmt.rank != len(shape):
        raise ValueError(f"format {fmt} has {fmt.rank} levels but the tensor has {len(shape)} dimensions")
    if fmt.block is not None:
        for d, (s, b) in enumerate(zip(shape, fmt.block)):
            if s % b:
                raise ValueError(f"size[{d}] = {s} is not divisible by the block size {b} of format {fmt!r}")


def _check_values_dtype(dtype, name: str = "values") -> None:
    """The one table of value dtypes sparse storage supports; ``name`` is the operand."""
    if dtype not in _SCAN_AS:
        raise TypeError(f"{name} of dtype {dtype} are not supported (expected a float, int, bool "
                        f"or complex dtype)")


def from_coords(indices, values, shape: Sequence[int], fmt: Format,
                sum_duplicates: bool = True) -> Storage:
    """Storage of ``fmt`` holding ``values`` at the columns of ``indices`` (ndim x n).

    Entries may come in any order; duplicates are summed (ORed for bool) because that is
    what torch's ``coalesce`` does, so a tensor built from coordinates means the same in
    both libraries. ``sum_duplicates=False`` promises unique coordinates (a ValueError says
    otherwise) and lets the last level reuse the sorted keys without a distinct pass."""
    shape = _check_shape(shape)
    _check_format(fmt, shape)
    if not isinstance(indices, torch.Tensor):
        try:
            indices = torch.as_tensor(np.asarray(indices))
        except Exception:
            raise ValueError(f"indices must be an integer tensor of shape (ndim, n), got {type(indices).__name__}") from None
    if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise ValueError(f"indices must have an integer dtype, got {indices.dtype}")
    if indices.dim() != 2:
        raise ValueError(f"indices must be 2-d (ndim x n), got {indices.dim()}-d of shape {tuple(indices.shape)}")
    if indices.shape[0] != len(shape):
        raise ValueError(f"indices has {indices.shape[0]} rows but size {shape} has {len(shape)} dimensions")
    if not isinstance(values, torch.Tensor):
        values = torch.as_tensor(values)
    _check_values_dtype(values.dtype)
    if values.dim() != 1:
        raise ValueError(f"values must be 1-d, got shape {tuple(values.shape)}")
    n = indices.shape[1]
    if values.numel() != n:
        raise ValueError(f"values has {values.numel()} entries but indices has {n} columns")
    if n:
        lo = indices.min(dim=1).values.tolist()
        hi = indices.max(dim=1).values.tolist()
        for d in range(len(shape)):
            if lo[d] < 0 or hi[d] >= shape[d]:
                bad = lo[d] if lo[d] < 0 else hi[d]
                raise ValueError(f"indices out of range in dimension {d}: coordinate {bad} "
                                 f"for size {shape[d]}")
    values = values.contiguous()
    wdt = _work_dtype(shape, fmt, n)
    idx = indices.to(wdt)
    dims = [idx[d].contiguous() for d in range(len(shape))]
    if fmt.block is None:
        keys = [dims[d] for d in fmt.mode_order]
    else:
        blk = fmt.block
        keys = [torch.div(dims[d], blk[d], rounding_mode="floor") for d in fmt.mode_order]
        keys += [torch.remainder(dims[d], blk[d]) for d in range(len(shape))]
    return _assemble(shape, fmt, keys, values, n, len(keys), unique=False,
                     reject_duplicates=not sum_duplicates)


def _level_view(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """``x`` as a strided view with one dimension per stored level, in level order."""
    if fmt.block is None:
        return x.permute(fmt.mode_order)
    r = x.dim()
    split = x
    for d in range(r - 1, -1, -1):
        split = split.unflatten(d, (x.shape[d] // fmt.block[d], fmt.block[d]))
    order = [2 * d for d in fmt.mode_order] + [2 * d + 1 for d in range(r)]
    return split.permute(order)


def from_dense(x: torch.Tensor, fmt: Format) -> Storage:
    """Storage of ``fmt`` holding the nonzeros of the strided tensor ``x`` (any strides).

    The tensor is scanned in the target's level order (two passes: count per row, then fill),
    so the entries arrive sorted and nothing is sorted afterwards; the leading dense levels
    come straight from the per-row counts."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided or not x.is_cpu:
        raise ValueError(f"x must be a strided CPU tensor, got layout {x.layout} on {x.device}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (a 0-d tensor has no sparse format)")
    shape = tuple(x.shape)
    _check_format(fmt, shape)
    _check_values_dtype(x.dtype)
    if fmt.block is None and fmt.levels == _DENSE_COMPRESSED:   # CSR, CSC
        return _compressed_rows_from_dense(x, fmt, shape)
    kinds = level_kinds(fmt)
    sizes = [s for _, s, _ in level_sizes(shape, fmt)]
    if all(kd is _DENSE for kd in kinds):  # every position stored: a permuted copy
        vals = _level_view(x, fmt).contiguous().reshape(-1)
        if vals.data_ptr() == x.data_ptr():
            vals = vals.clone()
        return _build(shape, fmt, [None] * len(kinds), vals, int((x != 0).sum()), True,
                      start=len(kinds), eoff=None, parents=vals.numel())
    y = _level_view(x, fmt)
    L = y.dim()
    m, stride = sizes[-1], y.stride(-1)
    outer = sizes[:-1]
    rows = 1
    for s in outer:
        rows *= s
    # start offset (in elements) of every row of the level view
    rstart = torch.zeros(1, dtype=torch.int64)
    for s, st in zip(outer, y.stride()[:-1]):
        rstart = (rstart[:, None] + torch.arange(s, dtype=torch.int64)[None, :] * st).reshape(-1)
    cdef int T = _team(x.numel())
    cdef int kind = _SCAN_AS[x.dtype]
    cnt = torch.empty(rows, dtype=torch.int64)
    # data_ptr of the view already includes the storage offset
    _scan_typed(kind, y, rows, rstart, m, stride, cnt, None, None, None, False, T)
    off = torch.zeros(rows + 1, dtype=torch.int64)
    torch.cumsum(cnt, 0, out=off[1:])
    n = int(off[rows])
    wdt = _work_dtype(shape, fmt, n)
    inner = torch.empty(n, dtype=wdt)
    vals = torch.empty(n, dtype=x.dtype)
    _scan_typed(kind, y, rows, rstart, m, stride, cnt, off, inner, vals, True, T)
    # leading dense levels come from the row counts; the other outer keys are written out
    lead = 0
    while lead < L - 1 and kinds[lead] is _DENSE:
        lead += 1
    keys: List[Optional[torch.Tensor]] = [None] * L
    keys[L - 1] = inner
    div = rows
    for k in range(L - 1):
        div = div // outer[k] if outer[k] else 0
        if k >= lead:
            keys[k] = _k_rows_key(off, rows, div, outer[k], wdt) if rows else torch.empty(0, dtype=wdt)
    group, parents = 1, 1
    for s in outer[lead:]:
        group *= s
    for s in outer[:lead]:
        parents *= s
    eoff = off[::group].to(wdt).contiguous() if rows else torch.zeros(parents + 1, dtype=wdt)
    return _build(shape, fmt, keys, vals, n, True, start=lead, eoff=eoff, parents=parents)


def _compressed_rows_from_dense(x: torch.Tensor, fmt: Format, shape: tuple) -> Storage:
    """``from_dense`` for a matrix into a dense level over a compressed one (CSR, CSC): the
    two scans write the row pointers and the columns straight into the level arrays, with
    none of the general path's per-level bookkeeping (a 64 x 784 batch: ~60 us less), and
    x read through its own strides (no permuted view, no arange: ~4 us less)."""
    d0, d1 = fmt.mode_order
    cdef int64_t rows = shape[d0], m = shape[d1], r
    cdef int64_t rstride = x.stride(d0)
    cdef int T = _team(rows * m)
    rstart = torch.empty(rows, dtype=torch.int64)
    cdef int64_t* rs = <int64_t*>_ptr(rstart)
    for r in range(rows):
        rs[r] = r * rstride
    off = torch.empty(rows + 1, dtype=torch.int64)
    cdef int64_t* op = <int64_t*>_ptr(off)
    op[0] = 0
    cnt = off[1:]
    cdef int kind = _SCAN_AS[x.dtype]
    _scan_typed(kind, x, rows, rstart, m, x.stride(d1), cnt, None, None, None, False, T)
    for r in range(rows):
        op[r + 1] += op[r]
    cdef int64_t n = op[rows]
    idt = torch.int32 if max(n, rows, m) <= INT32_MAX else torch.int64
    crd = torch.empty(n, dtype=idt)
    vals = torch.empty(n, dtype=x.dtype)
    _scan_typed(kind, x, rows, rstart, m, x.stride(d1), cnt, off, crd, vals, True, T)
    cdef int32_t* o32
    if idt == torch.int32:   # the row pointers in the index dtype (a copy loop, no torch call)
        pos = torch.empty(rows + 1, dtype=torch.int32)
        o32 = <int32_t*>_ptr(pos)
        for r in range(rows + 1):
            o32[r] = <int32_t>op[r]
    else:
        pos = off
    return Storage(fmt, shape, [Level(_DENSE, d0, rows), Level(_COMPRESSED, d1, m, pos, crd)], vals, idt)


def _dense_strides(st: Storage) -> List[int]:
    """Element stride in the contiguous dense result of one step at each level."""
    cstride = [1] * st.ndim
    for d in range(st.ndim - 2, -1, -1):
        cstride[d] = cstride[d + 1] * st.shape[d + 1]
    blk = st.format.block
    return [cstride[lv.dim] * (1 if (blk is None or lv.block_inner) else blk[lv.dim])
            for lv in st.levels]


def to_dense(st: Storage, out=None) -> torch.Tensor:
    """The contiguous dense tensor (dimension order) of a storage, written into ``out`` (zeroed,
    contiguous, the storage's shape and dtype) where one is given."""
    if st.ndim == 0:
        return st.values.reshape(()).clone()
    fmt = st.format
    if fmt.block is None and fmt.is_dense:
        inverse = [0] * st.ndim
        for k, d in enumerate(fmt.mode_order):
            inverse[d] = k
        lvshape = [st.shape[d] for d in fmt.mode_order]
        dense = st.values.reshape(lvshape).permute(inverse).contiguous()
        return dense.clone() if dense.data_ptr() == st.values.data_ptr() else dense
    if out is None:
        out = torch.zeros(st.shape, dtype=st.dtype)
    strides = _dense_strides(st)
    lv0 = st.levels[0]
    if st.ndim == 2 and fmt.block is None and lv0.kind is _DENSE and st.levels[1].kind is _COMPRESSED:
        # CSR / CSC (or either seen transposed): one pass writes every entry in place, with
        # no offsets array (a 64 x 784 batch as its 784 x 64 transpose: 37 -> 10 us)
        _k_rows_to_dense(st.levels[1], lv0.size, st.values, strides[0], strides[1], out)
        return out
    off = torch.zeros(1, dtype=torch.int64)
    P = 1
    for lv, stride in zip(st.levels, strides):
        if lv.kind is _DENSE:
            count = P * lv.size
        elif lv.pos is not None:
            count = int(lv.pos[P]) if lv.pos.numel() > P else 0
        else:
            count = P
        off = _k_place(lv, P, count, off, stride)
        P = count
    if P:
        out.view(-1)[off] = st.values
    return out


def coords(st: Storage) -> torch.Tensor:
    """int64 (ndim, nnz): the coordinate of every stored value, in storage order (also of an
    unordered storage: the coordinates pair with ``st.values`` position by position)."""
    nnz = st.nnz
    out = torch.empty((st.ndim, nnz), dtype=torch.int64)
    if st.ndim == 0:
        return out
    lc = _decode(st, st.index_dtype)
    blk = st.format.block
    if blk is None:
        for lv, c in zip(st.levels, lc):
            out[lv.dim].copy_(c)
        return out
    out.zero_()
    for lv, c in zip(st.levels, lc):
        if lv.block_inner:
            out[lv.dim].add_(c)
        else:
            out[lv.dim].add_(c.to(torch.int64) * blk[lv.dim])
    return out


def _presorted(src: Storage, origin: Sequence[Optional[int]]) -> int:
    """Smallest k such that the source's storage order already sorts the keys k: (it does
    when they are the source's own first levels, in order)."""
    need = len(origin)
    for k in range(len(origin) - 1, -1, -1):
        if list(origin[k:]) == list(range(len(origin) - k)):
            need = k
    return need


def _is_transpose(st: Storage, fmt: Format) -> bool:
    """A 2-level source ending in a compressed level whose dimensions the (non-coordinate
    rooted) target stores in the other order: CSR <-> CSC, DCSR -> DCSC, CSR -> DCSC, ..."""
    if len(st.levels) != 2 or st.format.block is not None or fmt.block is not None:
        return False
    k0, k1 = st.levels[0].kind, st.levels[1].kind
    return (k1 is _COMPRESSED and k0 is not _COORDINATE and fmt.levels[0] is not _COORDINATE
            and fmt.mode_order == st.format.mode_order[::-1])


def convert(st: Storage, fmt: Format) -> Storage:
    """The same tensor in another format, without a dense intermediate; stored values (also
    stored zeros) are kept, and only positions that a dense target level creates are zero.
    An unordered source (``einsum(..., sorted=False)``) is sorted first: the result is canonical."""
    _check_format(fmt, st.shape)
    st = st.with_sorted_coordinates()
    if fmt == st.format:
        return st
    n = st.nnz
    wdt = _work_dtype(st.shape, fmt, n)
    if _is_transpose(st, fmt) and st.levels[1].size <= 4 * n + (1 << 16):
        # the source's last level is compressed and the target stores its dimensions the other
        # way round: one counting-sort transpose moves parent coordinates and values at once.
        # Its histogram has one counter per column (per thread), so a dimension much wider
        # than the entries (2^32 columns, a few hundred entries) takes the sorting path below,
        # which allocates O(nnz) (plus the target's own pos array where its first level is dense)
        lv0, lv1 = st.levels
        rowmap = None if lv0.kind is _DENSE else lv0.crd.to(wdt)
        parents = lv0.size if lv0.kind is _DENSE else lv0.crd.numel()
        offsets, rows, vals = _k_transpose(lv1.pos.to(wdt), lv1.crd.to(wdt), rowmap, parents,
                                           lv1.size, st.values)
        if fmt.levels == _DENSE_COMPRESSED:   # CSR <-> CSC: the bucket starts are the pointers
            idt = index_dtype_for(st.shape, n)
            return Storage(fmt, st.shape, [Level(_DENSE, fmt.mode_order[0], lv1.size),
                                           Level(_COMPRESSED, fmt.mode_order[1], lv0.size,
                                                 _as_index(offsets, idt), _as_index(rows, idt))],
                           vals, idt)
        return _build(st.shape, fmt, [None, rows], vals, n, True, offsets0=offsets)
    lc = _decode(st, wdt, keep=True)
    keys, origin = _keys_from_levels(lc, st, fmt, st.shape, wdt)
    need = _presorted(st, origin)
    # sorting works in one index dtype; keys that are only read (no sort) keep the source's
    keys = [k.contiguous() if need == 0 else k.to(wdt).contiguous() for k in keys]
    return _assemble(st.shape, fmt, keys, st.values, n, need, unique=True)


def _start_lag() -> float:
    """Seconds between threads 0 and 1 starting their chunks in the last instrumented
    parallel region of two or more threads (for tuning the adaptive team size)."""
    return max(_start_at[t] for t in range(2)) - min(_start_at[t] for t in range(2))


def _threads_for(work: int) -> int:
    """The team size a kernel over ``work`` entries would use now (for tests and tuning)."""
    return _team(work)


def free_cores(int T) -> int:
    """How many of ``T`` threads to wake now: ``T``, less the cores that threads of other
    processes are running on (this process's own spinning OpenMP workers do not count).
    Generated kernels use it too (``tensor_compiler._threads_for``)."""
    if T <= 1 or not _ADAPTIVE:
        return T
    return max(1, min(T, _NCPU - _runnable_others()))
