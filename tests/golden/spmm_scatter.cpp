// scorch generated kernel, lowered from its .pyx (scorch/tensor_compiler/cxx_module.py)
// cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
// distutils: language = c++
// scorch generated kernel (codegen v1)
// out(j,k) = sum_i T0(i,j) * T1(i,k)
// loop order: i, j, k
// T0 access 0: csr levels ('i', 'j')
// T1 access 1: dense strided ('i', 'k')
// output: dense (dense)
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <type_traits>
#include <string.h>
#include <vector>

template <class A, class B> static inline typename std::common_type<A, B>::type
scorch_min(A a, B b) { return b < a ? b : a; }
template <class A, class B> static inline typename std::common_type<A, B>::type
scorch_max(A a, B b) { return b > a ? b : a; }

typedef float scorch_vf16 __attribute__((vector_size(16), aligned(4), may_alias));
static inline scorch_vf16 scorch_vf16_zero(void) { scorch_vf16 z = {0}; return z; }
static inline float scorch_vf16_hsum(scorch_vf16 v) { float s = 0; for (int i = 0; i < 4; i++) s += v[i]; return s; }
typedef float scorch_vf32 __attribute__((vector_size(32), aligned(4), may_alias));
static inline scorch_vf32 scorch_vf32_zero(void) { scorch_vf32 z = {0}; return z; }
static inline float scorch_vf32_hsum(scorch_vf32 v) { float s = 0; for (int i = 0; i < 8; i++) s += v[i]; return s; }
typedef float scorch_vf __attribute__((vector_size(64), aligned(4), may_alias));
static inline scorch_vf scorch_vf_zero(void) { scorch_vf z = {0}; return z; }
static inline float scorch_vf_hsum(scorch_vf v) { float s = 0; for (int i = 0; i < 16; i++) s += v[i]; return s; }
struct Args {
    int64_t N_i;
    int64_t N_j;
    int64_t N_k;
    int32_t* t0_pos1;
    int32_t* t0_crd1;
    float* t0_vals;
    int64_t t1_st_i;
    int64_t t1_st_k;
    float* t1_vals;
    float* out_vals;
    int64_t out_st_j;
    int64_t out_st_k;
};
typedef void (*chunk_fn)(Args*, int64_t, int64_t, std::vector<int64_t>*, std::vector<float>*);

static void run_chunk(Args* pa, int64_t clo, int64_t chi, std::vector<int64_t>* ocrd, std::vector<float>* oval) {
    Args a;
    int64_t c_i;
    int64_t p0_0;
    int64_t o1_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t oo_1;
    float x0_1;
    int64_t c_k;
    int64_t o1_2;
    int64_t oo_2;
    a = pa[0];
    {
        int64_t scorch_end0 = a.N_i;
        for (int64_t scorch_i0 = 0; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            o1_0 = (c_i * a.t1_st_i);
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    oo_1 = (c_j * a.out_st_j);
                    x0_1 = a.t0_vals[q0_1];
                    {
                        int64_t scorch_end2 = a.N_k;
                        for (int64_t scorch_i2 = 0; scorch_i2 < scorch_end2; scorch_i2 += 1) {
                            c_k = scorch_i2;
                            o1_2 = (o1_0 + c_k);
                            oo_2 = (oo_1 + c_k);
                            a.out_vals[oo_2] += ((x0_1 * a.t1_vals[o1_2]));
                        }
                    }
                }
            }
        }
    }
}

static void run_chunk_w4(Args* pa, int64_t clo, int64_t chi, std::vector<int64_t>* ocrd, std::vector<float>* oval) {
    Args a;
    int64_t c_i;
    int64_t p0_0;
    int64_t o1_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t oo_1;
    float x0_1;
    int64_t c_k;
    a = pa[0];
    {
        int64_t scorch_end0 = a.N_i;
        for (int64_t scorch_i0 = 0; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            o1_0 = (c_i * a.t1_st_i);
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    oo_1 = (c_j * a.out_st_j);
                    x0_1 = a.t0_vals[q0_1];
                    (((scorch_vf16*)(((a.out_vals + oo_1) + 0))))[0] = ((((scorch_vf16*)(((a.out_vals + oo_1) + 0))))[0] + ((x0_1 * (((scorch_vf16*)(((a.t1_vals + o1_0) + 0))))[0])));
                }
            }
        }
    }
}

static void run_chunk_w8(Args* pa, int64_t clo, int64_t chi, std::vector<int64_t>* ocrd, std::vector<float>* oval) {
    Args a;
    int64_t c_i;
    int64_t p0_0;
    int64_t o1_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t oo_1;
    float x0_1;
    int64_t c_k;
    a = pa[0];
    {
        int64_t scorch_end0 = a.N_i;
        for (int64_t scorch_i0 = 0; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            o1_0 = (c_i * a.t1_st_i);
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    oo_1 = (c_j * a.out_st_j);
                    x0_1 = a.t0_vals[q0_1];
                    (((scorch_vf32*)(((a.out_vals + oo_1) + 0))))[0] = ((((scorch_vf32*)(((a.out_vals + oo_1) + 0))))[0] + ((x0_1 * (((scorch_vf32*)(((a.t1_vals + o1_0) + 0))))[0])));
                }
            }
        }
    }
}

static void run_chunk_w16(Args* pa, int64_t clo, int64_t chi, std::vector<int64_t>* ocrd, std::vector<float>* oval) {
    Args a;
    int64_t c_i;
    int64_t p0_0;
    int64_t o1_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t oo_1;
    float x0_1;
    int64_t c_k;
    a = pa[0];
    {
        int64_t scorch_end0 = a.N_i;
        for (int64_t scorch_i0 = 0; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            o1_0 = (c_i * a.t1_st_i);
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    oo_1 = (c_j * a.out_st_j);
                    x0_1 = a.t0_vals[q0_1];
                    (((scorch_vf*)(((a.out_vals + oo_1) + 0))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 0))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 0))))[0])));
                }
            }
        }
    }
}

static void run_chunk_w32(Args* pa, int64_t clo, int64_t chi, std::vector<int64_t>* ocrd, std::vector<float>* oval) {
    Args a;
    int64_t c_i;
    int64_t p0_0;
    int64_t o1_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t oo_1;
    float x0_1;
    int64_t c_k;
    a = pa[0];
    {
        int64_t scorch_end0 = a.N_i;
        for (int64_t scorch_i0 = 0; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            o1_0 = (c_i * a.t1_st_i);
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    oo_1 = (c_j * a.out_st_j);
                    x0_1 = a.t0_vals[q0_1];
                    (((scorch_vf*)(((a.out_vals + oo_1) + 0))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 0))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 0))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 16))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 16))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 16))))[0])));
                }
            }
        }
    }
}

static void run_chunk_w64(Args* pa, int64_t clo, int64_t chi, std::vector<int64_t>* ocrd, std::vector<float>* oval) {
    Args a;
    int64_t c_i;
    int64_t p0_0;
    int64_t o1_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t oo_1;
    float x0_1;
    int64_t c_k;
    a = pa[0];
    {
        int64_t scorch_end0 = a.N_i;
        for (int64_t scorch_i0 = 0; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            o1_0 = (c_i * a.t1_st_i);
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    oo_1 = (c_j * a.out_st_j);
                    x0_1 = a.t0_vals[q0_1];
                    (((scorch_vf*)(((a.out_vals + oo_1) + 0))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 0))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 0))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 16))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 16))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 16))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 32))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 32))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 32))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 48))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 48))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 48))))[0])));
                }
            }
        }
    }
}

static void run_chunk_w128(Args* pa, int64_t clo, int64_t chi, std::vector<int64_t>* ocrd, std::vector<float>* oval) {
    Args a;
    int64_t c_i;
    int64_t p0_0;
    int64_t o1_0;
    int64_t c_j;
    int64_t q0_1;
    int64_t h0_1;
    int64_t e0_1;
    int64_t oo_1;
    float x0_1;
    int64_t c_k;
    a = pa[0];
    {
        int64_t scorch_end0 = a.N_i;
        for (int64_t scorch_i0 = 0; scorch_i0 < scorch_end0; scorch_i0 += 1) {
            c_i = scorch_i0;
            p0_0 = c_i;
            o1_0 = (c_i * a.t1_st_i);
            q0_1 = a.t0_pos1[p0_0];
            h0_1 = a.t0_pos1[(p0_0 + 1)];
            {
                int64_t scorch_end1 = h0_1;
                for (int64_t scorch_i1 = q0_1; scorch_i1 < scorch_end1; scorch_i1 += 1) {
                    q0_1 = scorch_i1;
                    c_j = a.t0_crd1[q0_1];
                    oo_1 = (c_j * a.out_st_j);
                    x0_1 = a.t0_vals[q0_1];
                    (((scorch_vf*)(((a.out_vals + oo_1) + 0))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 0))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 0))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 16))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 16))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 16))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 32))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 32))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 32))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 48))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 48))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 48))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 64))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 64))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 64))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 80))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 80))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 80))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 96))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 96))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 96))))[0])));
                    (((scorch_vf*)(((a.out_vals + oo_1) + 112))))[0] = ((((scorch_vf*)(((a.out_vals + oo_1) + 112))))[0] + ((x0_1 * (((scorch_vf*)(((a.t1_vals + o1_0) + 112))))[0])));
                }
            }
        }
    }
}

static void kernel_c(const int64_t* args, int nthreads, int panel) {
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
    a.N_i = args[0];
    a.N_j = args[1];
    a.N_k = args[2];
    a.t0_pos1 = ((int32_t*)((size_t)args[3]));
    a.t0_crd1 = ((int32_t*)((size_t)args[4]));
    a.t0_vals = ((float*)((size_t)args[5]));
    a.t1_st_i = args[6];
    a.t1_st_k = args[7];
    a.t1_vals = ((float*)((size_t)args[8]));
    a.out_vals = ((float*)((size_t)args[9]));
    a.out_st_j = args[10];
    a.out_st_k = args[11];
    lo0 = 0;
    hi0 = 0;
    nchunks = 1;
    memset(((void*)a.out_vals), 0, ((a.N_j * a.N_k) * sizeof(float)));
    fn = run_chunk;
    if ((a.N_k == 4)) {
        fn = run_chunk_w4;
    }
    if ((a.N_k == 8)) {
        fn = run_chunk_w8;
    }
    if ((a.N_k == 16)) {
        fn = run_chunk_w16;
    }
    if ((a.N_k == 32)) {
        fn = run_chunk_w32;
    }
    if ((a.N_k == 64)) {
        fn = run_chunk_w64;
    }
    if ((a.N_k == 128)) {
        fn = run_chunk_w128;
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
    if ((nchunks == 1)) {
        {
            if ((fn == run_chunk)) {
                run_chunk((&a), lo0, hi0, NULL, NULL);
            }
            else if ((fn == run_chunk_w4)) {
                run_chunk_w4((&a), lo0, hi0, NULL, NULL);
            }
            else if ((fn == run_chunk_w8)) {
                run_chunk_w8((&a), lo0, hi0, NULL, NULL);
            }
            else if ((fn == run_chunk_w16)) {
                run_chunk_w16((&a), lo0, hi0, NULL, NULL);
            }
            else if ((fn == run_chunk_w32)) {
                run_chunk_w32((&a), lo0, hi0, NULL, NULL);
            }
            else if ((fn == run_chunk_w64)) {
                run_chunk_w64((&a), lo0, hi0, NULL, NULL);
            }
            else if ((fn == run_chunk_w128)) {
                run_chunk_w128((&a), lo0, hi0, NULL, NULL);
            }
            else {
                fn((&a), lo0, hi0, NULL, NULL);
            }
        }
    }
    else {
        {
            int64_t scorch_end1 = nchunks;
            if (scorch_end1 > 0) {
#pragma omp parallel for schedule(dynamic) num_threads(nthreads)
                for (int64_t scorch_i1 = 0; scorch_i1 < scorch_end1; scorch_i1++) {
                    int64_t t = scorch_i1;
                    if ((fn == run_chunk)) {
                        run_chunk((&a), bounds[t], bounds[(t + 1)], NULL, NULL);
                    }
                    else if ((fn == run_chunk_w4)) {
                        run_chunk_w4((&a), bounds[t], bounds[(t + 1)], NULL, NULL);
                    }
                    else if ((fn == run_chunk_w8)) {
                        run_chunk_w8((&a), bounds[t], bounds[(t + 1)], NULL, NULL);
                    }
                    else if ((fn == run_chunk_w16)) {
                        run_chunk_w16((&a), bounds[t], bounds[(t + 1)], NULL, NULL);
                    }
                    else if ((fn == run_chunk_w32)) {
                        run_chunk_w32((&a), bounds[t], bounds[(t + 1)], NULL, NULL);
                    }
                    else if ((fn == run_chunk_w64)) {
                        run_chunk_w64((&a), bounds[t], bounds[(t + 1)], NULL, NULL);
                    }
                    else if ((fn == run_chunk_w128)) {
                        run_chunk_w128((&a), bounds[t], bounds[(t + 1)], NULL, NULL);
                    }
                    else {
                        fn((&a), bounds[t], bounds[(t + 1)], NULL, NULL);
                    }
                }
            }
        }
    }
    return;
}


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
    if (PyList_GET_SIZE(argv[0]) < 12) {
        PyErr_SetString(PyExc_IndexError, "kernel: args has fewer than 12 values");
        return NULL;
    }
    int64_t values[12 + 1];
    for (Py_ssize_t i = 0; i < 12; i++) {
        values[i] = (int64_t)PyLong_AsLongLong(PyList_GET_ITEM(argv[0], i));
        if (values[i] == -1 && PyErr_Occurred()) return NULL;
    }
    long nthreads = PyLong_AsLong(argv[1]);
    if (nthreads == -1 && PyErr_Occurred()) return NULL;
    long panel = argc > 2 ? PyLong_AsLong(argv[2]) : 0;
    if (panel == -1 && PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    kernel_c(values, (int)nthreads, (int)panel);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
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
    PyObject* cap = PyCapsule_New((void*)kernel_c, "scorch.kernel_c", NULL);
    if (cap == NULL || PyModule_AddObject(m, "KERNEL_C", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

