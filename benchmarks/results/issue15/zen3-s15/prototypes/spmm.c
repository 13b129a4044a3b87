// build: gcc -O3 -march=haswell -mtune-ctrl=^use_gather -DK=16 -o spmm16 spmm.c -lm (AVX-512: -march=x86-64-v4 -mprefer-vector-width=512 -DVB=64); run: ./spmm16 $PROTO_DATA/<matrix> [rounds] (data from export.py)
// SpMM K=32 float32 AVX2: out[i,:] = sum_q vals[q] * B[crd[q], :]
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>
#ifndef K
#define K 32
#endif
#ifndef VB
#define VB 32   /* vector bytes: 32 (AVX2) or 64 (AVX-512) */
#endif
#define LANES (VB / 4)
#define NV (K / LANES)
typedef float vf __attribute__((vector_size(VB)));
static int64_t M, N, NNZ; static int64_t *pos64, *crd64; static int32_t *pos, *crd; static float *vals, *B, *out;
static void *load(const char *d, const char *f, size_t *n) { char p[512]; snprintf(p, 512, "%s/%s", d, f);
  FILE *fp = fopen(p, "rb"); fseek(fp, 0, SEEK_END); *n = ftell(fp); fseek(fp, 0, SEEK_SET);
  void *b = aligned_alloc(64, (*n + 63) / 64 * 64 + 64); fread(b, 1, *n, fp); fclose(fp); return b; }
static void v_cur(void) {
  for (int64_t i = 0; i < M; i++) { vf acc[NV]; for (int v = 0; v < NV; v++) acc[v] = (vf){0};
    for (int32_t q = pos[i]; q < pos[i + 1]; q++) { const float *b = B + (int64_t)crd[q] * K; float s = vals[q];
      for (int v = 0; v < NV; v++) acc[v] += s * *(vf*)(b + LANES * v); }
    for (int v = 0; v < NV; v++) *(vf*)(out + i * K + LANES * v) = acc[v]; } }
static void v_split2(void) {
  for (int64_t i = 0; i < M; i++) { vf acc[NV], acd[NV]; for (int v = 0; v < NV; v++) acc[v] = acd[v] = (vf){0};
    int32_t q = pos[i], h = pos[i + 1];
    for (; q + 1 < h; q += 2) { const float *b = B + (int64_t)crd[q] * K, *c = B + (int64_t)crd[q + 1] * K; float s = vals[q], t = vals[q + 1];
      for (int v = 0; v < NV; v++) { acc[v] += s * *(vf*)(b + LANES * v); acd[v] += t * *(vf*)(c + LANES * v); } }
    if (q < h) { const float *b = B + (int64_t)crd[q] * K; float s = vals[q]; for (int v = 0; v < NV; v++) acc[v] += s * *(vf*)(b + LANES * v); }
    for (int v = 0; v < NV; v++) *(vf*)(out + i * K + LANES * v) = acc[v] + acd[v]; } }
static void v_split4(void) {
  for (int64_t i = 0; i < M; i++) { vf a0[NV], a1[NV], a2[NV], a3[NV]; for (int v = 0; v < NV; v++) a0[v] = a1[v] = a2[v] = a3[v] = (vf){0};
    int32_t q = pos[i], h = pos[i + 1];
    for (; q + 3 < h; q += 4) { const float *b0 = B + (int64_t)crd[q] * K, *b1 = B + (int64_t)crd[q + 1] * K, *b2 = B + (int64_t)crd[q + 2] * K, *b3 = B + (int64_t)crd[q + 3] * K;
      float s0 = vals[q], s1 = vals[q + 1], s2 = vals[q + 2], s3 = vals[q + 3];
      for (int v = 0; v < NV; v++) { a0[v] += s0 * *(vf*)(b0 + LANES * v); a1[v] += s1 * *(vf*)(b1 + LANES * v); a2[v] += s2 * *(vf*)(b2 + LANES * v); a3[v] += s3 * *(vf*)(b3 + LANES * v); } }
    for (; q < h; q++) { const float *b = B + (int64_t)crd[q] * K; float s = vals[q]; for (int v = 0; v < NV; v++) a0[v] += s * *(vf*)(b + LANES * v); }
    for (int v = 0; v < NV; v++) *(vf*)(out + i * K + LANES * v) = (a0[v] + a1[v]) + (a2[v] + a3[v]); } }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmpd(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
  size_t n; int64_t *sh = load(argv[1], "shape", &n); M = sh[0]; N = sh[1]; NNZ = sh[2];
  pos64 = load(argv[1], "pos", &n); crd64 = load(argv[1], "crd", &n); vals = load(argv[1], "vals", &n);
  pos = malloc((M + 1) * 4); crd = malloc(NNZ * 4); for (int64_t i = 0; i <= M; i++) pos[i] = pos64[i]; for (int64_t q = 0; q < NNZ; q++) crd[q] = crd64[q];
  B = aligned_alloc(64, N * K * 4); for (int64_t x = 0; x < N * K; x++) B[x] = (float)((x * 7919) % 1000) / 1000.f;
  out = aligned_alloc(64, M * K * 4); float *ref = malloc(M * K * 4);
  void (*fns[])(void) = {v_cur, v_split2, v_split4}; const char *names[] = {"cur", "split2", "split4"};
  int nf = 3, rounds = argc > 2 ? atoi(argv[2]) : 15; double t[8][64];
  v_cur(); memcpy(ref, out, M * K * 4);
  for (int r = 0; r < rounds; r++) for (int f = 0; f < nf; f++) { int ff = r % 2 ? nf - 1 - f : f;
    double t0 = now(); fns[ff](); t[ff][r] = now() - t0;
    for (int64_t x = 0; x < M * K; x += 101) if (fabsf(out[x] - ref[x]) > 1e-3f * (1 + fabsf(ref[x]))) { printf("WRONG %s\n", names[ff]); break; } }
  printf("K=%d VB=%d %-22s", K, VB, (strrchr(argv[1], 47) ? strrchr(argv[1], 47) + 1 : argv[1]));
  for (int f = 0; f < nf; f++) { qsort(t[f], rounds, sizeof(double), cmpd); printf(" %s %.2f/%.2f", names[f], t[f][rounds / 2] / NNZ * 1e9, t[f][0] / NNZ * 1e9); }
  printf("  (ns/entry, median/min)\n"); }
