// build: gcc -O3 -march=haswell -mtune-ctrl=^use_gather -o sddmm sddmm.c -lm; run: ./sddmm $PROTO_DATA/<matrix> [rounds] (data from export.py)
// SDDMM n x K K=128 float32 prototypes: out[q] = S[q] * dot(B[i,:], C[crd[q],:])
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <sys/mman.h>
#define K 128
typedef float vf __attribute__((vector_size(32)));
static int64_t M, N, NNZ; static int64_t *pos, *crd; static float *vals, *B, *C, *out;
static void *load(const char *d, const char *f, size_t *n) { char p[512]; snprintf(p, 512, "%s/%s", d, f);
  FILE *fp = fopen(p, "rb"); fseek(fp, 0, SEEK_END); *n = ftell(fp); fseek(fp, 0, SEEK_SET);
  void *b = aligned_alloc(64, (*n + 63) / 64 * 64 + 64); fread(b, 1, *n, fp); fclose(fp); return b; }
static inline float hsum(vf v) { __m128 a = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  a = _mm_hadd_ps(a, a); a = _mm_hadd_ps(a, a); return _mm_cvtss_f32(a); }
static inline __m128 hsum4(vf a, vf b, vf c, vf d) {
  __m256 ab = _mm256_hadd_ps((__m256)a, (__m256)b), cd = _mm256_hadd_ps((__m256)c, (__m256)d);
  __m256 s = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)); }
#define PF(p, h) __builtin_prefetch((const void*)(p), 0, h)

// v_cur: current generated structure, prefetch distance D (entries), hint H
#define DEFV(NAME, D, H, LINES) DEFS(NAME, D, H, LINES, 1)
#define DEFS(NAME, D, H, LINES, STEP) DEFB(NAME, D, H, LINES, STEP, 0)
#define DEFB(NAME, D, H, LINES, STEP, BD) DEFX(NAME, D, H, LINES, STEP, BD, 0)
#define DEFX(NAME, D, H, LINES, STEP, BD, NOB) \
static void NAME(void) { int64_t pfe = NNZ - D; \
  for (int64_t i = 0; i < M; i++) { const float *b = NOB ? Bfix : B + i * K; int64_t q = pos[i], h = pos[i + 1]; \
    if (BD && i + BD < M) for (int c = 0; c < 8; c++) PF(B + (i + BD) * K + c * 16, 3); \
    while (q + 3 < h) { \
      if (D && q < pfe - 3) for (int u = 0; u < 4; u++) { const float *r = C + crd[q + D + u] * K; for (int c = 0; c < LINES; c += STEP) PF(r + c * 16, H); } \
      const float *c0 = C + crd[q] * K, *c1 = C + crd[q + 1] * K, *c2 = C + crd[q + 2] * K, *c3 = C + crd[q + 3] * K; \
      vf d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0}; \
      for (int c = 0; c < K; c += 8) { vf bv = *(vf*)(b + c); d0 += bv * *(vf*)(c0 + c); d1 += bv * *(vf*)(c1 + c); d2 += bv * *(vf*)(c2 + c); d3 += bv * *(vf*)(c3 + c); } \
      d0 *= vals[q]; d1 *= vals[q + 1]; d2 *= vals[q + 2]; d3 *= vals[q + 3]; \
      _mm_storeu_ps(out + q, hsum4(d0, d1, d2, d3)); q += 4; } \
    for (; q < h; q++) { if (D && q < pfe) { const float *r = C + crd[q + D] * K; for (int c = 0; c < LINES; c += STEP) PF(r + c * 16, H); } \
      const float *c0 = C + crd[q] * K; vf d0 = {0}; for (int c = 0; c < K; c += 8) d0 += *(vf*)(b + c) * *(vf*)(c0 + c); out[q] = vals[q] * hsum(d0); } } }
static int64_t *crd_real, *crd_l1;
static float *Bfix;
DEFV(v_cur, 8, 3, 8)
DEFV(v_nopf, 0, 3, 8)
DEFV(v_t1, 8, 2, 8)
DEFV(v_t2, 8, 1, 8)
DEFV(v_nta, 8, 0, 8)
DEFV(v_d16, 16, 3, 8)
DEFV(v_d16t2, 16, 1, 8)
DEFV(v_d4, 4, 3, 8)
DEFV(v_half, 8, 3, 4)
DEFS(v_alt, 8, 3, 8, 2)
DEFB(v_pfB1, 8, 3, 8, 1, 1)
DEFX(v_noB, 8, 3, 8, 1, 0, 1)
DEFB(v_pfB2, 8, 3, 8, 1, 2)
DEFB(v_pfB4, 8, 3, 8, 1, 4)
DEFS(v_alt16, 16, 3, 8, 2)
DEFS(v_alt12, 12, 3, 8, 2)


// helpers of v_2acc and v_e8: four entries with two FMA chains each, and one entry with four
static inline void quad2(const float *b, int64_t q, int D, int64_t pfe) {
  if (q < pfe - 3) for (int u = 0; u < 4; u++) { const float *r = C + crd[q + D + u] * K; for (int c = 0; c < 8; c++) PF(r + c * 16, 3); }
  const float *c0 = C + crd[q] * K, *c1 = C + crd[q + 1] * K, *c2 = C + crd[q + 2] * K, *c3 = C + crd[q + 3] * K;
  vf d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0}, e0 = {0}, e1 = {0}, e2 = {0}, e3 = {0};
  for (int c = 0; c < K; c += 16) { vf bv = *(vf*)(b + c), bw = *(vf*)(b + c + 8);
    d0 += bv * *(vf*)(c0 + c); d1 += bv * *(vf*)(c1 + c); d2 += bv * *(vf*)(c2 + c); d3 += bv * *(vf*)(c3 + c);
    e0 += bw * *(vf*)(c0 + c + 8); e1 += bw * *(vf*)(c1 + c + 8); e2 += bw * *(vf*)(c2 + c + 8); e3 += bw * *(vf*)(c3 + c + 8); }
  _mm_storeu_ps(out + q, _mm_mul_ps(hsum4(d0 + e0, d1 + e1, d2 + e2, d3 + e3), _mm_loadu_ps(vals + q))); }
static inline void one4(const float *b, int64_t q, int D, int64_t pfe) {
  if (q < pfe) { const float *r = C + crd[q + D] * K; for (int c = 0; c < 8; c++) PF(r + c * 16, 3); }
  const float *c0 = C + crd[q] * K; vf d0 = {0}, e0 = {0}, f0 = {0}, g0 = {0};
  for (int c = 0; c < K; c += 32) { d0 += *(vf*)(b + c) * *(vf*)(c0 + c); e0 += *(vf*)(b + c + 8) * *(vf*)(c0 + c + 8);
    f0 += *(vf*)(b + c + 16) * *(vf*)(c0 + c + 16); g0 += *(vf*)(b + c + 24) * *(vf*)(c0 + c + 24); }
  out[q] = vals[q] * hsum((d0 + e0) + (f0 + g0)); }
// 4 entries, 2 chains each (8 independent FMA chains)
static void v_2acc(void) { const int D = 8; int64_t pfe = NNZ - D;
  for (int64_t i = 0; i < M; i++) { const float *b = B + i * K; int64_t q = pos[i], h = pos[i + 1];
    for (; q + 3 < h; q += 4) quad2(b, q, D, pfe);
    for (; q < h; q++) one4(b, q, D, pfe); } }
// 8 entries a step, one chain each
static void v_e8(void) { const int D = 8; int64_t pfe = NNZ - D;
  for (int64_t i = 0; i < M; i++) { const float *b = B + i * K; int64_t q = pos[i], h = pos[i + 1];
    while (q + 7 < h) {
      if (q < pfe - 7) for (int u = 0; u < 8; u++) { const float *r = C + crd[q + D + u] * K; for (int c = 0; c < 8; c++) PF(r + c * 16, 3); }
      const float *cc[8]; for (int u = 0; u < 8; u++) cc[u] = C + crd[q + u] * K;
      vf d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0}, d4 = {0}, d5 = {0}, d6 = {0}, d7 = {0};
      for (int c = 0; c < K; c += 8) { vf bv = *(vf*)(b + c);
        d0 += bv * *(vf*)(cc[0] + c); d1 += bv * *(vf*)(cc[1] + c); d2 += bv * *(vf*)(cc[2] + c); d3 += bv * *(vf*)(cc[3] + c);
        d4 += bv * *(vf*)(cc[4] + c); d5 += bv * *(vf*)(cc[5] + c); d6 += bv * *(vf*)(cc[6] + c); d7 += bv * *(vf*)(cc[7] + c); }
      _mm_storeu_ps(out + q, _mm_mul_ps(hsum4(d0, d1, d2, d3), _mm_loadu_ps(vals + q)));
      _mm_storeu_ps(out + q + 4, _mm_mul_ps(hsum4(d4, d5, d6, d7), _mm_loadu_ps(vals + q + 4))); q += 8; }
    for (; q + 3 < h; q += 4) quad2(b, q, D, pfe);
    for (; q < h; q++) one4(b, q, D, pfe); } }

// v_noB (defined with the others above): B fixed to one L1-resident row (is B's stream the difference?)
// read with the quad structure: 4 rows interleaved column by column, adds, no B
static void v_read4(void) { int64_t pfe = NNZ - 8; vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
  int64_t q = 0;
  for (; q + 3 < NNZ; q += 4) {
    if (q < pfe - 3) for (int u = 0; u < 4; u++) { const float *r = C + crd[q + 8 + u] * K; for (int c = 0; c < 8; c++) PF(r + c * 16, 3); }
    const float *c0 = C + crd[q] * K, *c1 = C + crd[q + 1] * K, *c2 = C + crd[q + 2] * K, *c3 = C + crd[q + 3] * K;
    vf d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0};
    for (int c = 0; c < K; c += 8) { d0 += *(vf*)(c0 + c); d1 += *(vf*)(c1 + c); d2 += *(vf*)(c2 + c); d3 += *(vf*)(c3 + c); }
    _mm_storeu_ps(out + q, hsum4(d0, d1, d2, d3)); }
  for (; q < NNZ; q++) out[q] = 0; }
// the dot with the whole row of the quad's entries: FMAs into 4 chains, but the row loop flat over all entries (no row breaks, B per entry)

// two accumulator chains per entry over halves (less dependency? no: 16 FMAs each chain 4 entries already)
// pure read: sum every C row (memory bound reference)
static void v_l1(void) { int64_t *sv = crd; crd = crd_l1; v_cur(); crd = sv; }
static void v_read(void) { int64_t pfe = NNZ - 8; vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  for (int64_t q = 0; q < NNZ; q++) { if (q < pfe) { const float *r = C + crd[q + 8] * K; for (int c = 0; c < 8; c++) PF(r + c * 16, 3); }
    const float *c0 = C + crd[q] * K; for (int c = 0; c < K; c += 32) { a0 += *(vf*)(c0 + c); a1 += *(vf*)(c0 + c + 8); a2 += *(vf*)(c0 + c + 16); a3 += *(vf*)(c0 + c + 24); } }
  out[0] = hsum(a0 + a1 + a2 + a3); }
static void v_readnp(void) { vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  for (int64_t q = 0; q < NNZ; q++) {
    const float *c0 = C + crd[q] * K; for (int c = 0; c < K; c += 32) { a0 += *(vf*)(c0 + c); a1 += *(vf*)(c0 + c + 8); a2 += *(vf*)(c0 + c + 16); a3 += *(vf*)(c0 + c + 24); } }
  out[0] = hsum(a0 + a1 + a2 + a3); }
static void v_seq(void) { vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}; int64_t rows = N < NNZ ? N : NNZ;
  for (int64_t r = 0; r < NNZ; r++) { const float *c0 = C + (r % N) * K; for (int c = 0; c < K; c += 32) { a0 += *(vf*)(c0 + c); a1 += *(vf*)(c0 + c + 8); a2 += *(vf*)(c0 + c + 16); a3 += *(vf*)(c0 + c + 24); } }
  out[0] = hsum(a0 + a1 + a2 + a3); }

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmpd(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
  size_t n; int64_t *sh = load(argv[1], "shape", &n); M = sh[0]; N = sh[1]; NNZ = sh[2];
  pos = load(argv[1], "pos", &n); crd = load(argv[1], "crd", &n); vals = load(argv[1], "vals", &n);
  B = load(argv[1], "B", &n); C = load(argv[1], "C", &n);
  if (getenv("HUGE")) { size_t sz = (n + (2 << 20) - 1) / (2 << 20) * (2 << 20); float *h = aligned_alloc(2 << 20, sz);
    madvise(h, sz, MADV_HUGEPAGE); memcpy(h, C, n); C = h; } out = aligned_alloc(64, NNZ * 4 + 64);
  float *ref = malloc(NNZ * 4); Bfix = aligned_alloc(64, K * 4); for (int c = 0; c < K; c++) Bfix[c] = 1.0f; crd_l1 = malloc(NNZ * 8); for (int64_t q = 0; q < NNZ; q++) crd_l1[q] = crd[q] & 7; if (getenv("L1")) crd = crd_l1;
  // also defined above: v_t1, v_t2 (prefetch hints), v_d4, v_d16t2, v_half, v_alt12, v_alt16, v_pfB*: swap into this list (16 at most); the last 4 stay last
  void (*fns[])(void) = {v_cur, v_nopf, v_noB, v_read4, v_pfB1, v_pfB2, v_pfB4, v_2acc, v_e8, v_nta, v_d16, v_alt, v_l1, v_read, v_readnp, v_seq};
  const char *names[] = {"cur", "nopf", "noB", "read4", "pfB1", "pfB2", "pfB4", "2acc", "e8", "nta", "d16", "alt", "l1", "read", "readnp", "seq"};
  int nf = sizeof(fns) / sizeof(fns[0]); int rounds = argc > 2 ? atoi(argv[2]) : 7;
  double t[16][64]; v_cur(); memcpy(ref, out, NNZ * 4);
  for (int r = 0; r < rounds; r++) for (int f = 0; f < nf; f++) { int ff = r % 2 ? nf - 1 - f : f;
    double t0 = now(); fns[ff](); t[ff][r] = now() - t0;
    if (ff < nf - 4 && ff != 2 && ff != 3) for (int64_t q = 0; q < NNZ; q += 97) if (fabsf(out[q] - ref[q]) > 1e-3f * (1 + fabsf(ref[q]))) { printf("WRONG %s\n", names[ff]); break; } }
  printf("%-20s", (strrchr(argv[1], 47) ? strrchr(argv[1], 47) + 1 : argv[1]));
  for (int f = 0; f < nf; f++) { qsort(t[f], rounds, sizeof(double), cmpd); printf(" %s %.1f/%.1f", names[f], t[f][rounds / 2] / NNZ * 1e9, t[f][0] / NNZ * 1e9); }
  printf("  (ns/entry, median)\n"); }
