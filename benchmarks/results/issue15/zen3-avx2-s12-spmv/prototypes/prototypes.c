#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <immintrin.h>
typedef struct { int64_t m, k, nnz; int32_t *pos, *crd; float *val; } M;
static M load(const char* n){ char p[256]; snprintf(p,256,"/tmp/spmv8h/%s.bin",n); FILE*f=fopen(p,"rb"); M a; int64_t h[3]; fread(h,8,3,f); a.m=h[0];a.k=h[1];a.nnz=h[2];
 a.pos=aligned_alloc(64,((a.m+1)*4+63)/64*64); a.crd=aligned_alloc(64,((a.nnz+64)*4+63)/64*64); a.val=aligned_alloc(64,((a.nnz+64)*4+63)/64*64);
 fread(a.pos,4,a.m+1,f); fread(a.crd,4,a.nnz,f); fread(a.val,4,a.nnz,f); fclose(f); return a;}
static double now(){ struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec; }
#define PS(p) __builtin_prefetch((const void*)(p),0,0)

__attribute__((noinline,aligned(64))) void v_base(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  for(int64_t i=lo;i<hi;i++){ float acc=0; for(int64_t q=a->pos[i];q<a->pos[i+1];q++) acc+=a->val[q]*x[a->crd[q]]; y[i]=acc; } }
__attribute__((noinline)) void v_acc2(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  for(int64_t i=lo;i<hi;i++){ float a0=0,a1=0; int64_t q=a->pos[i],h=a->pos[i+1]; for(;q+2<=h;q+=2){a0+=a->val[q]*x[a->crd[q]];a1+=a->val[q+1]*x[a->crd[q+1]];} if(q<h)a0+=a->val[q]*x[a->crd[q]]; y[i]=a0+a1; } }
/* number of rows [lo,r) whose block reads stay inside the arrays: pos[i+1]+W-1 <= nnz */
static int64_t safe_end(const M*a,int64_t lo,int64_t hi,int W){ int64_t r=hi; while(r>lo && a->pos[r]+W > a->nnz) r--; return r; }
/* scalar masked blocks of W, first block unconditional */
#define SCALAR_BLK(NAME,W) __attribute__((noinline)) void NAME(const M*a,const float*x,float*y,int64_t lo,int64_t hi){ \
  int64_t r=safe_end(a,lo,hi,W); const int32_t*crd=a->crd; const float*val=a->val; \
  for(int64_t i=lo;i<r;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; float s[W]; for(int k=0;k<W;k++)s[k]=0; \
    do { for(int k=0;k<W;k++){ float p=val[q+k]*x[crd[q+k]]; s[k]+= (q+k<h)?p:0.f; } q+=W; } while(q<h); \
    float t=0; for(int k=0;k<W;k++)t+=s[k]; y[i]=t; } \
  v_base(a,x,y,r,hi); }
SCALAR_BLK(v_sblk4,4)
SCALAR_BLK(v_sblk8,8)
/* AVX2 vector blocks of 8 with hw gather */
static inline float hsum8(__m256 v){ __m128 l=_mm256_castps256_ps128(v), h=_mm256_extractf128_ps(v,1); l=_mm_add_ps(l,h); l=_mm_add_ps(l,_mm_movehl_ps(l,l)); l=_mm_add_ss(l,_mm_movehdup_ps(l)); return _mm_cvtss_f32(l);}
__attribute__((noinline)) void v_vg8(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  int64_t r=safe_end(a,lo,hi,8); const __m256i iota=_mm256_setr_epi32(0,1,2,3,4,5,6,7);
  for(int64_t i=lo;i<r;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; __m256 acc=_mm256_setzero_ps();
    do { __m256i idx=_mm256_loadu_si256((const __m256i*)(a->crd+q)); __m256 v=_mm256_loadu_ps(a->val+q);
      __m256 m=_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(h-q)),iota));
      __m256 g=_mm256_i32gather_ps(x,idx,4); acc=_mm256_add_ps(acc,_mm256_and_ps(m,_mm256_mul_ps(v,g))); q+=8; } while(q<h);
    y[i]=hsum8(acc);} v_base(a,x,y,r,hi); }
/* emulated gather */
static inline __m256 eg8(const float*x,const int32_t*c){ __m128 lo=_mm_setr_ps(x[c[0]],x[c[1]],x[c[2]],x[c[3]]); __m128 hi=_mm_setr_ps(x[c[4]],x[c[5]],x[c[6]],x[c[7]]); return _mm256_insertf128_ps(_mm256_castps128_ps256(lo),hi,1);}
__attribute__((noinline)) void v_ve8(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  int64_t r=safe_end(a,lo,hi,8); const __m256i iota=_mm256_setr_epi32(0,1,2,3,4,5,6,7);
  for(int64_t i=lo;i<r;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; __m256 acc=_mm256_setzero_ps();
    do { __m256 v=_mm256_loadu_ps(a->val+q);
      __m256 m=_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(h-q)),iota));
      __m256 g=eg8(x,a->crd+q); acc=_mm256_add_ps(acc,_mm256_and_ps(m,_mm256_mul_ps(v,g))); q+=8; } while(q<h);
    y[i]=hsum8(acc);} v_base(a,x,y,r,hi); }
/* 4-wide sse vector blocks, emulated gather */
__attribute__((noinline)) void v_ve4(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  int64_t r=safe_end(a,lo,hi,4); const __m128i iota=_mm_setr_epi32(0,1,2,3);
  for(int64_t i=lo;i<r;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; __m128 acc=_mm_setzero_ps();
    do { const int32_t*c=a->crd+q; __m128 v=_mm_loadu_ps(a->val+q);
      __m128 m=_mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32((int)(h-q)),iota));
      __m128 g=_mm_setr_ps(x[c[0]],x[c[1]],x[c[2]],x[c[3]]); acc=_mm_add_ps(acc,_mm_and_ps(m,_mm_mul_ps(v,g))); q+=4; } while(q<h);
    acc=_mm_add_ps(acc,_mm_movehl_ps(acc,acc)); acc=_mm_add_ss(acc,_mm_movehdup_ps(acc)); y[i]=_mm_cvtss_f32(acc);} v_base(a,x,y,r,hi); }
/* streams variant of ve8: prefetch 512 entries ahead at row start and per block */
__attribute__((noinline)) void v_ve8s(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  int64_t r=safe_end(a,lo,hi,8); const __m256i iota=_mm256_setr_epi32(0,1,2,3,4,5,6,7);
  for(int64_t i=lo;i<r;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; __m256 acc=_mm256_setzero_ps(); PS(a->crd+q+512); PS(a->val+q+512);
    do { __m256 v=_mm256_loadu_ps(a->val+q);
      __m256 m=_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(h-q)),iota));
      __m256 g=eg8(x,a->crd+q); acc=_mm256_add_ps(acc,_mm256_and_ps(m,_mm256_mul_ps(v,g))); q+=8; if(q<h){PS(a->crd+q+512); PS(a->val+q+512);} } while(q<h);
    y[i]=hsum8(acc);} v_base(a,x,y,r,hi); }

/* sblk8 with gcc's vectorizer on (lane loop of 8 = one ymm) */
#define SCALAR_BLKV(NAME,W) __attribute__((noinline,optimize("tree-vectorize"))) void NAME(const M*a,const float*x,float*y,int64_t lo,int64_t hi){ \
  int64_t r=safe_end(a,lo,hi,W); const int32_t*crd=a->crd; const float*val=a->val; \
  for(int64_t i=lo;i<r;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; float s[W]; for(int k=0;k<W;k++)s[k]=0; \
    do { for(int k=0;k<W;k++){ float p=val[q+k]*x[crd[q+k]]; s[k]+= (q+k<h)?p:0.f; } q+=W; } while(q<h); \
    float t=0; for(int k=0;k<W;k++)t+=s[k]; y[i]=t; } \
  v_base(a,x,y,r,hi); }
SCALAR_BLKV(v_vblk8,8)
SCALAR_BLKV(v_vblk4,4)
typedef float vf8 __attribute__((vector_size(32),aligned(4),may_alias));
typedef int vi8 __attribute__((vector_size(32),aligned(4),may_alias));
/* vector extension: products lane by lane, packed, masked add */
__attribute__((noinline)) void v_vx8(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  int64_t r=safe_end(a,lo,hi,8); const vi8 iota={0,1,2,3,4,5,6,7}; const int32_t*c=a->crd; const float*v=a->val;
  for(int64_t i=lo;i<r;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; vf8 acc={0};
    do { vf8 p={v[q]*x[c[q]],v[q+1]*x[c[q+1]],v[q+2]*x[c[q+2]],v[q+3]*x[c[q+3]],v[q+4]*x[c[q+4]],v[q+5]*x[c[q+5]],v[q+6]*x[c[q+6]],v[q+7]*x[c[q+7]]};
      vi8 m = iota < (int)(h-q); vf8 z={0}; acc += m ? p : z; q+=8; } while(q<h);
    float t=0; for(int k=0;k<8;k++) t+=acc[k]; y[i]=t; } v_base(a,x,y,r,hi); }
/* vector extension: x packed, vals vector load */
__attribute__((noinline)) void v_vy8(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  int64_t r=safe_end(a,lo,hi,8); const vi8 iota={0,1,2,3,4,5,6,7}; const int32_t*c=a->crd; const float*v=a->val;
  for(int64_t i=lo;i<r;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; vf8 acc={0};
    do { vf8 g={x[c[q]],x[c[q+1]],x[c[q+2]],x[c[q+3]],x[c[q+4]],x[c[q+5]],x[c[q+6]],x[c[q+7]]};
      vf8 p = *(const vf8*)(v+q) * g;
      vi8 m = iota < (int)(h-q); vf8 z={0}; acc += m ? p : z; q+=8; } while(q<h);
    float t=0; for(int k=0;k<8;k++) t+=acc[k]; y[i]=t; } v_base(a,x,y,r,hi); }

typedef int vm8 __attribute__((vector_size(32)));
static inline vf8 rb_add(vf8 acc, vf8 p, int64_t n){ const vm8 lane={0,1,2,3,4,5,6,7}; vf8 z={0}; return acc + (lane < (int)(n<8?n:8) ? p : z); }
static inline float rb_sum(vf8 v){ auto h=__builtin_shufflevector(v,v,0,1,2,3)+__builtin_shufflevector(v,v,4,5,6,7); float s=0; for(int k=0;k<4;k++) s+=h[k]; return s; }
#define GEN(NAME, PFB, EXPECT) __attribute__((noinline)) void NAME(const M*a,const float*x,float*y,int64_t lo,int64_t hi){ \
  int64_t qend=a->pos[a->m]; const int32_t*c=a->crd; const float*v=a->val; \
  for(int64_t i=lo;i<hi;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; float acc=0; \
    if(EXPECT(h+8<=qend)){ vf8 accv={0}; int64_t qb=q, qe=h+(h==q); PS(c+q+512); PS(v+q+512); \
      while(qb<qe){ if(PFB){PS(c+qb+8+512); PS(v+qb+8+512);} \
        vf8 g={x[c[qb]],x[c[qb+1]],x[c[qb+2]],x[c[qb+3]],x[c[qb+4]],x[c[qb+5]],x[c[qb+6]],x[c[qb+7]]}; \
        accv=rb_add(accv, *(const vf8*)(v+qb)*g, h-qb); qb+=8; } acc+=rb_sum(accv); } \
    else { for(;q<h;q++) acc+=v[q]*x[c[q]]; } y[i]=acc; } }
#define NOEXP(c) (c)
#define LIKELY(c) __builtin_expect((c),1)
GEN(v_gen, 1, NOEXP)
GEN(v_genl, 1, LIKELY)
GEN(v_gen0, 0, NOEXP)
GEN(v_gen0l, 0, LIKELY)

__attribute__((noinline)) void v_streams(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  for(int64_t i=lo;i<hi;i++){ float acc=0; int64_t q=a->pos[i],h=a->pos[i+1]; PS(a->crd+q+512); PS(a->val+q+512); int64_t qb=q;
    while(qb+16<=h){ PS(a->crd+qb+16+512); PS(a->val+qb+16+512); for(int64_t k=qb;k<qb+16;k++) acc+=a->val[k]*x[a->crd[k]]; qb+=16;}
    for(int64_t k=qb;k<h;k++) acc+=a->val[k]*x[a->crd[k]]; y[i]=acc; } }

__attribute__((noinline)) void v_streamspf(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  int64_t pfe=a->pos[a->m]-64;
  for(int64_t i=lo;i<hi;i++){ float acc=0; int64_t q=a->pos[i],h=a->pos[i+1]; PS(a->crd+q+512); PS(a->val+q+512); int64_t qb=q;
    while(qb+16<=h){ PS(a->crd+qb+16+512); PS(a->val+qb+16+512); for(int64_t k=qb;k<qb+16;k++){ if(k<pfe) __builtin_prefetch(x+a->crd[k+64],0,3); acc+=a->val[k]*x[a->crd[k]];} qb+=16;}
    for(int64_t k=qb;k<h;k++){ if(k<pfe) __builtin_prefetch(x+a->crd[k+64],0,3); acc+=a->val[k]*x[a->crd[k]];} y[i]=acc; } }
__attribute__((noinline)) void v_genpf(const M*a,const float*x,float*y,int64_t lo,int64_t hi){
  int64_t qend=a->pos[a->m]; int64_t pfe=qend-64; const int32_t*c=a->crd; const float*v=a->val;
  for(int64_t i=lo;i<hi;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; float acc=0;
    if(h+8<=qend){ vf8 accv={0}; int64_t qb=q, qe=h+(h==q); PS(c+q+512); PS(v+q+512);
      while(qb<qe){ PS(c+qb+8+512); PS(v+qb+8+512);
        for(int k=0;k<8;k++) if(qb+k<pfe) __builtin_prefetch(x+c[qb+k+64],0,3);
        vf8 g={x[c[qb]],x[c[qb+1]],x[c[qb+2]],x[c[qb+3]],x[c[qb+4]],x[c[qb+5]],x[c[qb+6]],x[c[qb+7]]};
        accv=rb_add(accv, *(const vf8*)(v+qb)*g, h-qb); qb+=8; } acc+=rb_sum(accv); }
    else { for(;q<h;q++) acc+=v[q]*x[c[q]]; } y[i]=acc; } }

static inline vf8 rb_add_off(vf8 acc, vf8 p, int64_t n, int off){ const vm8 lane={0,1,2,3,4,5,6,7}; vf8 z={0}; int64_t m=n-off; return acc + (lane < (int)(m<8?(m<0?0:m):8) ? p : z); }
#define GEN16(NAME, PFB) __attribute__((noinline)) void NAME(const M*a,const float*x,float*y,int64_t lo,int64_t hi){ \
  int64_t qend=a->pos[a->m]; const int32_t*c=a->crd; const float*v=a->val; \
  for(int64_t i=lo;i<hi;i++){ int64_t q=a->pos[i],h=a->pos[i+1]; float acc=0; \
    if(h+16<=qend){ vf8 accv={0}, accw={0}; int64_t qb=q, qe=h+(h==q); PS(c+q+512); PS(v+q+512); \
      while(qb<qe){ if(PFB){PS(c+qb+16+512); PS(v+qb+16+512);} \
        vf8 g={x[c[qb]],x[c[qb+1]],x[c[qb+2]],x[c[qb+3]],x[c[qb+4]],x[c[qb+5]],x[c[qb+6]],x[c[qb+7]]}; \
        vf8 g2={x[c[qb+8]],x[c[qb+9]],x[c[qb+10]],x[c[qb+11]],x[c[qb+12]],x[c[qb+13]],x[c[qb+14]],x[c[qb+15]]}; \
        accv=rb_add_off(accv, *(const vf8*)(v+qb)*g, h-qb, 0); accw=rb_add_off(accw, *(const vf8*)(v+qb+8)*g2, h-qb, 8); qb+=16; } acc+=rb_sum(accv+accw); } \
    else { for(;q<h;q++) acc+=v[q]*x[c[q]]; } y[i]=acc; } }
GEN16(v_gen16, 1)

typedef void (*fn)(const M*,const float*,float*,int64_t,int64_t);
int main(int argc,char**argv){
  M a=load(argv[1]); int rounds=argc>2?atoi(argv[2]):7;
  float*x=aligned_alloc(64,(a.k*4+63)/64*64), *y=aligned_alloc(64,(a.m*4+63)/64*64), *y0=malloc(a.m*4);
  for(int64_t j=0;j<a.k;j++) x[j]=(float)((j*7919)%1000)/1000.f-0.5f;
  const char* names[]={"base","streams","gen","gen16"};
  fn fns[]={v_base,v_streams,v_gen,v_gen16}; int nf=4;
  v_base(&a,x,y0,0,a.m);
  double best[16]; for(int f=0;f<nf;f++){ best[f]=1e9; fns[f](&a,x,y,0,a.m); double e=0; for(int64_t i=0;i<a.m;i++) e=fmax(e,fabs(y[i]-y0[i])); if(e>1e-3*(1+fabs(y0[0]))) printf("%s WRONG %g\n",names[f],e); }
  int reps = (int)(2e7 / (a.nnz+a.m)); if(reps<1)reps=1;
  for(int r=0;r<rounds;r++) for(int f=0;f<nf;f++){ double t=now(); for(int k=0;k<reps;k++) fns[f](&a,x,y,0,a.m); t=(now()-t)/reps; if(t<best[f])best[f]=t; }
  printf("%-20s", argv[1]); for(int f=0;f<nf;f++) printf(" %s=%.1fus(%.2fns)", names[f], best[f]*1e6, best[f]*1e9/a.nnz); printf("\n");
  for(int f=1;f<nf;f++) printf("  %s %.2fx", names[f], best[0]/best[f]); printf("\n");
}
