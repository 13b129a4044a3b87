# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
# scorch generated kernel (codegen v1)
# out(i,k) = sum_j T0(i,j) * T1(j,k)
# loop order: i, j, k
# T0 access 0: csr levels ('i', 'j')
# T1 access 1: dense strided ('j', 'k')
# output: dense (dense)
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector
cdef extern from *:
    """
    #define scorch_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)
    #include <unistd.h>
    static long scorch_l2_query(void) {
        long s = 0;
    #ifdef _SC_LEVEL2_CACHE_SIZE
        s = sysconf(_SC_LEVEL2_CACHE_SIZE);
    #endif
        return s > 0 ? s : (512L << 10);
    }
    static long scorch_l2_bytes(void) {
        static const long bytes = scorch_l2_query();   /* once, thread-safe (C++11) */
        return bytes;
    }
    """
    void scorch_prefetch(const void*) noexcept nogil
    long scorch_l2_bytes() noexcept nogil
from cython.operator cimport dereference as deref, preincrement as inc
from cython.parallel cimport prange

cdef struct Args:
    int64_t N_i
    int64_t N_j
    int64_t N_k
    int32_t* t0_pos1
    int32_t* t0_crd1
    float* t0_vals
    int64_t t1_st_j
    int64_t t1_st_k
    float* t1_vals
    float* out_vals
    int64_t out_st_i
    int64_t out_st_k

cdef extern from *:
    """
    typedef float scorch_vf16 __attribute__((vector_size(16), aligned(4), may_alias));
    static inline scorch_vf16 scorch_vf16_zero(void) { scorch_vf16 z = {0}; return z; }
    static inline float scorch_vf16_hsum(scorch_vf16 v) { float s = 0; for (int i = 0; i < 4; i++) s += v[i]; return s; }
    typedef float scorch_vf32 __attribute__((vector_size(32), aligned(4), may_alias));
    static inline scorch_vf32 scorch_vf32_zero(void) { scorch_vf32 z = {0}; return z; }
    static inline float scorch_vf32_hsum(scorch_vf32 v) { float s = 0; for (int i = 0; i < 8; i++) s += v[i]; return s; }
    typedef float scorch_vf __attribute__((vector_size(64), aligned(4), may_alias));
    static inline scorch_vf scorch_vf_zero(void) { scorch_vf z = {0}; return z; }
    static inline float scorch_vf_hsum(scorch_vf v) { float s = 0; for (int i = 0; i < 16; i++) s += v[i]; return s; }
    """
    ctypedef float scorch_vf16
    scorch_vf16 scorch_vf16_zero() noexcept nogil
    float scorch_vf16_hsum(scorch_vf16) noexcept nogil
    ctypedef float scorch_vf32
    scorch_vf32 scorch_vf32_zero() noexcept nogil
    float scorch_vf32_hsum(scorch_vf32) noexcept nogil
    ctypedef float scorch_vf
    scorch_vf scorch_vf_zero() noexcept nogil
    float scorch_vf_hsum(scorch_vf) noexcept nogil

ctypedef void (*chunk_fn)(Args*, int64_t, int64_t, vector[int64_t]*, vector[float]*) noexcept nogil

cdef void run_chunk(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t oo_0
    cdef int64_t c_k
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o1_1
    cdef float x0_1
    cdef int64_t o1_2
    cdef int64_t oo_2
    for c_i in range(clo, chi):
        p0_0 = c_i
        oo_0 = c_i * a.out_st_i
        for c_k in range(a.N_k):
            a.out_vals[oo_0 + c_k] = 0
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o1_1 = c_j * a.t1_st_j
            x0_1 = a.t0_vals[q0_1]
            for c_k in range(0, a.N_k):
                o1_2 = o1_1 + c_k
                oo_2 = oo_0 + c_k
                a.out_vals[oo_2] += (x0_1 * a.t1_vals[o1_2])

cdef void run_chunk_w4(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t oo_0
    cdef int64_t c_k
    cdef scorch_vf16 wv0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o1_1
    for c_i in range(clo, chi):
        p0_0 = c_i
        oo_0 = c_i * a.out_st_i
        wv0 = scorch_vf16_zero()
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o1_1 = c_j * a.t1_st_j
            wv0 = wv0 + (a.t0_vals[q0_1] * (<scorch_vf16*>(a.t1_vals + o1_1 + 0))[0])
        (<scorch_vf16*>(a.out_vals + oo_0 + 0))[0] = wv0

cdef void run_chunk_w8(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t oo_0
    cdef int64_t c_k
    cdef scorch_vf32 wv0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o1_1
    for c_i in range(clo, chi):
        p0_0 = c_i
        oo_0 = c_i * a.out_st_i
        wv0 = scorch_vf32_zero()
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o1_1 = c_j * a.t1_st_j
            wv0 = wv0 + (a.t0_vals[q0_1] * (<scorch_vf32*>(a.t1_vals + o1_1 + 0))[0])
        (<scorch_vf32*>(a.out_vals + oo_0 + 0))[0] = wv0

cdef void run_chunk_w16(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t oo_0
    cdef int64_t c_k
    cdef scorch_vf wv0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pfe
    cdef int64_t o1_1
    pfe = 0 if (a.N_j * a.t1_st_j * sizeof(float) <= scorch_l2_bytes()) else <int64_t>a.t0_pos1[a.N_i] - 64
    for c_i in range(clo, chi):
        p0_0 = c_i
        oo_0 = c_i * a.out_st_i
        wv0 = scorch_vf_zero()
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pfe:
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + 64] * a.t1_st_j)
            o1_1 = c_j * a.t1_st_j
            wv0 = wv0 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 0))[0])
        (<scorch_vf*>(a.out_vals + oo_0 + 0))[0] = wv0

cdef void run_chunk_w32(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t oo_0
    cdef int64_t c_k
    cdef scorch_vf wv0
    cdef scorch_vf wv1
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pfe
    cdef int64_t o1_1
    pfe = 0 if (a.N_j * a.t1_st_j * sizeof(float) <= scorch_l2_bytes()) else <int64_t>a.t0_pos1[a.N_i] - 32
    for c_i in range(clo, chi):
        p0_0 = c_i
        oo_0 = c_i * a.out_st_i
        wv0 = scorch_vf_zero()
        wv1 = scorch_vf_zero()
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pfe:
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + 32] * a.t1_st_j)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + 32] * a.t1_st_j + 16)
            o1_1 = c_j * a.t1_st_j
            wv0 = wv0 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 0))[0])
            wv1 = wv1 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 16))[0])
        (<scorch_vf*>(a.out_vals + oo_0 + 0))[0] = wv0
        (<scorch_vf*>(a.out_vals + oo_0 + 16))[0] = wv1

cdef void run_chunk_w64(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t oo_0
    cdef int64_t c_k
    cdef scorch_vf wv0
    cdef scorch_vf wv1
    cdef scorch_vf wv2
    cdef scorch_vf wv3
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pfd
    cdef int64_t pfe
    cdef int64_t o1_1
    pfd = 32 if (a.N_j * a.t1_st_j * sizeof(float) >= 16777216) else 16
    pfe = 0 if (a.N_j * a.t1_st_j * sizeof(float) <= scorch_l2_bytes()) else <int64_t>a.t0_pos1[a.N_i] - pfd
    for c_i in range(clo, chi):
        p0_0 = c_i
        oo_0 = c_i * a.out_st_i
        wv0 = scorch_vf_zero()
        wv1 = scorch_vf_zero()
        wv2 = scorch_vf_zero()
        wv3 = scorch_vf_zero()
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pfe:
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 16)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 32)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 48)
            o1_1 = c_j * a.t1_st_j
            wv0 = wv0 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 0))[0])
            wv1 = wv1 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 16))[0])
            wv2 = wv2 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 32))[0])
            wv3 = wv3 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 48))[0])
        (<scorch_vf*>(a.out_vals + oo_0 + 0))[0] = wv0
        (<scorch_vf*>(a.out_vals + oo_0 + 16))[0] = wv1
        (<scorch_vf*>(a.out_vals + oo_0 + 32))[0] = wv2
        (<scorch_vf*>(a.out_vals + oo_0 + 48))[0] = wv3

cdef void run_chunk_w128(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t oo_0
    cdef int64_t c_k
    cdef scorch_vf wv0
    cdef scorch_vf wv1
    cdef scorch_vf wv2
    cdef scorch_vf wv3
    cdef scorch_vf wv4
    cdef scorch_vf wv5
    cdef scorch_vf wv6
    cdef scorch_vf wv7
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pfd
    cdef int64_t pfe
    cdef int64_t o1_1
    pfd = 32 if (a.N_j * a.t1_st_j * sizeof(float) >= 16777216) else 8
    pfe = 0 if (a.N_j * a.t1_st_j * sizeof(float) <= scorch_l2_bytes()) else <int64_t>a.t0_pos1[a.N_i] - pfd
    for c_i in range(clo, chi):
        p0_0 = c_i
        oo_0 = c_i * a.out_st_i
        wv0 = scorch_vf_zero()
        wv1 = scorch_vf_zero()
        wv2 = scorch_vf_zero()
        wv3 = scorch_vf_zero()
        wv4 = scorch_vf_zero()
        wv5 = scorch_vf_zero()
        wv6 = scorch_vf_zero()
        wv7 = scorch_vf_zero()
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pfe:
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 16)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 32)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 48)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 64)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 80)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 96)
                scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + pfd] * a.t1_st_j + 112)
            o1_1 = c_j * a.t1_st_j
            wv0 = wv0 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 0))[0])
            wv1 = wv1 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 16))[0])
            wv2 = wv2 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 32))[0])
            wv3 = wv3 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 48))[0])
            wv4 = wv4 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 64))[0])
            wv5 = wv5 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 80))[0])
            wv6 = wv6 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 96))[0])
            wv7 = wv7 + (a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_1 + 112))[0])
        (<scorch_vf*>(a.out_vals + oo_0 + 0))[0] = wv0
        (<scorch_vf*>(a.out_vals + oo_0 + 16))[0] = wv1
        (<scorch_vf*>(a.out_vals + oo_0 + 32))[0] = wv2
        (<scorch_vf*>(a.out_vals + oo_0 + 48))[0] = wv3
        (<scorch_vf*>(a.out_vals + oo_0 + 64))[0] = wv4
        (<scorch_vf*>(a.out_vals + oo_0 + 80))[0] = wv5
        (<scorch_vf*>(a.out_vals + oo_0 + 96))[0] = wv6
        (<scorch_vf*>(a.out_vals + oo_0 + 112))[0] = wv7

cdef void kernel_c(const int64_t* args, int nthreads, int panel) noexcept nogil:
    cdef Args a
    a.N_i = args[0]
    a.N_j = args[1]
    a.N_k = args[2]
    a.t0_pos1 = <int32_t*><size_t>args[3]
    a.t0_crd1 = <int32_t*><size_t>args[4]
    a.t0_vals = <float*><size_t>args[5]
    a.t1_st_j = args[6]
    a.t1_st_k = args[7]
    a.t1_vals = <float*><size_t>args[8]
    a.out_vals = <float*><size_t>args[9]
    a.out_st_i = args[10]
    a.out_st_k = args[11]
    cdef int64_t lo0 = 0, hi0 = 0, nchunks = 1, t, n, total, off
    hi0 = a.N_i
    if nthreads > 1 and hi0 - lo0 >= 2 and a.t0_pos1[hi0] - a.t0_pos1[lo0] >= 1024:
        nchunks = min(hi0 - lo0, 8 * nthreads, 1024)
    cdef chunk_fn fn = run_chunk
    if a.N_k == 4:
        fn = run_chunk_w4
    if a.N_k == 8:
        fn = run_chunk_w8
    if a.N_k == 16:
        fn = run_chunk_w16
    if a.N_k == 32:
        fn = run_chunk_w32
    if a.N_k == 64:
        fn = run_chunk_w64
    if a.N_k == 128:
        fn = run_chunk_w128
    cdef int64_t bounds[1025]   # chunk boundaries (at most 1024 chunks)
    if nchunks > 1:
        for t in range(nchunks + 1):
            bounds[t] = lo0 + ((hi0 - lo0) * t) // nchunks
    cdef int64_t btot, btarget, blo, bhi, bmid
    if nchunks > 1:
        btot = a.t0_pos1[hi0] - a.t0_pos1[lo0]
        blo = lo0
        for t in range(1, nchunks):
            btarget = a.t0_pos1[lo0] + (btot * t) // nchunks
            bhi = hi0
            while blo < bhi:
                bmid = (blo + bhi) // 2
                if a.t0_pos1[bmid] < btarget:
                    blo = bmid + 1
                else:
                    bhi = bmid
            bounds[t] = blo
    cdef Args b
    cdef int64_t pp, pw
    cdef chunk_fn pfn
    if panel > 0 and panel < a.N_k and panel in (4, 8, 16, 32, 64, 128):
        pfn = run_chunk
        if panel == 4:
            pfn = run_chunk_w4
        if panel == 8:
            pfn = run_chunk_w8
        if panel == 16:
            pfn = run_chunk_w16
        if panel == 32:
            pfn = run_chunk_w32
        if panel == 64:
            pfn = run_chunk_w64
        if panel == 128:
            pfn = run_chunk_w128
        pp = 0
        while pp < a.N_k:
            pw = min(panel, a.N_k - pp)
            b = a
            b.N_k = pw
            b.t1_vals = a.t1_vals + pp
            b.out_vals = a.out_vals + pp
            fn = pfn if pw == panel else run_chunk
            if nchunks == 1:
                with nogil:
                    fn(&b, lo0, hi0, NULL, NULL)
            else:
                for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):
                    fn(&b, bounds[t], bounds[t + 1], NULL, NULL)
            pp += panel
        return
    if nchunks == 1:
        with nogil:
            if fn == run_chunk:
                run_chunk(&a, lo0, hi0, NULL, NULL)
            elif fn == run_chunk_w4:
                run_chunk_w4(&a, lo0, hi0, NULL, NULL)
            elif fn == run_chunk_w8:
                run_chunk_w8(&a, lo0, hi0, NULL, NULL)
            elif fn == run_chunk_w16:
                run_chunk_w16(&a, lo0, hi0, NULL, NULL)
            elif fn == run_chunk_w32:
                run_chunk_w32(&a, lo0, hi0, NULL, NULL)
            elif fn == run_chunk_w64:
                run_chunk_w64(&a, lo0, hi0, NULL, NULL)
            elif fn == run_chunk_w128:
                run_chunk_w128(&a, lo0, hi0, NULL, NULL)
            else:
                fn(&a, lo0, hi0, NULL, NULL)
    else:
        for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):
            if fn == run_chunk:
                run_chunk(&a, bounds[t], bounds[t + 1], NULL, NULL)
            elif fn == run_chunk_w4:
                run_chunk_w4(&a, bounds[t], bounds[t + 1], NULL, NULL)
            elif fn == run_chunk_w8:
                run_chunk_w8(&a, bounds[t], bounds[t + 1], NULL, NULL)
            elif fn == run_chunk_w16:
                run_chunk_w16(&a, bounds[t], bounds[t + 1], NULL, NULL)
            elif fn == run_chunk_w32:
                run_chunk_w32(&a, bounds[t], bounds[t + 1], NULL, NULL)
            elif fn == run_chunk_w64:
                run_chunk_w64(&a, bounds[t], bounds[t + 1], NULL, NULL)
            elif fn == run_chunk_w128:
                run_chunk_w128(&a, bounds[t], bounds[t + 1], NULL, NULL)
            else:
                fn(&a, bounds[t], bounds[t + 1], NULL, NULL)
    return

def kernel(list args, int nthreads, int panel=0):
    cdef int64_t values[12]
    cdef int i
    for i in range(12):
        values[i] = args[i]
    with nogil:
        kernel_c(values, nthreads, panel)
    return None

cdef extern from "Python.h":
    object PyCapsule_New(void*, const char*, void*)

KERNEL_C = PyCapsule_New(<void*>kernel_c, b"scorch.kernel_c", NULL)
