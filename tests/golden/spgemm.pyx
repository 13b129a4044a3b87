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
cdef extern from *:
    """
    #define scorch_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)
    """
    void scorch_prefetch(const void*) noexcept nogil
from scorch._runtime.workspace cimport AppendBuffer, ChunkBuffers, DenseScratch, SparseWorkspace, dense_scratch, dense_ws_drain_list, pool_give
from scorch._runtime.workspace cimport dense_ws_drain_scan
from cython.operator cimport dereference as deref, preincrement as inc
from cython.parallel cimport prange
from scorch._runtime.result cimport KernelResult, RESULT_OK, RESULT_OVERFLOW, RESULT_RUNTIME, RESULT_NOMEM, RESULT_INT, RESULT_UINT, RESULT_FLOAT, result_init, result_alloc, result_free, result_zeros_i64, result_array, result_error, result_hand_over, result_gather, result_pos, result_check_allocation, result_failed, result_failure_flag, result_to_python
from scorch._runtime.result cimport result_resize, result_drop_range

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
    int64_t* out_pos   # row counts, then (prefix sum) the compressed level's pos

ctypedef void (*chunk_fn)(Args*, int64_t, int64_t, AppendBuffer[int32_t]*, AppendBuffer[float]*) noexcept nogil

cdef void run_chunk(Args* pa, int64_t clo, int64_t chi, AppendBuffer[int32_t]* ocrd, AppendBuffer[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef float* wv
    cdef uint8_t* wm
    cdef int32_t* wl
    cdef int64_t wc
    cdef int64_t wsize
    cdef DenseScratch[float]* wsp
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pse
    cdef int64_t psr
    cdef int64_t p1_0
    cdef float x0_1
    cdef int64_t c_k
    cdef int64_t q1_1
    cdef int64_t h1_1
    cdef int64_t e1_1
    cdef int64_t wkey
    cdef int wnew
    cdef int64_t wn
    cdef int64_t wi
    cdef int64_t wb
    wsize = a.N_k
    wsp = dense_scratch[float](wsize + 1)
    wv = wsp.values
    wm = wsp.mark
    wl = wsp.touched
    for c_i in range(clo, chi):
        p0_0 = c_i
        wc = 0
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        pse = <int64_t>a.t0_pos1[a.N_i] - 16
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pse:
                scorch_prefetch(a.t1_pos1 + a.t0_crd1[q0_1 + 16])
                psr = a.t1_pos1[a.t0_crd1[q0_1 + 8]]
                scorch_prefetch(a.t1_crd1 + psr)
                scorch_prefetch(a.t1_vals + psr)
            p1_0 = c_j
            x0_1 = a.t0_vals[q0_1]
            q1_1 = a.t1_pos1[p1_0]
            h1_1 = a.t1_pos1[p1_0 + 1]
            for q1_1 in range(q1_1, h1_1):
                c_k = a.t1_crd1[q1_1]
                wkey = c_k
                wnew = 1 - wm[wkey]
                wm[wkey] = 1
                wv[wkey] = wv[wkey] + (x0_1 * a.t1_vals[q1_1])
                wl[wc] = <int32_t>wkey
                wc = wc + wnew
        wn = wc
        if wn:
            wb = deref(oval).size()
            deref(oval).grow(wn)
            deref(ocrd).grow(wn)
            dense_ws_drain_list[int32_t, float](wl, wc, wv, wm, deref(ocrd).data() + wb, deref(oval).data() + wb, wsp.sort_tmp)
            a.out_pos[c_i + 1] += wn
            if deref(oval).call_failed():
                return

cdef void run_chunk_scan(Args* pa, int64_t clo, int64_t chi, AppendBuffer[int32_t]* ocrd, AppendBuffer[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef float* wv
    cdef uint8_t* wm
    cdef int32_t* wl
    cdef int64_t wc
    cdef int64_t wsize
    cdef DenseScratch[float]* wsp
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pse
    cdef int64_t psr
    cdef int64_t p1_0
    cdef float x0_1
    cdef int64_t c_k
    cdef int64_t q1_1
    cdef int64_t h1_1
    cdef int64_t e1_1
    cdef int64_t wkey
    cdef int64_t wn
    cdef int64_t wi
    cdef int64_t wb
    wsize = a.N_k
    wsp = dense_scratch[float](wsize + 1)
    wv = wsp.values
    wm = wsp.mark
    wl = wsp.touched
    for c_i in range(clo, chi):
        p0_0 = c_i
        wc = 0
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        pse = <int64_t>a.t0_pos1[a.N_i] - 16
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pse:
                scorch_prefetch(a.t1_pos1 + a.t0_crd1[q0_1 + 16])
                psr = a.t1_pos1[a.t0_crd1[q0_1 + 8]]
                scorch_prefetch(a.t1_crd1 + psr)
                scorch_prefetch(a.t1_vals + psr)
            p1_0 = c_j
            x0_1 = a.t0_vals[q0_1]
            q1_1 = a.t1_pos1[p1_0]
            h1_1 = a.t1_pos1[p1_0 + 1]
            for q1_1 in range(q1_1, h1_1):
                c_k = a.t1_crd1[q1_1]
                wkey = c_k
                wm[wkey] = 1
                wv[wkey] = wv[wkey] + (x0_1 * a.t1_vals[q1_1])
                wc = 1
        wn = wc
        if wn:
            wb = deref(oval).size()
            deref(oval).grow(wsize)
            deref(ocrd).grow(wsize)
            wn = dense_ws_drain_scan[int32_t, float](wv, wm, 0, wsize, deref(ocrd).data() + wb, deref(oval).data() + wb)
            deref(oval).trim(wsize - wn)
            deref(ocrd).trim(wsize - wn)
            a.out_pos[c_i + 1] += wn
            if deref(oval).call_failed():
                return

cdef void run_chunk_map(Args* pa, int64_t clo, int64_t chi, AppendBuffer[int32_t]* ocrd, AppendBuffer[float]* oval) noexcept nogil:
    cdef Args a = pa[0]
    cdef SparseWorkspace[float] ws
    cdef int64_t c_i
    cdef int64_t p0_0
    cdef int64_t c_j
    cdef int64_t q0_1
    cdef int64_t h0_1
    cdef int64_t e0_1
    cdef int64_t pse
    cdef int64_t psr
    cdef int64_t p1_0
    cdef float x0_1
    cdef int64_t c_k
    cdef int64_t q1_1
    cdef int64_t h1_1
    cdef int64_t e1_1
    cdef int64_t wkey
    cdef int64_t wn
    cdef int64_t wi
    cdef int64_t wb
    for c_i in range(clo, chi):
        p0_0 = c_i
        q0_1 = a.t0_pos1[p0_0]
        h0_1 = a.t0_pos1[p0_0 + 1]
        pse = <int64_t>a.t0_pos1[a.N_i] - 16
        for q0_1 in range(q0_1, h0_1):
            c_j = a.t0_crd1[q0_1]
            if q0_1 < pse:
                scorch_prefetch(a.t1_pos1 + a.t0_crd1[q0_1 + 16])
                psr = a.t1_pos1[a.t0_crd1[q0_1 + 8]]
                scorch_prefetch(a.t1_crd1 + psr)
                scorch_prefetch(a.t1_vals + psr)
            p1_0 = c_j
            x0_1 = a.t0_vals[q0_1]
            q1_1 = a.t1_pos1[p1_0]
            h1_1 = a.t1_pos1[p1_0 + 1]
            for q1_1 in range(q1_1, h1_1):
                c_k = a.t1_crd1[q1_1]
                wkey = c_k
                ws.add(wkey, (x0_1 * a.t1_vals[q1_1]))
        wn = ws.size()
        if wn:
            wb = deref(oval).size()
            deref(oval).grow(wn)
            deref(ocrd).grow(wn)
            ws.drain(deref(ocrd).data() + wb, deref(oval).data() + wb, 0)
            a.out_pos[c_i + 1] += wn
            if deref(oval).call_failed():
                return

cdef int kernel_result_c(const int64_t* args, int nthreads, int panel, KernelResult* res) noexcept nogil:
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
    if <double>a.N_k >= 9.2e18:
        return result_error(res, RESULT_OVERFLOW, b"workspace over k is too large to index with int64", 0)
    cdef int64_t lo0 = 0, hi0 = 0, nchunks = 1, t, n, total, off
    hi0 = a.N_i
    if nthreads > 1 and hi0 - lo0 >= 2 and a.t0_pos1[hi0] - a.t0_pos1[lo0] >= 1024:
        nchunks = min(hi0 - lo0, 8 * nthreads, 1024)
    cdef chunk_fn fn = run_chunk
    if 8 * <double><int64_t>a.t0_pos1[a.N_i] * <double><int64_t>a.t1_pos1[a.N_j] >= a.N_k * max(<double>a.N_i, 1.0) * max(<double>a.N_j, 1.0):
        fn = run_chunk_scan
    if a.N_k > 4194304:
        fn = run_chunk_map
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
    if a.N_k > 2147483647:
        return result_error(res, RESULT_OVERFLOW, b"output dimension k (%lld) does not fit the int32 coordinates of this kernel", a.N_k)
    cdef int64_t P = a.N_i
    cdef int64_t* pp = result_zeros_i64(P + 1)
    result_array(res, 0, pp, P + 1, RESULT_INT, sizeof(int64_t), (P + 1) * sizeof(int64_t), result_free)
    if pp == NULL:
        return result_error(res, RESULT_NOMEM, b"out of memory for the %lld row counts of the output", P + 1)
    a.out_pos = pp
    cdef ChunkBuffers[AppendBuffer[int32_t]] crds
    cdef ChunkBuffers[AppendBuffer[float]] vals
    crds.allocate(nchunks)
    vals.allocate(nchunks)
    for t in range(nchunks):
        vals[t].report_failure_to(result_failure_flag(res))
        crds[t * 1 + 0].report_failure_to(result_failure_flag(res))
    if nchunks == 1:
        with nogil:
            if fn == run_chunk:
                run_chunk(&a, lo0, hi0, &crds[0], &vals[0])
            elif fn == run_chunk_scan:
                run_chunk_scan(&a, lo0, hi0, &crds[0], &vals[0])
            elif fn == run_chunk_map:
                run_chunk_map(&a, lo0, hi0, &crds[0], &vals[0])
            else:
                fn(&a, lo0, hi0, &crds[0], &vals[0])
    else:
        for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):
            if fn == run_chunk:
                run_chunk(&a, bounds[t], bounds[t + 1], &crds[t], &vals[t])
            elif fn == run_chunk_scan:
                run_chunk_scan(&a, bounds[t], bounds[t + 1], &crds[t], &vals[t])
            elif fn == run_chunk_map:
                run_chunk_map(&a, bounds[t], bounds[t + 1], &crds[t], &vals[t])
            else:
                fn(&a, bounds[t], bounds[t + 1], &crds[t], &vals[t])
    if result_failed(res):
        return result_error(res, RESULT_NOMEM, b"out of memory while the kernel appended its output entries: the result does not fit in memory%.0lld", 0)
    cdef vector[int64_t] offs
    offs.resize(nchunks + 1)
    offs[0] = 0
    for t in range(nchunks):
        offs[t + 1] = offs[t] + vals[t].size()
    total = offs[nchunks]
    cdef bint wide = max(total, P, a.N_i, a.N_k) > 2147483647
    if result_pos(pp, P, not wide) != total:
        return result_error(res, RESULT_RUNTIME, b"scorch kernel: row counts and appended entries disagree", 0)
    if not wide:
        result_array(res, 0, pp, P + 1, RESULT_INT, sizeof(int32_t), (P + 1) * sizeof(int64_t), result_free)
    cdef size_t nbytes
    cdef void* block
    if nchunks == 1 and total > 0 and wide == False:
        block = crds[0].release(&nbytes)   # (C leaves argument order open)
        result_hand_over(res, 1, block, nbytes, total, RESULT_INT, sizeof(int32_t), pool_give)
        block = vals[0].release(&nbytes)
        result_hand_over(res, 2, block, nbytes, total, RESULT_FLOAT, sizeof(float), pool_give)
        return RESULT_OK
    cdef int32_t* gc
    cdef float* gv
    if total > 0 and wide == False:
        gc = <int32_t*>result_resize(crds[0].release(&nbytes), total * sizeof(int32_t))
        gv = <float*>result_resize(vals[0].release(&nbytes), total * sizeof(float))
        if gc == NULL or gv == NULL:
            result_free(gc, 0)
            result_free(gv, 0)
            return result_error(res, RESULT_NOMEM, b"out of memory for the %lld entries of the output", total)
        for t in prange(1, nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):
            result_gather(offs[t + 1] - offs[t], offs[t], crds[t].data(), vals[t].data(), gc, gv, wide)
            crds[t].give_back()
            vals[t].give_back()
        result_array(res, 1, gc, total, RESULT_INT, sizeof(int32_t), (total) * sizeof(int32_t), result_free)
        result_array(res, 2, gv, total, RESULT_FLOAT, sizeof(float), (total) * sizeof(float), result_free)
        return RESULT_OK
    cdef int64_t isz = 8 if wide else 4
    cdef void* cp = result_alloc(total * isz)
    cdef float* vp = <float*>result_alloc(total * sizeof(float))
    if cp == NULL or vp == NULL:
        result_free(cp, 0)
        result_free(vp, 0)
        return result_error(res, RESULT_NOMEM, b"out of memory for the %lld entries of the output", total)
    for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):
        result_gather(vals[t].size(), offs[t], crds[t].data(), vals[t].data(), cp, vp, wide)
    result_array(res, 1, cp, total, RESULT_INT, isz, total * isz, result_free)
    result_array(res, 2, vp, total, RESULT_FLOAT, sizeof(float), (total) * sizeof(float), result_free)
    return RESULT_OK

def kernel(list args, int nthreads, int panel=0):
    cdef int64_t values[9]
    cdef KernelResult res
    cdef int i
    for i in range(9):
        values[i] = args[i]
    result_init(&res)
    with nogil:
        kernel_result_c(values, nthreads, panel, &res)
        result_check_allocation(&res)
    return result_to_python(&res)
