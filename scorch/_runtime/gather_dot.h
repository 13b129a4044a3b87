// Row loops for the short-rows SpMV shape (``out[i] = sum_q vals[q] * x[crd[q]]`` over the
// rows lo..hi of one sparse level), called by the short-rows module's chunk functions
// (``scorch/tensor_compiler/lower/gather_rows.py`` says when):
//
// - ``rows_dot_*`` / ``rows_dot_pairs_*``: the scalar row loop, one or two partial sums a row.
// - ``rows_gather_dot_*``: each row one ``gather_dot_*``: the CPU's gather instruction, 8
//   lanes and a masked tail, so a row of up to 8 entries is one branch-free step. Rows of
//   random lengths mispredict the scalar loop's exit about once a row; this has no
//   data-dependent branch for them.
//
// Both are out-of-line and 64-byte aligned: the same loop inlined into a generated chunk
// function ran 7.8 us or 21 us on bcspwr10 (AVX-512 Zen 5, 1 thread) depending on unrelated
// code elsewhere in the kernel; out of line its speed no longer depends on its neighbours.
//
// Where the target has no AVX-512 (F + VL) the gathered dots are the plain scalar loops, so
// a kernel compiles on every target; the lowering only calls them on AVX-512 targets.
#pragma once
#include <stdint.h>
#if defined(__AVX512F__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SCORCH_GATHER_DOT_AVX512 1
#endif

namespace scorch {

#ifdef SCORCH_GATHER_DOT_AVX512
static inline __mmask8 gather_tail_mask(int64_t n) { return (__mmask8)((1u << n) - 1u); }

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float gather_dot_f32_i32(const int32_t* crd, const float* v, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (; n > 8; n -= 8, crd += 8, v += 8) {
        __m256i c = _mm256_loadu_si256((const __m256i*)crd);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(v), _mm256_i32gather_ps(x, c, 4), acc);
    }
    __mmask8 k = gather_tail_mask(n);
    __m256i c = _mm256_maskz_loadu_epi32(k, crd);
    __m256 g = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), k, c, x, 4);
    return hsum8(_mm256_fmadd_ps(_mm256_maskz_loadu_ps(k, v), g, acc));
}

static inline float gather_dot_f32_i64(const int64_t* crd, const float* v, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (; n > 8; n -= 8, crd += 8, v += 8) {
        __m512i c = _mm512_loadu_si512((const void*)crd);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(v), _mm512_i64gather_ps(c, x, 4), acc);
    }
    __mmask8 k = gather_tail_mask(n);
    __m512i c = _mm512_maskz_loadu_epi64(k, crd);
    __m256 g = _mm512_mask_i64gather_ps(_mm256_setzero_ps(), k, c, x, 4);
    return hsum8(_mm256_fmadd_ps(_mm256_maskz_loadu_ps(k, v), g, acc));
}

static inline double gather_dot_f64_i32(const int32_t* crd, const double* v, const double* x, int64_t n) {
    __m512d acc = _mm512_setzero_pd();
    for (; n > 8; n -= 8, crd += 8, v += 8) {
        __m256i c = _mm256_loadu_si256((const __m256i*)crd);
        acc = _mm512_fmadd_pd(_mm512_loadu_pd(v), _mm512_i32gather_pd(c, x, 8), acc);
    }
    __mmask8 k = gather_tail_mask(n);
    __m256i c = _mm256_maskz_loadu_epi32(k, crd);
    __m512d g = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), k, c, x, 8);
    return _mm512_reduce_add_pd(_mm512_fmadd_pd(_mm512_maskz_loadu_pd(k, v), g, acc));
}

static inline double gather_dot_f64_i64(const int64_t* crd, const double* v, const double* x, int64_t n) {
    __m512d acc = _mm512_setzero_pd();
    for (; n > 8; n -= 8, crd += 8, v += 8) {
        __m512i c = _mm512_loadu_si512((const void*)crd);
        acc = _mm512_fmadd_pd(_mm512_loadu_pd(v), _mm512_i64gather_pd(c, x, 8), acc);
    }
    __mmask8 k = gather_tail_mask(n);
    __m512i c = _mm512_maskz_loadu_epi64(k, crd);
    __m512d g = _mm512_mask_i64gather_pd(_mm512_setzero_pd(), k, c, x, 8);
    return _mm512_reduce_add_pd(_mm512_fmadd_pd(_mm512_maskz_loadu_pd(k, v), g, acc));
}
#else
template <class V, class I>
static inline V gather_dot_scalar(const I* crd, const V* v, const V* x, int64_t n) {
    V acc = 0;
    for (int64_t q = 0; q < n; q++) acc += v[q] * x[crd[q]];
    return acc;
}
static inline float gather_dot_f32_i32(const int32_t* c, const float* v, const float* x, int64_t n) { return gather_dot_scalar(c, v, x, n); }
static inline float gather_dot_f32_i64(const int64_t* c, const float* v, const float* x, int64_t n) { return gather_dot_scalar(c, v, x, n); }
static inline double gather_dot_f64_i32(const int32_t* c, const double* v, const double* x, int64_t n) { return gather_dot_scalar(c, v, x, n); }
static inline double gather_dot_f64_i64(const int64_t* c, const double* v, const double* x, int64_t n) { return gather_dot_scalar(c, v, x, n); }
#endif

#define SCORCH_ROW_LOOP __attribute__((noinline, aligned(64)))

// A row of at least ``kLongRow`` entries in a matrix of short rows (the dense row of an arrow
// matrix, a hub of a graph) runs four partial sums: one sum waits out an add latency an entry
// (arrow_spqr_46500's row of 46,500 entries: most of its SpMV's time). One compare a row,
// never taken where all rows are short.
constexpr int64_t kLongRow = 64;

template <class V, class I>
__attribute__((noinline)) static V dot_long(const I* crd, const V* v, const V* x, int64_t n) {
    V a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t q = 0;
    for (; q + 4 <= n; q += 4) {
        a0 += v[q] * x[crd[q]];
        a1 += v[q + 1] * x[crd[q + 1]];
        a2 += v[q + 2] * x[crd[q + 2]];
        a3 += v[q + 3] * x[crd[q + 3]];
    }
    for (; q < n; q++) a0 += v[q] * x[crd[q]];
    return (a0 + a1) + (a2 + a3);
}

// the scalar row loops: the row's end carried to the next row's start (one pos load a row);
// ``rows_dot`` keeps one sum a row, ``rows_dot_pairs`` two (a 6-entry row waits out 3 add
// latencies, not 6: 4elt 35.8 -> 31.5 us; but rows of 2 pay for the pairing: arrow 57 ->
// 78 us), chosen by the average row length (``facts.PAIRED_ROWS_MIN``)
template <class V, class I>
SCORCH_ROW_LOOP static void rows_dot(const I* pos, const I* crd, const V* v, const V* x, V* out,
                                     int64_t ost, int64_t lo, int64_t hi) {
    int64_t q = pos[lo];
    for (int64_t i = lo; i < hi; i++) {
        int64_t h = pos[i + 1];
        V acc = 0;
        if (__builtin_expect(h - q >= kLongRow, 0)) {
            acc = dot_long(crd + q, v + q, x, h - q);
            q = h;
        }
        for (; q < h; q++) acc += v[q] * x[crd[q]];
        out[i * ost] = acc;
    }
}

template <class V, class I>
SCORCH_ROW_LOOP static void rows_dot_pairs(const I* pos, const I* crd, const V* v, const V* x, V* out,
                                           int64_t ost, int64_t lo, int64_t hi) {
    int64_t q = pos[lo];
    for (int64_t i = lo; i < hi; i++) {
        int64_t h = pos[i + 1];
        V a0 = 0, a1 = 0;
        if (__builtin_expect(h - q >= kLongRow, 0)) {
            a0 = dot_long(crd + q, v + q, x, h - q);
            q = h;
        }
        for (; q + 1 < h; q += 2) {
            a0 += v[q] * x[crd[q]];
            a1 += v[q + 1] * x[crd[q + 1]];
        }
        if (q < h) {
            a0 += v[q] * x[crd[q]];
            q++;
        }
        out[i * ost] = a0 + a1;
    }
}

// one gathered dot a row; ``streams``: request the index and value lines ``distance``
// entries ahead at each row start (non-temporal: they pass by the cache holding x)
template <class V, class I, V (*DOT)(const I*, const V*, const V*, int64_t)>
SCORCH_ROW_LOOP static void rows_gather_dot(const I* pos, const I* crd, const V* v, const V* x, V* out,
                                            int64_t ost, int64_t lo, int64_t hi, int64_t distance) {
    int64_t q = pos[lo];
    for (int64_t i = lo; i < hi; i++) {
        int64_t h = pos[i + 1];
        if (distance) {
            __builtin_prefetch((const void*)(crd + q + distance), 0, 0);
            __builtin_prefetch((const void*)(v + q + distance), 0, 0);
        }
        out[i * ost] = DOT(crd + q, v + q, x, h - q);
        q = h;
    }
}

#define SCORCH_ROW_LOOPS(VN, V, IN, I)                                                          \
    static inline void rows_dot_##VN##_##IN(const I* pos, const I* crd, const V* v, const V* x,  \
                                            V* out, int64_t ost, int64_t lo, int64_t hi) {     \
        rows_dot<V, I>(pos, crd, v, x, out, ost, lo, hi);                                      \
    }                                                                                          \
    static inline void rows_dot_pairs_##VN##_##IN(const I* pos, const I* crd, const V* v,      \
                                                  const V* x, V* out, int64_t ost, int64_t lo,  \
                                                  int64_t hi) {                                 \
        rows_dot_pairs<V, I>(pos, crd, v, x, out, ost, lo, hi);                                \
    }                                                                                          \
    static inline void rows_gather_dot_##VN##_##IN(const I* pos, const I* crd, const V* v,      \
                                                   const V* x, V* out, int64_t ost, int64_t lo, \
                                                   int64_t hi, int64_t distance) {             \
        rows_gather_dot<V, I, gather_dot_##VN##_##IN>(pos, crd, v, x, out, ost, lo, hi, distance); \
    }
SCORCH_ROW_LOOPS(f32, float, i32, int32_t)
SCORCH_ROW_LOOPS(f32, float, i64, int64_t)
SCORCH_ROW_LOOPS(f64, double, i32, int32_t)
SCORCH_ROW_LOOPS(f64, double, i64, int64_t)
#undef SCORCH_ROW_LOOPS

// Whether the rows' lengths change from one row to the next in at least ``percent`` % of
// ``samples`` evenly spaced pairs of neighbouring rows: then the scalar row loop
// mispredicts its exit about once a row (random graphs, R-MAT), while meshes (4elt, mdual)
// and banded matrices repeat their lengths and predict well. O(samples) reads of ``pos``,
// the same answer for the same pattern every call.
template <class I>
static inline bool rows_vary(const I* pos, int64_t rows, int64_t samples, int64_t percent) {
    if (rows < 2 * samples) return false;
    int64_t differ = 0;
    for (int64_t k = 0; k < samples; k++) {
        int64_t r = (rows - 2) * k / samples;
        differ += (pos[r + 1] - pos[r]) != (pos[r + 2] - pos[r + 1]);
    }
    return differ * 100 >= percent * samples;
}
static inline bool rows_vary_i32(const int32_t* pos, int64_t rows, int64_t samples, int64_t percent) { return rows_vary(pos, rows, samples, percent); }
static inline bool rows_vary_i64(const int64_t* pos, int64_t rows, int64_t samples, int64_t percent) { return rows_vary(pos, rows, samples, percent); }

}  // namespace scorch
