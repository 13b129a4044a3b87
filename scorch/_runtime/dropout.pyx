# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Dense dropout's mask-and-scale, with a counter-based RNG: ``out[i] = x[i] * (keep_i ? 1/(1-p) : 0)``.

Why: torch's CPU dropout draws its mask with ``bernoulli_`` on one thread and then multiplies,
~25 ns an element (18 of a Cora-scale GCN step's 45 ms). Here element ``i`` is kept iff
``mix(mix(i * golden + k0) ^ k1) < (1-p) * 2^32``, ``mix`` a 32-bit integer hash and
``(k0, k1)`` the call's 64-bit seed: a pure function of ``(seed, i)`` in 32-bit lanes, so the
loop vectorizes on AVX2 as on AVX-512 (no 64-bit multiplies), splits across threads with the
same result at any thread count, and the backward regenerates the mask from the seed instead
of storing it. A new seed per call comes from torch's generator. Multiplying (not selecting) keeps torch's
``NaN * 0 = NaN``. Built for AVX-512, AVX2 and baseline x86-64 (``target_clones``: the loader
picks the machine's), since setup.py compiles the runtime without ``-march``.
"""
from libc.stdint cimport int64_t, uint64_t

cdef extern from * nogil:
    """
    #include <stdint.h>
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    #define SCORCH_DROPOUT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
    #else
    #define SCORCH_DROPOUT_CLONES
    #endif
    /* lowbias32 (C. Wellons' hash prospector): a 32-bit bijection with near-ideal avalanche */
    static inline uint32_t scorch_mix32(uint32_t h) {
        h ^= h >> 16; h *= 0x7feb352dU;
        h ^= h >> 15; h *= 0x846ca68bU;
        h ^= h >> 16;
        return h;
    }
    /* element i's draw: two keyed rounds over the low 32 bits of i; the high bits go into the
       second key (a block never straddles a 2^32 boundary) */
    static inline uint32_t scorch_draw(uint32_t lo, uint32_t k0, uint32_t k1) {
        return scorch_mix32(scorch_mix32(lo * 0x9E3779B9U + k0) ^ k1);
    }
    #define SCORCH_DROPOUT_BODY(T)                                                        \\
        for (int64_t i = i0; i < i1; ++i) {                                               \\
            T m = (scorch_draw((uint32_t)i, k0, k1) < thresh) ? scale : (T)0;             \\
            out[i] = x[i] * m;                                                            \\
        }
    SCORCH_DROPOUT_CLONES
    static void scorch_dropout_block_f32(const float* __restrict x, float* __restrict out,
            int64_t i0, int64_t i1, uint32_t k0, uint32_t k1, uint32_t thresh, float scale) {
        SCORCH_DROPOUT_BODY(float)
    }
    SCORCH_DROPOUT_CLONES
    static void scorch_dropout_block_f64(const double* __restrict x, double* __restrict out,
            int64_t i0, int64_t i1, uint32_t k0, uint32_t k1, uint32_t thresh, double scale) {
        SCORCH_DROPOUT_BODY(double)
    }
    /* in place (out == x) must not go through the __restrict loops */
    template <typename T>
    static void scorch_dropout_block_alias(const T* x, T* out, int64_t i0, int64_t i1,
            uint32_t k0, uint32_t k1, uint32_t thresh, T scale) {
        SCORCH_DROPOUT_BODY(T)
    }
    static inline void scorch_dropout_block(const float* x, float* out, int64_t i0, int64_t i1,
            uint32_t k0, uint32_t k1, uint32_t thresh, float scale) {
        if (x == out) scorch_dropout_block_alias<float>(x, out, i0, i1, k0, k1, thresh, scale);
        else scorch_dropout_block_f32(x, out, i0, i1, k0, k1, thresh, scale);
    }
    static inline void scorch_dropout_block(const double* x, double* out, int64_t i0, int64_t i1,
            uint32_t k0, uint32_t k1, uint32_t thresh, double scale) {
        if (x == out) scorch_dropout_block_alias<double>(x, out, i0, i1, k0, k1, thresh, scale);
        else scorch_dropout_block_f64(x, out, i0, i1, k0, k1, thresh, scale);
    }
    template <typename T>
    static void scorch_dropout(const T* x, T* out, int64_t n, uint64_t seed, uint32_t thresh,
                               T scale, int nthreads) {
        const int64_t block = 8192;     /* divides 2^32 */
        const int64_t nblocks = (n + block - 1) / block;
        const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        #pragma omp parallel for schedule(static) num_threads(nthreads) if(nthreads > 1)
        for (int64_t b = 0; b < nblocks; ++b) {
            int64_t i0 = b * block, i1 = i0 + block < n ? i0 + block : n;
            uint32_t hi = (uint32_t)((uint64_t)i0 >> 32);
            scorch_dropout_block(x, out, i0, i1, k0, hi ? k1 ^ scorch_mix32(hi) : k1, thresh,
                                 scale);
        }
    }
    """
    void scorch_dropout[T](const T* x, T* out, int64_t n, uint64_t seed, unsigned int thresh,
                           T scale, int nthreads)


def keep_threshold(double keep) -> int:
    """The 32-bit draw below which an element is kept: ``keep * 2^32``, within (0, 2^32)."""
    cdef double t = keep * 4294967296.0
    if t < 1.0:
        return 1
    if t > 4294967295.0:
        return 4294967295
    return <unsigned int>(t + 0.5)


def mask_scale(size_t x, size_t out, int64_t n, bint is_double, uint64_t seed,
               unsigned int thresh, double scale, int nthreads):
    """``out[:n] = x[:n] * mask * scale`` over contiguous float32 (or float64) buffers given by
    address; ``out`` may be ``x``."""
    if n <= 0:
        return
    if is_double:
        with nogil:
            scorch_dropout[double](<const double*>x, <double*>out, n, seed, thresh, scale,
                                   nthreads)
    else:
        with nogil:
            scorch_dropout[float](<const float*>x, <float*>out, n, seed, thresh, <float>scale,
                                  nthreads)
