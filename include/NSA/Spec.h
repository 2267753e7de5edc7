//===- Spec.h - the arithmetic of docs/Spec.md -------------------*- C++ -*-===//
//
// Small, dependency-free functions that state the index arithmetic of the NSA
// specification once, for the verifiers, the passes, the float64 reference
// and the runtime alike. Section names refer to docs/Spec.md.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_SPEC_H
#define NSA_SPEC_H

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mlir::nsa::spec {

/// Number of compressed blocks of a sequence of `seqLen` tokens: block `i`
/// covers `[i*stride, i*stride + block)` and must fit ("Compression").
constexpr int64_t numCompressedBlocks(int64_t seqLen, int64_t block,
                                      int64_t stride) {
  return seqLen < block ? 0 : (seqLen - block) / stride + 1;
}

/// Rows of the packed compressed tensor of `totalLen` tokens: an upper bound
/// of the sum of numCompressedBlocks over the packed sequences ("Packed
/// sequences").
constexpr int64_t numPackedCompressedRows(int64_t totalLen, int64_t stride) {
  return totalLen / stride;
}

/// Number of compressed blocks that token `t` sees: those that end at or
/// before `t`, i.e. `i*stride + block - 1 <= t` ("Compression attention").
constexpr int64_t numVisibleCompressedBlocks(int64_t t, int64_t block,
                                             int64_t stride) {
  return numCompressedBlocks(t + 1, block, stride);
}

/// Number of selection blocks of a sequence of `seqLen` tokens (the last one
/// may be partial).
constexpr int64_t numSelectionBlocks(int64_t seqLen, int64_t slcBlock) {
  return (seqLen + slcBlock - 1) / slcBlock;
}

/// Overlap weight of compressed block `i` on selection block `j` (Eq. 9):
/// the number of stride-sized sub-blocks the two share ("Block importance").
constexpr int64_t overlapWeight(int64_t i, int64_t j, int64_t cmpBlock,
                                int64_t cmpStride, int64_t slcBlock) {
  int64_t lo = i * cmpStride > j * slcBlock ? i * cmpStride : j * slcBlock;
  int64_t cmpEnd = i * cmpStride + cmpBlock, slcEnd = (j + 1) * slcBlock;
  int64_t hi = cmpEnd < slcEnd ? cmpEnd : slcEnd;
  return hi > lo ? (hi - lo) / cmpStride : 0;
}

/// The always-on selection blocks ("Forced blocks", Spec 5.4). For a query
/// in selection block `c`, block `j <= c` is forced when any pattern holds:
///   initial:    j < initial
///   local:      c - j < local
///   log-spaced: c - j = 2^i for some 0 <= i < logLevels
///   hubs:       hubStride > 0 and j % hubStride == 0
///   explicit:   j is listed in `blocks`
struct Backbone {
  int64_t initial = 0;
  int64_t local = 0;
  int64_t logLevels = 0;
  int64_t hubStride = 0;
  std::vector<int64_t> blocks;

  bool isForced(int64_t j, int64_t c) const {
    if (j < 0 || j > c)
      return false;
    int64_t back = c - j;
    if (j < initial || back < local)
      return true;
    if (back > 0 && (back & (back - 1)) == 0 && back < (int64_t(1) << logLevels))
      return true;
    if (hubStride > 0 && j % hubStride == 0)
      return true;
    return std::binary_search(blocks.begin(), blocks.end(), j);
  }

  /// Whether a forced block `a` makes every later block reachable in one
  /// hop: true for the absolute patterns (initial, hubs, explicit), whose
  /// block is forced for every later query.
  bool isAttractor(int64_t a) const {
    return a < initial || (hubStride > 0 && a % hubStride == 0) ||
           std::binary_search(blocks.begin(), blocks.end(), a);
  }

  /// Appends the forced blocks of a query in selection block `queryBlock`,
  /// increasing and without duplicates.
  void forcedBlocks(int64_t queryBlock, std::vector<int64_t> &out) const {
    size_t first = out.size();
    for (int64_t j = 0; j < std::min(initial, queryBlock + 1); ++j)
      out.push_back(j);
    for (int64_t j = std::max<int64_t>(0, queryBlock - local + 1);
         j <= queryBlock; ++j)
      out.push_back(j);
    for (int64_t i = 0; i < logLevels && (int64_t(1) << i) <= queryBlock; ++i)
      out.push_back(queryBlock - (int64_t(1) << i));
    if (hubStride > 0)
      for (int64_t j = 0; j <= queryBlock; j += hubStride)
        out.push_back(j);
    for (int64_t j : blocks)
      if (j <= queryBlock)
        out.push_back(j);
    std::sort(out.begin() + first, out.end());
    out.erase(std::unique(out.begin() + first, out.end()), out.end());
  }

  /// The most forced blocks of any query whose selection block is at most
  /// `maxQueryBlock`; with `maxQueryBlock < 0` (no length bound), the
  /// supremum over all queries, or -1 when it is unbounded (hubs).
  int64_t maxForcedBlocks(int64_t maxQueryBlock = -1) const {
    std::vector<int64_t> tmp;
    if (maxQueryBlock < 0) {
      if (hubStride > 0)
        return -1;
      // Far enough out every pattern contributes its full, disjoint set.
      int64_t far = initial + local + (int64_t(1) << std::min<int64_t>(
                                           logLevels, 62)) +
                    (blocks.empty() ? 0 : blocks.back()) + 1;
      forcedBlocks(far, tmp);
      return static_cast<int64_t>(tmp.size());
    }
    int64_t most = 0;
    for (int64_t c = 0; c <= maxQueryBlock; ++c) {
      tmp.clear();
      forcedBlocks(c, tmp);
      most = std::max<int64_t>(most, tmp.size());
    }
    return most;
  }
};

} // namespace mlir::nsa::spec

#endif // NSA_SPEC_H

