// SDDMM with C as n x K (K = 128 float32), kernel only, C prototypes of issue 15 session 11 (sddmm7).
// Build: g++ -O3 -march=native -fassociative-math -fno-signed-zeros -fno-trapping-math -mtune-ctrl=^use_gather -std=c++17 prototype.cpp -o proto
// Input: MATRIX.bin from dump_matrices.py; run: ./proto MATRIX.bin ROUNDS (variants interleaved, thread CPU time).
// IDEAL=1: every entry of row i reads C row i (C in L1); IDEAL=2: columns 0..len-1 (L1);
// IDEAL=3: entry q reads C row q % n (pure streaming, 512 bytes an entry, no reuse);
// IDEAL=N > 3: the real columns mod N (N x 512 bytes of C). COLBLK=1: the column-block variants.
// Every variant's first round is checked against a double-precision reference (prints WRONG).
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>
#include <chrono>
#include <algorithm>
#include <cmath>
#include <time.h>
#include <sys/mman.h>
template<class T> struct HA { typedef T value_type; HA(){} template<class U> HA(const HA<U>&){} T* allocate(size_t n){ size_t b=(n*sizeof(T)+(2<<20))&~((size_t)(2<<20)-1); void* p=aligned_alloc(2<<20,b); return (T*)p;} void deallocate(T* p,size_t){free(p);} };
template<class T,class U> bool operator==(const HA<T>&,const HA<U>&){return true;}
template<class T,class U> bool operator!=(const HA<T>&,const HA<U>&){return false;}
static double cpu(){timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
typedef float vf __attribute__((vector_size(32), aligned(4), may_alias));
typedef float vf4 __attribute__((vector_size(16), aligned(4), may_alias));
#define PF(p) __builtin_prefetch((const void*)(p), 0, 3)
static inline vf4 hsum4(vf a, vf b, vf c, vf d) {
    auto x = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
    auto y = __builtin_shufflevector(c, d, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(c, d, 4, 5, 6, 7, 12, 13, 14, 15);
    auto z = __builtin_shufflevector(x, y, 0, 1, 8, 9, 4, 5, 12, 13) + __builtin_shufflevector(x, y, 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(z, z, 0, 4, 2, 6) + __builtin_shufflevector(z, z, 1, 5, 3, 7);
}
static inline float hsum(vf v){ float s=0; for(int i=0;i<8;i++) s+=v[i]; return s; }
enum { K = 128 };
struct M { int64_t m, n, nnz; std::vector<int32_t> pos, crd; std::vector<float> sv, out; std::vector<float, HA<float>> B, C; float* Cp; float* Ch; };

// V0: current generated code (4 chains, prefetch D entries ahead, all 8 lines)
template <int D, int PANEL, int STEP = 16, int HINT = 3>
__attribute__((noinline)) void v_cur(M& a, int64_t lo, int64_t hi, int k0) {
    const float* B = a.B.data(); const float* C = a.Cp; const int32_t* crd = a.crd.data();
    float* out = a.out.data(); const float* sv = a.sv.data();
    int64_t pfe = a.pos[a.m] - D;
    for (int64_t i = lo; i < hi; i++) {
        const float* b = B + i * K + k0;
        int64_t q = a.pos[i], h = a.pos[i + 1];
        for (; q + 3 < h; q += 4) {
            if (D && q < pfe - 3) for (int e = 0; e < 4; e++) for (int l = 0; l < PANEL; l += STEP) __builtin_prefetch(C + (int64_t)crd[q + D + e] * K + k0 + l, 0, HINT);
            const float* c0 = C + (int64_t)crd[q] * K + k0; const float* c1 = C + (int64_t)crd[q+1] * K + k0;
            const float* c2 = C + (int64_t)crd[q+2] * K + k0; const float* c3 = C + (int64_t)crd[q+3] * K + k0;
            vf d0 = *(vf*)b * *(vf*)c0, d1 = *(vf*)b * *(vf*)c1, d2 = *(vf*)b * *(vf*)c2, d3 = *(vf*)b * *(vf*)c3;
#pragma GCC unroll 16
            for (int k = 8; k < PANEL; k += 8) {
                vf bb = *(vf*)(b + k);
                d0 += bb * *(vf*)(c0 + k); d1 += bb * *(vf*)(c1 + k); d2 += bb * *(vf*)(c2 + k); d3 += bb * *(vf*)(c3 + k);
            }
            vf4 r = hsum4(d0, d1, d2, d3) * *(vf4*)(sv + q);
            if (PANEL == K) *(vf4*)(out + q) = r; else *(vf4*)(out + q) = (k0 ? *(vf4*)(out + q) : (vf4){0,0,0,0}) + r;
        }
        for (; q < h; q++) {
            const float* c0 = C + (int64_t)crd[q] * K + k0;
            vf d0 = *(vf*)b * *(vf*)c0;
            for (int k = 8; k < PANEL; k += 8) d0 += *(vf*)(b + k) * *(vf*)(c0 + k);
            float r = hsum(d0) * sv[q];
            out[q] = (PANEL == K || !k0) ? r : out[q] + r;
        }
    }
}
// V1: 2 chains per entry (8 chains)
template <int D, int PANEL>
__attribute__((noinline)) void v_2ch(M& a, int64_t lo, int64_t hi, int k0) {
    const float* B = a.B.data(); const float* C = a.Cp; const int32_t* crd = a.crd.data();
    float* out = a.out.data(); const float* sv = a.sv.data();
    int64_t pfe = a.pos[a.m] - D;
    for (int64_t i = lo; i < hi; i++) {
        const float* b = B + i * K + k0;
        int64_t q = a.pos[i], h = a.pos[i + 1];
        for (; q + 3 < h; q += 4) {
            if (D && q < pfe - 3) for (int e = 0; e < 4; e++) for (int l = 0; l < PANEL; l += 16) PF(C + (int64_t)crd[q + D + e] * K + k0 + l);
            const float* c0 = C + (int64_t)crd[q] * K + k0; const float* c1 = C + (int64_t)crd[q+1] * K + k0;
            const float* c2 = C + (int64_t)crd[q+2] * K + k0; const float* c3 = C + (int64_t)crd[q+3] * K + k0;
            vf d0 = *(vf*)b * *(vf*)c0, d1 = *(vf*)b * *(vf*)c1, d2 = *(vf*)b * *(vf*)c2, d3 = *(vf*)b * *(vf*)c3;
            vf bb1 = *(vf*)(b + 8);
            vf e0 = bb1 * *(vf*)(c0 + 8), e1 = bb1 * *(vf*)(c1 + 8), e2 = bb1 * *(vf*)(c2 + 8), e3 = bb1 * *(vf*)(c3 + 8);
#pragma GCC unroll 16
            for (int k = 16; k < PANEL; k += 16) {
                vf bb = *(vf*)(b + k);
                d0 += bb * *(vf*)(c0 + k); d1 += bb * *(vf*)(c1 + k); d2 += bb * *(vf*)(c2 + k); d3 += bb * *(vf*)(c3 + k);
                vf bc = *(vf*)(b + k + 8);
                e0 += bc * *(vf*)(c0 + k + 8); e1 += bc * *(vf*)(c1 + k + 8); e2 += bc * *(vf*)(c2 + k + 8); e3 += bc * *(vf*)(c3 + k + 8);
            }
            vf4 r = hsum4(d0 + e0, d1 + e1, d2 + e2, d3 + e3) * *(vf4*)(sv + q);
            if (PANEL == K) *(vf4*)(out + q) = r; else *(vf4*)(out + q) = (k0 ? *(vf4*)(out + q) : (vf4){0,0,0,0}) + r;
        }
        for (; q < h; q++) {
            const float* c0 = C + (int64_t)crd[q] * K + k0;
            vf d0 = *(vf*)b * *(vf*)c0;
            for (int k = 8; k < PANEL; k += 8) d0 += *(vf*)(b + k) * *(vf*)(c0 + k);
            float r = hsum(d0) * sv[q];
            out[q] = (PANEL == K || !k0) ? r : out[q] + r;
        }
    }
}

// V2: the row's last 1-3 entries run one padded 4-entry step (missing entries repeat the last one)
template <int D>
__attribute__((noinline)) void v_pad(M& a, int64_t lo, int64_t hi, int k0) {
    const float* B = a.B.data(); const float* C = a.Cp; const int32_t* crd = a.crd.data();
    float* out = a.out.data(); const float* sv = a.sv.data();
    int64_t pfe = a.pos[a.m] - D;
    for (int64_t i = lo; i < hi; i++) {
        const float* b = B + i * K;
        int64_t q = a.pos[i], h = a.pos[i + 1];
        for (; q < h; q += 4) {
            if (D && q < pfe - 3) for (int e = 0; e < 4; e++) for (int l = 0; l < K; l += 16) PF(C + (int64_t)crd[q + D + e] * K + l);
            int64_t l1 = q + 1 < h ? q + 1 : h - 1, l2 = q + 2 < h ? q + 2 : h - 1, l3 = q + 3 < h ? q + 3 : h - 1;
            const float* c0 = C + (int64_t)crd[q] * K; const float* c1 = C + (int64_t)crd[l1] * K;
            const float* c2 = C + (int64_t)crd[l2] * K; const float* c3 = C + (int64_t)crd[l3] * K;
            vf d0 = *(vf*)b * *(vf*)c0, d1 = *(vf*)b * *(vf*)c1, d2 = *(vf*)b * *(vf*)c2, d3 = *(vf*)b * *(vf*)c3;
#pragma GCC unroll 16
            for (int k = 8; k < K; k += 8) {
                vf bb = *(vf*)(b + k);
                d0 += bb * *(vf*)(c0 + k); d1 += bb * *(vf*)(c1 + k); d2 += bb * *(vf*)(c2 + k); d3 += bb * *(vf*)(c3 + k);
            }
            vf4 r = hsum4(d0, d1, d2, d3);
            if (q + 3 < h) *(vf4*)(out + q) = r * *(vf4*)(sv + q);
            else { out[q] = r[0] * sv[q]; if (q + 1 < h) out[q + 1] = r[1] * sv[q + 1]; if (q + 2 < h) out[q + 2] = r[2] * sv[q + 2]; }
        }
    }
}

// V3: column blocks: NB passes over the rows, pass b runs each row's entries with columns in
// block b (rows are sorted: a contiguous part of the row, its start kept in cur[i])
template <int D, int NB>
__attribute__((noinline)) void v_colblk(M& a, int64_t lo, int64_t hi, int k0) {
    const float* B = a.B.data(); const float* C = a.Cp; const int32_t* crd = a.crd.data();
    float* out = a.out.data(); const float* sv = a.sv.data();
    std::vector<int64_t> cur(a.pos.begin() + lo, a.pos.begin() + hi + 1);
    int64_t pfe = a.pos[a.m] - D;
    for (int bl = 0; bl < NB; bl++) {
        int64_t jhi = bl == NB - 1 ? a.n : (a.n * (bl + 1)) / NB;
        for (int64_t i = lo; i < hi; i++) {
            const float* b = B + i * K;
            int64_t q = cur[i - lo], h0 = a.pos[i + 1], h = q;
            while (h < h0 && crd[h] < jhi) h++;
            cur[i - lo] = h;
            if (q == h) continue;
            for (; q + 3 < h; q += 4) {
                if (D && q < pfe - 3) for (int e = 0; e < 4; e++) for (int l = 0; l < K; l += 16) PF(C + (int64_t)crd[q + D + e] * K + l);
                const float* c0 = C + (int64_t)crd[q] * K; const float* c1 = C + (int64_t)crd[q+1] * K;
                const float* c2 = C + (int64_t)crd[q+2] * K; const float* c3 = C + (int64_t)crd[q+3] * K;
                vf d0 = *(vf*)b * *(vf*)c0, d1 = *(vf*)b * *(vf*)c1, d2 = *(vf*)b * *(vf*)c2, d3 = *(vf*)b * *(vf*)c3;
#pragma GCC unroll 16
                for (int k = 8; k < K; k += 8) {
                    vf bb = *(vf*)(b + k);
                    d0 += bb * *(vf*)(c0 + k); d1 += bb * *(vf*)(c1 + k); d2 += bb * *(vf*)(c2 + k); d3 += bb * *(vf*)(c3 + k);
                }
                *(vf4*)(out + q) = hsum4(d0, d1, d2, d3) * *(vf4*)(sv + q);
            }
            for (; q < h; q++) {
                const float* c0 = C + (int64_t)crd[q] * K;
                vf d0 = *(vf*)b * *(vf*)c0;
                for (int k = 8; k < K; k += 8) d0 += *(vf*)(b + k) * *(vf*)(c0 + k);
                out[q] = hsum(d0) * sv[q];
            }
        }
    }
}
typedef void (*KF)(M&, int64_t, int64_t, int);
static M load(const char* path) {
    M a; FILE* f = fopen(path, "rb"); int64_t h[3]; fread(h, 8, 3, f); a.m = h[0]; a.n = h[1]; a.nnz = h[2];
    a.pos.resize(a.m + 1); a.crd.resize(a.nnz); fread(a.pos.data(), 4, a.m + 1, f); fread(a.crd.data(), 4, a.nnz, f); fclose(f);
    if (getenv("IDEAL") && atoi(getenv("IDEAL")) > 0) { int mode = atoi(getenv("IDEAL")); for (int64_t i = 0; i < a.m; i++) for (int64_t q = a.pos[i]; q < a.pos[i+1]; q++) a.crd[q] = mode == 1 ? i % a.n : (mode == 2 ? (int32_t)((q - a.pos[i]) % a.n) : mode == 3 ? (int32_t)(q % a.n) : (int32_t)(a.crd[q] % mode)); }
    a.sv.resize(a.nnz); a.B.resize(a.m * K); a.C.resize(a.n * K); a.out.resize(a.nnz + 8);
    srand(1); for (auto& x : a.sv) x = rand() / (float)RAND_MAX + 0.5f; for (auto& x : a.B) x = rand() / (float)RAND_MAX - 0.5f; for (auto& x : a.C) x = rand() / (float)RAND_MAX - 0.5f;
    { size_t b=(a.n*K*4+(2<<20))&~((size_t)(2<<20)-1); a.Ch=(float*)aligned_alloc(2<<20,b); int r=madvise(a.Ch,b,MADV_HUGEPAGE); if(r) perror("madvise"); memcpy(a.Ch,a.C.data(),a.n*K*4); }
    a.Cp = a.C.data();
    { FILE* f=fopen("/proc/self/smaps_rollup","r"); char l[256]; while(fgets(l,256,f)) if(strstr(l,"AnonHuge")) printf("%s",l); fclose(f); }
    return a;
}
static double ref_err(M& a) {
    double e = 0; for (int64_t i = 0; i < a.m; i++) for (int64_t q = a.pos[i]; q < a.pos[i+1]; q++) {
        double s = 0; for (int k = 0; k < K; k++) s += (double)a.B[i*K+k] * a.Cp[(int64_t)a.crd[q]*K+k];
        s *= a.sv[q]; e = std::max(e, std::fabs(s - a.out[q])); }
    return e;
}
// run a kernel over the whole matrix: panels of PANEL over row blocks of rb rows (rb = m: whole)
static void run(M& a, KF f, int panel, int64_t rb) {
    for (int64_t lo = 0; lo < a.m; lo += rb) { int64_t hi = std::min(a.m, lo + rb);
        for (int k0 = 0; k0 < K; k0 += panel) f(a, lo, hi, k0); }
}
struct V { const char* name; KF f; int panel; int64_t rb; int huge; };
int main(int argc, char** argv) {
    M a = load(argv[1]); int reps = argc > 2 ? atoi(argv[2]) : 10;
    std::vector<V> vs = getenv("COLBLK") ? std::vector<V>{
        {"cur D8", v_cur<8, 128>, 128, 1 << 30, 0}, {"colblk 2 D8", v_colblk<8, 2>, 128, 1 << 30, 0},
        {"colblk 4 D8", v_colblk<8, 4>, 128, 1 << 30, 0}, {"colblk 8 D8", v_colblk<8, 8>, 128, 1 << 30, 0}} : std::vector<V>{
        
        // the generated AVX2 K = 128 kernel (4 entries a step, B's row shared, prefetch 8 entries ahead)
        {"cur D8", v_cur<8, 128>, 128, 1 << 30, 0}, {"cur D0", v_cur<0, 128>, 128, 1 << 30, 0},
        {"cur D16", v_cur<16, 128>, 128, 1 << 30, 0}, {"cur D32", v_cur<32, 128>, 128, 1 << 30, 0},
        {"cur D8 2 lines", v_cur<8, 128, 64>, 128, 1 << 30, 0}, {"cur D16 prefetcht2", v_cur<16, 128, 16, 1>, 128, 1 << 30, 0},
        {"cur D8 C huge pages", v_cur<8, 128>, 128, 1 << 30, 1},
        {"2 chains D8", v_2ch<8, 128>, 128, 1 << 30, 0}, {"padded tail D8", v_pad<8>, 128, 1 << 30, 0},
        {"panels 2x64 D16", v_cur<16, 64>, 64, 1 << 30, 0}, {"panels 4x32 D32", v_cur<32, 32>, 32, 1 << 30, 0},
        {"panels 8x16 D64", v_cur<64, 16>, 16, 1 << 30, 0}, {"panels 2x64 rows 512", v_2ch<16, 64>, 64, 512, 0},
    };
    std::vector<std::vector<double>> ts(vs.size());
    for (int r = 0; r < reps; r++) for (size_t v = 0; v < vs.size(); v++) {
        a.Cp = vs[v].huge ? a.Ch : a.C.data(); double t0 = cpu(); run(a, vs[v].f, vs[v].panel, vs[v].rb);
        ts[v].push_back(cpu() - t0);
        if (r == 0) { double e = ref_err(a); if (e > 1e-3) printf("WRONG %s %g\n", vs[v].name, e); memset(a.out.data(), 0, 4 * a.nnz); }
    }
    for (size_t v = 0; v < vs.size(); v++) { auto& t = ts[v]; std::sort(t.begin(), t.end());
        printf("%-18s med %8.3f ms min %8.3f ms  %6.1f ns/entry (min)\n", vs[v].name, t[t.size()/2]*1e3, t[0]*1e3, t[0]*1e9/a.nnz); }
}
