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
#define ROWS_DOT(NAME, ATTR) \
__attribute__((noinline, aligned(64), ATTR)) void NAME(const csr* A, const float* x, float* y) { \
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val; int64_t q = pos[0]; \
  for (int64_t i = 0; i < A->m; i++) { int64_t h = pos[i+1]; float acc = 0; for (; q < h; q++) acc += v[q] * x[crd[q]]; y[i] = acc; } }
ROWS_DOT(fma1, optimize("fp-contract=fast"))
ROWS_DOT(mul1, optimize("fp-contract=off"))
#define ROWS_PAIRS(NAME, ATTR) \
__attribute__((noinline, aligned(64), ATTR)) void NAME(const csr* A, const float* x, float* y) { \
  const int32_t *pos = A->pos, *crd = A->crd; const float* v = A->val; int64_t q = pos[0]; \
  for (int64_t i = 0; i < A->m; i++) { int64_t h = pos[i+1]; float a0 = 0, a1 = 0; \
    for (; q + 1 < h; q += 2) { a0 += v[q] * x[crd[q]]; a1 += v[q+1] * x[crd[q+1]]; } \
    if (q < h) { a0 += v[q] * x[crd[q]]; q++; } y[i] = a0 + a1; } }
ROWS_PAIRS(fma2, optimize("fp-contract=fast"))
ROWS_PAIRS(mul2, optimize("fp-contract=off"))
typedef void (*fn_t)(const csr*, const float*, float*);
int main(int argc, char** argv) {
  for (int a = 1; a < argc; a++) {
    char p[256]; snprintf(p, sizeof p, "/tmp/s39/spmv/%s.bin", argv[a]); csr A = load(p);
    float* x = malloc(4*A.n); for (int64_t j = 0; j < A.n; j++) x[j] = (float)((j * 7919) % 1000) / 1000.f;
    float* y = calloc(A.m, 4);
    struct { const char* name; fn_t f; } fs[] = { {"fma1", fma1}, {"mul1", mul1}, {"fma2", fma2}, {"mul2", mul2} };
    int nf = 4; double best[8]; double med[8][31];
    for (int f = 0; f < nf; f++) best[f] = 1e9;
    for (int r = 0; r < 31; r++) for (int f = 0; f < nf; f++) {
      int reps = (int)(2e6 / A.nnz) + 1; double t0 = now(); for (int k = 0; k < reps; k++) fs[f].f(&A, x, y); double t = (now() - t0) / reps;
      med[f][r] = t; if (t < best[f]) best[f] = t; }
    printf("%-20s %5.1f/row", argv[a], (double)A.nnz/A.m);
    for (int f = 0; f < nf; f++) { double* m = med[f]; for (int i=0;i<31;i++) for(int j=i+1;j<31;j++) if (m[j]<m[i]) {double t=m[i];m[i]=m[j];m[j]=t;} printf("  %s %.1f/%.1f", fs[f].name, m[15]*1e6, best[f]*1e6); }
    printf("  us (median/min)\n");
  } }
