// The MoE gate gradient out(b,n) = G(b,n) sum_d x(b,d) sum_h dy(b,h) E(n,d,h) on the gate's pattern,
// read expert-major (n, b, d, h), 1024 inputs x 784 -> 512, 8 experts, top 2 (random routing):
// hand-written forms against the generated kernel's (issue 13, session 12, moe8).
// Build: g++ -O3 -march=haswell -mtune-ctrl=^use_gather -fassociative-math -fno-signed-zeros
//        -fno-trapping-math -funroll-loops -fvariable-expansion-in-unroller gate_grad_prototype.cpp -o proto
// (the flags of the generated run-time-width chunk function); run: ./proto [ROUNDS] (variants interleaved,
// process CPU ms, min and median). Every variant is checked against ``orig`` (max relative error).
// orig: the generated run_chunk (4 inputs jammed, each walks all of E[n]: 1.6 MB from L3 per 4 inputs).
// blocked / vkb<R,C>: rows d cut into blocks of DB rows (DB x 2 KB of E[n] stays in L2) hoisted above the
// inputs of expert n, partial sums kept per stored entry (out[q]); vk / vkb: explicit 8-float vectors,
// R inputs x C rows of E per pass over h (R*C accumulators, C+R loads per R*C FMAs); jam2 / sb24: the
// same tiles written as scalar loops (as the compiler's run-time-width variant is), left to gcc.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <ctime>
#include <vector>
#include <algorithm>
#include <random>
#include <functional>
#include <cmath>
typedef int64_t I;
// one stored entry q over rows [d0b, d1b), adding to a0 (the rest of a tile, in every variant)
static inline float one_entry(I q, I d0b, I d1b, I D, I H, const int32_t* crd, const float* G,
  const float* dy, const float* x, const float* En, float a0) {
  const float *d0 = dy + crd[q]*H, *x0 = x + crd[q]*D;
  for (I d = d0b; d < d1b; d++) { const float* Ed = En + d*H; float p0 = 0;
    for (I h = 0; h < H; h++) p0 += d0[h]*Ed[h];
    a0 += (G[q]*x0[d])*p0; }
  return a0;
}
// for each expert n and each block [d0b, d1b) of its rows d: tile(E[n], segment s..e, d0b, d1b), partial sums in out
template <class F>
static inline void each_block(I N, I D, I H, I DB, const int32_t* pos, const float* E, float* out, F tile) {
  for (I n = 0; n < N; n++) {
    I s = pos[n], e = pos[n+1];
    for (I q = s; q < e; q++) out[q] = 0;
    for (I d0b = 0; d0b < D; d0b += DB) tile(E + n * D * H, s, e, d0b, std::min(D, d0b + DB));
  }
}
// d-blocked: a block of DB rows of E[n] (DB*H floats) stays in L2 while every input of expert n uses it
__attribute__((noinline)) void blocked(I N, I D, I H, I DB, const int32_t* pos, const int32_t* crd, const float* G,
  const float* dy, const float* x, const float* E, float* out) {
  each_block(N, D, H, DB, pos, E, out, [&](const float* En, I s, I e, I d0b, I d1b) {
      I q = s;
      for (; q + 3 < e; q += 4) {
        const float *d0 = dy + crd[q]*H, *d1 = dy + crd[q+1]*H, *d2 = dy + crd[q+2]*H, *d3 = dy + crd[q+3]*H;
        const float *x0 = x + crd[q]*D, *x1 = x + crd[q+1]*D, *x2 = x + crd[q+2]*D, *x3 = x + crd[q+3]*D;
        float a0=out[q],a1=out[q+1],a2=out[q+2],a3=out[q+3];
        for (I d = d0b; d < d1b; d++) {
          const float* Ed = En + d*H;
          float p0=0,p1=0,p2=0,p3=0;
          for (I h = 0; h < H; h++) { p0 += d0[h]*Ed[h]; p1 += d1[h]*Ed[h]; p2 += d2[h]*Ed[h]; p3 += d3[h]*Ed[h]; }
          a0 += (G[q]*x0[d])*p0; a1 += (G[q+1]*x1[d])*p1; a2 += (G[q+2]*x2[d])*p2; a3 += (G[q+3]*x3[d])*p3;
        }
        out[q]=a0; out[q+1]=a1; out[q+2]=a2; out[q+3]=a3;
      }
      for (; q < e; q++) out[q] = one_entry(q, d0b, d1b, D, H, crd, G, dy, x, En, out[q]);
  });
}
// the generated form: 4 inputs jammed, each pass walking all rows (one block of all of them)
__attribute__((noinline)) void orig(I N, I D, I H, const int32_t* pos, const int32_t* crd, const float* G,
  const float* dy, const float* x, const float* E, float* out) { blocked(N, D, H, D, pos, crd, G, dy, x, E, out); }

// d jammed by 2 under the 4-input tile: 8 independent chains, E rows shared by 4 inputs
__attribute__((noinline)) void jam2(I N, I D, I H, const int32_t* pos, const int32_t* crd, const float* G,
  const float* dy, const float* x, const float* E, float* out) {
  for (I n = 0; n < N; n++) {
    const float* En = E + n * D * H;
    I q = pos[n], e = pos[n+1];
    for (; q + 3 < e; q += 4) {
      const float *d0 = dy + crd[q]*H, *d1 = dy + crd[q+1]*H, *d2 = dy + crd[q+2]*H, *d3 = dy + crd[q+3]*H;
      const float *x0 = x + crd[q]*D, *x1 = x + crd[q+1]*D, *x2 = x + crd[q+2]*D, *x3 = x + crd[q+3]*D;
      float a0=0,a1=0,a2=0,a3=0;
      I d = 0;
      for (; d + 1 < D; d += 2) {
        const float* Ed = En + d*H; const float* Ee = Ed + H;
        float p0=0,p1=0,p2=0,p3=0, r0=0,r1=0,r2=0,r3=0;
        for (I h = 0; h < H; h++) { p0 += d0[h]*Ed[h]; p1 += d1[h]*Ed[h]; p2 += d2[h]*Ed[h]; p3 += d3[h]*Ed[h];
                                    r0 += d0[h]*Ee[h]; r1 += d1[h]*Ee[h]; r2 += d2[h]*Ee[h]; r3 += d3[h]*Ee[h]; }
        a0 += (G[q]*x0[d])*p0; a1 += (G[q+1]*x1[d])*p1; a2 += (G[q+2]*x2[d])*p2; a3 += (G[q+3]*x3[d])*p3;
        a0 += (G[q]*x0[d+1])*r0; a1 += (G[q+1]*x1[d+1])*r1; a2 += (G[q+2]*x2[d+1])*r2; a3 += (G[q+3]*x3[d+1])*r3;
      }
      for (; d < D; d++) {
        const float* Ed = En + d*H;
        float p0=0,p1=0,p2=0,p3=0;
        for (I h = 0; h < H; h++) { p0 += d0[h]*Ed[h]; p1 += d1[h]*Ed[h]; p2 += d2[h]*Ed[h]; p3 += d3[h]*Ed[h]; }
        a0 += (G[q]*x0[d])*p0; a1 += (G[q+1]*x1[d])*p1; a2 += (G[q+2]*x2[d])*p2; a3 += (G[q+3]*x3[d])*p3;
      }
      out[q]=a0; out[q+1]=a1; out[q+2]=a2; out[q+3]=a3;
    }
    for (; q < e; q++) out[q] = one_entry(q, 0, D, D, H, crd, G, dy, x, En, 0);
  }
}

typedef float vf __attribute__((vector_size(32), aligned(4), may_alias));
static inline float hs(vf v) { float s = 0; for (int i = 0; i < 8; i++) s += v[i]; return s; }
// explicit vectors: R inputs x C rows of E per pass over h; dy vectors loaded once per h step
template <int R, int C>
__attribute__((noinline)) void vkb(I N, I D, I H, I DB, const int32_t* pos, const int32_t* crd, const float* G,
  const float* dy, const float* x, const float* E, float* out) {
  for (I n = 0; n < N; n++) {
    const float* En = E + n * D * H;
    I s = pos[n], e = pos[n+1];
    for (I q = s; q < e; q++) out[q] = 0;
    for (I d0b = 0; d0b < D; d0b += DB) {
    I d1b = std::min(D, d0b + DB);
    I q = s;
    for (; q + R - 1 < e; q += R) {
      const float* dr[R]; const float* xr[R]; float a[R];
      for (int i = 0; i < R; i++) { dr[i] = dy + crd[q+i]*H; xr[i] = x + crd[q+i]*D; a[i] = out[q+i]; }
      I d = d0b;
      for (; d + C - 1 < d1b; d += C) {
        vf p[R][C];
        for (int i = 0; i < R; i++) for (int j = 0; j < C; j++) p[i][j] = vf{0,0,0,0,0,0,0,0};
        for (I h = 0; h < H; h += 8) {
          vf ev[C]; for (int j = 0; j < C; j++) ev[j] = *(const vf*)(En + (d+j)*H + h);
          for (int i = 0; i < R; i++) { vf dv = *(const vf*)(dr[i] + h);
            for (int j = 0; j < C; j++) p[i][j] += dv * ev[j]; }
        }
        for (int i = 0; i < R; i++) for (int j = 0; j < C; j++) a[i] += (G[q+i]*xr[i][d+j]) * hs(p[i][j]);
      }
      for (; d < d1b; d++) { const float* Ed = En + d*H;
        for (int i = 0; i < R; i++) { float s = 0; for (I h = 0; h < H; h++) s += dr[i][h]*Ed[h]; a[i] += (G[q+i]*xr[i][d])*s; } }
      for (int i = 0; i < R; i++) out[q+i] = a[i];
    }
    for (; q < e; q++) out[q] = one_entry(q, d0b, d1b, D, H, crd, G, dy, x, En, out[q]);
    }
  }
}
// unblocked: one block of all rows
template <int R, int C>
__attribute__((noinline)) void vk(I N, I D, I H, const int32_t* pos, const int32_t* crd, const float* G,
  const float* dy, const float* x, const float* E, float* out) { vkb<R, C>(N, D, H, D, pos, crd, G, dy, x, E, out); }

// scalar source (as the run-time-width chunk function is written), 2 inputs x 4 rows d, d-blocked
__attribute__((noinline)) void sb24(I N, I D, I H, I DB, const int32_t* pos, const int32_t* crd, const float* G,
  const float* dy, const float* x, const float* E, float* out) {
  each_block(N, D, H, DB, pos, E, out, [&](const float* En, I s, I e, I d0b, I d1b) {
      I q = s;
      for (; q + 1 < e; q += 2) {
        const float *y0 = dy + crd[q]*H, *y1 = dy + crd[q+1]*H;
        const float *x0 = x + crd[q]*D, *x1 = x + crd[q+1]*D;
        float a0=out[q], a1=out[q+1];
        I d = d0b;
        for (; d + 3 < d1b; d += 4) {
          const float *e0 = En + d*H, *e1 = e0 + H, *e2 = e1 + H, *e3 = e2 + H;
          float p00=0,p01=0,p02=0,p03=0,p10=0,p11=0,p12=0,p13=0;
          for (I h = 0; h < H; h++) {
            p00 += y0[h]*e0[h]; p01 += y0[h]*e1[h]; p02 += y0[h]*e2[h]; p03 += y0[h]*e3[h];
            p10 += y1[h]*e0[h]; p11 += y1[h]*e1[h]; p12 += y1[h]*e2[h]; p13 += y1[h]*e3[h]; }
          a0 += (G[q]*x0[d])*p00; a0 += (G[q]*x0[d+1])*p01; a0 += (G[q]*x0[d+2])*p02; a0 += (G[q]*x0[d+3])*p03;
          a1 += (G[q+1]*x1[d])*p10; a1 += (G[q+1]*x1[d+1])*p11; a1 += (G[q+1]*x1[d+2])*p12; a1 += (G[q+1]*x1[d+3])*p13;
        }
        for (; d < d1b; d++) { const float* Ed = En + d*H; float p0=0,p1=0;
          for (I h = 0; h < H; h++) { p0 += y0[h]*Ed[h]; p1 += y1[h]*Ed[h]; }
          a0 += (G[q]*x0[d])*p0; a1 += (G[q+1]*x1[d])*p1; }
        out[q]=a0; out[q+1]=a1;
      }
      for (; q < e; q++) out[q] = one_entry(q, d0b, d1b, D, H, crd, G, dy, x, En, out[q]);
  });
}
static double cpu() { timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec*1e3 + t.tv_nsec*1e-6; }
int main(int argc, char** argv) {
  I B=1024, D=784, H=512, N=8, K=2;
  std::mt19937 rng(0); std::uniform_real_distribution<float> u(0,1);
  std::vector<float> x(B*D), dy(B*H), E(N*D*H);
  for (auto& v: x) v=u(rng); for (auto& v: dy) v=u(rng); for (auto& v: E) v=u(rng)/28;
  std::vector<std::vector<int>> per(N);
  for (I b=0;b<B;b++){ std::vector<int> p(N); for(int i=0;i<N;i++)p[i]=i; std::shuffle(p.begin(),p.end(),rng); for(int k=0;k<K;k++) per[p[k]].push_back(b);}
  std::vector<int32_t> pos(N+1,0), crd; std::vector<float> G;
  for (I n=0;n<N;n++){ for(int b: per[n]){crd.push_back(b); G.push_back(u(rng));} pos[n+1]=crd.size(); }
  I nnz = crd.size(); std::vector<float> o1(nnz), o2(nnz);
  std::vector<std::pair<const char*, std::function<void()>>> fs = {
    {"orig", [&]{ orig(N,D,H,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o1.data()); }},
    {"v4x2", [&]{ vk<4,2>(N,D,H,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"v2x4", [&]{ vk<2,4>(N,D,H,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"blk4x1/128", [&]{ blocked(N,D,H,128,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b4x2/128", [&]{ vkb<4,2>(N,D,H,128,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b2x4/128", [&]{ vkb<2,4>(N,D,H,128,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b2x4/64", [&]{ vkb<2,4>(N,D,H,64,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"sb2x4/128", [&]{ sb24(N,D,H,128,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"sb2x4/all", [&]{ sb24(N,D,H,D,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b1x8/128", [&]{ vkb<1,8>(N,D,H,128,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b3x4/128", [&]{ vkb<3,4>(N,D,H,128,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b2x3/128", [&]{ vkb<2,3>(N,D,H,128,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b2x4/32", [&]{ vkb<2,4>(N,D,H,32,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"jam2", [&]{ jam2(N,D,H,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b3x3/96", [&]{ vkb<3,3>(N,D,H,96,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
    {"b4x2/200", [&]{ vkb<4,2>(N,D,H,200,pos.data(),crd.data(),G.data(),dy.data(),x.data(),E.data(),o2.data()); }},
  };
  for (size_t i = 1; i < fs.size(); i++) {
    fs[0].second(); fs[i].second(); double err = 0;
    for (I k = 0; k < nnz; k++) err = std::max(err, (double)fabsf(o1[k] - o2[k]) / fabsf(o1[k]));
    printf("%-12s max rel. error %.2g\n", fs[i].first, err);
  }
  int reps = argc > 1 ? atoi(argv[1]) : 21; std::vector<std::vector<double>> T(fs.size());
  for (int rep=0; rep<reps; rep++) for (size_t i=0;i<fs.size();i++) { double t=cpu(); fs[i].second(); T[i].push_back(cpu()-t); }
  for (size_t i=0;i<fs.size();i++) { auto v=T[i]; std::sort(v.begin(),v.end()); printf("%-12s min %.1f med %.1f\n", fs[i].first, v[0], v[reps/2]); }

}
