# cython: language_level=3
# distutils: language = c++
"""``result_to_python``: a sparse-output kernel's ``KernelResult`` as numpy arrays.

Each array is a view of the block the kernel handed over (no copy); its base is a capsule
that gives the block back (``ResultArray.give``: the kernel module's pool, or free) when the
array dies. Kept out of the kernels so they need no Python object (they build as plain C++)
and numpy's C API is compiled once, here.
"""
from cpython.pycapsule cimport (PyCapsule_New, PyCapsule_GetPointer, PyCapsule_GetContext,
                                PyCapsule_SetContext)
from libc.stdlib cimport malloc, free
from cpython.ref cimport Py_INCREF
cimport numpy as cnp

cnp.import_array()

__all__ = ["RESULT_TO_PYTHON"]


cdef struct _Give:     # what a capsule gives back, and to whom
    give_fn give
    size_t nbytes


cdef void _give_block(object cap) noexcept:
    cdef _Give* g = <_Give*>PyCapsule_GetContext(cap)
    g.give(PyCapsule_GetPointer(cap, NULL), g.nbytes)
    free(g)


cdef int _typenum(int kind, int itemsize) except -1:
    if kind == RESULT_FLOAT:
        if itemsize == 4:
            return cnp.NPY_FLOAT32
        if itemsize == 8:
            return cnp.NPY_FLOAT64
    elif kind == RESULT_INT:
        if itemsize == 1:
            return cnp.NPY_INT8
        if itemsize == 2:
            return cnp.NPY_INT16
        if itemsize == 4:
            return cnp.NPY_INT32
        if itemsize == 8:
            return cnp.NPY_INT64
    elif kind == RESULT_UINT and itemsize == 1:
        return cnp.NPY_UINT8
    raise TypeError(f"kernel result: no array type of kind {kind} and {itemsize} bytes")


cdef object _array(ResultArray* a):
    cdef cnp.npy_intp n = a.n
    cdef int typenum = _typenum(a.kind, a.itemsize)
    if a.data == NULL:         # nothing was handed over: an empty array of that type
        return cnp.PyArray_SimpleNew(1, &n, typenum)
    cdef _Give* g = <_Give*>malloc(sizeof(_Give))
    if g == NULL:
        raise MemoryError()
    g.give = a.give
    g.nbytes = a.nbytes
    cdef void* data = a.data
    try:
        cap = PyCapsule_New(data, NULL, _give_block)
    except BaseException:
        free(g)
        raise
    PyCapsule_SetContext(cap, g)
    a.data = NULL              # the capsule owns the block now
    arr = cnp.PyArray_SimpleNewFromData(1, &n, typenum, data)
    Py_INCREF(cap)             # PyArray_SetBaseObject steals a reference
    cnp.PyArray_SetBaseObject(arr, cap)
    return arr


cdef object result_to_python(KernelResult* r):
    if r.status != RESULT_OK:
        msg = r.message.decode("utf-8", "replace")
        result_release(r)
        if r.status == RESULT_OVERFLOW:
            raise OverflowError(msg)
        if r.status == RESULT_NOMEM:
            raise MemoryError(msg)
        raise RuntimeError(msg)
    cdef int i
    try:
        out = tuple([_array(&r.arrays[i]) for i in range(r.narrays)])
    except BaseException:
        result_release(r)      # the blocks not yet taken over
        raise
    if r.narrays == 0:
        return None
    if r.narrays == 1:
        return out[0]
    return out


RESULT_TO_PYTHON = PyCapsule_New(<void*>result_to_python, b"scorch.result_to_python", NULL)
