#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint64_t rng = 88172645463325252ull;
static inline uint64_t xs(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
int main(int argc, char** argv) {
    int64_t n = atoll(argv[1]), nnz = atoll(argv[2]);
    float* x = aligned_alloc(64, n * 4); int32_t* idx = aligned_alloc(64, nnz * 4); float* v = aligned_alloc(64, nnz * 4);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 7);
    for (int64_t i = 0; i < nnz; i++) { idx[i] = xs() % n; v[i] = 1.0f; }
    double best_g = 1e9, best_s = 1e9;
    volatile float sink;
    for (int r = 0; r < 7; r++) {
        double t0 = now();
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int64_t i = 0; i + 3 < nnz; i += 4) { s0 += v[i] * x[idx[i]]; s1 += v[i+1] * x[idx[i+1]]; s2 += v[i+2] * x[idx[i+2]]; s3 += v[i+3] * x[idx[i+3]]; }
        sink = s0 + s1 + s2 + s3;
        double t = now() - t0; if (t < best_g) best_g = t;
        t0 = now();
        s0 = s1 = s2 = s3 = 0;
        for (int64_t i = 0; i + 3 < nnz; i += 4) { if (i + 96 < nnz) { __builtin_prefetch(x + idx[i+96]); __builtin_prefetch(x + idx[i+97]); __builtin_prefetch(x + idx[i+98]); __builtin_prefetch(x + idx[i+99]); } s0 += v[i] * x[idx[i]]; s1 += v[i+1] * x[idx[i+1]]; s2 += v[i+2] * x[idx[i+2]]; s3 += v[i+3] * x[idx[i+3]]; } if (0) for (int64_t i = 0; i + 3 < nnz; i += 4) { s0 += v[i] * (float)idx[i]; s1 += v[i+1] * (float)idx[i+1]; s2 += v[i+2]*(float)idx[i+2]; s3 += v[i+3]*(float)idx[i+3]; }
        sink = s0 + s1 + s2 + s3;
        t = now() - t0; if (t < best_s) best_s = t;
    }
    printf("n=%lld nnz=%lld: random gather+stream %.2f ms (%.3f ns/entry, %.1f GB/s compulsory)  prefetched gather %.2f ms (%.1f GB/s compulsory)\n",
        (long long)n, (long long)nnz, best_g * 1e3, best_g / nnz * 1e9, (nnz * 8.0 + n * 4.0) / best_g / 1e9, best_s * 1e3, (nnz * 8.0 + n * 4.0) / best_s / 1e9);
    return 0;
}
