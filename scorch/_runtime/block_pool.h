// The process pool of output blocks: compiled into scorch._runtime.workspace only, which
// exports it to every kernel module through the SCORCH_POOL_CAPSULE capsule (workspace.h:
// PoolApi, process_pool_api).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <vector>

#include "workspace.h"

namespace scorch {

// Memory blocks that output buffers hand back for the next kernel call. Fresh pages cost a
// page fault each on first touch (for a mid-size SpGEMM that was a quarter of its time);
// a returned block keeps its pages, so steady-state calls touch no new memory. Blocks are
// powers of two bytes, kept in one list per size (oldest first), at most ``limit()`` bytes
// in all: a block given back past the limit evicts the oldest kept ones (a training loop's
// kernels keep reusing theirs, blocks of one-off calls age out). Blocks past kMaxPooledBlock
// are given back at once (a big output's pages fault in cheaply: result_alloc maps them on huge pages).
// ONE pool serves the whole process (process_pool_api): Python loads each kernel module
// RTLD_LOCAL, so a pool compiled into the kernels would be one per module (per-module pools
// kept 0.3-0.9 GB once 14 distinct kernels had run). Each kept block remembers the module
// that gave it back (``owner``) for take_own_largest.
class BlockPool {
 public:
  static constexpr size_t kPoolBytes = size_t(128) << 20;   // default limit (SCORCH_POOL_MB)
  static constexpr size_t kMaxPooledBlock = size_t(32) << 20;

  BlockPool() {
    const char* mb = std::getenv("SCORCH_POOL_MB");
    char* end = nullptr;
    const unsigned long long v = mb ? std::strtoull(mb, &end, 10) : 0;
    if (mb && end != mb && *end == 0) limit_ = static_cast<size_t>(v) << 20;
  }

  // A block of at least ``need`` bytes (its size, a power of two, to ``*got``), or nullptr
  // when malloc fails.
  void* take(size_t need, size_t* got) {
    const int cls = size_class(need);
    *got = size_t(1) << cls;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::deque<Kept>& list = free_[cls];
      if (!list.empty()) {
        void* p = list.back().p;
        list.pop_back();
        held_ -= *got;
        return p;
      }
    }
    return result_alloc(*got);   // a mapping of its own from 1 MB (huge pages from 4 MB)
  }
  // The largest kept block of at least ``need`` bytes that ``owner`` gave back, or nullptr.
  void* take_own_largest(size_t need, size_t* got, const void* owner) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int cls = 63; cls >= 0 && (size_t(1) << cls) >= need; --cls) {
      std::deque<Kept>& list = free_[cls];
      for (auto it = list.end(); it != list.begin();) {
        if ((--it)->owner != owner) continue;
        void* p = it->p;
        list.erase(it);
        *got = size_t(1) << cls;
        held_ -= *got;
        return p;
      }
    }
    return nullptr;
  }
  // Give back a block that take() returned (``size`` as it reported).
  void give(void* p, size_t size, const void* owner) {
    if (p == nullptr) return;
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // (a size take() did not report, not a power of two, would be taken back as more)
      if (size <= kMaxPooledBlock && size <= limit_ && (size & (size - 1)) == 0) {
        evict(limit_ - size, &evicted);
        free_[size_class(size)].push_back(Kept{p, ++seq_, owner});
        held_ += size;
        p = nullptr;
      }
    }
    free_blocks(evicted);
    result_free(p, size);
  }
  size_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }
  size_t limit() {
    std::lock_guard<std::mutex> lock(mutex_);
    return limit_;
  }
  // A new limit (0: keep nothing); the kept blocks past it go back to malloc.
  void set_limit(size_t bytes) {
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = bytes;
      evict(bytes, &evicted);
    }
    free_blocks(evicted);
  }
  // Every kept block back to malloc (blocks that live arrays hold come back later).
  void release() {
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      evict(0, &evicted);
    }
    free_blocks(evicted);
  }

 private:
  struct Kept {
    void* p;
    uint64_t seq;        // order of giving back: the oldest is evicted first
    const void* owner;
  };
  std::mutex mutex_;
  std::deque<Kept> free_[64];
  size_t held_ = 0;
  size_t limit_ = kPoolBytes;
  uint64_t seq_ = 0;

  static int size_class(size_t bytes) { return pool_size_class(bytes); }
  // (outside the lock: a mapping's munmap is a system call)
  static void free_blocks(const std::vector<void*>& blocks) {
    for (void* q : blocks) result_free(q, 0);
  }
  // The oldest kept blocks to ``out`` until at most ``keep`` bytes are kept (mutex held).
  void evict(size_t keep, std::vector<void*>* out) {
    while (held_ > keep) {
      int oldest = -1;
      for (int cls = 0; cls < 64; ++cls) {
        if (!free_[cls].empty() && (oldest < 0 || free_[cls].front().seq < free_[oldest].front().seq))
          oldest = cls;
      }
      out->push_back(free_[oldest].front().p);
      free_[oldest].pop_front();
      held_ -= size_t(1) << oldest;
    }
  }
};

// The process pool (scorch._runtime.workspace's). Never destroyed: an array may give its
// block back from a thread still running at exit.
inline BlockPool& process_pool() {
  static BlockPool* pool = new BlockPool();
  return *pool;
}
inline void* process_pool_take(size_t need, size_t* got) { return process_pool().take(need, got); }
inline void* process_pool_take_own_largest(size_t need, size_t* got, const void* owner) {
  return process_pool().take_own_largest(need, got, owner);
}
inline void process_pool_give(void* p, size_t size, const void* owner) { process_pool().give(p, size, owner); }
inline PoolApi* process_pool_exports() {
  static PoolApi api = {process_pool_take, process_pool_take_own_largest, process_pool_give};
  return &api;
}

}  // namespace scorch
