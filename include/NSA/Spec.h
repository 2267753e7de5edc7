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

/// The always-on selection blocks ("Forced blocks"). With `c` the selection
/// block that holds the query token: blocks `0 .. initial-1` and
/// `c-local+1 .. c`, clipped to `0 .. c`.
struct Backbone {
  int64_t initial = 0;
  int64_t local = 0;

  /// The largest number of distinct forced blocks of any query.
  int64_t maxForcedBlocks() const { return initial + local; }

  /// Appends the forced blocks of a query in selection block `queryBlock`,
  /// increasing and without duplicates.
  void forcedBlocks(int64_t queryBlock, std::vector<int64_t> &blocks) const {
    int64_t firstLocal = std::max<int64_t>(0, queryBlock - local + 1);
    for (int64_t j = 0, e = std::min(initial, firstLocal); j < e; ++j)
      blocks.push_back(j);
    for (int64_t j = firstLocal; j <= queryBlock; ++j)
      blocks.push_back(j);
  }
};

} // namespace mlir::nsa::spec

#endif // NSA_SPEC_H

