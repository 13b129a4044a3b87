# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
# scorch generated kernel (codegen v1)
# out(j,k) = sum_i T0(i,j) * T1(i,k)
# loop order: i, j, k
# T0 access 0: csr levels ('i', 'j')
# T1 access 1: dense strided ('i', 'k')
# output: dense (dense)
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector
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
    float* out_vals
    int64_t out_st_j
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
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t oo_1
    cdef float x0_1
    cdef int64_t c_k
    cdef int64_t o1_2
    cdef int64_t oo_2
    for c_i in range(0, a.N_i):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            oo_1 = c_j * a.out_st_j
            x0_1 = a.t0_vals[q0_1]
            for c_k in range(0, a.N_k):
                o1_2 = o1_0 + c_k
                oo_2 = oo_1 + c_k
                a.out_vals[oo_2] += (x0_1 * a.t1_vals[o1_2])

cdef void run_chunk_w4(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t oo_1
    cdef float x0_1
    cdef int64_t c_k
    for c_i in range(0, a.N_i):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            oo_1 = c_j * a.out_st_j
            x0_1 = a.t0_vals[q0_1]
            (<scorch_vf16*>(a.out_vals + oo_1 + 0))[0] = (<scorch_vf16*>(a.out_vals + oo_1 + 0))[0] + (x0_1 * (<scorch_vf16*>(a.t1_vals + o1_0 + 0))[0])

cdef void run_chunk_w8(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t oo_1
    cdef float x0_1
    cdef int64_t c_k
    for c_i in range(0, a.N_i):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            oo_1 = c_j * a.out_st_j
            x0_1 = a.t0_vals[q0_1]
            (<scorch_vf32*>(a.out_vals + oo_1 + 0))[0] = (<scorch_vf32*>(a.out_vals + oo_1 + 0))[0] + (x0_1 * (<scorch_vf32*>(a.t1_vals + o1_0 + 0))[0])

cdef void run_chunk_w16(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t oo_1
    cdef float x0_1
    cdef int64_t c_k
    for c_i in range(0, a.N_i):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            oo_1 = c_j * a.out_st_j
            x0_1 = a.t0_vals[q0_1]
            (<scorch_vf*>(a.out_vals + oo_1 + 0))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 0))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0])

cdef void run_chunk_w32(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t oo_1
    cdef float x0_1
    cdef int64_t c_k
    for c_i in range(0, a.N_i):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            oo_1 = c_j * a.out_st_j
            x0_1 = a.t0_vals[q0_1]
            (<scorch_vf*>(a.out_vals + oo_1 + 0))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 0))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 16))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 16))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0])

cdef void run_chunk_w64(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t oo_1
    cdef float x0_1
    cdef int64_t c_k
    for c_i in range(0, a.N_i):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            oo_1 = c_j * a.out_st_j
            x0_1 = a.t0_vals[q0_1]
            (<scorch_vf*>(a.out_vals + oo_1 + 0))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 0))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 16))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 16))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 32))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 32))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 48))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 48))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0])

cdef void run_chunk_w128(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t oo_1
    cdef float x0_1
    cdef int64_t c_k
    for c_i in range(0, a.N_i):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            oo_1 = c_j * a.out_st_j
            x0_1 = a.t0_vals[q0_1]
            (<scorch_vf*>(a.out_vals + oo_1 + 0))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 0))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 0))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 16))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 16))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 16))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 32))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 32))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 32))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 48))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 48))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 48))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 64))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 64))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 64))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 80))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 80))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 80))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 96))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 96))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 96))[0])
            (<scorch_vf*>(a.out_vals + oo_1 + 112))[0] = (<scorch_vf*>(a.out_vals + oo_1 + 112))[0] + (x0_1 * (<scorch_vf*>(a.t1_vals + o1_0 + 112))[0])

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
    a.out_vals = <float*><size_t>args[9]
    a.out_st_j = args[10]
    a.out_st_k = args[11]
    cdef int64_t lo0 = 0, hi0 = 0, nchunks = 1, t, n, total, off
    memset(<void*>a.out_vals, 0, a.N_j * a.N_k * sizeof(float))
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
