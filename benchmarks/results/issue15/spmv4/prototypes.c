#include <stdint.h>
#include <string.h>
typedef int32_t I;
#define RESTRICT __restrict__
void v_base(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  for (int64_t i = 0; i < n; i++) { float acc = 0; for (int64_t q = pos[i]; q < pos[i+1]; q++) acc += val[q] * x[crd[q]]; y[i] = acc; }
}
void v_acc2(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  for (int64_t i = 0; i < n; i++) { float a0 = 0, a1 = 0; int64_t q = pos[i], h = pos[i+1];
    for (; q + 1 < h; q += 2) { a0 += val[q] * x[crd[q]]; a1 += val[q+1] * x[crd[q+1]]; }
    if (q < h) a0 += val[q] * x[crd[q]];
    y[i] = a0 + a1; }
}
void v_acc4(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  for (int64_t i = 0; i < n; i++) { float a0 = 0, a1 = 0, a2 = 0, a3 = 0; int64_t q = pos[i], h = pos[i+1];
    for (; q + 3 < h; q += 4) { a0 += val[q] * x[crd[q]]; a1 += val[q+1] * x[crd[q+1]]; a2 += val[q+2] * x[crd[q+2]]; a3 += val[q+3] * x[crd[q+3]]; }
    for (; q < h; q++) a0 += val[q] * x[crd[q]];
    y[i] = (a0 + a1) + (a2 + a3); }
}
/* two rows interleaved */
void v_two(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    int64_t q0 = pos[i], h0 = pos[i+1], q1 = h0, h1 = pos[i+2];
    float a0 = 0, a1 = 0;
    int64_t m = (h0 - q0) < (h1 - q1) ? (h0 - q0) : (h1 - q1);
    for (int64_t k = 0; k < m; k++) { a0 += val[q0+k] * x[crd[q0+k]]; a1 += val[q1+k] * x[crd[q1+k]]; }
    for (int64_t q = q0 + m; q < h0; q++) a0 += val[q] * x[crd[q]];
    for (int64_t q = q1 + m; q < h1; q++) a1 += val[q] * x[crd[q]];
    y[i] = a0; y[i+1] = a1;
  }
  for (; i < n; i++) { float acc = 0; for (int64_t q = pos[i]; q < pos[i+1]; q++) acc += val[q] * x[crd[q]]; y[i] = acc; }
}
/* prefetch ahead */
void v_pf(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  int64_t pfe = pos[n] - 64;
  for (int64_t i = 0; i < n; i++) { float acc = 0; for (int64_t q = pos[i]; q < pos[i+1]; q++) { if (q < pfe) __builtin_prefetch(x + crd[q+64], 0, 3); acc += val[q] * x[crd[q]]; } y[i] = acc; }
}
/* blocked: products into an L1 buffer (branch-free gather pass), then row sums */
#define B 512
void v_blk(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  float tmp[B];
  int64_t i = 0, end = pos[n];
  float acc = 0;
  int64_t p0 = pos[0];
  while (p0 < end) {
    int64_t p1 = p0 + B < end ? p0 + B : end;
    for (int64_t p = p0; p < p1; p++) tmp[p - p0] = val[p] * x[crd[p]];
    const float* t = tmp - p0;
    while (i < n && pos[i+1] <= p1) {
      int64_t q = pos[i] > p0 ? pos[i] : p0, h = pos[i+1];
      for (; q < h; q++) acc += t[q];
      y[i] = acc; acc = 0; i++;
    }
    if (i < n) { int64_t q = pos[i] > p0 ? pos[i] : p0; for (; q < p1; q++) acc += t[q]; }
    p0 = p1;
  }
  for (; i < n; i++) { y[i] = acc; acc = 0; }
}
/* masked chunks of W entries: one loop trip per W entries, lanes past the row's end select 0
   (their crd/val are the next rows' entries, read but not used); rows whose chunk would run
   past nnz take the plain loop */
#define MASKED(NAME, W) \
void NAME(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) { \
  int64_t end = pos[n]; int64_t i = 0; \
  for (; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; \
    if (h + W > end) break; \
    float acc[W] = {0}; \
    do { for (int k = 0; k < W; k++) { float pr = val[q+k] * x[crd[q+k]]; acc[k] += (q + k < h) ? pr : 0.0f; } q += W; } while (q < h); \
    float s = 0; for (int k = 0; k < W; k++) s += acc[k]; y[i] = s; } \
  for (; i < n; i++) { float acc = 0; for (int64_t q = pos[i]; q < pos[i+1]; q++) acc += val[q] * x[crd[q]]; y[i] = acc; } \
}
MASKED(v_m4, 4)
MASKED(v_m8, 8)
MASKED(v_m2, 2)
#define PF2(NAME, D) \
void NAME(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) { \
  int64_t end = pos[n]; int64_t i = 0; \
  for (; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; if (h + D > end) break; float acc = 0; \
    for (; q < h; q++) { __builtin_prefetch(x + crd[q + D], 0, 3); acc += val[q] * x[crd[q]]; } y[i] = acc; } \
  for (; i < n; i++) { float acc = 0; for (int64_t q = pos[i]; q < pos[i+1]; q++) acc += val[q] * x[crd[q]]; y[i] = acc; } \
}
PF2(v_pf32, 32)
PF2(v_pf64, 64)
PF2(v_pf128, 128)
PF2(v_pf256, 256)
#define HYB(NAME, T) \
void NAME(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) { \
  for (int64_t i = 0; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; float acc = 0; \
    if (h - q >= T) { float a1 = 0, a2 = 0, a3 = 0; \
      for (; q + 3 < h; q += 4) { acc += val[q] * x[crd[q]]; a1 += val[q+1] * x[crd[q+1]]; a2 += val[q+2] * x[crd[q+2]]; a3 += val[q+3] * x[crd[q+3]]; } \
      acc = (acc + a1) + (a2 + a3); } \
    for (; q < h; q++) acc += val[q] * x[crd[q]]; \
    y[i] = acc; } \
}
HYB(v_h8, 8)
HYB(v_h16, 16)
HYB(v_h32, 32)
#define NTA(NAME, D, EVERY) \
void NAME(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) { \
  for (int64_t i = 0; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; float acc = 0; \
    __builtin_prefetch(crd + q + D, 0, 0); __builtin_prefetch(val + q + D, 0, 0); \
    for (; q < h; q++) { if (EVERY && (q & 15) == 0) { __builtin_prefetch(crd + q + D + 16, 0, 0); __builtin_prefetch(val + q + D + 16, 0, 0); } acc += val[q] * x[crd[q]]; } \
    y[i] = acc; } \
}
NTA(v_nta256r, 256, 0)
NTA(v_nta1kr, 1024, 0)
NTA(v_nta256, 256, 1)
NTA(v_nta1k, 1024, 1)
#define ROWPF(NAME, D, LOC) \
void NAME(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) { \
  for (int64_t i = 0; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; float acc = 0; \
    __builtin_prefetch(crd + q + D, 0, LOC); __builtin_prefetch(val + q + D, 0, LOC); \
    for (; q < h; q++) acc += val[q] * x[crd[q]]; \
    y[i] = acc; } \
}
ROWPF(v_r512t0, 512, 3)
ROWPF(v_r512nta, 512, 0)
ROWPF(v_r2knta, 2048, 0)
ROWPF(v_r128nta, 128, 0)
#define BLKPF(NAME, D) \
void NAME(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) { \
  for (int64_t i = 0; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; float acc = 0; \
    __builtin_prefetch(crd + q + D, 0, 0); __builtin_prefetch(val + q + D, 0, 0); \
    for (; q + 16 <= h; q += 16) { __builtin_prefetch(crd + q + D + 16, 0, 0); __builtin_prefetch(val + q + D + 16, 0, 0); \
       for (int k = 0; k < 16; k++) acc += val[q+k] * x[crd[q+k]]; } \
    for (; q < h; q++) acc += val[q] * x[crd[q]]; \
    y[i] = acc; } \
}
BLKPF(v_b1k, 1024)
BLKPF(v_b512, 512)
void v_blk16(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  for (int64_t i = 0; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; float acc = 0;
    for (; q + 16 <= h; q += 16) { for (int k = 0; k < 16; k++) acc += val[q+k] * x[crd[q+k]]; }
    for (; q < h; q++) acc += val[q] * x[crd[q]];
    y[i] = acc; }
}
/* row-start prefetch of the streams plus, in long rows, one per 16 entries from the row's own loop */
void v_rowlong(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  for (int64_t i = 0; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; float acc = 0;
    __builtin_prefetch(crd + q + 512, 0, 0); __builtin_prefetch(val + q + 512, 0, 0);
    for (; q < h; q++) acc += val[q] * x[crd[q]];
    y[i] = acc; }
}
void v_b512pf(int64_t n, const I* RESTRICT pos, const I* RESTRICT crd, const float* RESTRICT val, const float* RESTRICT x, float* RESTRICT y) {
  int64_t pfe = pos[n] - 64;
  for (int64_t i = 0; i < n; i++) { int64_t q = pos[i], h = pos[i+1]; float acc = 0;
    __builtin_prefetch(crd + q + 512, 0, 0); __builtin_prefetch(val + q + 512, 0, 0);
    for (; q + 16 <= h; q += 16) { __builtin_prefetch(crd + q + 512 + 16, 0, 0); __builtin_prefetch(val + q + 512 + 16, 0, 0);
       for (int k = 0; k < 16; k++) { if (q + k < pfe) __builtin_prefetch(x + crd[q+k+64], 0, 3); acc += val[q+k] * x[crd[q+k]]; } }
    for (; q < h; q++) { if (q < pfe) __builtin_prefetch(x + crd[q+64], 0, 3); acc += val[q] * x[crd[q]]; }
    y[i] = acc; }
}
