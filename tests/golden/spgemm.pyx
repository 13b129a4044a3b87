# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
# scorch generated kernel (codegen v1)
# out(i,k) = sum_j T0(i,j) * T1(j,k)
# loop order: i, j, k
# T0 access 0: csr levels ('i', 'j')
# T1 access 1: csr levels ('j', 'k')
# output: csr (ws)
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector
from scorch._runtime.workspace cimport DenseWorkspace, SparseWorkspace
from cython.operator cimport dereference as deref, preincrement as inc
from cython.parallel cimport prange
import numpy as np

cdef struct Args:
    int64_t N_i
    int64_t N_j
    int64_t N_k
    int32_t* t0_pos1
    int32_t* t0_crd1
    float* t0_vals
    int32_t* t1_pos1
    int32_t* t1_crd1
    float* t1_vals

cdef void run_chunk(Args* pa, int64_t clo, int64_t chi, vector[int64_t]* ocrd, vector[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef SparseWorkspace[float] ws
    cdef DenseWorkspace[float] dws
    cdef int wdense
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t p1_0
    cdef int64_t c_k
    cdef int64_t q1_1
    cdef int64_t h1_1
    cdef int64_t e1_1
    cdef int64_t wkey
    cdef int64_t wn
    cdef int64_t wi
    cdef int64_t wb
    wdense = a.N_k <= 4194304
    if wdense:
        dws.resize(a.N_k)
    for c_i in range(clo, chi):
        p0_0 = c_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            p1_0 = c_j
            q1_1 = a.t1_pos1[p1_0]
            h1_1 = a.t1_pos1[p1_0 + 1]
            for q1_1 in range(q1_1, h1_1):
                c_k = a.t1_crd1[q1_1]
                wkey = c_k
                if wdense:
                    dws.add(wkey, (a.t0_vals[q0_1] * a.t1_vals[q1_1]))
                else:
                    ws.add(wkey, (a.t0_vals[q0_1] * a.t1_vals[q1_1]))
        wn = dws.size() if wdense else ws.size()
        if wn:
            wb = deref(oval).size()
            deref(oval).resize(wb + wn)
            ocrd[1].resize(wb + wn)
            if wdense:
                dws.drain(ocrd[1].data() + wb, deref(oval).data() + wb, 0)
            else:
                ws.drain(ocrd[1].data() + wb, deref(oval).data() + wb, 0)
            ocrd[0].insert(ocrd[0].end(), <size_t>wn, c_i)

def kernel(list args, int nthreads):
    cdef Args a
    a.N_i = args[0]
    a.N_j = args[1]
    a.N_k = args[2]
    a.t0_pos1 = <int32_t*><size_t>args[3]
    a.t0_crd1 = <int32_t*><size_t>args[4]
    a.t0_vals = <float*><size_t>args[5]
    a.t1_pos1 = <int32_t*><size_t>args[6]
    a.t1_crd1 = <int32_t*><size_t>args[7]
    a.t1_vals = <float*><size_t>args[8]
    if <object>a.N_k >= 4611686018427387904:
        raise OverflowError('workspace over k is too large to index with int64')
    cdef int64_t lo0 = 0, hi0 = 0, nchunks = 1, t, n, total, off
    hi0 = a.N_i
    if nthreads > 1 and hi0 - lo0 >= 64:
        nchunks = min(hi0 - lo0, 8 * nthreads)
    cdef vector[int64_t] bounds
    bounds.resize(nchunks + 1)
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
    cdef vector[vector[int64_t]] crds
    cdef vector[vector[float]] vals
    crds.resize(nchunks * 2)
    vals.resize(nchunks)
    if nchunks == 1:
        with nogil:
            run_chunk(&a, lo0, hi0, &crds[0], &vals[0])
    else:
        for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):
            run_chunk(&a, bounds[t], bounds[t + 1], &crds[t * 2], &vals[t])
    total = 0
    for t in range(nchunks):
        total += vals[t].size()
    crd_arr = np.empty(2 * total, dtype=np.int64)  # level-major: row l = level l
    val_arr = np.empty(total, dtype=np.float32)
    cdef size_t cp = crd_arr.ctypes.data, vp = val_arr.ctypes.data
    cdef int64_t l
    off = 0
    for t in range(nchunks):
        n = vals[t].size()
        if n:
            for l in range(2):
                memcpy(<void*>(cp + (l * total + off) * sizeof(int64_t)), crds[t * 2 + l].data(), n * sizeof(int64_t))
            memcpy(<void*>(vp + off * sizeof(float)), vals[t].data(), n * sizeof(float))
        off += n
    return crd_arr, val_arr
