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
#include <limits>
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
  // Not (seqLen + slcBlock - 1) / slcBlock: that overflows near 2^63.
  return seqLen / slcBlock + (seqLen % slcBlock != 0);
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

/// Selection scores that rank blocks apart from their importance (Spec 5.4
/// and 14): a local block first, then the other forced blocks, then a NaN
/// importance, then every number; ties to the lower block.
constexpr float kLocalScore = std::numeric_limits<float>::infinity();
constexpr float kForcedScore = 0x1.fffffep+127f; // the largest finite float
constexpr float kNaNScore = 0x1.fffffcp+127f;    // the float below it

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

  /// The number of forced blocks of a query in selection block `c` (the
  /// size of forcedBlocks(c)) in closed form: O(logLevels log |blocks| +
  /// |blocks|), whatever the sizes. The initial and local blocks cover
  /// [0, c] but for the gap [min(initial, c + 1), c - local + 1); the
  /// other patterns add the gap blocks they hit, each counted once.
  int64_t countForcedBlocks(int64_t c) const {
    if (c < 0)
      return 0;
    int64_t gapLo = std::min(initial, c + 1);
    int64_t gapHi = std::max(gapLo, local >= c + 1 ? int64_t(0) : c - local + 1);
    int64_t count = (c + 1) - (gapHi - gapLo);
    if (gapHi == gapLo)
      return count;
    auto isHub = [&](int64_t j) { return hubStride > 0 && j % hubStride == 0; };
    if (hubStride > 0)
      count += (gapHi - 1) / hubStride -
               (gapLo > 0 ? (gapLo - 1) / hubStride : int64_t(-1));
    for (size_t k = 0; k < blocks.size(); ++k)
      if ((k == 0 || blocks[k] != blocks[k - 1]) && blocks[k] >= gapLo &&
          blocks[k] < gapHi && !isHub(blocks[k]))
        ++count;
    for (int64_t i = 0; i < std::min<int64_t>(logLevels, 62) &&
                        (int64_t(1) << i) <= c;
         ++i) {
      int64_t j = c - (int64_t(1) << i);
      if (j >= gapLo && j < gapHi && !isHub(j) &&
          !std::binary_search(blocks.begin(), blocks.end(), j))
        ++count;
    }
    return count;
  }

  /// The most forced blocks of any query whose selection block is at most
  /// `maxQueryBlock`; with `maxQueryBlock < 0` (no length bound), the
  /// supremum over all queries, or -1 when it is unbounded (hubs).
  /// Bounded work for any sizes (no list of blocks is built): see
  /// docs/Spec.md section 5.4.
  int64_t maxForcedBlocks(int64_t maxQueryBlock = -1) const {
    int64_t levels = std::min<int64_t>(logLevels, 62);
    int64_t lastBlock = blocks.empty() ? 0 : blocks.back();
    if (maxQueryBlock < 0) {
      if (hubStride > 0)
        return -1;
      // Far enough out every pattern contributes its full, disjoint set.
      int64_t far = saturatingAdd(
          saturatingAdd(initial, local),
          saturatingAdd(int64_t(1) << std::min<int64_t>(levels, 61),
                        saturatingAdd(lastBlock, 1)));
      return countForcedBlocks(
          std::min(far, std::numeric_limits<int64_t>::max() - 1));
    }
    int64_t m = maxQueryBlock;
    // Up to c = initial + local - 1 the initial and local blocks cover
    // [0, c]: the count is c + 1, largest at the end of that range.
    int64_t covered = saturatingAdd(initial, local) - 1;
    int64_t best = std::min(m, covered) + 1;
    if (m <= covered)
      return best;
    // Beyond it the count is initial + local plus the gap blocks the
    // log-spaced, hub and explicit patterns hit. Without hubs that part
    // only grows with c except where a log-spaced block falls on an
    // explicit one (c = b + 2^i): the maximum is at such a point, or at the
    // last c <= m that is none.
    std::vector<int64_t> hits;
    for (int64_t b : blocks)
      for (int64_t i = 0; i < levels; ++i) {
        int64_t c = saturatingAdd(b, int64_t(1) << i);
        if (c > covered && c <= m)
          hits.push_back(c);
      }
    std::sort(hits.begin(), hits.end());
    hits.erase(std::unique(hits.begin(), hits.end()), hits.end());
    int64_t last = m;
    while (last > covered && std::binary_search(hits.begin(), hits.end(), last))
      --last;
    if (hubStride == 0) {
      for (int64_t c : hits)
        best = std::max(best, countForcedBlocks(c));
      if (last > covered)
        best = std::max(best, countForcedBlocks(last));
      return best;
    }
    // With hubs the count also changes with c modulo the stride. Scan down
    // from m while a smaller c could still beat the best: the count at c is
    // at most initial + local + log levels + explicit blocks + the hubs up
    // to c. A scan of more than 2^24 / (levels + |blocks| + 1) steps (each
    // costs that much: hubs, huge patterns and a huge bound together) ends
    // on that bound instead: conservative, never too small.
    auto bound = [&](int64_t c) {
      return std::min(
          c + 1, saturatingAdd(saturatingAdd(initial, local),
                               levels + static_cast<int64_t>(blocks.size()) +
                                   c / hubStride + 1));
    };
    int64_t steps = 0,
            budget = (int64_t(1) << 24) /
                     (levels + static_cast<int64_t>(blocks.size()) + 1);
    for (int64_t c = m; c > covered && bound(c) > best; --c) {
      if (++steps > budget)
        return std::max(best, bound(c));
      best = std::max(best, countForcedBlocks(c));
    }
    return best;
  }

private:
  static int64_t saturatingAdd(int64_t x, int64_t y) {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    return x > kMax - y ? kMax : x + y;
  }
};

} // namespace mlir::nsa::spec

#endif // NSA_SPEC_H

