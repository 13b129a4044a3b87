#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <math.h>
typedef struct { int64_t m, n, nnz; int32_t *pos, *crd; float *val; } csr;
static csr load(const char* p) { csr A; FILE* f = fopen(p, "rb"); int64_t h[3]; fread(h, 8, 3, f);
  A.m = h[0]; A.n = h[1]; A.nnz = h[2]; A.pos = malloc(4*(A.m+1)); A.crd = aligned_alloc(64, 4*A.nnz+256); A.val = aligned_alloc(64, 4*A.nnz+256);
  fread(A.pos, 4, A.m+1, f); fread(A.crd, 4, A.nnz, f); fread(A.val, 4, A.nnz, f); fclose(f);
  memset(A.crd + A.nnz, 0, 256); memset(A.val + A.nnz, 0, 256); return A; }
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9*t.tv_nsec; }

__attribute__((noinline, optimize("no-tree-vectorize"))) void scalar(const csr* A, const float* x, float* y) {
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val;
  #pragma omp parallel for schedule(dynamic, 2048)
  for (int64_t i = 0; i < A->m; i++) { float acc = 0; for (int32_t q = pos[i]; q < pos[i+1]; q++) acc += v[q] * x[crd[q]]; y[i] = acc; } }

#ifdef __AVX512F__
// one masked 16-lane step per row of <= 16 entries; longer rows loop
__attribute__((noinline)) void masked16(const csr* A, const float* x, float* y) {
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val;
  for (int64_t i = 0; i < A->m; i++) {
    int32_t q = pos[i], h = pos[i+1];
    __m512 acc = _mm512_setzero_ps();
    while (h - q > 16) { __m512i c = _mm512_loadu_si512(crd + q); acc = _mm512_fmadd_ps(_mm512_loadu_ps(v + q), _mm512_i32gather_ps(c, x, 4), acc); q += 16; }
    __mmask16 k = (__mmask16)((1u << (h - q)) - 1);
    __m512i c = _mm512_maskz_loadu_epi32(k, crd + q);
    __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, c, x, 4);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, v + q), g, acc);
    y[i] = _mm512_reduce_add_ps(acc);
  } }
// 8-lane version (AVX-512VL masks on ymm)
__attribute__((noinline)) void masked8(const csr* A, const float* x, float* y) {
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val;
  #pragma omp parallel for schedule(dynamic, 2048)
  for (int64_t i = 0; i < A->m; i++) {
    int32_t q = pos[i], h = pos[i+1];
    __m256 acc = _mm256_setzero_ps();
    while (h - q > 8) { __m256i c = _mm256_loadu_si256((const __m256i*)(crd + q)); acc = _mm256_fmadd_ps(_mm256_loadu_ps(v + q), _mm256_i32gather_ps(x, c, 4), acc); q += 8; }
    __mmask8 k = (__mmask8)((1u << (h - q)) - 1);
    __m256i c = _mm256_maskz_loadu_epi32(k, crd + q);
    __m256 g = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), k, c, x, 4);
    acc = _mm256_fmadd_ps(_mm256_maskz_loadu_ps(k, v + q), g, acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s)); s = _mm_add_ss(s, _mm_movehdup_ps(s));
    y[i] = _mm_cvtss_f32(s);
  } }

__attribute__((noinline)) void masked8pf(const csr* A, const float* x, float* y) {
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val; int64_t pfe = pos[A->m] - 64;
  #pragma omp parallel for schedule(dynamic, 2048)
  for (int64_t i = 0; i < A->m; i++) {
    int32_t q = pos[i], h = pos[i+1];
    __builtin_prefetch(crd + q + 512, 0, 0); __builtin_prefetch(v + q + 512, 0, 0);
    if (q < pfe) { __builtin_prefetch(x + crd[q + 64], 0, 3); __builtin_prefetch(x + crd[q + 64 + 4], 0, 3);__builtin_prefetch(x + crd[q + 64+8], 0, 3); }
    __m256 acc = _mm256_setzero_ps();
    while (h - q > 8) { __m256i c = _mm256_loadu_si256((const __m256i*)(crd + q)); acc = _mm256_fmadd_ps(_mm256_loadu_ps(v + q), _mm256_i32gather_ps(x, c, 4), acc); q += 8; }
    __mmask8 k = (__mmask8)((1u << (h - q)) - 1);
    __m256i c = _mm256_maskz_loadu_epi32(k, crd + q);
    __m256 g = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), k, c, x, 4);
    acc = _mm256_fmadd_ps(_mm256_maskz_loadu_ps(k, v + q), g, acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s)); s = _mm_add_ss(s, _mm_movehdup_ps(s));
    y[i] = _mm_cvtss_f32(s);
  } }
__attribute__((noinline)) void masked8st(const csr* A, const float* x, float* y) {
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val;
  #pragma omp parallel for schedule(dynamic, 2048)
  for (int64_t i = 0; i < A->m; i++) {
    int32_t q = pos[i], h = pos[i+1];
    __builtin_prefetch(crd + q + 512, 0, 0); __builtin_prefetch(v + q + 512, 0, 0);
    __m256 acc = _mm256_setzero_ps();
    while (h - q > 8) { __m256i c = _mm256_loadu_si256((const __m256i*)(crd + q)); acc = _mm256_fmadd_ps(_mm256_loadu_ps(v + q), _mm256_i32gather_ps(x, c, 4), acc); q += 8; }
    __mmask8 k = (__mmask8)((1u << (h - q)) - 1);
    __m256i c = _mm256_maskz_loadu_epi32(k, crd + q);
    __m256 g = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), k, c, x, 4);
    acc = _mm256_fmadd_ps(_mm256_maskz_loadu_ps(k, v + q), g, acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s)); s = _mm_add_ss(s, _mm_movehdup_ps(s));
    y[i] = _mm_cvtss_f32(s);
  } }
#endif
#ifdef __AVX2__
// AVX2: mask from a table; maskload of crd/vals, masked gather
static int32_t masktab[16] = {-1,-1,-1,-1,-1,-1,-1,-1,0,0,0,0,0,0,0,0};
__attribute__((noinline)) void avx2_8(const csr* A, const float* x, float* y) {
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val;
  for (int64_t i = 0; i < A->m; i++) {
    int32_t q = pos[i], h = pos[i+1];
    __m256 acc = _mm256_setzero_ps();
    while (h - q > 8) { __m256i c = _mm256_loadu_si256((const __m256i*)(crd + q)); acc = _mm256_fmadd_ps(_mm256_loadu_ps(v + q), _mm256_i32gather_ps(x, c, 4), acc); q += 8; }
    __m256i k = _mm256_loadu_si256((const __m256i*)(masktab + 8 - (h - q)));
    __m256i c = _mm256_maskload_epi32(crd + q, k);
    __m256 g = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), x, c, _mm256_castsi256_ps(k), 4);
    acc = _mm256_fmadd_ps(_mm256_maskload_ps(v + q, k), g, acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s)); s = _mm_add_ss(s, _mm_movehdup_ps(s));
    y[i] = _mm_cvtss_f32(s);
  } }
// AVX2 without hardware gather: scalar loads inserted (what gcc emits)
__attribute__((noinline)) void avx2_8_emul(const csr* A, const float* x, float* y) {
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val;
  for (int64_t i = 0; i < A->m; i++) {
    int32_t q = pos[i], h = pos[i+1];
    __m256 acc = _mm256_setzero_ps();
    while (h - q > 8) { const int32_t* c = crd + q; __m256 g = _mm256_setr_ps(x[c[0]],x[c[1]],x[c[2]],x[c[3]],x[c[4]],x[c[5]],x[c[6]],x[c[7]]); acc = _mm256_fmadd_ps(_mm256_loadu_ps(v + q), g, acc); q += 8; }
    float t[8] = {0}; for (int j = 0; j < h - q; j++) t[j] = v[q+j] * x[crd[q+j]];
    __m256 s8 = _mm256_add_ps(acc, _mm256_loadu_ps(t));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s)); s = _mm_add_ss(s, _mm_movehdup_ps(s));
    y[i] = _mm_cvtss_f32(s);
  } }
#endif
// products flat, then row sums (two passes)
__attribute__((noinline, optimize("no-tree-vectorize"))) void twopass(const csr* A, const float* x, float* y, float* tmp) {
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val;
  const int64_t B = 4096;
  for (int64_t i0 = 0; i0 < A->m; ) {
    int64_t q0 = pos[i0]; int64_t i1 = i0; while (i1 < A->m && pos[i1+1] - q0 <= B) i1++; if (i1 == i0) i1 = i0 + 1;
    int64_t q1 = pos[i1];
    if (q1 - q0 > B) { float acc=0; for (int64_t q=q0;q<q1;q++) acc+=v[q]*x[crd[q]]; y[i0]=acc; i0=i1; continue; }
    #pragma GCC ivdep
    for (int64_t q = q0; q < q1; q++) tmp[q - q0] = v[q] * x[crd[q]];
    for (int64_t i = i0; i < i1; i++) { float acc = 0; for (int32_t q = pos[i]; q < pos[i+1]; q++) acc += tmp[q - q0]; y[i] = acc; }
    i0 = i1;
  } }

typedef void (*fn_t)(const csr*, const float*, float*);
static float* TMP;
static void tp(const csr* A, const float* x, float* y) { twopass(A, x, y, TMP); }
int main(int argc, char** argv) {
  TMP = aligned_alloc(64, 4*4096*2);
  for (int a = 1; a < argc; a++) {
    char p[256]; snprintf(p, sizeof p, "/tmp/s20/%s.bin", argv[a]); csr A = load(p);
    float* x = malloc(4*A.n); for (int64_t j = 0; j < A.n; j++) x[j] = (float)((j * 7919) % 1000) / 1000.f;
    float* y0 = calloc(A.m, 4); float* y = calloc(A.m, 4);
    scalar(&A, x, y0);
    struct { const char* name; fn_t f; } fs[] = { {"scalar", scalar},
#ifdef __AVX512F__
      {"masked8", masked8}, {"m8pf", masked8pf}, {"m8st", masked8st},
#endif
#ifdef __AVX2__
      
#endif
      };
    int nf = sizeof fs / sizeof fs[0]; double best[8];
    for (int f = 0; f < nf; f++) best[f] = 1e9;
    for (int r = 0; r < 15; r++) for (int f = 0; f < nf; f++) {
      int reps = (int)(2e6 / A.nnz) + 1; double t0 = now(); for (int k = 0; k < reps; k++) fs[f].f(&A, x, y); double t = (now() - t0) / reps;
      if (t < best[f]) best[f] = t; if (r == 0) { double err = 0; for (int64_t i = 0; i < A.m; i++) err = fmax(err, fabs(y[i]-y0[i])); if (err > 1e-2) printf("  %s WRONG %g\n", fs[f].name, err); } }
    printf("%-20s %5.1f/row", argv[a], (double)A.nnz/A.m);
    for (int f = 0; f < nf; f++) printf("  %s %.1f", fs[f].name, best[f]*1e6);
    printf("  us\n");
  } }
