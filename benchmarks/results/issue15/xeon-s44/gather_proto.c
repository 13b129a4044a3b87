// SpMV row-loop prototypes for Intel's gathers (session 44), float32 values, int32 indices.
// Each: y[i] = sum over row i of v[q] * x[crd[q]].  Build (see NOTES.md):
//   gcc -O3 -march=native -fassociative-math -fno-signed-zeros -fno-trapping-math \
//       -fno-tree-vectorize -falign-loops=32 -shared -fPIC -o gather_proto.so gather_proto.c
#include <stdint.h>
#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// the current runtime loop (gather_dot.h: gather_dot_f32_i32)
static inline float dot_base(const int32_t* crd, const float* v, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (; n > 8; n -= 8, crd += 8, v += 8) {
        __m256i c = _mm256_loadu_si256((const __m256i*)crd);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(v), _mm256_i32gather_ps(x, c, 4), acc);
    }
    __mmask8 k = (__mmask8)((1u << n) - 1u);
    __m256i c = _mm256_maskz_loadu_epi32(k, crd);
    __m256 g = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), k, c, x, 4);
    return hsum8(_mm256_fmadd_ps(_mm256_maskz_loadu_ps(k, v), g, acc));
}

// 16 lanes a step (one zmm gather): a row of up to 16 entries is one masked step
static inline float dot_z16(const int32_t* crd, const float* v, const float* x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (; n > 16; n -= 16, crd += 16, v += 16) {
        __m512i c = _mm512_loadu_si512((const void*)crd);
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(v), _mm512_i32gather_ps(c, x, 4), acc);
    }
    __mmask16 k = (__mmask16)((1u << n) - 1u);
    __m512i c = _mm512_maskz_loadu_epi32(k, crd);
    __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, c, x, 4);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, v), g, acc);
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    return hsum8(h);
}

// 8 lanes, rows of 9-16 as two steps without a loop (the second masked)
static inline float dot_y2(const int32_t* crd, const float* v, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    if (n > 16) {
        __m256 acc2 = _mm256_setzero_ps();
        for (; n > 16; n -= 16, crd += 16, v += 16) {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(v), _mm256_i32gather_ps(x, _mm256_loadu_si256((const __m256i*)crd), 4), acc);
            acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 8), _mm256_i32gather_ps(x, _mm256_loadu_si256((const __m256i*)(crd + 8)), 4), acc2);
        }
        acc = _mm256_add_ps(acc, acc2);
    }
    if (n > 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(v), _mm256_i32gather_ps(x, _mm256_loadu_si256((const __m256i*)crd), 4), acc);
        n -= 8; crd += 8; v += 8;
    }
    __mmask8 k = (__mmask8)((1u << n) - 1u);
    __m256i c = _mm256_maskz_loadu_epi32(k, crd);
    __m256 g = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), k, c, x, 4);
    return hsum8(_mm256_fmadd_ps(_mm256_maskz_loadu_ps(k, v), g, acc));
}

// 16 lanes with two accumulators on long rows
static inline float dot_z16b(const int32_t* crd, const float* v, const float* x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    if (n > 32) {
        __m512 acc2 = _mm512_setzero_ps();
        for (; n > 32; n -= 32, crd += 32, v += 32) {
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(v), _mm512_i32gather_ps(_mm512_loadu_si512((const void*)crd), x, 4), acc);
            acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(v + 16), _mm512_i32gather_ps(_mm512_loadu_si512((const void*)(crd + 16)), x, 4), acc2);
        }
        acc = _mm512_add_ps(acc, acc2);
    }
    if (n > 16) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(v), _mm512_i32gather_ps(_mm512_loadu_si512((const void*)crd), x, 4), acc);
        n -= 16; crd += 16; v += 16;
    }
    __mmask16 k = (__mmask16)((1u << n) - 1u);
    __m512i c = _mm512_maskz_loadu_epi32(k, crd);
    __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, c, x, 4);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, v), g, acc);
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    return hsum8(h);
}

#define ROWS(NAME, DOT)                                                                       \
    __attribute__((noinline, aligned(64))) void NAME(int64_t rows, const int32_t* pos,       \
                                                     const int32_t* crd, const float* v,     \
                                                     const float* x, float* y) {             \
        int64_t q = pos[0];                                                                   \
        for (int64_t i = 0; i < rows; i++) {                                                  \
            int64_t h = pos[i + 1];                                                           \
            y[i] = DOT(crd + q, v + q, x, h - q);                                             \
            q = h;                                                                            \
        }                                                                                     \
    }
ROWS(g_base, dot_base)
ROWS(g_z16, dot_z16)
ROWS(g_y2, dot_y2)
ROWS(g_z16b, dot_z16b)

// scalar row loop (gather_dot.h: rows_dot)
__attribute__((noinline, aligned(64))) void s_base(int64_t rows, const int32_t* pos, const int32_t* crd,
                                                   const float* v, const float* x, float* y) {
    int64_t q = pos[0];
    for (int64_t i = 0; i < rows; i++) {
        int64_t h = pos[i + 1];
        float acc = 0;
        for (; q < h; q++) acc += v[q] * x[crd[q]];
        y[i] = acc;
    }
}

// "flat": the products of a block of rows gathered 8 entries a step across row boundaries
// (unmasked but for the block's last step) into an L1 buffer, then each row summed from it:
// a row of 10 takes 1.25 gathers, not 2 (a masked gather costs a full one on this core)
#define FLAT_ROWS 32
#define FLAT_BUF 1024
static inline float sum_buf(const float* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (; n > 8; n -= 8, b += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(b));
    __mmask8 k = (__mmask8)((1u << n) - 1u);
    return hsum8(_mm256_add_ps(acc, _mm256_maskz_loadu_ps(k, b)));
}
__attribute__((noinline, aligned(64))) void g_flat(int64_t rows, const int32_t* pos, const int32_t* crd,
                                                   const float* v, const float* x, float* y) {
    float buf[FLAT_BUF + 8] __attribute__((aligned(64)));
    for (int64_t i0 = 0; i0 < rows; i0 += FLAT_ROWS) {
        int64_t i1 = i0 + FLAT_ROWS < rows ? i0 + FLAT_ROWS : rows;
        int64_t q0 = pos[i0], n = pos[i1] - q0;
        if (n > FLAT_BUF) {
            for (int64_t i = i0; i < i1; i++) y[i] = dot_base(crd + pos[i], v + pos[i], x, pos[i + 1] - pos[i]);
            continue;
        }
        int64_t k = 0;
        for (; k + 8 <= n; k += 8) {
            __m256i c = _mm256_loadu_si256((const __m256i*)(crd + q0 + k));
            _mm256_store_ps(buf + k, _mm256_mul_ps(_mm256_loadu_ps(v + q0 + k), _mm256_i32gather_ps(x, c, 4)));
        }
        if (k < n) {
            __mmask8 m = (__mmask8)((1u << (n - k)) - 1u);
            __m256i c = _mm256_maskz_loadu_epi32(m, crd + q0 + k);
            __m256 g = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), m, c, x, 4);
            _mm256_store_ps(buf + k, _mm256_mul_ps(_mm256_maskz_loadu_ps(m, v + q0 + k), g));
        }
        for (int64_t i = i0; i < i1; i++) y[i] = sum_buf(buf + (pos[i] - q0), pos[i + 1] - pos[i]);
    }
}

// the same with 16-lane (zmm) gathers for the block
__attribute__((noinline, aligned(64))) void g_flat16(int64_t rows, const int32_t* pos, const int32_t* crd,
                                                     const float* v, const float* x, float* y) {
    float buf[FLAT_BUF + 16] __attribute__((aligned(64)));
    for (int64_t i0 = 0; i0 < rows; i0 += FLAT_ROWS) {
        int64_t i1 = i0 + FLAT_ROWS < rows ? i0 + FLAT_ROWS : rows;
        int64_t q0 = pos[i0], n = pos[i1] - q0;
        if (n > FLAT_BUF) {
            for (int64_t i = i0; i < i1; i++) y[i] = dot_base(crd + pos[i], v + pos[i], x, pos[i + 1] - pos[i]);
            continue;
        }
        int64_t k = 0;
        for (; k + 16 <= n; k += 16) {
            __m512i c = _mm512_loadu_si512((const void*)(crd + q0 + k));
            _mm512_store_ps(buf + k, _mm512_mul_ps(_mm512_loadu_ps(v + q0 + k), _mm512_i32gather_ps(c, x, 4)));
        }
        if (k < n) {
            __mmask16 m = (__mmask16)((1u << (n - k)) - 1u);
            __m512i c = _mm512_maskz_loadu_epi32(m, crd + q0 + k);
            __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, c, x, 4);
            _mm512_store_ps(buf + k, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, v + q0 + k), g));
        }
        for (int64_t i = i0; i < i1; i++) y[i] = sum_buf(buf + (pos[i] - q0), pos[i + 1] - pos[i]);
    }
}
