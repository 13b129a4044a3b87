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
  int allocation_failed;   // set (by any OpenMP worker of this call) when an output buffer
                           // could not grow: see result_failure_flag. Last, so that
                           // result.pyx, built before it, reads the fields above unmoved
};

// Output blocks. Each sits kBlockHeader bytes into an allocation whose first bytes say how
// it was made (BlockHead), so that result_free and result_regrow handle any of them: blocks
// of kMapFrom bytes or more are mappings of their own (mmap), smaller ones come from malloc.
// Why not malloc for all: glibc carves blocks of up to 32 MB from its heap once a process
// has freed a mapped one, and there realloc copies (the old block and the new held at once)
// and a freed block stays in the process (a process's first A @ A^T peaked at 2.2x its
// output). A mapping grows and shrinks in place (mremap: no copy) and leaves at once.
enum { BLOCK_HEAP = 0x5c0c4eafu, BLOCK_MAPPED = 0x5c0cd1a9u };
struct BlockHead {
  uint32_t kind;    // BLOCK_HEAP / BLOCK_MAPPED
  uint32_t unused;
  size_t length;    // bytes allocated, header included (a mapping: its whole length)
};
static const size_t kBlockHeader = 64;          // keeps a mapping's block 64-byte aligned
static const size_t kMapFrom = (size_t)1 << 20;
static const size_t kHugeFrom = (size_t)4 << 20;

inline BlockHead* result_block_head(void* p) { return (BlockHead*)((char*)p - kBlockHeader); }

// The length of the mapping that holds a block of ``bytes``.
inline size_t result_map_length(size_t bytes) { return (bytes + kBlockHeader + 4095) & ~(size_t)4095; }

// Mapping ``m`` (``length`` bytes, for a block of ``bytes``) as a block: its header written,
// and from kHugeFrom on asking for transparent huge pages for the whole mapping, as numpy's
// allocator does (first-touch page faults of a big fresh output cost more than the kernel
// that fills it; advising only some of its pages would split it, and mremap refuses those).
inline void* result_mapped_block(void* m, size_t length, size_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes >= kHugeFrom) madvise(m, length, MADV_HUGEPAGE);
#endif
  BlockHead* h = (BlockHead*)m;
  h->kind = BLOCK_MAPPED;
  h->length = length;
  return (char*)m + kBlockHeader;
}

// A mapping of its own for ``bytes``, zeroed by the system.
inline void* result_map(size_t bytes) {
  const size_t length = result_map_length(bytes);
  void* m = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return m == MAP_FAILED ? NULL : result_mapped_block(m, length, bytes);
}

// ``bytes`` of uninitialized memory that result_free gives back.
inline void* result_alloc(size_t bytes) {
  if (bytes >= kMapFrom) return result_map(bytes);
  BlockHead* h = (BlockHead*)malloc(bytes + kBlockHeader);
  if (h == NULL) return NULL;
  h->kind = BLOCK_HEAP;
  h->length = bytes + kBlockHeader;
  return (char*)h + kBlockHeader;
}

// Give back a block that result_alloc, result_regrow or result_resize returned (NULL: none).
inline void result_free(void* p, size_t) {
  if (p == NULL) return;
  BlockHead* h = result_block_head(p);
  if (h->kind == BLOCK_MAPPED) munmap(h, h->length);
  else free(h);
}

// ``block`` resized to ``bytes``, its first values kept; NULL (``block`` untouched) when
// there is no memory. A mapping is remapped (no copy; shrinking gives the tail back); a heap
// block that reaches kMapFrom moves to a mapping once.
inline void* result_regrow(void* block, size_t bytes) {
  if (block == NULL) return result_alloc(bytes);
  BlockHead* h = result_block_head(block);
  if (h->kind == BLOCK_MAPPED) {
    const size_t length = result_map_length(bytes);
    if (length == h->length) return block;
    void* m = mremap(h, h->length, length, MREMAP_MAYMOVE);
    return m == MAP_FAILED ? NULL : result_mapped_block(m, length, bytes);
  }
  if (bytes >= kMapFrom) {
    void* q = result_map(bytes);
    if (q == NULL) return NULL;
    const size_t held = h->length - kBlockHeader;
    memcpy(q, block, held < bytes ? held : bytes);
    free(h);
    return q;
  }
  BlockHead* g = (BlockHead*)realloc(h, bytes + kBlockHeader);
  if (g == NULL) return NULL;
  g->length = bytes + kBlockHeader;
  return (char*)g + kBlockHeader;
}

// ``block`` resized to ``bytes`` as result_regrow does; on failure the block is given back
// and NULL returned.
inline void* result_resize(void* block, size_t bytes) {
  void* p = result_regrow(block, bytes);
  if (p == NULL) result_free(block, 0);
  return p;
}

// The whole pages inside ``[p, p + bytes)`` (part of a block whose values were copied out)
// given back to the system now, before the block is freed: a block the output is gathered
// from then shrinks as the output grows. Bytes at either end that share a page with other
// data (a neighbour's values, the block's header, the allocator's bookkeeping) are kept.
// Only ranges of kDropFrom or more: each call is a system call that makes every core running
// this process drop the pages from its TLB, cheap only beside copying a quarter megabyte.
static const size_t kDropFrom = (size_t)256 << 10;
inline void result_drop_range(void* p, size_t bytes) {
  if (bytes < kDropFrom) return;
  const uintptr_t start = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
  const uintptr_t end = ((uintptr_t)p + bytes) & ~(uintptr_t)4095;
  if (end > start) madvise((void*)start, end - start, MADV_DONTNEED);
}

// ``n`` zeroed int64 slots (the rows' counts, then pos); a mapping comes zeroed.
inline int64_t* result_zeros_i64(int64_t n) {
  const size_t bytes = (size_t)n * sizeof(int64_t);
  if (bytes >= kMapFrom) return (int64_t*)result_map(bytes);
  int64_t* p = (int64_t*)result_alloc(bytes);
  if (p != NULL) memset(p, 0, bytes);
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
  r->allocation_failed = 0;
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

// Where an output buffer of this call records that it could not grow (AppendBuffer,
// workspace.h: report_failure_to): a C++ exception thrown in an OpenMP region, or through
// the kernel's C entry, ends the process, so the buffer records the failure, keeps a row's
// room to write into, and the call ends with MemoryError (result_check_allocation). One
// flag per call, in its result: one per kernel module (a static) let a failing call in one
// Python thread make another thread's call of the same kernel raise, and the failing call
// lose its own failure (the other call's check had cleared it). Workers write it and read
// it with relaxed atomics: any value once set stays set, and nothing else is ordered by it.
inline int* result_failure_flag(KernelResult* r) { return &r->allocation_failed; }

// Whether an output buffer of this call could not grow.
inline int result_failed(KernelResult* r) {
  return __atomic_load_n(&r->allocation_failed, __ATOMIC_RELAXED);
}

// After kernel_result_c: a failed allocation turns the call's result into MemoryError.
inline void result_check_allocation(KernelResult* r) {
  if (!result_failed(r)) return;
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

// ``n`` coordinates into ``crd_out`` at offset ``off``, as int64 (``wide``) or int32.
// ``crd`` may be ``crd_out`` itself (narrowing in place: front to back, each slot is read
// before a write reaches it).
template <typename C>
inline void result_put_coords(int64_t n, int64_t off, const C* crd, void* crd_out, int wide) {
  if (n <= 0) return;
  if (wide) {
    int64_t* out = (int64_t*)crd_out + off;
    if (sizeof(C) == sizeof(int64_t)) {
      if ((const void*)out != (const void*)crd) memmove(out, crd, (size_t)n * sizeof(int64_t));
    }
    else for (int64_t e = n - 1; e >= 0; e--) out[e] = (int64_t)crd[e];   // back to front
  } else {
    int32_t* out = (int32_t*)crd_out + off;
    if (sizeof(C) == sizeof(int32_t)) {
      if ((const void*)out != (const void*)crd) memmove(out, crd, (size_t)n * sizeof(int32_t));
    }
    else for (int64_t e = 0; e < n; e++) out[e] = (int32_t)crd[e];
  }
}

// One chunk's ``n`` entries into the output at offset ``off``: values, and coordinates as
// int64 (``wide``) or int32 at ``crd_out``.
template <typename C, typename V>
inline void result_gather(int64_t n, int64_t off, const C* crd, const V* val, void* crd_out,
                          V* val_out, int wide) {
  if (n <= 0) return;
  memcpy(val_out + off, val, (size_t)n * sizeof(V));
  result_put_coords(n, off, crd, crd_out, wide);
}

// Level ``l`` of the coordinate tuples of one chunk's ``R`` level buffers joined into one
// level-major array of int64 (``wide``) or int32, built in level 0's block: ``block`` (``n``
// values of ``C``, a block from result_alloc that this takes over) is converted into ``out``
// (the array so far; level 0: the block itself), resized in place, then freed, so no copy of the
// output is held beside the buffers (a union's COO/DCSR output peaked at 3-4.5x its size
// with a concatenated copy). Returns the array (``(l + 1) * n`` coordinates, a block
// result_free takes back), or NULL once out of memory (every block freed).
template <typename C>
inline void* result_join_level(void* out, C* block, int l, int R, int64_t n, int wide) {
  const size_t isz = wide ? 8 : 4;
  if (l == 0) out = block;
  else if (out == NULL) {
    result_free(block, 0);
    return NULL;
  }
  if (l > 0 || isz > sizeof(C)) {
    out = result_resize(out, (size_t)(l + 1) * (size_t)n * isz);
    if (out == NULL) {
      if (l > 0) result_free(block, 0);
      return NULL;
    }
  }
  result_put_coords(n, (int64_t)l * n, l ? block : (C*)out, out, wide);
  if (l > 0) result_free(block, 0);
  if (R == 1) out = result_resize(out, (size_t)n * isz);   // one level: its tail back
  return out;
}

// The first level at which sorted tuple ``e`` (> 0) of a level-major array differs from
// tuple ``e - 1``, among levels ``0 .. R - 2`` (``R - 1``: only the last level differs).
template <typename I>
inline int result_first_change(const I* crd, int R, int64_t n, int64_t e) {
  int d = 0;
  while (d < R - 1 && crd[(int64_t)d * n + e] == crd[(int64_t)d * n + e - 1]) d++;
  return d;
}

// The levels of a chain of compressed levels (DCSR, CSF) from the level-major array
// ``crd`` of ``n`` sorted unique tuples of ``R`` coordinates, in one pass and in the
// index type itself (no per-entry parent array). Every level but the last keeps one entry
// per distinct prefix: a new array, ``*count`` long, holds ``m_0 .. m_{R-2}`` (those
// counts), then for each level k < R - 1 its crd (``m_k``) and the next level's pos
// (``m_k + 1``). The last level's coordinates are moved to the front of ``crd`` (the
// caller gives the rest back). NULL: out of memory.
template <typename I>
inline I* result_chain_levels(I* crd, int R, int64_t n, int64_t* count) {
  const int U = R - 1;
  int64_t m[16] = {0};
  if (U > 16) return NULL;
  for (int64_t e = 0; e < n; e++) {
    const int d = e ? result_first_change(crd, R, n, e) : 0;
    for (int k = d; k < U; k++) m[k]++;
  }
  int64_t size = U;
  for (int k = 0; k < U; k++) size += 2 * m[k] + 1;
  I* out = (I*)result_alloc((size_t)size * sizeof(I));
  if (out == NULL) return NULL;
  I* crd_k[16];
  I* pos_k[16];          // the pos of level k + 1
  int64_t next[16] = {0};
  I* at = out + U;
  for (int k = 0; k < U; k++) {
    out[k] = (I)m[k];
    crd_k[k] = at;
    pos_k[k] = at + m[k];
    at += 2 * m[k] + 1;
  }
  for (int64_t e = 0; e < n; e++) {
    const int d = e ? result_first_change(crd, R, n, e) : 0;
    for (int k = d; k < U; k++) {   // a new prefix at levels d .. U - 1, its children from here
      crd_k[k][next[k]] = crd[(int64_t)k * n + e];
      pos_k[k][next[k]] = (I)(k + 1 < U ? next[k + 1] : e);
      next[k]++;
    }
  }
  for (int k = 0; k < U; k++) pos_k[k][m[k]] = (I)(k + 1 < U ? m[k + 1] : n);
  memmove(crd, crd + (int64_t)U * n, (size_t)n * sizeof(I));
  *count = size;
  return out;
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
