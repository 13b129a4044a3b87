#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
static double now(){ return omp_get_wtime(); }
int64_t n, m, nnz; int32_t *ptr, *idx; float *val;
static void load(const char* f){ FILE* F=fopen(f,"rb"); int64_t h[3]; fread(h,8,3,F); n=h[0]; m=h[1]; nnz=h[2];
  ptr=malloc(4*(n+1)); idx=malloc(4*nnz); val=malloc(4*nnz); fread(ptr,4,n+1,F); fread(idx,4,nnz,F); fread(val,4,nnz,F); fclose(F);}
static void csr(const float* x, float* y){
  #pragma omp parallel for schedule(dynamic, 1024)
  for (int64_t i=0;i<n;i++){ float s0=0,s1=0; int32_t p=ptr[i], e=ptr[i+1];
    for(;p+1<e;p+=2){ s0+=val[p]*x[idx[p]]; s1+=val[p+1]*x[idx[p+1]]; }
    if(p<e) s0+=val[p]*x[idx[p]]; y[i]=s0+s1; } }
/* tiles */
int RBB, CBB; int64_t nrb, ncb; int64_t* toff; uint32_t* tix; float* tval;
static void build(){
  int64_t RB=1<<RBB, CB=1<<CBB; nrb=(n+RB-1)/RB; ncb=(m+CB-1)/CB;
  toff=calloc(nrb*ncb+1,8); tix=malloc(4*nnz); tval=malloc(4*nnz);
  for(int64_t i=0;i<n;i++) for(int32_t p=ptr[i];p<ptr[i+1];p++) toff[(i>>RBB)*ncb+(idx[p]>>CBB)+1]++;
  for(int64_t t=0;t<nrb*ncb;t++) toff[t+1]+=toff[t];
  int64_t* fill=malloc((size_t)nrb*(size_t)ncb*8); memcpy(fill,toff,(size_t)nrb*(size_t)ncb*8);
  for(int64_t i=0;i<n;i++) for(int32_t p=ptr[i];p<ptr[i+1];p++){ int64_t t=(i>>RBB)*ncb+(idx[p]>>CBB); int64_t q=fill[t]++;
     tix[q]=((uint32_t)(i&(RB-1))<<16)|(uint32_t)(idx[p]&(CB-1)); tval[q]=val[p]; }
  free(fill);
}
static void tiled(const float* x, float* y){
  int64_t RB=1<<RBB, CB=1<<CBB;
  #pragma omp parallel for schedule(dynamic,1)
  for(int64_t rb=0;rb<nrb;rb++){ float* yb=y+rb*RB; int64_t rows = (rb+1)*RB<=n?RB:n-rb*RB; memset(yb,0,4*rows);
    for(int64_t cb=0;cb<ncb;cb++){ const float* xb=x+cb*CB; int64_t a=toff[rb*ncb+cb], b=toff[rb*ncb+cb+1];
      const uint32_t* ti=tix; const float* tv=tval;
      for(int64_t q=a;q<b;q++){ uint32_t w=ti[q]; yb[w>>16]+=tv[q]*xb[w&0xffff]; } } } }
int main(int argc,char**argv){ load(argv[1]); RBB=atoi(argv[2]); CBB=atoi(argv[3]);
  float* x=malloc(4*m); float*y=malloc(4*n); float*y2=malloc(4*n); for(int64_t j=0;j<m;j++) x[j]=(j%7)*0.1f+0.5f;
  double t0=now(); build(); double tb=now()-t0;
  double best1=1e9,best2=1e9;
  for(int r=0;r<7;r++){ t0=now(); csr(x,y); double t=now()-t0; if(t<best1)best1=t; }
  for(int r=0;r<7;r++){ t0=now(); tiled(x,y2); double t=now()-t0; if(t<best2)best2=t; }
  double err=0; for(int64_t i=0;i<n;i++){ double d=y[i]-y2[i]; if(d<0)d=-d; if(d>err)err=d; }
  double bytes = 8.0*nnz + 4.0*(n+1) + 4.0*m + 4.0*n;
  printf("%s thr=%d RB=2^%d CB=2^%d build %.1f ms | csr %.2f ms (%.2f ns/e, %.1f GB/s) | tiled %.2f ms (%.2f ns/e, %.1f GB/s) speedup %.2f err %.1e\n",
    argv[1], omp_get_max_threads(), RBB, CBB, tb*1e3, best1*1e3, best1*1e9/nnz, bytes/best1/1e9, best2*1e3, best2*1e9/nnz, bytes/best2/1e9, best1/best2, err);
}
