# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
# scorch generated kernel (codegen v1)
# out(i,j) = sum_k T0(i,j) * T1(i,k) * T2(k,j)
# loop order: i, j, k
# T0 access 0: csr levels ('i', 'j')
# T1 access 1: dense strided ('i', 'k')
# T2 access 2: dense strided ('k', 'j')
# output: csr (acc, values in access 0's pattern)
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
    int64_t t1_st_i
    int64_t t1_st_k
    float* t1_vals
    int64_t t2_st_k
    int64_t t2_st_j
    float* t2_vals
    float* out_vals

cdef extern from *:
    """
    typedef float scorch_vf16 __attribute__((vector_size(16), aligned(4), may_alias));
    static inline scorch_vf16 scorch_vf16_zero(void) { scorch_vf16 z = {0}; return z; }
    static inline float scorch_vf16_hsum(scorch_vf16 v) { float s = 0; for (int i = 0; i < 4; i++) s += v[i]; return s; }
    static inline scorch_vf16 scorch_vf16_hsum4(scorch_vf16 a, scorch_vf16 b, scorch_vf16 c, scorch_vf16 d) {
        auto x = __builtin_shufflevector(a, b, 0, 1, 4, 5) + __builtin_shufflevector(a, b, 2, 3, 6, 7);
        auto y = __builtin_shufflevector(c, d, 0, 1, 4, 5) + __builtin_shufflevector(c, d, 2, 3, 6, 7);
        return __builtin_shufflevector(x, y, 0, 2, 4, 6) + __builtin_shufflevector(x, y, 1, 3, 5, 7);
    }
    typedef float scorch_vf32 __attribute__((vector_size(32), aligned(4), may_alias));
    static inline scorch_vf32 scorch_vf32_zero(void) { scorch_vf32 z = {0}; return z; }
    static inline float scorch_vf32_hsum(scorch_vf32 v) { float s = 0; for (int i = 0; i < 8; i++) s += v[i]; return s; }
    static inline scorch_vf16 scorch_vf32_hsum4(scorch_vf32 a, scorch_vf32 b, scorch_vf32 c, scorch_vf32 d) {
        auto x = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
        auto y = __builtin_shufflevector(c, d, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(c, d, 4, 5, 6, 7, 12, 13, 14, 15);
        auto z = __builtin_shufflevector(x, y, 0, 1, 8, 9, 4, 5, 12, 13) + __builtin_shufflevector(x, y, 2, 3, 10, 11, 6, 7, 14, 15);
        return __builtin_shufflevector(z, z, 0, 4, 2, 6) + __builtin_shufflevector(z, z, 1, 5, 3, 7);
    }
    typedef float scorch_vf __attribute__((vector_size(64), aligned(4), may_alias));
    static inline scorch_vf scorch_vf_zero(void) { scorch_vf z = {0}; return z; }
    static inline float scorch_vf_hsum(scorch_vf v) { float s = 0; for (int i = 0; i < 16; i++) s += v[i]; return s; }
    static inline scorch_vf16 scorch_vf_hsum4(scorch_vf a, scorch_vf b, scorch_vf c, scorch_vf d) {
        auto a8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
        auto b8 = __builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(b, b, 8, 9, 10, 11, 12, 13, 14, 15);
        auto c8 = __builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15);
        auto d8 = __builtin_shufflevector(d, d, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(d, d, 8, 9, 10, 11, 12, 13, 14, 15);
        auto x = __builtin_shufflevector(a8, b8, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(a8, b8, 4, 5, 6, 7, 12, 13, 14, 15);
        auto y = __builtin_shufflevector(c8, d8, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(c8, d8, 4, 5, 6, 7, 12, 13, 14, 15);
        auto z = __builtin_shufflevector(x, y, 0, 1, 8, 9, 4, 5, 12, 13) + __builtin_shufflevector(x, y, 2, 3, 10, 11, 6, 7, 14, 15);
        return __builtin_shufflevector(z, z, 0, 4, 2, 6) + __builtin_shufflevector(z, z, 1, 5, 3, 7);
    }
    """
    ctypedef float scorch_vf16
    scorch_vf16 scorch_vf16_zero() noexcept nogil
    float scorch_vf16_hsum(scorch_vf16) noexcept nogil
    scorch_vf16 scorch_vf16_hsum4(scorch_vf16, scorch_vf16, scorch_vf16, scorch_vf16) noexcept nogil
    ctypedef float scorch_vf32
    scorch_vf32 scorch_vf32_zero() noexcept nogil
    float scorch_vf32_hsum(scorch_vf32) noexcept nogil
    scorch_vf16 scorch_vf32_hsum4(scorch_vf32, scorch_vf32, scorch_vf32, scorch_vf32) noexcept nogil
    ctypedef float scorch_vf
    scorch_vf scorch_vf_zero() noexcept nogil
    float scorch_vf_hsum(scorch_vf) noexcept nogil
    scorch_vf16 scorch_vf_hsum4(scorch_vf, scorch_vf, scorch_vf, scorch_vf) noexcept nogil

ctypedef void (*chunk_fn)(Args*, int64_t, int64_t, vector[int64_t]*, vector[float]*) noexcept nogil

cdef void run_chunk(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1
    cdef float acc
    cdef int64_t c_k
    cdef int64_t o1_2
    cdef int64_t o2_2
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            acc = 0
            for c_k in range(0, a.N_k):
                o1_2 = o1_0 + c_k
                o2_2 = o2_1 + c_k
                acc += ((a.t0_vals[q0_1] * a.t1_vals[o1_2]) * a.t2_vals[o2_2])
            a.out_vals[q0_1] = acc

cdef void run_chunk_w4(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1_0
    cdef scorch_vf16 dv0
    cdef int64_t o2_1_1
    cdef scorch_vf16 dv1
    cdef int64_t o2_1_2
    cdef scorch_vf16 dv2
    cdef int64_t o2_1_3
    cdef scorch_vf16 dv3
    cdef int64_t o2_1
    cdef float acc
    cdef int64_t c_k
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        while q0_1 + 3 < h0_1:
            o2_1_0 = a.t0_crd1[q0_1] * a.t2_st_j
            dv0 = ((a.t0_vals[q0_1] * (<scorch_vf16*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf16*>(a.t2_vals + o2_1_0 + 0))[0])
            o2_1_1 = a.t0_crd1[q0_1 + 1] * a.t2_st_j
            dv1 = ((a.t0_vals[q0_1 + 1] * (<scorch_vf16*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf16*>(a.t2_vals + o2_1_1 + 0))[0])
            o2_1_2 = a.t0_crd1[q0_1 + 2] * a.t2_st_j
            dv2 = ((a.t0_vals[q0_1 + 2] * (<scorch_vf16*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf16*>(a.t2_vals + o2_1_2 + 0))[0])
            o2_1_3 = a.t0_crd1[q0_1 + 3] * a.t2_st_j
            dv3 = ((a.t0_vals[q0_1 + 3] * (<scorch_vf16*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf16*>(a.t2_vals + o2_1_3 + 0))[0])
            (<scorch_vf16*>(a.out_vals + q0_1))[0] = scorch_vf16_hsum4(dv0, dv1, dv2, dv3)
            q0_1 += 4
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            acc = 0
            acc = acc + scorch_vf16_hsum(((a.t0_vals[q0_1] * (<scorch_vf16*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf16*>(a.t2_vals + o2_1 + 0))[0]))
            a.out_vals[q0_1] = acc

cdef void run_chunk_w8(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1_0
    cdef scorch_vf32 dv0
    cdef int64_t o2_1_1
    cdef scorch_vf32 dv1
    cdef int64_t o2_1_2
    cdef scorch_vf32 dv2
    cdef int64_t o2_1_3
    cdef scorch_vf32 dv3
    cdef int64_t o2_1
    cdef float acc
    cdef int64_t c_k
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        while q0_1 + 3 < h0_1:
            o2_1_0 = a.t0_crd1[q0_1] * a.t2_st_j
            dv0 = ((a.t0_vals[q0_1] * (<scorch_vf32*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf32*>(a.t2_vals + o2_1_0 + 0))[0])
            o2_1_1 = a.t0_crd1[q0_1 + 1] * a.t2_st_j
            dv1 = ((a.t0_vals[q0_1 + 1] * (<scorch_vf32*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf32*>(a.t2_vals + o2_1_1 + 0))[0])
            o2_1_2 = a.t0_crd1[q0_1 + 2] * a.t2_st_j
            dv2 = ((a.t0_vals[q0_1 + 2] * (<scorch_vf32*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf32*>(a.t2_vals + o2_1_2 + 0))[0])
            o2_1_3 = a.t0_crd1[q0_1 + 3] * a.t2_st_j
            dv3 = ((a.t0_vals[q0_1 + 3] * (<scorch_vf32*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf32*>(a.t2_vals + o2_1_3 + 0))[0])
            (<scorch_vf16*>(a.out_vals + q0_1))[0] = scorch_vf32_hsum4(dv0, dv1, dv2, dv3)
            q0_1 += 4
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            acc = 0
            acc = acc + scorch_vf32_hsum(((a.t0_vals[q0_1] * (<scorch_vf32*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf32*>(a.t2_vals + o2_1 + 0))[0]))
            a.out_vals[q0_1] = acc

cdef void run_chunk_w16(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pfe
    cdef int64_t o2_1_0
    cdef scorch_vf dv0
    cdef int64_t o2_1_1
    cdef scorch_vf dv1
    cdef int64_t o2_1_2
    cdef scorch_vf dv2
    cdef int64_t o2_1_3
    cdef scorch_vf dv3
    cdef int64_t o2_1
    cdef float acc
    cdef int64_t c_k
    pfe = 0 if (a.N_j * a.t2_st_j * sizeof(float) <= scorch_l2_bytes()) else <int64_t>a.t0_pos1[a.N_i] - 64
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        while q0_1 + 3 < h0_1:
            if q0_1 < pfe - 3:
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 64] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 65] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 66] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 67] * a.t2_st_j)
            o2_1_0 = a.t0_crd1[q0_1] * a.t2_st_j
            dv0 = ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 0))[0])
            o2_1_1 = a.t0_crd1[q0_1 + 1] * a.t2_st_j
            dv1 = ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 0))[0])
            o2_1_2 = a.t0_crd1[q0_1 + 2] * a.t2_st_j
            dv2 = ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 0))[0])
            o2_1_3 = a.t0_crd1[q0_1 + 3] * a.t2_st_j
            dv3 = ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 0))[0])
            (<scorch_vf16*>(a.out_vals + q0_1))[0] = scorch_vf_hsum4(dv0, dv1, dv2, dv3)
            q0_1 += 4
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pfe:
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 64] * a.t2_st_j)
            o2_1 = c_j * a.t2_st_j
            acc = 0
            acc = acc + scorch_vf_hsum(((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 0))[0]))
            a.out_vals[q0_1] = acc

cdef void run_chunk_w32(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pfe
    cdef int64_t o2_1_0
    cdef scorch_vf dv0
    cdef int64_t o2_1_1
    cdef scorch_vf dv1
    cdef int64_t o2_1_2
    cdef scorch_vf dv2
    cdef int64_t o2_1_3
    cdef scorch_vf dv3
    cdef int64_t o2_1
    cdef float acc
    cdef int64_t c_k
    pfe = 0 if (a.N_j * a.t2_st_j * sizeof(float) <= scorch_l2_bytes()) else <int64_t>a.t0_pos1[a.N_i] - 32
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        while q0_1 + 3 < h0_1:
            if q0_1 < pfe - 3:
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 32] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 32] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 33] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 33] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 34] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 34] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 35] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 35] * a.t2_st_j + 16)
            o2_1_0 = a.t0_crd1[q0_1] * a.t2_st_j
            dv0 = ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 16))[0])
            o2_1_1 = a.t0_crd1[q0_1 + 1] * a.t2_st_j
            dv1 = ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 0))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 16))[0])
            o2_1_2 = a.t0_crd1[q0_1 + 2] * a.t2_st_j
            dv2 = ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 0))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 16))[0])
            o2_1_3 = a.t0_crd1[q0_1 + 3] * a.t2_st_j
            dv3 = ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 0))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 16))[0])
            (<scorch_vf16*>(a.out_vals + q0_1))[0] = scorch_vf_hsum4(dv0, dv1, dv2, dv3)
            q0_1 += 4
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pfe:
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 32] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 32] * a.t2_st_j + 16)
            o2_1 = c_j * a.t2_st_j
            acc = 0
            acc = acc + scorch_vf_hsum(((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 16))[0]))
            a.out_vals[q0_1] = acc

cdef void run_chunk_w64(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pfd
    cdef int64_t pfe
    cdef int64_t o2_1_0
    cdef scorch_vf dv0
    cdef int64_t o2_1_1
    cdef scorch_vf dv1
    cdef int64_t o2_1_2
    cdef scorch_vf dv2
    cdef int64_t o2_1_3
    cdef scorch_vf dv3
    cdef int64_t o2_1
    cdef float acc
    cdef int64_t c_k
    pfd = 32 if (a.N_j * a.t2_st_j * sizeof(float) >= 16777216) else 16
    pfe = 0 if (a.N_j * a.t2_st_j * sizeof(float) <= scorch_l2_bytes()) else <int64_t>a.t0_pos1[a.N_i] - pfd
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        while q0_1 + 3 < h0_1:
            if q0_1 < pfe - 3:
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 48)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 48)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 48)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 48)
            o2_1_0 = a.t0_crd1[q0_1] * a.t2_st_j
            dv0 = ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 16))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 32))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 48))[0])
            o2_1_1 = a.t0_crd1[q0_1 + 1] * a.t2_st_j
            dv1 = ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 0))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 16))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 32))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 48))[0])
            o2_1_2 = a.t0_crd1[q0_1 + 2] * a.t2_st_j
            dv2 = ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 0))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 16))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 32))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 48))[0])
            o2_1_3 = a.t0_crd1[q0_1 + 3] * a.t2_st_j
            dv3 = ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 0))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 16))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 32))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 48))[0])
            (<scorch_vf16*>(a.out_vals + q0_1))[0] = scorch_vf_hsum4(dv0, dv1, dv2, dv3)
            q0_1 += 4
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pfe:
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 48)
            o2_1 = c_j * a.t2_st_j
            acc = 0
            acc = acc + scorch_vf_hsum(((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 16))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 32))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 48))[0]))
            a.out_vals[q0_1] = acc

cdef void run_chunk_w128(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pfd
    cdef int64_t pfe
    cdef int64_t o2_1_0
    cdef scorch_vf dv0
    cdef int64_t o2_1_1
    cdef scorch_vf dv1
    cdef int64_t o2_1_2
    cdef scorch_vf dv2
    cdef int64_t o2_1_3
    cdef scorch_vf dv3
    cdef int64_t o2_1
    cdef float acc
    cdef int64_t c_k
    pfd = 32 if (a.N_j * a.t2_st_j * sizeof(float) >= 16777216) else 8
    pfe = 0 if (a.N_j * a.t2_st_j * sizeof(float) <= scorch_l2_bytes()) else <int64_t>a.t0_pos1[a.N_i] - pfd
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        while q0_1 + 3 < h0_1:
            if q0_1 < pfe - 3:
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 48)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 64)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 80)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 96)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 112)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 48)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 64)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 80)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 96)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 1] * a.t2_st_j + 112)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 48)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 64)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 80)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 96)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 2] * a.t2_st_j + 112)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 48)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 64)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 80)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 96)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 112)
            o2_1_0 = a.t0_crd1[q0_1] * a.t2_st_j
            dv0 = ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 16))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 32))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 48))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 64))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 64))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 80))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 80))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 96))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 96))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 112))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_0 + 112))[0])
            o2_1_1 = a.t0_crd1[q0_1 + 1] * a.t2_st_j
            dv1 = ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 0))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 16))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 32))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 48))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 64))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 64))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 80))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 80))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 96))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 96))[0]) + ((a.t0_vals[q0_1 + 1] * (<scorch_vf*>(a.t1_vals + o1_0 + 112))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_1 + 112))[0])
            o2_1_2 = a.t0_crd1[q0_1 + 2] * a.t2_st_j
            dv2 = ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 0))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 16))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 32))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 48))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 64))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 64))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 80))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 80))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 96))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 96))[0]) + ((a.t0_vals[q0_1 + 2] * (<scorch_vf*>(a.t1_vals + o1_0 + 112))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_2 + 112))[0])
            o2_1_3 = a.t0_crd1[q0_1 + 3] * a.t2_st_j
            dv3 = ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 0))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 16))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 32))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 48))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 64))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 64))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 80))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 80))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 96))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 96))[0]) + ((a.t0_vals[q0_1 + 3] * (<scorch_vf*>(a.t1_vals + o1_0 + 112))[0]) * (<scorch_vf*>(a.t2_vals + o2_1_3 + 112))[0])
            (<scorch_vf16*>(a.out_vals + q0_1))[0] = scorch_vf_hsum4(dv0, dv1, dv2, dv3)
            q0_1 += 4
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pfe:
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 16)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 32)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 48)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 64)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 80)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 96)
                scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd] * a.t2_st_j + 112)
            o2_1 = c_j * a.t2_st_j
            acc = 0
            acc = acc + scorch_vf_hsum(((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 16))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 32))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 48))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 64))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 64))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 80))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 80))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 96))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 96))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_0 + 112))[0]) * (<scorch_vf*>(a.t2_vals + o2_1 + 112))[0]))
            a.out_vals[q0_1] = acc

cdef void run_chunk_strided(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1
    cdef float acc
    cdef int64_t c_k
    cdef int64_t o1_2
    cdef int64_t o2_2
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            acc = 0
            for c_k in range(0, a.N_k):
                o1_2 = o1_0 + c_k * a.t1_st_k
                o2_2 = o2_1 + c_k * a.t2_st_k
                acc += ((a.t0_vals[q0_1] * a.t1_vals[o1_2]) * a.t2_vals[o2_2])
            a.out_vals[q0_1] = acc

cdef void kernel_c(const int64_t* args, int nthreads, int panel) noexcept nogil:
    cdef Args a
    a.N_i = args[0]
    a.N_j = args[1]
    a.N_k = args[2]
    a.t0_pos1 = <int32_t*><size_t>args[3]
    a.t0_crd1 = <int32_t*><size_t>args[4]
    a.t0_vals = <float*><size_t>args[5]
    a.t1_st_i = args[6]
    a.t1_st_k = args[7]
    a.t1_vals = <float*><size_t>args[8]
    a.t2_st_k = args[9]
    a.t2_st_j = args[10]
    a.t2_vals = <float*><size_t>args[11]
    a.out_vals = <float*><size_t>args[12]
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
    if a.t1_st_k != 1 or a.t2_st_k != 1:
        fn = run_chunk_strided
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
            elif fn == run_chunk_strided:
                run_chunk_strided(&a, lo0, hi0, NULL, NULL)
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
            elif fn == run_chunk_strided:
                run_chunk_strided(&a, bounds[t], bounds[t + 1], NULL, NULL)
            else:
                fn(&a, bounds[t], bounds[t + 1], NULL, NULL)
    return

def kernel(list args, int nthreads, int panel=0):
    cdef int64_t values[13]
    cdef int i
    for i in range(13):
        values[i] = args[i]
    with nogil:
        kernel_c(values, nthreads, panel)
    return None

cdef extern from "Python.h":
    object PyCapsule_New(void*, const char*, void*)

KERNEL_C = PyCapsule_New(<void*>kernel_c, b"scorch.kernel_c", NULL)
