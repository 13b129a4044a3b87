/* Left-packing the nonzeros of a contiguous dense row: the fill pass of dense -> sparse.

Why: the scalar fill (write every element at the next free slot, advance past a nonzero) is
one loop-carried dependency per element, ~2 ns each: 100 us for a 64 x 784 MNIST batch, most
of ``scorch.sparse_tensor(batch)``. With AVX2 eight elements go at once: a compare gives an
8-bit mask, a 256-entry table turns the mask into the lane permutation that moves the nonzero
lanes to the front, and the packed values and their coordinates are stored whole; the next
block starts past the nonzeros only. A block is stored only while eight slots of the row's
own range remain (its count from the first pass), so nothing past the row is written and
parallel rows never touch each other's slots; the rest of the row goes the scalar way.
The runtime is compiled without ``-march``, so the AVX2 body is a ``target`` function chosen
at run time; AVX-512 machines take it too. Elements compare like C's ``v != 0``: NaN is
stored, -0.0 is not. */
#pragma once
#include <stdint.h>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define SCORCH_PACK_X86 1
#endif

namespace scorch {

/* the scalar fill of a row from element j on: slots q..end-1 get its nonzeros in order */
template <typename T, typename I>
static inline void pack_row_from(const T* row, int64_t j, int64_t q, int64_t end, I* crd, T* val) {
    while (q < end) {
        T v = row[j];
        crd[q] = (I)j;
        val[q] = v;
        q += (v != 0);
        ++j;
    }
}

template <typename T, typename I>
static inline void pack_row_scalar(const T* row, int64_t q, int64_t end, I* crd, T* val) {
    pack_row_from(row, 0, q, end, crd, val);
}

#ifdef SCORCH_PACK_X86
/* lane permutations: entry m lists the set bits of m (low to high), then the rest */
struct PackTable {
    alignas(32) int32_t perm[256][8];
    PackTable() {
        for (int m = 0; m < 256; ++m) {
            int k = 0;
            for (int b = 0; b < 8; ++b)
                if (m >> b & 1) perm[m][k++] = b;
            for (int b = 0; b < 8; ++b)
                if (!(m >> b & 1)) perm[m][k++] = b;
        }
    }
};
static const PackTable PACK_TABLE;

__attribute__((target("avx2,popcnt")))
static void pack_row_avx2_f32(const float* row, int64_t m, int64_t q, int64_t end,
                              int32_t* crd, float* val) {
    const __m256 zero = _mm256_setzero_ps();
    int64_t j = 0;
    while (q + 8 <= end && j + 8 <= m) {
        __m256 v = _mm256_loadu_ps(row + j);
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_NEQ_UQ));
        __m256i perm = _mm256_load_si256((const __m256i*)PACK_TABLE.perm[mask]);
        _mm256_storeu_ps(val + q, _mm256_permutevar8x32_ps(v, perm));
        _mm256_storeu_si256((__m256i*)(crd + q), _mm256_add_epi32(perm, _mm256_set1_epi32((int32_t)j)));
        q += __builtin_popcount(mask);
        j += 8;
    }
    pack_row_from(row, j, q, end, crd, val);   // the row's last slots
}

/* doubles: four lanes, each moved as two 32-bit halves through the same table */
__attribute__((target("avx2,popcnt")))
static void pack_row_avx2_f64(const double* row, int64_t m, int64_t q, int64_t end,
                              int32_t* crd, double* val) {
    const __m256d zero = _mm256_setzero_pd();
    int64_t j = 0;
    while (q + 4 <= end && j + 4 <= m) {
        __m256d v = _mm256_loadu_pd(row + j);
        int mask = _mm256_movemask_pd(_mm256_cmp_pd(v, zero, _CMP_NEQ_UQ));
        /* the table's first four entries for a 4-bit mask permute lanes 0..3 */
        __m128i lanes = _mm_load_si128((const __m128i*)PACK_TABLE.perm[mask]);
        __m256i two_k = _mm256_slli_epi64(_mm256_cvtepu32_epi64(lanes), 1);   // lane k -> 2k
        __m256i halves = _mm256_add_epi64(_mm256_or_si256(two_k, _mm256_slli_epi64(two_k, 32)),
                                          _mm256_set1_epi64x((int64_t)1 << 32));   // (2k, 2k + 1)
        __m256 packed = _mm256_permutevar8x32_ps(_mm256_castpd_ps(v), halves);
        _mm256_storeu_pd(val + q, _mm256_castps_pd(packed));
        _mm_storeu_si128((__m128i*)(crd + q), _mm_add_epi32(lanes, _mm_set1_epi32((int32_t)j)));
        q += __builtin_popcount(mask);
        j += 4;
    }
    pack_row_from(row, j, q, end, crd, val);   // the row's last slots
}

static inline bool pack_has_avx2() {
    static const int has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
    return has;
}
#endif

/* the fill of one contiguous row of length m into slots q..end-1 (end - q = its nonzeros) */
static inline void pack_row_f32(const float* row, int64_t m, int64_t q, int64_t end,
                                int32_t* crd, float* val) {
#ifdef SCORCH_PACK_X86
    if (pack_has_avx2()) { pack_row_avx2_f32(row, m, q, end, crd, val); return; }
#endif
    pack_row_scalar(row, q, end, crd, val);
}

static inline void pack_row_f64(const double* row, int64_t m, int64_t q, int64_t end,
                                int32_t* crd, double* val) {
#ifdef SCORCH_PACK_X86
    if (pack_has_avx2()) { pack_row_avx2_f64(row, m, q, end, crd, val); return; }
#endif
    pack_row_scalar(row, q, end, crd, val);
}

}  // namespace scorch
