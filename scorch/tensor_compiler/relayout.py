"""Re-layout of a dense operand so that the kernel's innermost loop reads it with stride 1.

SDDMM ``ij,ik,kj->ij`` reads ``C[k, j]`` along ``k`` (the innermost loop): the kernel is
specialized for a unit stride there, so a row-major ``C`` is transposed once per call.
``x.t().contiguous()`` runs element by element through the whole matrix (7-13x slower
than a streaming copy on the dev box: 77-197 ms for a 128 x 325k float32 matrix, more
than the SDDMM itself), so 2-D transposes of float32/float64 go through a small compiled
kernel instead: 128 x 256 tiles (long runs along each source row for the prefetcher, the
destination lines stay in L2), columns of tiles split across threads; inside a tile two
register-transposed blocks one above the other write each destination cache line whole
(1 thread, under load: 128 x 5300 float32 0.109 -> 0.078 ms, 32 x 15606 0.067 -> 0.059 ms;
equal where the copy is bound by memory, 32 x 65536). Other cases (rank > 2, other dtypes) use torch.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

import torch

from ..level_storage import materialized
from .allocate import empty_output

__all__ = ["relayout", "transposed", "relayout_pays", "gather_pays", "out_of_order",
           "in_dimension_order", "COPY_PER_READ"]

#: a kernel that can read the operand with its own strides (``lower.facts.reads_strided``:
#: SDDMM's C as K x n, a cache line per value read) re-lays it out only when the copy moves
#: at most COPY_PER_READ entries per entry the kernel reads. SDDMM, C 32 x 200k and 128 x
#: 200k, 2000 rows, 1 thread, under load (copy / strided ms): 100 copied per read: K = 32
#: 4.8 / 0.37, K = 128 17.2 / 3.1; 20: 5.5 / 3.4, 15.7 / 13.5; 8: 6.5 / 7.5, 16.5 / 33.3;
#: 1: 9.3 / 49, 28 / 268 (``python benchmarks/results/issue15/sddmm4/relayout_crossing.py``)
COPY_PER_READ = 12

#: a tile is TILE_R source rows x TILE_C source columns (measured on the dev box, 128 x 325k
#: float32 at 1 thread: 64 x 64 52 ms, 128 x 128 34 ms, 128 x 256 33 ms; torch 137 ms)
TILE_R = 128
TILE_C = 256
#: the tile where the destination's row stride (R values) is a multiple of ALIASED_STRIDE
#: bytes: 256 destination rows that far apart share a handful of L1 sets and evict each
#: other on every block. Tall and narrow instead (1 thread, Zen 5, float32, us, default ->
#: narrow): 512 x 784 256 -> 44, 512 x 256 88 -> 19, 1024 x 1024 771 -> 290, 4096 x 128
#: 377 -> 120, 2048 x 2048 3174 -> 2234; strides off the power of two keep the default
#: (784 x 512 40 vs 51, 128 x 100000 23 vs 30 ms)
ALIASED_TILE_R = 512
ALIASED_TILE_C = 16
ALIASED_STRIDE = 2048

_SRC = """# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# scorch re-layout kernel: 2-D tiled transpose, {ct}
from libc.stdint cimport int64_t
from cython.parallel cimport prange

cdef extern from *:
    \"\"\"
    #include <stdint.h>
    #if defined(__AVX__)
    #include <immintrin.h>
    #endif
    /* d[c * dr + r] = s[r * sr + c] for a B x B block (B = 8 floats / 4 doubles): with AVX, B
       row loads, an in-register transpose (unpack, shuffle, 128-bit lane swap), B row stores */
    static inline void scorch_tr_float(const float* s, int64_t sr, float* d, int64_t dr) {{
    #if defined(__AVX__)
        __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + sr), r2 = _mm256_loadu_ps(s + 2 * sr),
               r3 = _mm256_loadu_ps(s + 3 * sr), r4 = _mm256_loadu_ps(s + 4 * sr),
               r5 = _mm256_loadu_ps(s + 5 * sr), r6 = _mm256_loadu_ps(s + 6 * sr),
               r7 = _mm256_loadu_ps(s + 7 * sr);
        __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
               t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
               t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(d + dr, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(d + 2 * dr, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(d + 3 * dr, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(d + 4 * dr, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(d + 5 * dr, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(d + 6 * dr, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(d + 7 * dr, _mm256_permute2f128_ps(u3, u7, 0x31));
    #else
        for (int c = 0; c < 8; c++) for (int r = 0; r < 8; r++) d[c * dr + r] = s[r * sr + c];
    #endif
    }}
    static inline void scorch_tr_double(const double* s, int64_t sr, double* d, int64_t dr) {{
    #if defined(__AVX__)
        __m256d r0 = _mm256_loadu_pd(s), r1 = _mm256_loadu_pd(s + sr),
                r2 = _mm256_loadu_pd(s + 2 * sr), r3 = _mm256_loadu_pd(s + 3 * sr);
        __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1),
                t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
        _mm256_storeu_pd(d, _mm256_permute2f128_pd(t0, t2, 0x20));
        _mm256_storeu_pd(d + dr, _mm256_permute2f128_pd(t1, t3, 0x20));
        _mm256_storeu_pd(d + 2 * dr, _mm256_permute2f128_pd(t0, t2, 0x31));
        _mm256_storeu_pd(d + 3 * dr, _mm256_permute2f128_pd(t1, t3, 0x31));
    #else
        for (int c = 0; c < 4; c++) for (int r = 0; r < 4; r++) d[c * dr + r] = s[r * sr + c];
    #endif
    }}
    \"\"\"
    void scorch_tr_{ct}(const {ct}* s, int64_t sr, {ct}* d, int64_t dr) noexcept nogil

DEF B = {B}

cdef void tile(const {ct}* s, {ct}* d, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
               int64_t sr, int64_t sc, int64_t R) noexcept nogil:
    cdef int64_t r, c, rb = r0, cb
    if sc == 1:
        # two B x B blocks one above the other, so that each destination line (2 B values:
        # 64 bytes) is written whole at once, not half now and half 256 columns later
        while rb + 2 * B <= r1:
            cb = c0
            while cb + B <= c1:
                scorch_tr_{ct}(s + rb * sr + cb, sr, d + cb * R + rb, R)
                scorch_tr_{ct}(s + (rb + B) * sr + cb, sr, d + cb * R + rb + B, R)
                cb = cb + B
            for c in range(cb, c1):
                for r in range(rb, rb + 2 * B):
                    d[c * R + r] = s[r * sr + c]
            rb = rb + 2 * B
        # B x B blocks transposed in registers, then the ragged right and bottom edges
        while rb + B <= r1:
            cb = c0
            while cb + B <= c1:
                scorch_tr_{ct}(s + rb * sr + cb, sr, d + cb * R + rb, R)
                cb = cb + B
            for c in range(cb, c1):
                for r in range(rb, rb + B):
                    d[c * R + r] = s[r * sr + c]
            rb = rb + B
    for c in range(c0, c1):
        for r in range(rb, r1):
            d[c * R + r] = s[r * sr + c * sc]

def transpose(size_t src, size_t dst, int64_t R, int64_t C, int64_t sr, int64_t sc, int nthreads):
    # dst (C x R, contiguous)[c, r] = src[r * sr + c * sc]
    cdef const {ct}* s = <const {ct}*>src
    cdef {ct}* d = <{ct}*>dst
    cdef int64_t nb = (C + {TC} - 1) // {TC}, b, r0, c0
    if nthreads <= 1 or nb < 2:
        with nogil:
            for b in range(nb):
                c0 = b * {TC}
                for r0 in range(0, R, {TR}):
                    tile(s, d, r0, min(r0 + {TR}, R), c0, min(c0 + {TC}, C), sr, sc, R)
    else:
        for b in prange(nb, nogil=True, schedule='dynamic', num_threads=nthreads):
            c0 = b * {TC}
            r0 = 0
            while r0 < R:
                tile(s, d, r0, min(r0 + {TR}, R), c0, min(c0 + {TC}, C), sr, sc, R)
                r0 = r0 + {TR}
"""

_CTYPES = {torch.float32: "float", torch.float64: "double"}
_kernels = {}

#: Re-laid-out copies live only for one kernel call, so they are written into a buffer kept
#: per (thread, slot, dtype) and reused by the next call: a fresh 512 KB tensor is
#: page-faulted on every call, and a small one costs more in torch's allocation and view
#: calls (~3 us) than its transpose. Buffers up to SCRATCH_MAX bytes are kept (with the view
#: of the last shape); a call needing more allocates (numpy's huge pages: a fresh 100 MB
#: costs ~10 ms of faults, less than its transpose). The bound is what stays held after the
#: operands are freed, per thread (it was 1 GiB: 0.4-2.3 GB held after ``A @ X.t()``).
SCRATCH_MAX = 32 << 20
_local = threading.local()


def _scratch_view(slot: int, dtype: torch.dtype, R: int, C: int):
    """(the C x R destination seen as R x C, its address) in this thread's buffer for slot."""
    views = getattr(_local, "views", None)
    if views is None:
        views = _local.views = {}
        _local.bufs = {}
    key = (slot, dtype)
    v = views.get(key)
    if v is not None and v[0] == R and v[1] == C:
        return v[2], v[3]
    n = R * C
    if n * (4 if dtype == torch.float32 else 8) > SCRATCH_MAX:
        d = empty_output((n,), dtype).view(C, R).t()
        return d, d.data_ptr()
    b = _local.bufs.get(key)
    if b is None or b.numel() < n:
        b = _local.bufs[key] = empty_output((max(n, 1024),), dtype)
    d = b[:n].view(C, R).t()
    views[key] = (R, C, d, d.data_ptr())
    return d, views[key][3]


def _kernel(dtype: torch.dtype, dest_row: int = 0):
    """The transpose kernel for ``dtype`` whose destination rows hold ``dest_row`` values
    (the tile depends on whether their stride aliases in the caches, see ALIASED_TILE_R)."""
    aliased = dest_row > 1 and (dest_row * (4 if dtype == torch.float32 else 8)) % ALIASED_STRIDE == 0
    k = _kernels.get((dtype, aliased))
    if k is None:
        from .build import load_kernel
        tr, tc = (ALIASED_TILE_R, ALIASED_TILE_C) if aliased else (TILE_R, TILE_C)
        src = _SRC.format(ct=_CTYPES[dtype], TR=tr, TC=tc, B=8 if dtype == torch.float32 else 4)
        k = load_kernel(src, f"relayout_{_CTYPES[dtype]}").transpose
        _kernels[(dtype, aliased)] = k
    return k


def relayout_pays(entries: int, reads: int) -> bool:
    """Whether copying an operand of ``entries`` entries to stride 1 costs less than the
    kernel's ``reads`` reads of it with its own (large) stride."""
    return entries <= COPY_PER_READ * reads


def gather_pays(entries: int, stored: int, extent: int) -> bool:
    """Whether an operand of ``entries`` entries that a sparse loop gathers along a
    dimension of ``extent`` (``lower.facts.gather_relayouts``) is copied to loop order: each
    of the ``stored`` entries reads ``entries / extent`` values of it, each a cache line of
    its own in the given layout; the copy pays under :func:`relayout_pays`'s rule, i.e. when
    the sparse operand stores at least ``extent / COPY_PER_READ`` entries. The MoE expert
    gradient (1024 x 784 ``x``, 2048 stored gates) copies; a gate of a few entries does not."""
    return extent > 0 and relayout_pays(entries, stored * (entries // extent))


def in_dimension_order(out: torch.Tensor, perm: Sequence[int],
                       threads_for: Optional[Callable[[int], int]] = None) -> torch.Tensor:
    """A fresh contiguous ``out.permute(perm)``: an output the kernel wrote in loop order, as
    torch returns results (a matrix through the tiled transpose)."""
    if out.dim() == 2 and tuple(perm) == (1, 0):
        return transposed(out, threads_for)
    return out.permute(tuple(perm)).contiguous()


def out_of_order(x: torch.Tensor, pairs) -> bool:
    """Whether ``x`` nests a dimension ``w`` outside ``u`` for one of the pairs ``(u, w)``
    (``lower.facts.order_relayouts``: ``u`` looped above a sparse loop, ``w`` below it)."""
    return any(x.stride(w) > x.stride(u) and x.shape[w] > 1 and x.shape[u] > 1 for u, w in pairs)


def transposed(x: torch.Tensor, threads_for: Optional[Callable[[int], int]] = None) -> torch.Tensor:
    """A fresh contiguous ``x.t()`` of a 2-D tensor (any strides): through the tiled kernel
    for float32 / float64 (a 64 x 784 batch: 6 vs 21 us for ``x.t().contiguous()``), torch
    for other dtypes. Unlike :func:`relayout` the result is the caller's to keep."""
    if x.dtype not in _CTYPES or x.numel() == 0 or type(x) is not torch.Tensor or not x.is_cpu:
        return x.t().contiguous()   # (a meta / subclass operand: the caller's check says why)
    x = materialized(x)
    R, C = x.shape
    d = empty_output((C, R), x.dtype)
    nt = threads_for(R * C) if threads_for is not None else 1
    _kernel(x.dtype, R)(x.data_ptr(), d.data_ptr(), R, C, x.stride(0), x.stride(1), nt)
    return d


def relayout(x: torch.Tensor, perm: Sequence[int], inv: Sequence[int],
             threads_for: Optional[Callable[[int], int]] = None, slot: int = 0) -> torch.Tensor:
    """``x`` with the same shape and values, laid out as ``x.permute(perm).contiguous()``
    (then viewed back through ``inv``). The result is scratch (see :data:`SCRATCH_MAX`):
    valid until the next call with the same ``slot`` on this thread."""
    if x.dim() == 2 and x.dtype in _CTYPES and x.numel() > 0:
        # the kernel writes S^T row-major for a source S: S = x for a transpose; S = x.t()
        # where x is a transposed view made row-major in its own order (W @ x.t()'s x^T)
        src = x if tuple(perm) == (1, 0) else x.t() if x.stride(0) == 1 else None
        if src is not None:
            R, C = src.shape
            d, ptr = _scratch_view(slot, x.dtype, R, C)
            nt = threads_for(R * C) if threads_for is not None else 1
            _kernel(x.dtype, R)(src.data_ptr(), ptr, R, C, src.stride(0), src.stride(1), nt)
            return d if src is x else d.t()
    return x.permute(tuple(perm)).contiguous().permute(tuple(inv))
