// build: gcc -O3 -march=haswell -mtune-ctrl=^use_gather -o spmv spmv.c -lm; run: ./spmv $PROTO_DATA/<matrix> [rounds] (data from export_spmv.py)
// SpMV float32, int32 indices: y[i] = sum_q vals[q] * x[crd[q]]; one accumulator vs several on long rows
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>
static int64_t M, N, NNZ; static int32_t *pos, *crd; static float *vals, *x, *y;
static void *load(const char *d, const char *f, size_t *n) { char p[512]; snprintf(p, 512, "%s/%s", d, f);
  FILE *fp = fopen(p, "rb"); fseek(fp, 0, SEEK_END); *n = ftell(fp); fseek(fp, 0, SEEK_SET);
  void *b = aligned_alloc(64, (*n + 63) / 64 * 64 + 64); fread(b, 1, *n, fp); fclose(fp); return b; }
static void v_cur(void) { for (int64_t i = 0; i < M; i++) { float acc = 0; for (int32_t q = pos[i]; q < pos[i + 1]; q++) acc += vals[q] * x[crd[q]]; y[i] = acc; } }
#define HYB(NAME, T, U) static void NAME(void) { for (int64_t i = 0; i < M; i++) { float acc = 0; int32_t q = pos[i], h = pos[i + 1]; \
  if (h - q >= T) { float a[U] = {0}; for (; q + U - 1 < h; q += U) for (int u = 0; u < U; u++) a[u] += vals[q + u] * x[crd[q + u]]; \
    for (int u = 1; u < U; u++) a[0] += a[u]; acc = a[0]; } \
  for (; q < h; q++) acc += vals[q] * x[crd[q]]; y[i] = acc; } }
HYB(v_h16x2, 16, 2)
HYB(v_h16x4, 16, 4)
HYB(v_h8x4, 8, 4)
HYB(v_h32x4, 32, 4)
HYB(v_h16x8, 16, 8)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmpd(const void *a, const void *b) { double u = *(double*)a, v = *(double*)b; return u < v ? -1 : u > v; }
int main(int argc, char **argv) {
  size_t n; int64_t *sh = load(argv[1], "shape", &n); M = sh[0]; N = sh[1]; NNZ = sh[2];
  pos = load(argv[1], "pos", &n); crd = load(argv[1], "crd", &n); vals = load(argv[1], "vals", &n);
  x = aligned_alloc(64, N * 4 + 64); for (int64_t j = 0; j < N; j++) x[j] = (float)((j * 7919) % 1000) / 1000.f;
  y = aligned_alloc(64, M * 4 + 64); float *ref = malloc(M * 4);
  void (*fns[])(void) = {v_cur, v_h16x2, v_h16x4, v_h8x4, v_h32x4, v_h16x8}; const char *names[] = {"cur", "h16x2", "h16x4", "h8x4", "h32x4", "h16x8"};
  int nf = 6, rounds = argc > 2 ? atoi(argv[2]) : 21; double t[8][128];
  v_cur(); memcpy(ref, y, M * 4);
  for (int r = 0; r < rounds; r++) for (int f = 0; f < nf; f++) { int ff = r % 2 ? nf - 1 - f : f;
    double t0 = now(); fns[ff](); t[ff][r] = now() - t0;
    for (int64_t i = 0; i < M; i += 7) if (fabsf(y[i] - ref[i]) > 1e-3f * (1 + fabsf(ref[i]))) { printf("WRONG %s\n", names[ff]); break; } }
  const char *b = strrchr(argv[1], '/'); printf("%-22s", b ? b + 1 : argv[1]);
  double base; qsort(t[0], rounds, sizeof(double), cmpd); base = t[0][rounds / 2];
  for (int f = 0; f < nf; f++) { if (f) qsort(t[f], rounds, sizeof(double), cmpd); printf(" %s %.2f (%.2fx)", names[f], t[f][rounds / 2] / NNZ * 1e9, base / t[f][rounds / 2]); }
  printf("  ns/entry median\n"); }
