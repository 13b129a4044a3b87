"""What a sparse-output kernel returns (kernel_result.h) and its conversion to numpy arrays.

A generated kernel fills a ``KernelResult`` without the GIL (blocks it hands over, or an
error) and returns ``result_to_python(&res)``: ``None`` without arrays, one array, or a tuple.
Kernels built as plain C++ (tensor_compiler/cxx_module.py) reach ``result_to_python``
through the ``RESULT_TO_PYTHON`` capsule of ``scorch._runtime.result``.
"""
from libc.stdint cimport int32_t, int64_t


cdef extern from "kernel_result.h" namespace "scorch" nogil:
    ctypedef void (*give_fn)(void*, size_t)
    enum:
        RESULT_OK
        RESULT_OVERFLOW
        RESULT_RUNTIME
        RESULT_NOMEM
        RESULT_INT
        RESULT_UINT
        RESULT_FLOAT
    cdef struct ResultArray:
        void* data
        int64_t n
        size_t nbytes
        give_fn give
        int kind
        int itemsize
    cdef struct KernelResult:
        int status
        int narrays
        ResultArray arrays[3]
        char message[256]
        int allocation_failed
    void result_free(void* p, size_t nbytes)
    void* result_alloc(size_t nbytes)
    int64_t* result_zeros_i64(int64_t n)
    void result_array(KernelResult* r, int i, void* data, int64_t n, int kind, int itemsize,
                      size_t nbytes, give_fn give)
    void result_init(KernelResult* r)
    int result_error(KernelResult* r, int status, const char* fmt, int64_t value)
    void result_release(KernelResult* r)
    void result_check_allocation(KernelResult* r)
    int* result_failure_flag(KernelResult* r)
    int result_failed(KernelResult* r)
    void result_hand_over(KernelResult* r, int i, void* block, size_t nbytes, int64_t n, int kind,
                          int itemsize, give_fn give)
    void result_gather[C, V](int64_t n, int64_t off, const C* crd, const V* val, void* crd_out,
                             V* val_out, int wide)
    void result_put_coords[C](int64_t n, int64_t off, const C* crd, void* crd_out, int wide)
    void* result_resize(void* block, size_t nbytes)
    void result_drop_range(void* p, size_t nbytes)
    void* result_join_level[C](void* out, C* block, int l, int R, int64_t n, int wide)
    I* result_chain_levels[I](I* crd, int R, int64_t n, int64_t* count)
    int64_t result_pos(int64_t* p, int64_t P, int narrow)


cdef object result_to_python(KernelResult* r)
