# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Moves of a dense matrix that follow a sparse operand's stored entries: the rows of a
result computed dense that hold a non-zero, moved to its front (``dense_route``: a ``cd``
result), and the columns a sparse batch touches, gathered out of a weight stored out x in
(and their gradient scattered back: ``sparse_ops/gathered_columns.py``).

Why here: torch's ops for these take extra passes and fresh arrays (``ne(0).any(1)``, a
gather: 0.8 ms for 20,000 x 32 floats, against ~0.05 ms), or walk the matrix element by
element along its long stride (``index_select`` of 9,000 columns out of a 256 x 80,000
weight, then a transpose: 8 ms). Each loop here reads what it needs once, in its layout.
"""
from libc.stdint cimport int64_t, intptr_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memmove
from cython.parallel cimport parallel, prange

import torch

__all__ = ["compact_nonzero_rows", "gather_columns", "scatter_columns"]


cdef inline void* _ptr(t):
    return <void*><intptr_t>t.data_ptr()


ctypedef fused word_t:
    uint8_t
    uint16_t
    uint32_t
    uint64_t


cdef int64_t _compact(word_t* a, int64_t n0, int64_t w, word_t mask, int64_t* rows) noexcept nogil:
    """Rows of ``a`` (``n0`` x ``w`` words) holding a word with a bit of ``mask`` set, moved
    in order to the front; their numbers in ``rows``; returns how many."""
    cdef int64_t r, j, k = 0
    cdef word_t* row
    for r in range(n0):
        row = a + r * w
        for j in range(w):
            if row[j] & mask:
                if k != r:
                    memmove(a + k * w, row, w * sizeof(word_t))
                rows[k] = r
                k += 1
                break
    return k


#: the bits that make an element non-zero, by element size: a float's all but its sign bit
#: (-0.0 is zero, NaN is not: like ``v != 0``); integers and bool are read as bytes
_FLOAT_MASKS = {2: 0x7fff, 4: 0x7fffffff, 8: 0x7fffffffffffffff}


def compact_nonzero_rows(flat: torch.Tensor) -> torch.Tensor:
    """Moves the rows of the contiguous matrix ``flat`` that hold a non-zero (NaN counts,
    -0.0 does not) to its front, in place and in order; returns their numbers (int64).
    A row is read up to its first non-zero and moved only when a dropped row precedes it."""
    if flat.dim() != 2 or not flat.is_contiguous():
        raise ValueError("compact_nonzero_rows: expected a contiguous matrix")
    cdef int64_t n0 = flat.shape[0], w = flat.shape[1], k
    rows = torch.empty(n0, dtype=torch.int64)
    if n0 == 0 or w == 0:
        return rows[:0]
    x = torch.view_as_real(flat) if flat.is_complex() else flat
    cdef int word = x.element_size()
    cdef uint64_t mask
    if x.is_floating_point() and word in _FLOAT_MASKS:
        mask = _FLOAT_MASKS[word]
        w = x.numel() // n0
    else:
        word, mask, w = 1, 0xff, x.numel() * word // n0
    cdef void* a = _ptr(x)
    cdef int64_t* rp = <int64_t*>_ptr(rows)
    with nogil:
        if word == 1:
            k = _compact(<uint8_t*>a, n0, w, <uint8_t>mask, rp)
        elif word == 2:
            k = _compact(<uint16_t*>a, n0, w, <uint16_t>mask, rp)
        elif word == 4:
            k = _compact(<uint32_t*>a, n0, w, <uint32_t>mask, rp)
        else:
            k = _compact(<uint64_t*>a, n0, w, <uint64_t>mask, rp)
    return rows[:k]


ctypedef fused real_t:
    float
    double

#: a task moves a band of rows (one 64-byte line of each destination row: 16 floats / 8
#: doubles) for a chunk of TASK_COLS columns: it reads each of its rows forward through
#: the chunk's (sorted) columns into a 128 KB staging block, then writes each destination
#: line whole (written straight from the rows, destination lines R values apart fall into
#: a few L1 sets). Gathering 9,450 random columns of a 256 x 80,000 float32 weight takes
#: ~10 ms at 1 thread and ~5.5 at 2 (Zen 4), as torch's ``index_select`` along the rows
#: does, where reading the whole weight takes 4.8 ms: the columns touch 87 % of its lines,
#: fetched with gaps. The gain over torch is the layout: the copy comes out as the kernel
#: reads it, and the gradient goes back into the weight's own layout.
DEF TASK_COLS = 2048
DEF BAND_BYTES = 64


cdef void _gather_task(const real_t* s, int64_t sr, const int64_t* cols, int64_t c0, int64_t c1,
                       int64_t rb, int64_t R, real_t* d, real_t* block) noexcept nogil:
    cdef int64_t band = BAND_BYTES // sizeof(real_t), r, c
    cdef int64_t r1 = min(rb + band, R), w = r1 - rb
    cdef const real_t* row
    for r in range(rb, r1):
        row = s + r * sr
        for c in range(c0, c1):
            block[(c - c0) * band + (r - rb)] = row[cols[c]]
    for c in range(c0, c1):
        memcpy(d + c * R + rb, block + (c - c0) * band, w * sizeof(real_t))


cdef void _scatter_task(const real_t* g, const int64_t* cols, int64_t c0, int64_t c1, int64_t rb,
                        int64_t R, real_t* d, int64_t dr, real_t* block) noexcept nogil:
    cdef int64_t band = BAND_BYTES // sizeof(real_t), r, c
    cdef int64_t r1 = min(rb + band, R), w = r1 - rb
    cdef real_t* row
    for c in range(c0, c1):
        memcpy(block + (c - c0) * band, g + c * R + rb, w * sizeof(real_t))
    for r in range(rb, r1):
        row = d + r * dr
        for c in range(c0, c1):
            row[cols[c]] = block[(c - c0) * band + (r - rb)]


cdef void _move(const void* src, int64_t sr, const int64_t* cols, int64_t n, int64_t R, void* dst,
                int64_t dr, bint wide, bint scatter, int T) noexcept nogil:
    """Every (column chunk, row band) task of a gather (or scatter) over ``T`` threads."""
    cdef int64_t band = BAND_BYTES // (8 if wide else 4)
    cdef int64_t nbands = (R + band - 1) // band, nchunks = (n + TASK_COLS - 1) // TASK_COLS
    cdef int64_t t, c0, c1, rb
    cdef void* block
    with parallel(num_threads=T):
        block = malloc(TASK_COLS * BAND_BYTES)
        for t in prange(nchunks * nbands, schedule='dynamic'):
            c0 = (t // nbands) * TASK_COLS
            c1 = min(c0 + TASK_COLS, n)
            rb = (t % nbands) * band
            if scatter and wide:
                _scatter_task(<const double*>src, cols, c0, c1, rb, R, <double*>dst, dr, <double*>block)
            elif scatter:
                _scatter_task(<const float*>src, cols, c0, c1, rb, R, <float*>dst, dr, <float*>block)
            elif wide:
                _gather_task(<const double*>src, sr, cols, c0, c1, rb, R, <double*>dst, <double*>block)
            else:
                _gather_task(<const float*>src, sr, cols, c0, c1, rb, R, <float*>dst, <float*>block)
        free(block)


cdef _moved(src, cols, dst, int64_t sr, int64_t dr, int64_t n, int64_t R, bint scatter, int threads):
    """:func:`_move` over the tensors' memory (nothing to move when empty)."""
    if n == 0 or R == 0:
        return
    cdef const int64_t* cp = <const int64_t*>_ptr(cols)
    cdef void* sp = _ptr(src)
    cdef void* dp = _ptr(dst)
    cdef bint wide = src.dtype == torch.float64
    with nogil:
        _move(sp, sr, cp, n, R, dp, dr, wide, scatter, max(1, threads))


def _checked(x: torch.Tensor, cols: torch.Tensor, int64_t limit, str name) -> None:
    if x.dim() != 2 or x.stride(1) != 1 or x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{name}: expected a float32/float64 matrix with contiguous rows")
    if cols.dtype != torch.int64 or cols.dim() != 1 or not cols.is_contiguous():
        raise ValueError(f"{name}: expected the columns as a contiguous 1-D int64 tensor")
    if cols.numel() and (int(cols.min()) < 0 or int(cols.max()) >= limit):
        raise IndexError(f"{name}: a column is out of range for {limit} columns")


def gather_columns(x: torch.Tensor, cols: torch.Tensor, out: torch.Tensor, int threads=1) -> None:
    """``out[:] = x[:, cols].t()`` for a float32 / float64 matrix ``x`` whose rows are
    contiguous and a contiguous ``out`` (``ncols`` x rows); ``cols`` sorted for the source
    to stream (any order is correct)."""
    _checked(x, cols, x.shape[1], "gather_columns")
    cdef int64_t R = x.shape[0], n = cols.numel(), sr = x.stride(0)
    if tuple(out.shape) != (n, R) or not out.is_contiguous() or out.dtype != x.dtype:
        raise ValueError("gather_columns: out must be a contiguous ncols x rows matrix of x's dtype")
    _moved(x, cols, out, sr, 0, n, R, False, threads)


def scatter_columns(g: torch.Tensor, cols: torch.Tensor, out: torch.Tensor, int threads=1) -> None:
    """``out[:, cols] = g.t()`` (``cols`` distinct): :func:`gather_columns`'s adjoint, into a
    zeroed ``out`` (rows x width, contiguous rows) the caller allocates."""
    _checked(out, cols, out.shape[1], "scatter_columns")
    g = g.contiguous()
    cdef int64_t n = g.shape[0], R = g.shape[1] if g.dim() == 2 else -1
    if g.dim() != 2 or n != cols.numel() or R != out.shape[0] or g.dtype != out.dtype:
        raise ValueError("scatter_columns: g must be ncols x rows of out's dtype")
    _moved(g, cols, out, 0, out.stride(0), n, R, True, threads)
