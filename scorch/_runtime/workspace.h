// Sparse workspaces for generated kernels: one instance per OpenMP thread, no locking.
//
// A workspace collects the scattered contributions to one output fiber (e.g. one row of
// A @ B) and then drains them, in coordinate order, into the crd/values arrays of a sparse
// output level. Both kinds are plain C++ objects with inline members so that Cython kernels
// can use them inside `nogil` prange loops (see workspace.pxd for the exact usage).
#pragma once

#include <Python.h>   // the process pool is fetched through a capsule (process_pool_api)

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <new>
#include <cstdint>


#include "kernel_result.h"
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace scorch {

template <typename V>
inline void ws_accumulate(V& acc, V v) { acc += v; }
template <>
inline void ws_accumulate<bool>(bool& acc, bool v) { acc = acc || v; }

// LSD radix sort of items[0:k] by key(item), a value in [0, span], 8 bits a pass over the
// bits span needs; stable. ``tmp`` holds k items. (A touched list of a few hundred
// spread-out coordinates: std::sort's compares mispredict about half the time, these passes
// do not branch on the keys; the sparse workspace's pending pairs: no std::stable_sort
// instantiated in every kernel.)
template <typename T, typename Key>
inline void radix_sort_by(T* items, int64_t k, uint64_t span, Key key, T* tmp) {
  T* src = items;
  T* dst = tmp;
  for (int shift = 0; shift < 64 && (span >> shift) != 0; shift += 8) {
    int64_t count[257] = {0};
    for (int64_t i = 0; i < k; ++i) ++count[(key(src[i]) >> shift & 255) + 1];
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (int64_t i = 0; i < k; ++i) dst[count[key(src[i]) >> shift & 255]++] = src[i];
    T* t = src;
    src = dst;
    dst = t;
  }
  if (src != items) std::copy(src, src + k, items);
}

// Accumulation for huge or unknown extents: each add is appended as a (coordinate, value)
// pair, and the pairs are sorted (stably, so equal coordinates sum in the order they came)
// and combined when the fiber is read, or when the pending pairs reach twice the combined
// ones (so memory stays within about twice the fiber's distinct entries). O(log k) per add
// amortized like the std::map it replaced, but sequential: the map's node allocation and
// pointer chasing made a 200k-entry sum into a 10M-wide sparse vector 210 ms (now ~15).
// The sort is a radix sort and the merge a loop into a second buffer, not std::stable_sort
// and std::inplace_merge: those two instantiated ~13 KB of code in every kernel with such
// a workspace (+0.3 s of g++ each) for what is a cold path. The second buffer is kept for
// the next combine: at the peak the two hold about four times the fiber's distinct entries
// (stable_sort's temporary buffer made it about three).
template <typename V>
class SparseWorkspace {
 public:
  using Entry = std::pair<int64_t, V>;
  std::vector<Entry> entries;   // [0, combined): sorted, distinct; the rest: pending adds
  std::vector<Entry> scratch;   // combine's second buffer (kept: no allocation per fiber)
  int64_t combined = 0;
  int64_t limit = 1024;

  inline void add(int64_t coord, V value) {
    entries.emplace_back(coord, value);
    if (static_cast<int64_t>(entries.size()) >= limit) {
      combine();
      limit = std::max<int64_t>(1024, 2 * static_cast<int64_t>(entries.size()));
    }
  }
  // Sort the pending adds, merge them into the combined head and sum equal coordinates.
  __attribute__((noinline)) void combine() {
    const int64_t n = static_cast<int64_t>(entries.size());
    if (combined == n) return;
    if (scratch.size() < static_cast<size_t>(n)) scratch.resize(static_cast<size_t>(n));
    Entry* pending = entries.data() + combined;
    sort_pending(pending, n - combined, scratch.data());
    // merge head and pending into scratch, summing equal coordinates (the head's first:
    // its adds came earlier)
    const Entry* a = entries.data();
    const Entry* a_end = pending;
    const Entry* b = pending;
    const Entry* b_end = entries.data() + n;
    Entry* out = scratch.data();
    int64_t k = -1;
    while (a != a_end || b != b_end) {
      const Entry& e = (b == b_end || (a != a_end && a->first <= b->first)) ? *a++ : *b++;
      if (k >= 0 && out[k].first == e.first) {
        ws_accumulate(out[k].second, e.second);
      } else {
        out[++k] = e;
      }
    }
    entries.swap(scratch);
    entries.resize(static_cast<size_t>(k + 1));
    combined = k + 1;
  }
  inline int64_t size() { combine(); return static_cast<int64_t>(entries.size()); }
  inline bool empty() const { return entries.empty(); }
  inline bool contains(int64_t coord) {
    combine();
    auto it = std::lower_bound(entries.begin(), entries.end(), coord,
                               [](const Entry& a, int64_t c) { return a.first < c; });
    return it != entries.end() && it->first == coord;
  }
  inline V get(int64_t coord) {
    combine();
    auto it = std::lower_bound(entries.begin(), entries.end(), coord,
                               [](const Entry& a, int64_t c) { return a.first < c; });
    return it != entries.end() && it->first == coord ? it->second : V(0);
  }

  // Sorted coordinates to crd[offset:], values to vals[offset:]; returns the end offset
  // (offset + size()) and leaves the workspace empty for the next fiber.
  template <typename I>
  inline int64_t drain(I* crd, V* vals, int64_t offset) {
    combine();
    for (const auto& kv : entries) {
      crd[offset] = static_cast<I>(kv.first);
      vals[offset] = kv.second;
      ++offset;
    }
    clear();
    return offset;
  }
  // Only the coordinates (a symbolic phase that sizes the output); also clears.
  template <typename I>
  inline int64_t drain_coords(I* crd, int64_t offset) {
    combine();
    for (const auto& kv : entries) crd[offset++] = static_cast<I>(kv.first);
    clear();
    return offset;
  }
  inline void clear() { entries.clear(); combined = 0; limit = 1024; }

 private:
  // Stable sort of p[0:n] by coordinate: insertion sort for a few, else radix_sort_by over
  // the coordinates' range (tmp holds n entries).
  static void sort_pending(Entry* p, int64_t n, Entry* tmp) {
    if (n <= 32) {
      for (int64_t i = 1; i < n; ++i) {
        Entry e = p[i];
        int64_t j = i;
        for (; j > 0 && p[j - 1].first > e.first; --j) p[j] = p[j - 1];
        p[j] = e;
      }
      return;
    }
    int64_t lo = p[0].first, hi = p[0].first;
    for (int64_t i = 1; i < n; ++i) {
      lo = p[i].first < lo ? p[i].first : lo;
      hi = p[i].first > hi ? p[i].first : hi;
    }
    const uint64_t base = static_cast<uint64_t>(lo);
    radix_sort_by(p, n, static_cast<uint64_t>(hi) - base,
                  [base](const Entry& e) { return static_cast<uint64_t>(e.first) - base; }, tmp);
  }
};

// The dense workspace: a values array over the fiber's extent (zero outside the fiber), a
// byte per coordinate (1: in the fiber), the list of touched coordinates and their range
// [lo, hi]. An add is ``values[c] += v`` plus a mark: no branch, and no chain through memory
// from one add to the next (a bitmap word shared by neighbouring coordinates made every add
// wait for the previous one's store). The sorted read-out walks the marks of [lo, hi] eight
// at a time, extracting set bytes (count-trailing-zeros), in O(span/8 + k), far cheaper than
// sorting the touched list unless the fiber is very spread out (then the list is sorted).
// Reading out resets the values and marks it read, so everything is zero between fibers and
// a kernel's per-thread arrays need no clearing. Generated kernels keep these arrays in
// their own locals (registers), with the add as inline code; DenseWorkspace wraps the same
// arrays for other callers. ``mark`` needs 8 bytes of padding past the extent.
// Sort k keys in [lo, hi] (radix_sort_by); ``tmp`` holds k keys.
template <typename K>
inline void radix_sort_range(K* keys, int64_t k, int64_t lo, int64_t hi, K* tmp) {
  radix_sort_by(keys, k, static_cast<uint64_t>(hi - lo),
                [lo](K c) { return static_cast<uint64_t>(static_cast<int64_t>(c) - lo); }, tmp);
}

// Fibers up to this many entries are drained by rank sort (see dense_ws_drain).
constexpr int64_t kRankSortMax = 128;
constexpr int kRankBlock = 16;

// The rank of each of touched[ib : ib + n] (n <= kRankBlock, distinct keys) among
// touched[0 : k]: the count of smaller keys, in a branch-free loop the compiler vectorizes.
template <typename K>
inline void rank_block(const K* touched, int64_t k, int64_t ib, int64_t n, int32_t* rank) {
  K key[kRankBlock];
  int32_t r[kRankBlock];
  for (int t = 0; t < kRankBlock; ++t) {
    key[t] = t < n ? touched[ib + t] : K(0);
    r[t] = 0;
  }
  for (int64_t j = 0; j < k; ++j) {
    const K x = touched[j];
    for (int t = 0; t < kRankBlock; ++t) r[t] += x < key[t];
  }
  for (int t = 0; t < kRankBlock; ++t) rank[t] = r[t];
}

#if defined(__AVX512F__)
// The same with the 16 keys in one 512-bit register, one broadcast compare and masked add
// per other key, two independent sums (the compiler vectorizes the generic loop over j
// instead, and pays a horizontal sum per key: about twice slower).
template <>
inline void rank_block<int32_t>(const int32_t* touched, int64_t k, int64_t ib, int64_t n,
                                int32_t* rank) {
  const __m512i key = _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << n) - 1), touched + ib);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i r0 = _mm512_setzero_si512();
  __m512i r1 = _mm512_setzero_si512();
  int64_t j = 0;
  for (; j + 1 < k; j += 2) {
    r0 = _mm512_mask_add_epi32(r0, _mm512_cmpgt_epi32_mask(key, _mm512_set1_epi32(touched[j])), r0, one);
    r1 = _mm512_mask_add_epi32(r1, _mm512_cmpgt_epi32_mask(key, _mm512_set1_epi32(touched[j + 1])), r1, one);
  }
  if (j < k) r0 = _mm512_mask_add_epi32(r0, _mm512_cmpgt_epi32_mask(key, _mm512_set1_epi32(touched[j])), r0, one);
  _mm512_storeu_si512(rank, _mm512_add_epi32(r0, r1));
}
#endif

// The fiber's coordinates keys[0:k] in the order given, with their values, into crd/vals;
// the values and marks read are cleared for the next fiber.
template <typename K, typename I, typename V>
inline void drain_in_order(const K* keys, int64_t k, V* values, uint8_t* mark, I* crd, V* vals) {
  for (int64_t i = 0; i < k; ++i) {
    const int64_t c = keys[i];
    crd[i] = static_cast<I>(c);
    vals[i] = values[c];
    values[c] = V(0);
    mark[c] = 0;
  }
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// AVX2 (without AVX-512, whose rank sort above stays): short fibers' touched coordinates
// sorted by a bitonic network in ymm registers, eight int32 keys each, padded with INT32_MAX
// (no key is that large: extents stay below 2^31 here). On Zen 3 the rank sort's 16 keys
// take two ymm registers and a horizontal step per key, and the marks scan branches on
// every 8-mark word: 4elt A @ A^T drains (18 entries a row) cost 1.5x what this does.
// Sixteen registers (65-128 keys) spill a few, and still beat the rank sort's k^2 / 8
// steps: uniform 2^16 A @ A^T (~110 spread entries a row) 1.10x in a C prototype.
constexpr int64_t kNetSortMax = 128;

// One compare-exchange step inside a register: lanes against the lanes ``P`` puts there;
// the lanes in ``M`` keep the larger key.
template <int P, int M>
inline __m256i net_step_lane(__m256i v) {
  const __m256i p = _mm256_shuffle_epi32(v, P);
  return _mm256_blend_epi32(_mm256_min_epi32(v, p), _mm256_max_epi32(v, p), M);
}
inline __m256i net_reverse(__m256i v) {
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0));
}
// A bitonic register sorted ascending: lane strides 4, 2, 1.
inline __m256i net_clean8(__m256i v) {
  const __m256i p = _mm256_permute2x128_si256(v, v, 1);
  v = _mm256_blend_epi32(_mm256_min_epi32(v, p), _mm256_max_epi32(v, p), 0xF0);
  v = net_step_lane<_MM_SHUFFLE(1, 0, 3, 2), 0xCC>(v);
  return net_step_lane<_MM_SHUFFLE(2, 3, 0, 1), 0xAA>(v);
}
// Eight keys in a register sorted ascending (bitonic sort: partners i^1; i^3, i^1; i^7, i^2, i^1).
inline __m256i net_sort8(__m256i v) {
  v = net_step_lane<_MM_SHUFFLE(2, 3, 0, 1), 0xAA>(v);
  v = net_step_lane<_MM_SHUFFLE(0, 1, 2, 3), 0xCC>(v);
  v = net_step_lane<_MM_SHUFFLE(2, 3, 0, 1), 0xAA>(v);
  const __m256i p = net_reverse(v);
  v = _mm256_blend_epi32(_mm256_min_epi32(v, p), _mm256_max_epi32(v, p), 0xF0);
  v = net_step_lane<_MM_SHUFFLE(1, 0, 3, 2), 0xCC>(v);
  return net_step_lane<_MM_SHUFFLE(2, 3, 0, 1), 0xAA>(v);
}
// R registers (1, 2, 4, 8 or 16) sorted ascending across r[0..R): each sorted, then merged in
// pairs, fours, eights (the mirrored compare first, so every merge sorts ascending).
template <int R>
inline void net_sort_regs(__m256i* r) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) r[i] = net_sort8(r[i]);
#pragma GCC unroll 4
  for (int S = 2; S <= R; S *= 2) {
#pragma GCC unroll 8
    for (int b = 0; b < R; b += S) {
#pragma GCC unroll 4
      for (int i = 0; i < S / 2; ++i) {
        const __m256i y = net_reverse(r[b + S - 1 - i]);
        const __m256i lo = _mm256_min_epi32(r[b + i], y);
        r[b + S - 1 - i] = net_reverse(_mm256_max_epi32(r[b + i], y));
        r[b + i] = lo;
      }
    }
#pragma GCC unroll 4
    for (int st = S / 4; st >= 1; st /= 2) {
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        if (i & st) continue;
        const __m256i lo = _mm256_min_epi32(r[i], r[i + st]);
        r[i + st] = _mm256_max_epi32(r[i], r[i + st]);
        r[i] = lo;
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) r[i] = net_clean8(r[i]);
  }
}
// keys[0:k] (k <= 8 R) sorted into out[0 : 8 R] (the padding last).
template <int R>
inline void net_sort(const int32_t* keys, int64_t k, int32_t* out) {
  __m256i r[R];
  const __m256i pad = _mm256_set1_epi32(INT32_MAX);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const int64_t left = k - 8 * i;
    if (left >= 8) {
      r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + 8 * i));
    } else if (left <= 0) {
      r[i] = pad;
    } else {
      const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lane);
      r[i] = _mm256_blendv_epi8(pad, _mm256_maskload_epi32(keys + 8 * i, m), m);
    }
  }
  net_sort_regs<R>(r);
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * i), r[i]);
}
// Sorted read-out of a fiber of k <= kNetSortMax entries (see dense_ws_drain).
template <typename I, typename V>
inline void net_drain(const int32_t* touched, int64_t k, V* values, uint8_t* mark, I* crd,
                      V* vals) {
  alignas(32) int32_t s[kNetSortMax];
  if (k <= 8) net_sort<1>(touched, k, s);
  else if (k <= 16) net_sort<2>(touched, k, s);
  else if (k <= 32) net_sort<4>(touched, k, s);
  else if (k <= 64) net_sort<8>(touched, k, s);
  else net_sort<16>(touched, k, s);
  drain_in_order(s, k, values, mark, crd, vals);
}
#define SCORCH_NET_SORT 1
#endif

// The marks of coordinates [lo, end) scanned eight at a time (lo a multiple of 8; marks
// padded by 8 bytes past the extent), each marked coordinate and its value to crd/vals in
// order, values and marks cleared; returns the number of entries. The sorted read-out of
// a fiber dense in its range (dense_ws_drain), and of one kept without a touched list (its
// adds only mark: kernels' run_chunk_scan, over the whole extent, for fibers that mark at
// least one coordinate in eight on average, where the list's bookkeeping costs more).
template <typename I, typename V>
inline int64_t dense_ws_drain_scan(V* values, uint8_t* mark, int64_t lo, int64_t end, I* crd, V* vals) {
  int64_t out = 0;
  for (int64_t base = lo; base < end; base += 8) {
    uint64_t word;
    std::memcpy(&word, mark + base, 8);
    if (!word) continue;
    std::memset(mark + base, 0, 8);
    while (word) {
      const int64_t c = base + (__builtin_ctzll(word) >> 3);
      crd[out] = static_cast<I>(c);
      vals[out] = values[c];
      values[c] = V(0);
      ++out;
      word &= word - 1;
    }
  }
  return out;
}

// The sorted read-out through a bitmap of the fiber's range, where that range spans no more
// 64-bit words than the fiber has entries (and at most kBitmapWords): one bit set an entry,
// then the words read back in order. A mesh's or a banded matrix's rows touch a narrow
// range (4elt A @ A^T: 18 entries a row within ~5 words), where this costs a few steps an
// entry, below any comparison sort of the k keys and below a scan of the byte marks.
// Returns false (nothing done) where the range is wider.
constexpr int64_t kBitmapWords = 64;   // ranges up to 4096 coordinates
template <typename K, typename I, typename V>
inline bool bitmap_drain(const K* touched, int64_t k, int64_t lo, int64_t hi, V* values,
                         uint8_t* mark, I* crd, V* vals) {
  const int64_t base = lo & ~int64_t(63);
  const int64_t words = ((hi - base) >> 6) + 1;
  if (words > kBitmapWords || words > k) return false;
  uint64_t bits[kBitmapWords];
  for (int64_t w = 0; w < words; ++w) bits[w] = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t c = static_cast<int64_t>(touched[i]) - base;
    bits[c >> 6] |= uint64_t(1) << (c & 63);
  }
  int64_t out = 0;
  for (int64_t w = 0; w < words; ++w) {
    uint64_t word = bits[w];
    while (word) {
      const int64_t c = base + (w << 6) + __builtin_ctzll(word);
      crd[out] = static_cast<I>(c);
      vals[out] = values[c];
      values[c] = V(0);
      mark[c] = 0;
      ++out;
      word &= word - 1;
    }
  }
  return true;
}

template <typename K, typename I, typename V>
inline void dense_ws_drain(K* touched, int64_t k, int64_t lo, int64_t hi, V* values,
                           uint8_t* mark, I* crd, V* vals, K* tmp) {
  if (k == 0) return;
  if (bitmap_drain(touched, k, lo, hi, values, mark, crd, vals)) return;
  const int64_t c0 = lo & ~int64_t(7);
  bool scan;
#if defined(SCORCH_NET_SORT)
  if (std::is_same<K, int32_t>::value && k <= kNetSortMax) {
    // the network costs about what two marks words do per entry (a banded row, nine
    // entries in two words: the scan is 1.2x faster; 4elt's 18 in ~33 words: the network)
    if (2 * ((hi - c0) / 8 + 1) > k) {
      net_drain(reinterpret_cast<const int32_t*>(touched), k, values, mark, crd, vals);
      return;
    }
    scan = true;
  } else
#endif
  {
    // eight marks cost about what one sorted element does; sorting k costs ~k log2 k
    int64_t log2k = 1;
    while ((int64_t(1) << log2k) < k) ++log2k;
    scan = (hi - c0) / 8 + 1 <= 2 * k * log2k;
  }
  if (scan) {
    dense_ws_drain_scan(values, mark, c0, hi + 1, crd, vals);
    return;
  }
  if (k <= kRankSortMax) {
    // rank sort: the touched coordinates are distinct, so an entry's place is the count of
    // smaller ones, about k^2 / lanes vector steps: for short fibers far cheaper than
    // insertion sort (a mispredicted branch per move) or radix passes (256 buckets each),
    // and it writes the output in place, with no pass over a sorted list.
    int32_t rank[kRankBlock];
    for (int64_t ib = 0; ib < k; ib += kRankBlock) {
      const int64_t n = std::min<int64_t>(kRankBlock, k - ib);
      rank_block(touched, k, ib, n, rank);
      for (int64_t t = 0; t < n; ++t) {
        const K c = touched[ib + t];
        crd[rank[t]] = static_cast<I>(c);
        vals[rank[t]] = values[c];
      }
    }
    for (int64_t i = 0; i < k; ++i) {
      values[touched[i]] = V(0);
      mark[touched[i]] = 0;
    }
    return;
  }
  if (tmp != nullptr) {
    radix_sort_range(touched, k, lo, hi, tmp);
  } else {
    std::sort(touched, touched + k);
  }
  drain_in_order(touched, k, values, mark, crd, vals);
}

// The range [lo, hi] of a touched list: the sorted read-out's choice of path needs it.
// Generated kernels find it here, once a fiber (k / 8 vector steps), not with a compare
// and two conditional moves in every add (Groebner A @ A^T: the adds ran ~1.2x faster).
inline void touched_range(const int32_t* touched, int64_t k, int64_t* lo, int64_t* hi) {
  int32_t mn = INT32_MAX, mx = INT32_MIN;
  for (int64_t i = 0; i < k; ++i) {
    mn = touched[i] < mn ? touched[i] : mn;
    mx = touched[i] > mx ? touched[i] : mx;
  }
  *lo = mn;
  *hi = mx;
}

// dense_ws_drain of a touched list whose range is not known yet (see touched_range).
template <typename I, typename V>
inline void dense_ws_drain_list(int32_t* touched, int64_t k, V* values, uint8_t* mark, I* crd,
                                V* vals, int32_t* tmp) {
  int64_t lo, hi;
  touched_range(touched, k, &lo, &hi);
  dense_ws_drain<int32_t>(touched, k, lo, hi, values, mark, crd, vals, tmp);
}

// The same read-out in insertion order (einsum(..., sorted=False): scipy's contract, the
// coordinates of a fiber unique but in no particular order): no marks scan, no rank or radix
// sort; the touched values and marks are cleared as they are read.
template <typename K, typename I, typename V>
inline void dense_ws_drain_unsorted(K* touched, int64_t k, V* values, uint8_t* mark, I* crd, V* vals) {
  drain_in_order(touched, k, values, mark, crd, vals);
}

// The dense workspace as an object (see dense_ws_drain), one allocation for every fiber.
template <typename V>
class DenseWorkspace {
 public:
  std::vector<V> values;
  std::vector<uint8_t> mark;
  std::vector<int64_t> touched;
  int64_t lo = INT64_MAX, hi = -1;   // range of the touched coordinates

  DenseWorkspace() {}
  explicit DenseWorkspace(int64_t n) { resize(n); }

  inline void resize(int64_t n) {
    values.assign(n, V(0));
    mark.assign(n + 8, 0);
    touched.clear();
    lo = INT64_MAX;
    hi = -1;
  }
  inline int64_t extent() const { return static_cast<int64_t>(values.size()); }
  inline int64_t size() const { return static_cast<int64_t>(touched.size()); }
  inline bool empty() const { return touched.empty(); }
  inline bool contains(int64_t coord) const { return mark[coord] != 0; }
  inline V get(int64_t coord) const { return values[coord]; }

  inline void add(int64_t coord, V value) {
    ws_accumulate(values[coord], value);
    if (!mark[coord]) {
      mark[coord] = 1;
      touched.push_back(coord);
      lo = coord < lo ? coord : lo;
      hi = coord > hi ? coord : hi;
    }
  }

  // Sorted drain (see dense_ws_drain).
  template <typename I>
  inline int64_t drain(I* crd, V* vals, int64_t offset) {
    const int64_t k = size();
    dense_ws_drain<int64_t>(touched.data(), k, lo, hi, values.data(), mark.data(),
                            crd + offset, vals + offset, nullptr);
    next();
    return offset + k;
  }
  // Insertion order (for outputs whose level does not need sorted coordinates).
  template <typename I>
  inline int64_t drain_unsorted(I* crd, V* vals, int64_t offset) {
    for (int64_t c : touched) {
      crd[offset] = static_cast<I>(c);
      vals[offset] = values[c];
      ++offset;
    }
    clear();
    return offset;
  }
  // Write the touched values into a dense output fiber (out[c] = value) and reset.
  inline void scatter(V* out) {
    for (int64_t c : touched) out[c] = values[c];
    clear();
  }
  // Forget the touched entries without reading them.
  inline void reset() { clear(); }

 private:
  inline void clear() {
    for (int64_t c : touched) {
      values[c] = V(0);
      mark[c] = 0;
    }
    next();
  }
  inline void next() {
    touched.clear();
    lo = INT64_MAX;
    hi = -1;
  }
};

// The pool's sizes are powers of two: the exponent of the smallest that holds ``bytes``.
inline int pool_size_class(size_t bytes) {
  int cls = 0;
  while ((size_t(1) << cls) < bytes) ++cls;
  return cls;
}

// The process pool's entry points, as scorch._runtime.workspace exports them (capsule
// SCORCH_POOL_CAPSULE). Plain C functions with no exception: a module built from another
// version of this header reaches the pool only through them, never through BlockPool's
// layout; a change to them must rename the capsule (old modules then keep pools of their own).
// V2: blocks carry result_alloc's header (kernel_result.h), which a V1 module's free() would
// not expect.
struct PoolApi {
  void* (*take)(size_t need, size_t* got);                              // nullptr: no memory
  void* (*take_own_largest)(size_t need, size_t* got, const void* owner);  // nullptr: none kept
  void (*give)(void* p, size_t size, const void* owner);
};
#define SCORCH_POOL_CAPSULE "scorch._runtime.workspace.BLOCK_POOL_V2"

// Where the process pool cannot be had (scorch._runtime.workspace not importable, or the
// interpreter finalizing): plain malloc and free, nothing kept. The pool itself
// (block_pool.h) is compiled into scorch._runtime.workspace only: in every kernel module it
// cost ~0.2 s of g++ for code that never ran there.
inline void* malloc_pool_take(size_t need, size_t* got) {
  *got = size_t(1) << pool_size_class(need);   // the size the pool would report
  return result_alloc(*got);
}
inline void* malloc_pool_take_own_largest(size_t, size_t*, const void*) { return nullptr; }
inline void malloc_pool_give(void* p, size_t bytes, const void*) { result_free(p, bytes); }
inline PoolApi* malloc_pool_api() {
  static PoolApi api = {malloc_pool_take, malloc_pool_take_own_largest, malloc_pool_give};
  return &api;
}

// The process pool's entry points from scorch._runtime.workspace, imported here (under the
// GIL) if no one has yet: PyCapsule_Import alone imports only the top package, and finds
// no ``workspace`` attribute on scorch._runtime until the submodule is imported, which
// nothing else in a user's process does. Each kernel module then kept a pool of its own.
inline PoolApi* import_process_pool() {
  PyObject* module = PyImport_ImportModule("scorch._runtime.workspace");
  PyObject* capsule = module == nullptr ? nullptr : PyObject_GetAttrString(module, "BLOCK_POOL_V2");
  Py_XDECREF(module);
  void* api = capsule == nullptr ? nullptr : PyCapsule_GetPointer(capsule, SCORCH_POOL_CAPSULE);
  Py_XDECREF(capsule);
  if (api == nullptr) PyErr_Clear();
  return static_cast<PoolApi*>(api);
}

// The process pool, fetched on this module's first use: the GIL (taken here, from any
// thread: kernels call this without it, inside OpenMP regions) serializes the import, and
// no other lock is held while waiting for it.
inline PoolApi* process_pool_api() {
  static std::atomic<PoolApi*> api{nullptr};
  PoolApi* a = api.load(std::memory_order_acquire);
  if (a != nullptr) return a;
  if (!Py_IsInitialized()) return malloc_pool_api();
  const PyGILState_STATE gil = PyGILState_Ensure();
  a = api.load(std::memory_order_acquire);
  if (a == nullptr) {
    a = import_process_pool();
    if (a == nullptr) a = malloc_pool_api();
    api.store(a, std::memory_order_release);
  }
  PyGILState_Release(gil);
  return a;
}

// What this module's output buffers take blocks from and give them back to: the process
// pool, with this module's own hint for take_largest.
class PoolHandle {
 public:
  void* take(size_t need, size_t* got) {
    void* p = process_pool_api()->take(need, got);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  // The largest block this module gave back if it holds ``need`` bytes, else take(need): an
  // output buffer's first block. A kernel called again gets back the room its last call
  // grew to, so its buffers do not double their way up again (4elt A @ A^T: 4 MB of copies a
  // call); only this module's blocks, or a small kernel's output would hold another's big one.
  void* take_largest(size_t need, size_t* got) {
    void* p = process_pool_api()->take_own_largest(need, got, this);
    if (p != nullptr) return p;
    // none kept (the last calls' outputs still hold theirs, see AppendBuffer::release):
    // the size the last first block had, so the buffer does not double its way up again
    p = take(std::max(need, last_first_.load(std::memory_order_relaxed)), got);
    last_first_.store(*got, std::memory_order_relaxed);
    return p;
  }
  // Give back a block that take() returned (``size`` as it reported).
  void give(void* p, size_t size) { process_pool_api()->give(p, size, this); }

 private:
  std::atomic<size_t> last_first_{0};   // the size of the last block take_largest had to allocate
};

inline PoolHandle& block_pool() {
  static PoolHandle pool;
  return pool;
}

// Give back a block to the pool (an output array that took over a block gives it back
// through the module that made it, see AppendBuffer::release).
inline void pool_give(void* p, size_t bytes) { block_pool().give(p, bytes); }

// A growable array of plain values that, unlike std::vector::resize, does not initialize
// the room it adds: kernels append output entries (one buffer per chunk of rows) and drain
// workspaces straight into room made by grow(). Memory comes from block_pool(). One per
// chunk, side by side in a vector that threads share: a cache line each, or the threads'
// size updates would contend for it.
template <typename T>
class alignas(64) AppendBuffer {
 public:
  AppendBuffer() {}
  AppendBuffer(const AppendBuffer&) = delete;
  AppendBuffer& operator=(const AppendBuffer&) = delete;
  AppendBuffer(AppendBuffer&& o) noexcept
      : ptr(o.ptr), n(o.n), cap(o.cap), failed(o.failed), sink(o.sink), sink_bytes(o.sink_bytes),
        call_failed_(o.call_failed_) {
    o.ptr = nullptr;
    o.n = o.cap = 0;
    o.failed = false;
    o.sink = nullptr;
    o.sink_bytes = 0;
  }
  ~AppendBuffer() {
    if (failed)
      block_pool().give(sink, sink_bytes);
    else
      block_pool().give(ptr, static_cast<size_t>(cap) * sizeof(T));
  }

  inline void push_back(T v) {
    if (n >= cap) reserve(n + 1);      // >=: after a failure, cap stays where the sink began
    ptr[n++] = v;
  }
  // Room for k more values, uninitialized; returns where it starts.
  inline T* grow(int64_t k) {
    if (n + k > cap) reserve(n + k);
    T* at = ptr + n;
    n += k;
    return at;
  }
  inline T* data() { return ptr; }
  inline int64_t size() const { return n; }
  // Give back the last k values grow() added (room a read-out did not fill).
  inline void trim(int64_t k) { n -= k; }
  // Record a failed allocation also in ``*flag``: the call's flag (kernel_result.h:
  // result_failure_flag), which every buffer of the call shares, so that one chunk's
  // failure stops the others and fails that call, and no other.
  inline void report_failure_to(int* flag) { call_failed_ = flag; }
  // Whether this buffer, or another buffer of its call, could not grow.
  inline bool call_failed() const {
    return failed || (call_failed_ != nullptr && __atomic_load_n(call_failed_, __ATOMIC_RELAXED));
  }
  // Hand the block over (its size in bytes to ``*bytes``; pool_give takes it back): the
  // output array of a call whose entries all sit in this one buffer is this memory, with
  // no copy into fresh pages. The buffer is empty afterwards.
  inline T* release(size_t* bytes) {
    T* p = ptr;
    *bytes = static_cast<size_t>(cap) * sizeof(T);
    ptr = nullptr;
    n = cap = 0;
    return p;
  }
  // Give the block back to the pool now (its values were copied out), not when the call
  // ends: the output is gathered chunk by chunk beside the chunks' buffers.
  inline void give_back() {
    size_t bytes = 0;
    T* p = release(&bytes);
    block_pool().give(p, bytes);
  }

 private:
  T* ptr = nullptr;
  int64_t n = 0, cap = 0;
  // After a failed allocation (``fail``): the kernel's result is lost (call_failed: its
  // entry returns before reading any buffer, and the call raises MemoryError), but its
  // chunk runs to the end, writing at ``data() + size()`` or where grow() points. So writes
  // go to a small ``sink`` block with room for the values written at a time: ``n`` keeps
  // counting, and ``ptr`` is placed ``n`` values before the sink, so that both ways of
  // addressing land in it; every write past ``cap`` (= n) comes back here.
  bool failed = false;
  T* sink = nullptr;
  size_t sink_bytes = 0;
  int* call_failed_ = nullptr;   // the call's flag (report_failure_to)

  // out of line: a cold path (g++ inlined it, and reserve, at every push_back site)
  __attribute__((noinline, cold)) void fail(int64_t need) {
    if (!failed) {
      if (call_failed_ != nullptr) __atomic_store_n(call_failed_, 1, __ATOMIC_RELAXED);
      failed = true;
      block_pool().give(ptr, static_cast<size_t>(cap) * sizeof(T));   // the lost entries
    }
    const size_t room = static_cast<size_t>(std::max<int64_t>(need - n, 1)) * sizeof(T);
    if (room > sink_bytes) {
      block_pool().give(sink, sink_bytes);
      sink = nullptr;
      sink_bytes = 0;
      try {
        sink = static_cast<T*>(block_pool().take(room, &sink_bytes));
      } catch (const std::bad_alloc&) {
        std::abort();                  // not even the room for one row's values
      }
    }
    ptr = sink - n;
    cap = n;                           // the next write past n comes back here
  }

  __attribute__((noinline)) void reserve(int64_t need) {
    if (failed) {
      fail(need);
      return;
    }
    int64_t c = cap ? cap * 2 : 4096;
    while (c < need) c *= 2;
    size_t got = 0;
    const size_t bytes = static_cast<size_t>(c) * sizeof(T);
    T* p = nullptr;
    // a block that is a mapping (kMapFrom) grows in place (result_regrow: remapped, no copy);
    // a smaller one by taking a bigger block from the pool (whose pages may be touched
    // already) and copying
    if (static_cast<size_t>(cap) * sizeof(T) >= kMapFrom) {
      got = size_t(1) << pool_size_class(bytes);   // a size the pool keeps
      p = static_cast<T*>(result_regrow(ptr, got));
      if (p == nullptr) {
        fail(need);
        return;
      }
      ptr = p;
      cap = static_cast<int64_t>(got / sizeof(T));
      return;
    }
    try {
      p = static_cast<T*>(cap ? block_pool().take(bytes, &got) : block_pool().take_largest(bytes, &got));
    } catch (const std::bad_alloc&) {
      fail(need);
      return;
    }
    if (n) std::memcpy(p, ptr, static_cast<size_t>(n) * sizeof(T));
    block_pool().give(ptr, static_cast<size_t>(cap) * sizeof(T));
    ptr = p;
    cap = static_cast<int64_t>(got / sizeof(T));
  }
};

// The output buffers of one call's chunks, side by side: a plain array allocated once a call
// (generated entries index it as chunk t's, or t * levels + l for a coordinate level l).
// std::vector's resize and destructor, instantiated for these buffers, cost every
// sparse-output kernel ~0.15 s of g++.
template <typename B>
class ChunkBuffers {
 public:
  ChunkBuffers() {}
  ChunkBuffers(const ChunkBuffers&) = delete;
  ChunkBuffers& operator=(const ChunkBuffers&) = delete;
  ~ChunkBuffers() { delete[] items_; }
  // n empty buffers (any earlier ones are given back first; none left if new throws)
  void allocate(int64_t n) {
    delete[] items_;
    items_ = nullptr;
    items_ = new B[n];
  }
  inline B& operator[](int64_t i) { return items_[i]; }

 private:
  B* items_ = nullptr;
};

// A thread's dense workspace arrays (see dense_ws_drain), kept for the thread's lifetime and
// reused by every kernel call it runs: values and marks (all zero between fibers) and the
// touched list over ``capacity`` coordinates. A call allocates and zeroes nothing once the
// thread has seen its extent. Generated kernels take it with dense_scratch<V>(extent).
template <typename V>
struct DenseScratch {
  V* values = nullptr;
  uint8_t* mark = nullptr;
  int32_t* touched = nullptr;
  int32_t* sort_tmp = nullptr;   // room for a radix sort of the touched list
  int64_t capacity = 0;
  ~DenseScratch() { release(); }
  void release() {
    std::free(values);
    std::free(mark);
    std::free(touched);
    std::free(sort_tmp);
    values = nullptr;
    mark = nullptr;
    touched = nullptr;
    sort_tmp = nullptr;
    capacity = 0;
  }
};

template <typename V>
inline DenseScratch<V>* dense_scratch(int64_t extent) {
  static thread_local DenseScratch<V> s;
  if (s.capacity < extent) {
    s.release();
    const size_t n = static_cast<size_t>(extent);
    s.values = static_cast<V*>(std::calloc(n, sizeof(V)));
    s.mark = static_cast<uint8_t*>(std::calloc(n + 8, 1));
    s.touched = static_cast<int32_t*>(std::malloc(n * sizeof(int32_t)));
    s.sort_tmp = static_cast<int32_t*>(std::malloc(n * sizeof(int32_t)));
    if (!s.values || !s.mark || !s.touched || !s.sort_tmp) {
      s.release();
      throw std::bad_alloc();
    }
    s.capacity = extent;
  }
  return &s;
}

}  // namespace scorch
