// Sparse workspaces for generated kernels: one instance per OpenMP thread, no locking.
//
// A workspace collects the scattered contributions to one output fiber (e.g. one row of
// A @ B) and then drains them, in coordinate order, into the crd/values arrays of a sparse
// output level. Both kinds are plain C++ objects with inline members so that Cython kernels
// can use them inside `nogil` prange loops (see workspace.pxd for the exact usage).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

namespace scorch {

template <typename V>
inline void ws_accumulate(V& acc, V v) { acc += v; }
template <>
inline void ws_accumulate<bool>(bool& acc, bool v) { acc = acc || v; }

// Ordered accumulation in a std::map: O(log k) per add, no memory proportional to the
// fiber's extent, so it suits huge or unknown extents and few entries per fiber.
template <typename V>
class SparseWorkspace {
 public:
  std::map<int64_t, V> entries;

  inline void add(int64_t coord, V value) {
    auto it = entries.lower_bound(coord);
    if (it != entries.end() && it->first == coord) {
      ws_accumulate(it->second, value);
    } else {
      entries.emplace_hint(it, coord, value);
    }
  }
  inline int64_t size() const { return static_cast<int64_t>(entries.size()); }
  inline bool empty() const { return entries.empty(); }
  inline bool contains(int64_t coord) const { return entries.find(coord) != entries.end(); }
  inline V get(int64_t coord) const {
    auto it = entries.find(coord);
    return it == entries.end() ? V(0) : it->second;
  }

  // Sorted coordinates to crd[offset:], values to vals[offset:]; returns the end offset
  // (offset + size()) and leaves the workspace empty for the next fiber.
  template <typename I>
  inline int64_t drain(I* crd, V* vals, int64_t offset) {
    for (const auto& kv : entries) {
      crd[offset] = static_cast<I>(kv.first);
      vals[offset] = kv.second;
      ++offset;
    }
    entries.clear();
    return offset;
  }
  // Only the coordinates (a symbolic phase that sizes the output); also clears.
  template <typename I>
  inline int64_t drain_coords(I* crd, int64_t offset) {
    for (const auto& kv : entries) crd[offset++] = static_cast<I>(kv.first);
    entries.clear();
    return offset;
  }
  inline void clear() { entries.clear(); }
};

// A dense array of the fiber's extent plus a marker per coordinate and the list of touched
// coordinates: O(1) per add, and clearing costs only what was touched, so one allocation
// serves every fiber a thread processes.
template <typename V>
class DenseWorkspace {
 public:
  std::vector<V> values;
  std::vector<uint8_t> marked;
  std::vector<int64_t> touched;

  DenseWorkspace() {}
  explicit DenseWorkspace(int64_t n) : values(n), marked(n, 0) {}

  inline void resize(int64_t n) {
    values.assign(n, V(0));
    marked.assign(n, 0);
    touched.clear();
  }
  inline int64_t extent() const { return static_cast<int64_t>(values.size()); }
  inline int64_t size() const { return static_cast<int64_t>(touched.size()); }
  inline bool empty() const { return touched.empty(); }
  inline bool contains(int64_t coord) const { return marked[coord] != 0; }
  inline V get(int64_t coord) const { return marked[coord] ? values[coord] : V(0); }

  inline void add(int64_t coord, V value) {
    if (marked[coord]) {
      ws_accumulate(values[coord], value);
    } else {
      marked[coord] = 1;
      values[coord] = value;
      touched.push_back(coord);
    }
  }

  // Sorted drain. A dense fiber (many touched coordinates) is cheaper to read back by
  // scanning the markers in order than by sorting the touched list.
  template <typename I>
  inline int64_t drain(I* crd, V* vals, int64_t offset) {
    const int64_t k = size(), n = extent();
    if (k * 16 >= n) {
      // branch-free scan (the markers' pattern is random: a branch per marker mispredicts
      // about half the time): every position is written at the output cursor, which only
      // advances past marked ones; it stops at the last marked coordinate, so the cursor
      // never passes offset + k
      const int64_t end = offset + k;
      for (int64_t c = 0; offset < end; ++c) {
        const int64_t m = marked[c];
        crd[offset] = static_cast<I>(c);
        vals[offset] = values[c];
        marked[c] = 0;
        offset += m;
      }
      touched.clear();
      return offset;
    }
    std::sort(touched.begin(), touched.end());
    return drain_unsorted(crd, vals, offset);
  }
  // Insertion order (for outputs whose level does not need sorted coordinates).
  template <typename I>
  inline int64_t drain_unsorted(I* crd, V* vals, int64_t offset) {
    for (int64_t c : touched) {
      crd[offset] = static_cast<I>(c);
      vals[offset] = values[c];
      marked[c] = 0;
      ++offset;
    }
    touched.clear();
    return offset;
  }
  // Write the touched values into a dense output fiber (out[c] = value) and reset.
  inline void scatter(V* out) {
    for (int64_t c : touched) {
      out[c] = values[c];
      marked[c] = 0;
    }
    touched.clear();
  }
  // Forget the touched entries without reading them.
  inline void reset() {
    for (int64_t c : touched) marked[c] = 0;
    touched.clear();
  }
};

}  // namespace scorch
