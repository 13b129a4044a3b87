// random 512-byte rows of a 32 MB matrix summed into 8 zmm accumulators: the L2/L3 gather floor
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
    int64_t rows = atol(argv[1]), n = atol(argv[2]); int pfd = atoi(argv[3]); int lines = atoi(argv[4]);
    float* B = aligned_alloc(64, rows * 128 * 4);
    for (int64_t x = 0; x < rows * 128; x++) B[x] = 1e-3f * (x % 7);
    int32_t* idx = malloc((n + 64) * 4);
    uint64_t s = 88172645463325252ull;
    for (int64_t q = 0; q < n + 64; q++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; idx[q] = s % rows; }
    double best = 1e9; float sink = 0;
    for (int r = 0; r < 7; r++) {
        __m512 a[8]; for (int v = 0; v < 8; v++) a[v] = _mm512_setzero_ps();
        double t0 = now();
        for (int64_t q = 0; q < n; q++) {
            const float* b = B + (int64_t)idx[q] * 128;
            if (pfd) { const char* p = (const char*)(B + (int64_t)idx[q + pfd] * 128); for (int l = 0; l < lines; l++) _mm_prefetch(p + 64 * l, _MM_HINT_T0); }
            for (int v = 0; v < 8; v++) a[v] = _mm512_add_ps(a[v], _mm512_load_ps(b + 16 * v));
        }
        double t = now() - t0; if (t < best) best = t;
        for (int v = 0; v < 8; v++) sink += _mm512_reduce_add_ps(a[v]);
    }
    printf("rows %ld (%.1f MB) pfd %d lines %d: %.2f ns/row, %.1f GB/s  (%g)\n", rows, rows * 512 / 1e6, pfd, lines, best / n * 1e9, n * 512 / best / 1e9, sink);
}
