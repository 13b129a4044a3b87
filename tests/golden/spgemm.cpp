// scorch generated kernel, lowered from its .pyx (scorch/tensor_compiler/cxx_module.py)
// cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
// distutils: language = c++
// scorch generated kernel (codegen v1)
// out(i,k) = sum_j T0(i,j) * T1(j,k)
// loop order: i, j, k
// T0 access 0: csr levels ('i', 'j')
// T1 access 1: csr levels ('j', 'k')
// output: csr (ws)
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <type_traits>
#include <string.h>
#include <vector>
#include "workspace.h"
#include "kernel_result.h"
using namespace scorch;

template <class A, class B> static inline typename std::common_type<A, B>::type
scorch_min(A a, B b) { return b < a ? b : a; }
template <class A, class B> static inline typename std::common_type<A, B>::type
scorch_max(A a, B b) { return b > a ? b : a; }

#define scorch_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)
struct Args {
    int64_t N_i;
    int64_t N_j;
    int64_t N_k;
    int32_t* t0_pos1;
    int32_t* t0_crd1;
    float* t0_vals;
    int32_t* t1_pos1;
    int32_t* t1_crd1;
    float* t1_vals;
    int64_t* out_pos;
};
typedef void (*chunk_fn)(Args*, int64_t, int64_t, AppendBuffer<int32_t>*, AppendBuffer<float>*);

static void run_chunk(Args* pa, int64_t clo, int64_t chi, AppendBuffer<int32_t>* ocrd, AppendBuffer<float>* oval) {
    Args a;
    float* wv;
    uint8_t* wm;
    int32_t* wl;
    int64_t wc;
    int64_t wsize;
    DenseScratch<float>* wsp;
    int64_t c_i;
    int64_t p0_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t pse;
    int64_t psr;
    int64_t p1_0;
    float x0_1;
    int64_t c_k;
    int64_t q1_1;
    int64_t h1_1;
    int64_t e1_1;
    int64_t wkey;
    int wnew;
    int64_t wn;
    int64_t wi;
    int64_t wb;
    a = pa[0];
    wsize = a.N_k;
    wsp = dense_scratch<float>((wsize + 1));
    wv = wsp->values;
    wm = wsp->mark;
    wl = wsp->touched;
    {
        int64_t scorch_end0 = chi;
        for (int64_t scorch_i0 = clo; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            wc = 0;
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            pse = (((int64_t)a.t0_pos1[a.N_i]) - 16);
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    if ((q0_1 < pse)) {
                        scorch_prefetch((a.t1_pos1 + a.t0_crd1[(q0_1 + 16)]));
                        psr = a.t1_pos1[a.t0_crd1[(q0_1 + 8)]];
                        scorch_prefetch((a.t1_crd1 + psr));
                        scorch_prefetch((a.t1_vals + psr));
                    }
                    p1_0 = c_j;
                    x0_1 = a.t0_vals[q0_1];
                    q1_1 = a.t1_pos1[p1_0];
                    h1_1 = a.t1_pos1[(p1_0 + 1)];
                    {
                        int64_t scorch_end2 = h1_1;
                        for (int64_t scorch_i2 = q1_1; scorch_i2 < scorch_end2; scorch_i2 += 1) {
                            q1_1 = scorch_i2;
                            c_k = a.t1_crd1[q1_1];
                            wkey = c_k;
                            wnew = (1 - wm[wkey]);
                            wm[wkey] = 1;
                            wv[wkey] = (wv[wkey] + ((x0_1 * a.t1_vals[q1_1])));
                            wl[wc] = ((int32_t)wkey);
                            wc = (wc + wnew);
                        }
                    }
                }
            }
            wn = wc;
            if (wn) {
                wb = (*(oval)).size();
                (*(oval)).grow(wn);
                (*(ocrd)).grow(wn);
                dense_ws_drain_list<int32_t, float>(wl, wc, wv, wm, ((*(ocrd)).data() + wb), ((*(oval)).data() + wb), wsp->sort_tmp);
                a.out_pos[(c_i + 1)] += wn;
                if ((*(oval)).call_failed()) {
                    return;
                }
            }
        }
    }
}

static void run_chunk_scan(Args* pa, int64_t clo, int64_t chi, AppendBuffer<int32_t>* ocrd, AppendBuffer<float>* oval) {
    Args a;
    float* wv;
    uint8_t* wm;
    int32_t* wl;
    int64_t wc;
    int64_t wsize;
    DenseScratch<float>* wsp;
    int64_t c_i;
    int64_t p0_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t pse;
    int64_t psr;
    int64_t p1_0;
    float x0_1;
    int64_t c_k;
    int64_t q1_1;
    int64_t h1_1;
    int64_t e1_1;
    int64_t wkey;
    int64_t wn;
    int64_t wi;
    int64_t wb;
    a = pa[0];
    wsize = a.N_k;
    wsp = dense_scratch<float>((wsize + 1));
    wv = wsp->values;
    wm = wsp->mark;
    wl = wsp->touched;
    {
        int64_t scorch_end0 = chi;
        for (int64_t scorch_i0 = clo; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            wc = 0;
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            pse = (((int64_t)a.t0_pos1[a.N_i]) - 16);
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    if ((q0_1 < pse)) {
                        scorch_prefetch((a.t1_pos1 + a.t0_crd1[(q0_1 + 16)]));
                        psr = a.t1_pos1[a.t0_crd1[(q0_1 + 8)]];
                        scorch_prefetch((a.t1_crd1 + psr));
                        scorch_prefetch((a.t1_vals + psr));
                    }
                    p1_0 = c_j;
                    x0_1 = a.t0_vals[q0_1];
                    q1_1 = a.t1_pos1[p1_0];
                    h1_1 = a.t1_pos1[(p1_0 + 1)];
                    {
                        int64_t scorch_end2 = h1_1;
                        for (int64_t scorch_i2 = q1_1; scorch_i2 < scorch_end2; scorch_i2 += 1) {
                            q1_1 = scorch_i2;
                            c_k = a.t1_crd1[q1_1];
                            wkey = c_k;
                            wm[wkey] = 1;
                            wv[wkey] = (wv[wkey] + ((x0_1 * a.t1_vals[q1_1])));
                            wc = 1;
                        }
                    }
                }
            }
            wn = wc;
            if (wn) {
                wb = (*(oval)).size();
                (*(oval)).grow(wsize);
                (*(ocrd)).grow(wsize);
                wn = dense_ws_drain_scan<int32_t, float>(wv, wm, 0, wsize, ((*(ocrd)).data() + wb), ((*(oval)).data() + wb));
                (*(oval)).trim((wsize - wn));
                (*(ocrd)).trim((wsize - wn));
                a.out_pos[(c_i + 1)] += wn;
                if ((*(oval)).call_failed()) {
                    return;
                }
            }
        }
    }
}

static void run_chunk_map(Args* pa, int64_t clo, int64_t chi, AppendBuffer<int32_t>* ocrd, AppendBuffer<float>* oval) {
    Args a;
    SparseWorkspace<float> ws;
    int64_t c_i;
    int64_t p0_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t pse;
    int64_t psr;
    int64_t p1_0;
    float x0_1;
    int64_t c_k;
    int64_t q1_1;
    int64_t h1_1;
    int64_t e1_1;
    int64_t wkey;
    int64_t wn;
    int64_t wi;
    int64_t wb;
    a = pa[0];
    {
        int64_t scorch_end0 = chi;
        for (int64_t scorch_i0 = clo; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            pse = (((int64_t)a.t0_pos1[a.N_i]) - 16);
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    if ((q0_1 < pse)) {
                        scorch_prefetch((a.t1_pos1 + a.t0_crd1[(q0_1 + 16)]));
                        psr = a.t1_pos1[a.t0_crd1[(q0_1 + 8)]];
                        scorch_prefetch((a.t1_crd1 + psr));
                        scorch_prefetch((a.t1_vals + psr));
                    }
                    p1_0 = c_j;
                    x0_1 = a.t0_vals[q0_1];
                    q1_1 = a.t1_pos1[p1_0];
                    h1_1 = a.t1_pos1[(p1_0 + 1)];
                    {
                        int64_t scorch_end2 = h1_1;
                        for (int64_t scorch_i2 = q1_1; scorch_i2 < scorch_end2; scorch_i2 += 1) {
                            q1_1 = scorch_i2;
                            c_k = a.t1_crd1[q1_1];
                            wkey = c_k;
                            ws.add(wkey, ((x0_1 * a.t1_vals[q1_1])));
                        }
                    }
                }
            }
            wn = ws.size();
            if (wn) {
                wb = (*(oval)).size();
                (*(oval)).grow(wn);
                (*(ocrd)).grow(wn);
                ws.drain(((*(ocrd)).data() + wb), ((*(oval)).data() + wb), 0);
                a.out_pos[(c_i + 1)] += wn;
                if ((*(oval)).call_failed()) {
                    return;
                }
            }
        }
    }
}

static int kernel_result_c(const int64_t* args, int nthreads, int panel, KernelResult* res) {
    Args a;
    int64_t lo0;
    int64_t hi0;
    int64_t nchunks;
    int64_t t;
    int64_t n;
    int64_t total;
    int64_t off;
    chunk_fn fn;
    int64_t bounds[1025];
    int64_t btot;
    int64_t btarget;
    int64_t blo;
    int64_t bhi;
    int64_t bmid;
    int64_t P;
    int64_t* pp;
    ChunkBuffers<AppendBuffer<int32_t>> crds;
    ChunkBuffers<AppendBuffer<float>> vals;
    std::vector<int64_t> offs;
    int wide;
    size_t nbytes;
    void* block;
    int32_t* gc;
    float* gv;
    int64_t isz;
    void* cp;
    float* vp;
    a.N_i = args[0];
    a.N_j = args[1];
    a.N_k = args[2];
    a.t0_pos1 = ((int32_t*)((size_t)args[3]));
    a.t0_crd1 = ((int32_t*)((size_t)args[4]));
    a.t0_vals = ((float*)((size_t)args[5]));
    a.t1_pos1 = ((int32_t*)((size_t)args[6]));
    a.t1_crd1 = ((int32_t*)((size_t)args[7]));
    a.t1_vals = ((float*)((size_t)args[8]));
    if ((((double)a.N_k) >= 9.2e18)) {
        return result_error(res, RESULT_OVERFLOW, "workspace over k is too large to index with int64", 0);
    }
    lo0 = 0;
    hi0 = 0;
    nchunks = 1;
    hi0 = a.N_i;
    if (((nthreads > 1) && ((hi0 - lo0) >= 2) && ((a.t0_pos1[hi0] - a.t0_pos1[lo0]) >= 1024))) {
        nchunks = scorch_min(scorch_min((hi0 - lo0), (8 * nthreads)), 1024);
    }
    fn = run_chunk;
    if ((((8 * ((double)((int64_t)a.t0_pos1[a.N_i]))) * ((double)((int64_t)a.t1_pos1[a.N_j]))) >= ((a.N_k * scorch_max(((double)a.N_i), 1.0)) * scorch_max(((double)a.N_j), 1.0)))) {
        fn = run_chunk_scan;
    }
    if ((a.N_k > 4194304)) {
        fn = run_chunk_map;
    }
    if ((nchunks > 1)) {
        {
            int64_t scorch_end0 = (nchunks + 1);
            for (int64_t scorch_i0 = 0; scorch_i0 < scorch_end0; scorch_i0 += 1) {
                t = scorch_i0;
                bounds[t] = (lo0 + (((((hi0 - lo0)) * t)) / nchunks));
            }
        }
    }
    if ((nchunks > 1)) {
        btot = (a.t0_pos1[hi0] - a.t0_pos1[lo0]);
        blo = lo0;
        {
            int64_t scorch_end1 = nchunks;
            for (int64_t scorch_i1 = 1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                t = scorch_i1;
                btarget = (a.t0_pos1[lo0] + (((btot * t)) / nchunks));
                bhi = hi0;
                while ((blo < bhi)) {
                    bmid = (((blo + bhi)) / 2);
                    if ((a.t0_pos1[bmid] < btarget)) {
                        blo = (bmid + 1);
                    }
                    else {
                        bhi = bmid;
                    }
                }
                bounds[t] = blo;
            }
        }
    }
    if ((a.N_k > 2147483647)) {
        return result_error(res, RESULT_OVERFLOW, "output dimension k (%lld) does not fit the int32 coordinates of this kernel", a.N_k);
    }
    P = a.N_i;
    pp = result_zeros_i64((P + 1));
    result_array(res, 0, pp, (P + 1), RESULT_INT, sizeof(int64_t), (((P + 1)) * sizeof(int64_t)), result_free);
    if ((pp == NULL)) {
        return result_error(res, RESULT_NOMEM, "out of memory for the %lld row counts of the output", (P + 1));
    }
    a.out_pos = pp;
    crds.allocate(nchunks);
    vals.allocate(nchunks);
    {
        int64_t scorch_end2 = nchunks;
        for (int64_t scorch_i2 = 0; scorch_i2 < scorch_end2; scorch_i2 += 1) {
            t = scorch_i2;
            vals[t].report_failure_to(result_failure_flag(res));
            crds[((t * 1) + 0)].report_failure_to(result_failure_flag(res));
        }
    }
    if ((nchunks == 1)) {
        {
            if ((fn == run_chunk)) {
                run_chunk((&a), lo0, hi0, (&crds[0]), (&vals[0]));
            }
            else if ((fn == run_chunk_scan)) {
                run_chunk_scan((&a), lo0, hi0, (&crds[0]), (&vals[0]));
            }
            else if ((fn == run_chunk_map)) {
                run_chunk_map((&a), lo0, hi0, (&crds[0]), (&vals[0]));
            }
            else {
                fn((&a), lo0, hi0, (&crds[0]), (&vals[0]));
            }
        }
    }
    else {
        {
            int64_t scorch_end3 = nchunks;
            if (scorch_end3 > 0) {
#pragma omp parallel for schedule(dynamic) num_threads(nthreads)
                for (int64_t scorch_i3 = 0; scorch_i3 < scorch_end3; scorch_i3++) {
                    int64_t t = scorch_i3;
                    if ((fn == run_chunk)) {
                        run_chunk((&a), bounds[t], bounds[(t + 1)], (&crds[t]), (&vals[t]));
                    }
                    else if ((fn == run_chunk_scan)) {
                        run_chunk_scan((&a), bounds[t], bounds[(t + 1)], (&crds[t]), (&vals[t]));
                    }
                    else if ((fn == run_chunk_map)) {
                        run_chunk_map((&a), bounds[t], bounds[(t + 1)], (&crds[t]), (&vals[t]));
                    }
                    else {
                        fn((&a), bounds[t], bounds[(t + 1)], (&crds[t]), (&vals[t]));
                    }
                }
            }
        }
    }
    if (result_failed(res)) {
        return result_error(res, RESULT_NOMEM, "out of memory while the kernel appended its output entries: the result does not fit in memory%.0lld", 0);
    }
    offs.resize((nchunks + 1));
    offs[0] = 0;
    {
        int64_t scorch_end4 = nchunks;
        for (int64_t scorch_i4 = 0; scorch_i4 < scorch_end4; scorch_i4 += 1) {
            t = scorch_i4;
            offs[(t + 1)] = (offs[t] + vals[t].size());
        }
    }
    total = offs[nchunks];
    wide = (scorch_max(scorch_max(scorch_max(total, P), a.N_i), a.N_k) > 2147483647);
    if ((result_pos(pp, P, (!(wide))) != total)) {
        return result_error(res, RESULT_RUNTIME, "scorch kernel: row counts and appended entries disagree", 0);
    }
    if ((!(wide))) {
        result_array(res, 0, pp, (P + 1), RESULT_INT, sizeof(int32_t), (((P + 1)) * sizeof(int64_t)), result_free);
    }
    if (((nchunks == 1) && (total > 0) && (wide == 0))) {
        block = crds[0].release((&nbytes));
        result_hand_over(res, 1, block, nbytes, total, RESULT_INT, sizeof(int32_t), pool_give);
        block = vals[0].release((&nbytes));
        result_hand_over(res, 2, block, nbytes, total, RESULT_FLOAT, sizeof(float), pool_give);
        return RESULT_OK;
    }
    if (((total > 0) && (wide == 0))) {
        gc = ((int32_t*)result_resize(crds[0].release((&nbytes)), (total * sizeof(int32_t))));
        gv = ((float*)result_resize(vals[0].release((&nbytes)), (total * sizeof(float))));
        if (((gc == NULL) || (gv == NULL))) {
            result_free(gc, 0);
            result_free(gv, 0);
            return result_error(res, RESULT_NOMEM, "out of memory for the %lld entries of the output", total);
        }
        {
            int64_t scorch_end5 = nchunks;
            if (scorch_end5 > 1) {
#pragma omp parallel for schedule(dynamic) num_threads(nthreads)
                for (int64_t scorch_i5 = 1; scorch_i5 < scorch_end5; scorch_i5++) {
                    int64_t t = scorch_i5;
                    result_gather((offs[(t + 1)] - offs[t]), offs[t], crds[t].data(), vals[t].data(), gc, gv, wide);
                    crds[t].give_back();
                    vals[t].give_back();
                }
            }
        }
        result_array(res, 1, gc, total, RESULT_INT, sizeof(int32_t), ((total) * sizeof(int32_t)), result_free);
        result_array(res, 2, gv, total, RESULT_FLOAT, sizeof(float), ((total) * sizeof(float)), result_free);
        return RESULT_OK;
    }
    isz = ((wide) ? (8) : (4));
    cp = result_alloc((total * isz));
    vp = ((float*)result_alloc((total * sizeof(float))));
    if (((cp == NULL) || (vp == NULL))) {
        result_free(cp, 0);
        result_free(vp, 0);
        return result_error(res, RESULT_NOMEM, "out of memory for the %lld entries of the output", total);
    }
    {
        int64_t scorch_end6 = nchunks;
        if (scorch_end6 > 0) {
#pragma omp parallel for schedule(dynamic) num_threads(nthreads)
            for (int64_t scorch_i6 = 0; scorch_i6 < scorch_end6; scorch_i6++) {
                int64_t t = scorch_i6;
                result_gather(vals[t].size(), offs[t], crds[t].data(), vals[t].data(), cp, vp, wide);
            }
        }
    }
    result_array(res, 1, cp, total, RESULT_INT, isz, (total * isz), result_free);
    result_array(res, 2, vp, total, RESULT_FLOAT, sizeof(float), ((total) * sizeof(float)), result_free);
    return RESULT_OK;
}

static PyObject* (*scorch_result_to_python)(KernelResult*);

/* the Python face: kernel(args, nthreads, panel=0) and the KERNEL_C capsule */
static PyObject* scorch_kernel(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
    if (argc < 2 || argc > 3) {
        PyErr_SetString(PyExc_TypeError, "kernel(args, nthreads, panel=0)");
        return NULL;
    }
    if (!PyList_Check(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "kernel: args must be a list");
        return NULL;
    }
    if (PyList_GET_SIZE(argv[0]) < 9) {
        PyErr_SetString(PyExc_IndexError, "kernel: args has fewer than 9 values");
        return NULL;
    }
    int64_t values[9 + 1];
    for (Py_ssize_t i = 0; i < 9; i++) {
        values[i] = (int64_t)PyLong_AsLongLong(PyList_GET_ITEM(argv[0], i));
        if (values[i] == -1 && PyErr_Occurred()) return NULL;
    }
    long nthreads = PyLong_AsLong(argv[1]);
    if (nthreads == -1 && PyErr_Occurred()) return NULL;
    long panel = argc > 2 ? PyLong_AsLong(argv[2]) : 0;
    if (panel == -1 && PyErr_Occurred()) return NULL;
    KernelResult res;
    result_init(&res);
    Py_BEGIN_ALLOW_THREADS
    kernel_result_c(values, (int)nthreads, (int)panel, &res);
    result_check_allocation(&res);
    Py_END_ALLOW_THREADS
    return scorch_result_to_python(&res);
}

static PyMethodDef scorch_methods[] = {
    {"kernel", (PyCFunction)(void (*)(void))scorch_kernel, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};

#define SCORCH_CAT2(a, b) a##b
#define SCORCH_CAT(a, b) SCORCH_CAT2(a, b)
#define SCORCH_STR2(a) #a
#define SCORCH_STR(a) SCORCH_STR2(a)
static struct PyModuleDef scorch_module = {
    PyModuleDef_HEAD_INIT, SCORCH_STR(SCORCH_MODULE), NULL, -1, scorch_methods};

PyMODINIT_FUNC SCORCH_CAT(PyInit_, SCORCH_MODULE)(void) {
    PyObject* m = PyModule_Create(&scorch_module);
    if (m == NULL) return NULL;
    PyObject* runtime = PyImport_ImportModule("scorch._runtime.result");
    PyObject* cap = runtime == NULL ? NULL : PyObject_GetAttrString(runtime, "RESULT_TO_PYTHON");
    Py_XDECREF(runtime);
    scorch_result_to_python = cap == NULL ? NULL
        : (PyObject* (*)(KernelResult*))PyCapsule_GetPointer(cap, "scorch.result_to_python");
    Py_XDECREF(cap);
    if (scorch_result_to_python == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

