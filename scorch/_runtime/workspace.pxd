"""Sparse workspaces that generated kernels cimport (C++ templates from workspace.h).

``SparseWorkspace[V]`` (appended pairs, sorted and combined when read) and ``DenseWorkspace[V]`` (dense array + marks +
touched list) for V in float, double, int32_t, int64_t. Each is a plain C++ object with
inline nogil members and no locking: create ONE PER THREAD inside a ``parallel()`` block.
The kernel must be compiled as C++ (``# distutils: language = c++`` as its first line).
``drain`` writes the sorted coordinates to ``crd[offset:]`` and the values to
``vals[offset:]`` (crd may be int32_t* or int64_t*), returns the end offset, and leaves the
workspace empty for the next fiber::

    # distutils: language = c++
    from libc.stdint cimport int32_t, int64_t
    from cython.parallel cimport parallel, prange
    from scorch._runtime.workspace cimport SparseWorkspace, DenseWorkspace

    cdef DenseWorkspace[double]* ws      # or SparseWorkspace[double]* (no extent needed)
    cdef int64_t i, p, end
    with nogil, parallel(num_threads=T):
        ws = new DenseWorkspace[double](ncols)    # per thread: assigned inside parallel()
        for i in prange(nrows, schedule='dynamic'):
            for p in range(A_pos[i], A_pos[i + 1]):
                ws.add(A_crd[p], A_vals[p] * alpha)
            end = ws.drain(&C_crd[0], &C_vals[0], C_pos[i])   # sorted; ws is empty again
        del ws

``AppendBuffer[T]`` is a growable array whose ``grow(k)`` adds k uninitialized slots (a
workspace drains into them): kernels collect each chunk's output entries in one;
``release`` hands its block to an output array, which gives it back with ``pool_give``;
``give_back`` returns it to the pool at once (its values copied out).

``size()`` gives the number of distinct coordinates (for a counting pass that sizes the
output before a fill pass); ``drain_unsorted`` (dense only) skips the sort; ``scatter(out)``
(dense only) writes the values into a dense fiber; ``reset()``/``clear()`` drop the contents.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t
from libcpp cimport bool as cbool


cdef extern from "workspace.h" namespace "scorch" nogil:
    cdef cppclass SparseWorkspace[V]:
        SparseWorkspace()
        void add(int64_t coord, V value)
        int64_t size()
        cbool empty()
        cbool contains(int64_t coord)
        V get(int64_t coord)
        int64_t drain(int32_t* crd, V* vals, int64_t offset)
        int64_t drain(int64_t* crd, V* vals, int64_t offset)
        int64_t drain_coords(int32_t* crd, int64_t offset)
        int64_t drain_coords(int64_t* crd, int64_t offset)
        void clear()

    cdef cppclass DenseWorkspace[V]:
        DenseWorkspace()
        DenseWorkspace(int64_t n)
        void resize(int64_t n)
        int64_t extent()
        int64_t size()
        cbool empty()
        cbool contains(int64_t coord)
        V get(int64_t coord)
        void add(int64_t coord, V value)
        int64_t drain(int32_t* crd, V* vals, int64_t offset)
        int64_t drain(int64_t* crd, V* vals, int64_t offset)
        int64_t drain_unsorted(int32_t* crd, V* vals, int64_t offset)
        int64_t drain_unsorted(int64_t* crd, V* vals, int64_t offset)
        void scatter(V* out)
        void reset()

    void dense_ws_drain[K, I, V](K* touched, int64_t k, int64_t lo, int64_t hi, V* values,
                                 uint8_t* mark, I* crd, V* vals, K* tmp)
    void dense_ws_drain_list[I, V](int32_t* touched, int64_t k, V* values, uint8_t* mark, I* crd,
                                   V* vals, int32_t* tmp)
    void dense_ws_drain_unsorted[K, I, V](K* touched, int64_t k, V* values, uint8_t* mark, I* crd,
                                          V* vals)
    int64_t dense_ws_drain_scan[I, V](V* values, uint8_t* mark, int64_t lo, int64_t end, I* crd,
                                      V* vals)

    cdef cppclass DenseScratch[V]:
        V* values
        uint8_t* mark
        int32_t* touched
        int32_t* sort_tmp
        int64_t capacity

    DenseScratch[V]* dense_scratch[V](int64_t extent)

    cdef cppclass AppendBuffer[T]:
        AppendBuffer()
        void push_back(T v)
        T* grow(int64_t k)
        T* data()
        int64_t size()
        void trim(int64_t k)
        T* release(size_t* nbytes)
        void give_back()
        void report_failure_to(int* flag)
        bint call_failed()

    # the buffers of a call's chunks (workspace.h: ChunkBuffers)
    cdef cppclass ChunkBuffers[B]:
        void allocate(int64_t n) except +
        B& operator[](int64_t i)

    void pool_give(void* p, size_t nbytes)

