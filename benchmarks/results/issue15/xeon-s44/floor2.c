// SpMM-shaped: rows of E random 512-byte B rows summed, each row's sum stored to out (512 B)
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
    int64_t rows = atol(argv[1]), E = atol(argv[2]); int mode = atoi(argv[3]); int64_t orows = atol(argv[4]);
    int64_t n = orows * E;
    float* B = aligned_alloc(64, rows * 128 * 4);
    float* out = aligned_alloc(64, orows * 128 * 4);
    for (int64_t x = 0; x < rows * 128; x++) B[x] = 1e-3f * (x % 7);
    for (int64_t x = 0; x < orows * 128; x++) out[x] = 0;
    int32_t* idx = malloc((n + 64) * 4);
    uint64_t s = 88172645463325252ull;
    for (int64_t q = 0; q < n + 64; q++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; idx[q] = s % rows; }
    double best = 1e9;
    for (int r = 0; r < 9; r++) {
        double t0 = now();
        int64_t q = 0;
        for (int64_t i = 0; i < orows; i++) {
            __m512 a[8]; for (int v = 0; v < 8; v++) a[v] = _mm512_setzero_ps();
            if (mode == 2 && i + 2 < orows) for (int l = 0; l < 8; l++) _mm_prefetch((const char*)(out + (i + 2) * 128 + 16 * l), _MM_HINT_ET0);
            for (int64_t e = 0; e < E; e++, q++) {
                const float* b = B + (int64_t)idx[q] * 128;
                const char* p = (const char*)(B + (int64_t)idx[q + 8] * 128); for (int l = 0; l < 8; l++) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
                for (int v = 0; v < 8; v++) a[v] = _mm512_add_ps(a[v], _mm512_load_ps(b + 16 * v));
            }
            if (mode == 1) for (int v = 0; v < 8; v++) _mm512_stream_ps(out + i * 128 + 16 * v, a[v]);
            else if (mode >= 0) for (int v = 0; v < 8; v++) _mm512_store_ps(out + i * 128 + 16 * v, a[v]);
        }
        double t = now() - t0; if (t < best) best = t;
    }
    printf("B %.1f MB, %ld a row, out %.1f MB, mode %d: %.2f ns/entry\n", rows * 512 / 1e6, E, orows * 512 / 1e6, mode, best / n * 1e9);
}
