# cython: language_level=3
# distutils: language = c++
"""Python-visible wrappers of the kernel workspaces (workspace.pxd), so that the exact C++
objects generated kernels use can be tested, and used by Python-level fallbacks.

``PySparseWorkspace(dtype)`` wraps ``SparseWorkspace[V]``; ``PyDenseWorkspace(n, dtype)`` wraps
``DenseWorkspace[V]``; dtype is one of torch.float32, float64, int32, int64.

This module also owns the process pool of output blocks (``BlockPool``, block_pool.h): every
kernel module fetches it through the ``BLOCK_POOL_V2`` capsule, so the blocks kept for reuse
stay under one limit (``pool_limit()``: 128 MB, or ``SCORCH_POOL_MB``) however many kernels
ran. ``pool_bytes()`` reads what it keeps, ``release_memory()`` frees it (scorch.cache_clear()
calls it).
"""
from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int32_t, int64_t, intptr_t

from typing import Tuple

cdef extern from "block_pool.h" namespace "scorch" nogil:
    # the process pool of output blocks (this module owns it and exports it)
    cdef cppclass BlockPool:
        size_t held()
        size_t limit()
        void set_limit(size_t nbytes)
        void release()
    BlockPool& process_pool()
    cdef cppclass PoolApi:
        pass
    PoolApi* process_pool_exports()

import torch

__all__ = ["PySparseWorkspace", "PyDenseWorkspace"]

#: the process pool's entry points (workspace.h: PoolApi, SCORCH_POOL_CAPSULE)
BLOCK_POOL_V2 = PyCapsule_New(<void*>process_pool_exports(), b"scorch._runtime.workspace.BLOCK_POOL_V2", NULL)


def pool_bytes() -> int:
    """Bytes of freed output blocks the process pool keeps for the next kernel calls."""
    return process_pool().held()


def pool_limit() -> int:
    """The most bytes the process pool keeps."""
    return process_pool().limit()


def set_pool_limit(size_t nbytes) -> None:
    """A new limit for the process pool (0: keep nothing); blocks past it are freed."""
    process_pool().set_limit(nbytes)


def release_memory() -> None:
    """Free every block the process pool keeps (blocks live tensors hold come back later)."""
    process_pool().release()

ctypedef fused wv_t:
    float
    double
    int32_t
    int64_t

_CODES = {torch.float32: 0, torch.float64: 1, torch.int32: 2, torch.int64: 3}


cdef inline void* _ptr(t):
    return <void*><intptr_t>t.data_ptr()


cdef int _code(dtype) except -1:
    if dtype not in _CODES:
        raise TypeError(f"workspace dtype must be float32, float64, int32 or int64, got {dtype}")
    return _CODES[dtype]


def _check_drain_args(crd, vals, int64_t offset, int64_t count, dtype):
    if not isinstance(crd, torch.Tensor) or crd.dtype not in (torch.int32, torch.int64) \
            or not crd.is_contiguous():
        raise ValueError("crd must be a contiguous int32 or int64 tensor")
    if not isinstance(vals, torch.Tensor) or vals.dtype != dtype or not vals.is_contiguous():
        raise ValueError(f"vals must be a contiguous {dtype} tensor")
    if offset < 0 or offset + count > crd.numel() or offset + count > vals.numel():
        raise ValueError(f"crd/vals too short: need {offset + count} entries from offset {offset}")


cdef void _free_sparse(SparseWorkspace[wv_t]* ws) noexcept:
    del ws


cdef void _free_dense(DenseWorkspace[wv_t]* ws) noexcept:
    del ws


cdef void _sparse_add_many(SparseWorkspace[wv_t]* ws, int64_t* c, wv_t* v, int64_t n) noexcept nogil:
    cdef int64_t i
    for i in range(n):
        ws.add(c[i], v[i])


cdef void _dense_add_many(DenseWorkspace[wv_t]* ws, int64_t* c, wv_t* v, int64_t n) noexcept nogil:
    cdef int64_t i
    for i in range(n):
        ws.add(c[i], v[i])


cdef class PySparseWorkspace:
    """Ordered accumulation of coordinate -> value (appended, sorted and combined when read)."""
    cdef void* ws
    cdef int code
    cdef readonly object dtype

    def __cinit__(self, dtype=torch.float64):
        self.code = _code(dtype)
        self.dtype = dtype
        if self.code == 0:
            self.ws = new SparseWorkspace[float]()
        elif self.code == 1:
            self.ws = new SparseWorkspace[double]()
        elif self.code == 2:
            self.ws = new SparseWorkspace[int32_t]()
        else:
            self.ws = new SparseWorkspace[int64_t]()

    def __dealloc__(self):
        if self.ws == NULL:
            return
        if self.code == 0:
            _free_sparse(<SparseWorkspace[float]*>self.ws)
        elif self.code == 1:
            _free_sparse(<SparseWorkspace[double]*>self.ws)
        elif self.code == 2:
            _free_sparse(<SparseWorkspace[int32_t]*>self.ws)
        else:
            _free_sparse(<SparseWorkspace[int64_t]*>self.ws)

    def add(self, int64_t coord, value) -> None:
        if self.code == 0:
            (<SparseWorkspace[float]*>self.ws).add(coord, <float>value)
        elif self.code == 1:
            (<SparseWorkspace[double]*>self.ws).add(coord, <double>value)
        elif self.code == 2:
            (<SparseWorkspace[int32_t]*>self.ws).add(coord, <int32_t>value)
        else:
            (<SparseWorkspace[int64_t]*>self.ws).add(coord, <int64_t>value)

    def add_many(self, coords: torch.Tensor, values: torch.Tensor) -> None:
        """Add every (coords[i], values[i]) in order, in one nogil loop."""
        c = torch.as_tensor(coords).to(torch.int64).contiguous()
        v = torch.as_tensor(values).to(self.dtype).contiguous()
        if c.numel() != v.numel():
            raise ValueError(f"coords has {c.numel()} entries but values has {v.numel()}")
        cdef int64_t n = c.numel()
        cdef int64_t* cp = <int64_t*>_ptr(c)
        cdef void* vp = _ptr(v)
        with nogil:
            if self.code == 0:
                _sparse_add_many(<SparseWorkspace[float]*>self.ws, cp, <float*>vp, n)
            elif self.code == 1:
                _sparse_add_many(<SparseWorkspace[double]*>self.ws, cp, <double*>vp, n)
            elif self.code == 2:
                _sparse_add_many(<SparseWorkspace[int32_t]*>self.ws, cp, <int32_t*>vp, n)
            else:
                _sparse_add_many(<SparseWorkspace[int64_t]*>self.ws, cp, <int64_t*>vp, n)

    def size(self) -> int:
        if self.code == 0:
            return (<SparseWorkspace[float]*>self.ws).size()
        elif self.code == 1:
            return (<SparseWorkspace[double]*>self.ws).size()
        elif self.code == 2:
            return (<SparseWorkspace[int32_t]*>self.ws).size()
        return (<SparseWorkspace[int64_t]*>self.ws).size()

    def __len__(self) -> int:
        return self.size()

    def get(self, int64_t coord):
        if self.code == 0:
            return (<SparseWorkspace[float]*>self.ws).get(coord)
        elif self.code == 1:
            return (<SparseWorkspace[double]*>self.ws).get(coord)
        elif self.code == 2:
            return (<SparseWorkspace[int32_t]*>self.ws).get(coord)
        return (<SparseWorkspace[int64_t]*>self.ws).get(coord)

    def drain(self, crd: torch.Tensor, vals: torch.Tensor, int64_t offset=0) -> int:
        """Sorted coordinates into crd[offset:], values into vals[offset:]; returns the end
        offset and empties the workspace."""
        _check_drain_args(crd, vals, offset, self.size(), self.dtype)
        cdef bint c64 = crd.dtype == torch.int64
        cdef void* cp = _ptr(crd)
        cdef void* vp = _ptr(vals)
        if self.code == 0:
            return (<SparseWorkspace[float]*>self.ws).drain(<int64_t*>cp, <float*>vp, offset) if c64 \
                else (<SparseWorkspace[float]*>self.ws).drain(<int32_t*>cp, <float*>vp, offset)
        elif self.code == 1:
            return (<SparseWorkspace[double]*>self.ws).drain(<int64_t*>cp, <double*>vp, offset) if c64 \
                else (<SparseWorkspace[double]*>self.ws).drain(<int32_t*>cp, <double*>vp, offset)
        elif self.code == 2:
            return (<SparseWorkspace[int32_t]*>self.ws).drain(<int64_t*>cp, <int32_t*>vp, offset) if c64 \
                else (<SparseWorkspace[int32_t]*>self.ws).drain(<int32_t*>cp, <int32_t*>vp, offset)
        return (<SparseWorkspace[int64_t]*>self.ws).drain(<int64_t*>cp, <int64_t*>vp, offset) if c64 \
            else (<SparseWorkspace[int64_t]*>self.ws).drain(<int32_t*>cp, <int64_t*>vp, offset)

    def drain_arrays(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(sorted int64 coordinates, values) as new tensors; empties the workspace."""
        n = self.size()
        crd = torch.empty(n, dtype=torch.int64)
        vals = torch.empty(n, dtype=self.dtype)
        self.drain(crd, vals, 0)
        return crd, vals

    def clear(self) -> None:
        if self.code == 0:
            (<SparseWorkspace[float]*>self.ws).clear()
        elif self.code == 1:
            (<SparseWorkspace[double]*>self.ws).clear()
        elif self.code == 2:
            (<SparseWorkspace[int32_t]*>self.ws).clear()
        else:
            (<SparseWorkspace[int64_t]*>self.ws).clear()


cdef class PyDenseWorkspace:
    """Accumulation into a dense array of extent ``n`` with markers and a touched list."""
    cdef void* ws
    cdef int code
    cdef readonly object dtype
    cdef readonly int64_t extent

    def __cinit__(self, int64_t n, dtype=torch.float64):
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        self.code = _code(dtype)
        self.dtype = dtype
        self.extent = n
        if self.code == 0:
            self.ws = new DenseWorkspace[float](n)
        elif self.code == 1:
            self.ws = new DenseWorkspace[double](n)
        elif self.code == 2:
            self.ws = new DenseWorkspace[int32_t](n)
        else:
            self.ws = new DenseWorkspace[int64_t](n)

    def __dealloc__(self):
        if self.ws == NULL:
            return
        if self.code == 0:
            _free_dense(<DenseWorkspace[float]*>self.ws)
        elif self.code == 1:
            _free_dense(<DenseWorkspace[double]*>self.ws)
        elif self.code == 2:
            _free_dense(<DenseWorkspace[int32_t]*>self.ws)
        else:
            _free_dense(<DenseWorkspace[int64_t]*>self.ws)

    cdef _check(self, int64_t coord):
        if coord < 0 or coord >= self.extent:
            raise IndexError(f"coordinate {coord} out of range for a workspace of extent {self.extent}")

    def add(self, int64_t coord, value) -> None:
        self._check(coord)
        if self.code == 0:
            (<DenseWorkspace[float]*>self.ws).add(coord, <float>value)
        elif self.code == 1:
            (<DenseWorkspace[double]*>self.ws).add(coord, <double>value)
        elif self.code == 2:
            (<DenseWorkspace[int32_t]*>self.ws).add(coord, <int32_t>value)
        else:
            (<DenseWorkspace[int64_t]*>self.ws).add(coord, <int64_t>value)

    def add_many(self, coords: torch.Tensor, values: torch.Tensor) -> None:
        c = torch.as_tensor(coords).to(torch.int64).contiguous()
        v = torch.as_tensor(values).to(self.dtype).contiguous()
        if c.numel() != v.numel():
            raise ValueError(f"coords has {c.numel()} entries but values has {v.numel()}")
        if c.numel() and (int(c.min()) < 0 or int(c.max()) >= self.extent):
            raise IndexError(f"coordinates out of range for a workspace of extent {self.extent}")
        cdef int64_t n = c.numel()
        cdef int64_t* cp = <int64_t*>_ptr(c)
        cdef void* vp = _ptr(v)
        with nogil:
            if self.code == 0:
                _dense_add_many(<DenseWorkspace[float]*>self.ws, cp, <float*>vp, n)
            elif self.code == 1:
                _dense_add_many(<DenseWorkspace[double]*>self.ws, cp, <double*>vp, n)
            elif self.code == 2:
                _dense_add_many(<DenseWorkspace[int32_t]*>self.ws, cp, <int32_t*>vp, n)
            else:
                _dense_add_many(<DenseWorkspace[int64_t]*>self.ws, cp, <int64_t*>vp, n)

    def size(self) -> int:
        if self.code == 0:
            return (<DenseWorkspace[float]*>self.ws).size()
        elif self.code == 1:
            return (<DenseWorkspace[double]*>self.ws).size()
        elif self.code == 2:
            return (<DenseWorkspace[int32_t]*>self.ws).size()
        return (<DenseWorkspace[int64_t]*>self.ws).size()

    def __len__(self) -> int:
        return self.size()

    def get(self, int64_t coord):
        self._check(coord)
        if self.code == 0:
            return (<DenseWorkspace[float]*>self.ws).get(coord)
        elif self.code == 1:
            return (<DenseWorkspace[double]*>self.ws).get(coord)
        elif self.code == 2:
            return (<DenseWorkspace[int32_t]*>self.ws).get(coord)
        return (<DenseWorkspace[int64_t]*>self.ws).get(coord)

    def drain(self, crd: torch.Tensor, vals: torch.Tensor, int64_t offset=0, bint sorted=True) -> int:
        """Touched coordinates (sorted, or in first-touch order) into crd[offset:], values
        into vals[offset:]; returns the end offset and resets the workspace."""
        _check_drain_args(crd, vals, offset, self.size(), self.dtype)
        cdef bint c64 = crd.dtype == torch.int64
        cdef void* cp = _ptr(crd)
        cdef void* vp = _ptr(vals)
        if self.code == 0:
            return _dense_drain(<DenseWorkspace[float]*>self.ws, cp, c64, <float*>vp, offset, sorted)
        elif self.code == 1:
            return _dense_drain(<DenseWorkspace[double]*>self.ws, cp, c64, <double*>vp, offset, sorted)
        elif self.code == 2:
            return _dense_drain(<DenseWorkspace[int32_t]*>self.ws, cp, c64, <int32_t*>vp, offset, sorted)
        return _dense_drain(<DenseWorkspace[int64_t]*>self.ws, cp, c64, <int64_t*>vp, offset, sorted)

    def drain_arrays(self, bint sorted=True) -> Tuple[torch.Tensor, torch.Tensor]:
        n = self.size()
        crd = torch.empty(n, dtype=torch.int64)
        vals = torch.empty(n, dtype=self.dtype)
        self.drain(crd, vals, 0, sorted)
        return crd, vals

    def scatter(self, out: torch.Tensor) -> None:
        """out[c] = value for every touched c (a dense output fiber), then reset."""
        if not isinstance(out, torch.Tensor) or out.dtype != self.dtype or not out.is_contiguous() \
                or out.numel() < self.extent:
            raise ValueError(f"out must be a contiguous {self.dtype} tensor of at least {self.extent} entries")
        cdef void* op = _ptr(out)
        if self.code == 0:
            (<DenseWorkspace[float]*>self.ws).scatter(<float*>op)
        elif self.code == 1:
            (<DenseWorkspace[double]*>self.ws).scatter(<double*>op)
        elif self.code == 2:
            (<DenseWorkspace[int32_t]*>self.ws).scatter(<int32_t*>op)
        else:
            (<DenseWorkspace[int64_t]*>self.ws).scatter(<int64_t*>op)

    def reset(self) -> None:
        if self.code == 0:
            (<DenseWorkspace[float]*>self.ws).reset()
        elif self.code == 1:
            (<DenseWorkspace[double]*>self.ws).reset()
        elif self.code == 2:
            (<DenseWorkspace[int32_t]*>self.ws).reset()
        else:
            (<DenseWorkspace[int64_t]*>self.ws).reset()

    def resize(self, int64_t n) -> None:
        """A new extent; drops the contents."""
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        self.extent = n
        if self.code == 0:
            (<DenseWorkspace[float]*>self.ws).resize(n)
        elif self.code == 1:
            (<DenseWorkspace[double]*>self.ws).resize(n)
        elif self.code == 2:
            (<DenseWorkspace[int32_t]*>self.ws).resize(n)
        else:
            (<DenseWorkspace[int64_t]*>self.ws).resize(n)


cdef int64_t _dense_drain(DenseWorkspace[wv_t]* ws, void* crd, bint c64, wv_t* vals, int64_t offset,
                          bint sorted) noexcept:
    if sorted:
        return ws.drain(<int64_t*>crd, vals, offset) if c64 else ws.drain(<int32_t*>crd, vals, offset)
    return ws.drain_unsorted(<int64_t*>crd, vals, offset) if c64 \
        else ws.drain_unsorted(<int32_t*>crd, vals, offset)
