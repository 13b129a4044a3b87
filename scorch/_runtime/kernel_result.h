// What a sparse-output kernel returns: up to three 1-D arrays over memory blocks it hands
// over (pos, crd, values), or an error. The kernel fills it without the GIL and without a
// Python object, so it builds as plain C++ (tensor_compiler/cxx_module.py); result.pyx, built
// once with the package, turns it into numpy arrays or raises (result_to_python).
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

namespace scorch {

typedef void (*give_fn)(void*, size_t);

enum { RESULT_OK = 0, RESULT_OVERFLOW = 1, RESULT_RUNTIME = 2, RESULT_NOMEM = 3 };
enum { RESULT_INT = 0, RESULT_UINT = 1, RESULT_FLOAT = 2 };
enum { RESULT_MAX_ARRAYS = 3 };

struct ResultArray {
  void* data;       // the block: the array's first element
  int64_t n;        // elements
  size_t nbytes;    // the block's size, for give
  give_fn give;     // gives the block back when the array dies (a kernel module's pool_give,
                    // or result_free)
  int kind;         // RESULT_INT / RESULT_UINT / RESULT_FLOAT
  int itemsize;
};

struct KernelResult {
  int status;       // RESULT_OK, or the exception result_to_python raises with ``message``
  int narrays;
  ResultArray arrays[RESULT_MAX_ARRAYS];
  char message[256];
};

inline void result_free(void* p, size_t) { free(p); }

// ``bytes`` of uninitialized memory that result_free gives back. Blocks of 4 MiB or more ask
// for transparent huge pages, as numpy's allocator does (first-touch page faults of a big
// fresh output cost more than the kernel that fills it).
inline void* result_alloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (p != NULL && bytes >= ((size_t)4 << 20)) {
#ifdef MADV_HUGEPAGE
    uintptr_t start = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
    uintptr_t end = ((uintptr_t)p + bytes) & ~(uintptr_t)4095;
    if (end > start) madvise((void*)start, end - start, MADV_HUGEPAGE);
#endif
  }
  return p;
}

// ``n`` zeroed int64 slots (the rows' counts, then pos).
inline int64_t* result_zeros_i64(int64_t n) {
  int64_t* p = (int64_t*)result_alloc((size_t)n * sizeof(int64_t));
  if (p != NULL) memset(p, 0, (size_t)n * sizeof(int64_t));
  return p;
}

// Array ``i`` of the result: ``n`` elements at ``data`` (the block, ``nbytes`` long).
inline void result_array(KernelResult* r, int i, void* data, int64_t n, int kind, int itemsize,
                         size_t nbytes, give_fn give) {
  ResultArray* a = &r->arrays[i];
  a->data = data;
  a->n = n;
  a->nbytes = nbytes;
  a->give = give;
  a->kind = kind;
  a->itemsize = itemsize;
  if (r->narrays < i + 1) r->narrays = i + 1;
}

// Start a result (no arrays, no error).
inline void result_init(KernelResult* r) {
  r->status = RESULT_OK;
  r->narrays = 0;
  r->message[0] = 0;
}

// An error: ``fmt`` with at most one ``%lld`` (``value``). Returns ``status``.
inline int result_error(KernelResult* r, int status, const char* fmt, int64_t value) {
  r->status = status;
  snprintf(r->message, sizeof(r->message), fmt, (long long)value);
  return status;
}

// Give back every block of a result (an error after some arrays were set).
inline void result_release(KernelResult* r) {
  for (int i = 0; i < r->narrays; i++) {
    ResultArray* a = &r->arrays[i];
    if (a->data != NULL && a->give != NULL) a->give(a->data, a->nbytes);
    a->data = NULL;
  }
  r->narrays = 0;
}

// Set when an output buffer could not grow inside a kernel (AppendBuffer, workspace.h): a
// C++ exception thrown in an OpenMP region, or through the kernel's C entry, ends the
// process, so the buffer records the failure, keeps a row's room to write into, and the
// call ends with MemoryError (result_check_allocation). One flag per kernel module.
inline volatile int& allocation_failed() {
  static volatile int failed = 0;
  return failed;
}

// After kernel_result_c: a failed allocation turns the call's result into MemoryError.
inline void result_check_allocation(KernelResult* r) {
  if (!allocation_failed()) return;
  allocation_failed() = 0;
  result_release(r);
  result_error(r, RESULT_NOMEM,
               "out of memory while the kernel appended its output entries: the result does "
               "not fit in memory%.0lld", 0);
}

// Array ``i``: the first ``n`` values of ``block`` (``nbytes`` long; ``give`` takes it back).
// A block less than half used is copied out and given back (the array would hold up to
// twice its memory); else the array is the block, with no copy into fresh pages.
inline void result_hand_over(KernelResult* r, int i, void* block, size_t nbytes, int64_t n,
                             int kind, int itemsize, give_fn give) {
  const size_t used = (size_t)n * (size_t)itemsize;
  if (2 * used < nbytes) {
    void* copy = result_alloc(used);
    if (copy != NULL) {
      memcpy(copy, block, used);
      give(block, nbytes);
      result_array(r, i, copy, n, kind, itemsize, used, result_free);
      return;
    }
  }
  result_array(r, i, block, n, kind, itemsize, nbytes, give);
}

// One chunk's ``n`` entries into the output at offset ``off``: values, and coordinates as
// int64 (``wide``) or int32 at ``crd_out``.
template <typename C, typename V>
inline void result_gather(int64_t n, int64_t off, const C* crd, const V* val, void* crd_out,
                          V* val_out, int wide) {
  if (n <= 0) return;
  memcpy(val_out + off, val, (size_t)n * sizeof(V));
  if (wide) {
    int64_t* out = (int64_t*)crd_out + off;
    if (sizeof(C) == sizeof(int64_t)) memcpy(out, crd, (size_t)n * sizeof(int64_t));
    else for (int64_t e = 0; e < n; e++) out[e] = (int64_t)crd[e];
  } else {
    int32_t* out = (int32_t*)crd_out + off;
    if (sizeof(C) == sizeof(int32_t)) memcpy(out, crd, (size_t)n * sizeof(int32_t));
    else for (int64_t e = 0; e < n; e++) out[e] = (int32_t)crd[e];
  }
}

// The rows' counts ``p[1..P]`` prefix-summed into pos in one pass: as int64, or (``narrow``)
// as int32 in place, pos in the output's int32 index type without a second block (each
// int64 slot is read before the int32 writes reach it). Returns pos[P].
inline int64_t result_pos(int64_t* p, int64_t P, int narrow) {
  int64_t run = 0;
  if (narrow) {
    int32_t* q = (int32_t*)p;
    q[0] = 0;
    for (int64_t t = 0; t < P; t++) {
      run += p[t + 1];
      q[t + 1] = (int32_t)run;
    }
  } else {
    p[0] = 0;
    for (int64_t t = 0; t < P; t++) {
      run += p[t + 1];
      p[t + 1] = run;
    }
  }
  return run;
}

}  // namespace scorch
