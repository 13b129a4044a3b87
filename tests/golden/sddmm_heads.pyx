# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
# scorch generated kernel (codegen v1)
# out(b,h,i,j) = sum_d T0(i,j) * T1(b,h,i,d) * T2(b,h,j,d)
# loop order: i, j, b, h, d
# T0 access 0: csr levels ('i', 'j')
# T1 access 1: dense strided ('b', 'h', 'i', 'd')
# T2 access 2: dense strided ('b', 'h', 'j', 'd')
# output: Format('dcdd', mode_order=(2, 3, 0, 1)) (acc, values in access 0's pattern)
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as inc
from cython.parallel cimport prange

cdef struct Args:
    int64_t N_i
    int64_t N_j
    int64_t N_b
    int64_t N_h
    int64_t N_d
    int32_t* t0_pos1
    int32_t* t0_crd1
    float* t0_vals
    int64_t t1_st_b
    int64_t t1_st_h
    int64_t t1_st_i
    int64_t t1_st_d
    float* t1_vals
    int64_t t2_st_b
    int64_t t2_st_h
    int64_t t2_st_j
    int64_t t2_st_d
    float* t2_vals
    float* out_vals

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
    cdef int64_t o2_1
    cdef int64_t c_b
    cdef int64_t o1_2
    cdef int64_t o2_2
    cdef int64_t c_h
    cdef int64_t o1_3
    cdef int64_t o2_3
    cdef float acc
    cdef int64_t c_d
    cdef int64_t o1_4
    cdef int64_t o2_4
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            for c_b in range(0, a.N_b):
                o1_2 = o1_0 + c_b * a.t1_st_b
                o2_2 = o2_1 + c_b * a.t2_st_b
                for c_h in range(0, a.N_h):
                    o1_3 = o1_2 + c_h * a.t1_st_h
                    o2_3 = o2_2 + c_h * a.t2_st_h
                    acc = 0
                    for c_d in range(0, a.N_d):
                        o1_4 = o1_3 + c_d
                        o2_4 = o2_3 + c_d
                        acc += ((a.t0_vals[q0_1] * a.t1_vals[o1_4]) * a.t2_vals[o2_4])
                    a.out_vals[((q0_1) * a.N_b + c_b) * a.N_h + c_h] = acc

cdef void run_chunk_w4(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1
    cdef int64_t c_b
    cdef int64_t o1_2
    cdef int64_t o2_2
    cdef int64_t c_h
    cdef int64_t o1_3
    cdef int64_t o2_3
    cdef float acc
    cdef int64_t c_d
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            for c_b in range(0, a.N_b):
                o1_2 = o1_0 + c_b * a.t1_st_b
                o2_2 = o2_1 + c_b * a.t2_st_b
                for c_h in range(0, a.N_h):
                    o1_3 = o1_2 + c_h * a.t1_st_h
                    o2_3 = o2_2 + c_h * a.t2_st_h
                    acc = 0
                    acc = acc + scorch_vf16_hsum(((a.t0_vals[q0_1] * (<scorch_vf16*>(a.t1_vals + o1_3 + 0))[0]) * (<scorch_vf16*>(a.t2_vals + o2_3 + 0))[0]))
                    a.out_vals[((q0_1) * a.N_b + c_b) * a.N_h + c_h] = acc

cdef void run_chunk_w8(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1
    cdef int64_t c_b
    cdef int64_t o1_2
    cdef int64_t o2_2
    cdef int64_t c_h
    cdef int64_t o1_3
    cdef int64_t o2_3
    cdef float acc
    cdef int64_t c_d
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            for c_b in range(0, a.N_b):
                o1_2 = o1_0 + c_b * a.t1_st_b
                o2_2 = o2_1 + c_b * a.t2_st_b
                for c_h in range(0, a.N_h):
                    o1_3 = o1_2 + c_h * a.t1_st_h
                    o2_3 = o2_2 + c_h * a.t2_st_h
                    acc = 0
                    acc = acc + scorch_vf32_hsum(((a.t0_vals[q0_1] * (<scorch_vf32*>(a.t1_vals + o1_3 + 0))[0]) * (<scorch_vf32*>(a.t2_vals + o2_3 + 0))[0]))
                    a.out_vals[((q0_1) * a.N_b + c_b) * a.N_h + c_h] = acc

cdef void run_chunk_w16(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1
    cdef int64_t c_b
    cdef int64_t o1_2
    cdef int64_t o2_2
    cdef int64_t c_h
    cdef int64_t o1_3
    cdef int64_t o2_3
    cdef float acc
    cdef int64_t c_d
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            for c_b in range(0, a.N_b):
                o1_2 = o1_0 + c_b * a.t1_st_b
                o2_2 = o2_1 + c_b * a.t2_st_b
                for c_h in range(0, a.N_h):
                    o1_3 = o1_2 + c_h * a.t1_st_h
                    o2_3 = o2_2 + c_h * a.t2_st_h
                    acc = 0
                    acc = acc + scorch_vf_hsum(((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 0))[0]))
                    a.out_vals[((q0_1) * a.N_b + c_b) * a.N_h + c_h] = acc

cdef void run_chunk_w32(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1
    cdef int64_t c_b
    cdef int64_t o1_2
    cdef int64_t o2_2
    cdef int64_t c_h
    cdef int64_t o1_3
    cdef int64_t o2_3
    cdef float acc
    cdef int64_t c_d
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            for c_b in range(0, a.N_b):
                o1_2 = o1_0 + c_b * a.t1_st_b
                o2_2 = o2_1 + c_b * a.t2_st_b
                for c_h in range(0, a.N_h):
                    o1_3 = o1_2 + c_h * a.t1_st_h
                    o2_3 = o2_2 + c_h * a.t2_st_h
                    acc = 0
                    acc = acc + scorch_vf_hsum(((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 16))[0]))
                    a.out_vals[((q0_1) * a.N_b + c_b) * a.N_h + c_h] = acc

cdef void run_chunk_w64(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1
    cdef int64_t c_b
    cdef int64_t o1_2
    cdef int64_t o2_2
    cdef int64_t c_h
    cdef int64_t o1_3
    cdef int64_t o2_3
    cdef float acc
    cdef int64_t c_d
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            for c_b in range(0, a.N_b):
                o1_2 = o1_0 + c_b * a.t1_st_b
                o2_2 = o2_1 + c_b * a.t2_st_b
                for c_h in range(0, a.N_h):
                    o1_3 = o1_2 + c_h * a.t1_st_h
                    o2_3 = o2_2 + c_h * a.t2_st_h
                    acc = 0
                    acc = acc + scorch_vf_hsum(((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 16))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 32))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 48))[0]))
                    a.out_vals[((q0_1) * a.N_b + c_b) * a.N_h + c_h] = acc

cdef void run_chunk_w128(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t o1_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t o2_1
    cdef int64_t c_b
    cdef int64_t o1_2
    cdef int64_t o2_2
    cdef int64_t c_h
    cdef int64_t o1_3
    cdef int64_t o2_3
    cdef float acc
    cdef int64_t c_d
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            for c_b in range(0, a.N_b):
                o1_2 = o1_0 + c_b * a.t1_st_b
                o2_2 = o2_1 + c_b * a.t2_st_b
                for c_h in range(0, a.N_h):
                    o1_3 = o1_2 + c_h * a.t1_st_h
                    o2_3 = o2_2 + c_h * a.t2_st_h
                    acc = 0
                    acc = acc + scorch_vf_hsum(((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 0))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 0))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 16))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 16))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 32))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 32))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 48))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 48))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 64))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 64))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 80))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 80))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 96))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 96))[0]) + ((a.t0_vals[q0_1] * (<scorch_vf*>(a.t1_vals + o1_3 + 112))[0]) * (<scorch_vf*>(a.t2_vals + o2_3 + 112))[0]))
                    a.out_vals[((q0_1) * a.N_b + c_b) * a.N_h + c_h] = acc

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
    cdef int64_t c_b
    cdef int64_t o1_2
    cdef int64_t o2_2
    cdef int64_t c_h
    cdef int64_t o1_3
    cdef int64_t o2_3
    cdef float acc
    cdef int64_t c_d
    cdef int64_t o1_4
    cdef int64_t o2_4
    for c_i in range(clo, chi):
        p0_0 = c_i
        o1_0 = c_i * a.t1_st_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            o2_1 = c_j * a.t2_st_j
            for c_b in range(0, a.N_b):
                o1_2 = o1_0 + c_b * a.t1_st_b
                o2_2 = o2_1 + c_b * a.t2_st_b
                for c_h in range(0, a.N_h):
                    o1_3 = o1_2 + c_h * a.t1_st_h
                    o2_3 = o2_2 + c_h * a.t2_st_h
                    acc = 0
                    for c_d in range(0, a.N_d):
                        o1_4 = o1_3 + c_d * a.t1_st_d
                        o2_4 = o2_3 + c_d * a.t2_st_d
                        acc += ((a.t0_vals[q0_1] * a.t1_vals[o1_4]) * a.t2_vals[o2_4])
                    a.out_vals[((q0_1) * a.N_b + c_b) * a.N_h + c_h] = acc

cdef void kernel_c(const int64_t* args, int nthreads, int panel) noexcept nogil:
    cdef Args a
    a.N_i = args[0]
    a.N_j = args[1]
    a.N_b = args[2]
    a.N_h = args[3]
    a.N_d = args[4]
    a.t0_pos1 = <int32_t*><size_t>args[5]
    a.t0_crd1 = <int32_t*><size_t>args[6]
    a.t0_vals = <float*><size_t>args[7]
    a.t1_st_b = args[8]
    a.t1_st_h = args[9]
    a.t1_st_i = args[10]
    a.t1_st_d = args[11]
    a.t1_vals = <float*><size_t>args[12]
    a.t2_st_b = args[13]
    a.t2_st_h = args[14]
    a.t2_st_j = args[15]
    a.t2_st_d = args[16]
    a.t2_vals = <float*><size_t>args[17]
    a.out_vals = <float*><size_t>args[18]
    cdef int64_t lo0 = 0, hi0 = 0, nchunks = 1, t, n, total, off
    hi0 = a.N_i
    if nthreads > 1 and hi0 - lo0 >= 2 and a.t0_pos1[hi0] - a.t0_pos1[lo0] >= 1024:
        nchunks = min(hi0 - lo0, 8 * nthreads, 1024)
    cdef chunk_fn fn = run_chunk
    if a.N_d == 4:
        fn = run_chunk_w4
    if a.N_d == 8:
        fn = run_chunk_w8
    if a.N_d == 16:
        fn = run_chunk_w16
    if a.N_d == 32:
        fn = run_chunk_w32
    if a.N_d == 64:
        fn = run_chunk_w64
    if a.N_d == 128:
        fn = run_chunk_w128
    if a.t1_st_d != 1 or a.t2_st_d != 1:
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
    cdef int64_t values[19]
    cdef int i
    for i in range(19):
        values[i] = args[i]
    with nogil:
        kernel_c(values, nthreads, panel)
    return None

cdef extern from "Python.h":
    object PyCapsule_New(void*, const char*, void*)

KERNEL_C = PyCapsule_New(<void*>kernel_c, b"scorch.kernel_c", NULL)
