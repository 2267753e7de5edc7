//===- Reach.h - worst-case hop bound of an NSA backbone ---------*- C++ -*-===//
//
// How many layers information needs, in the worst case, to travel from any
// token to any later token when only the always-on (backbone) selection
// blocks and the sliding window are used (docs/Spec.md, "Reach"). Exact, and
// checked against a token-level breadth-first search in the unit tests.
// Dependency-free: used by the verifier, the `nsa-analyze-reach` pass and the
// `nsa-reach` tool.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_REACH_H
#define NSA_REACH_H

#include "NSA/Spec.h"

#include <cstdint>

namespace mlir::nsa::spec {

struct ReachReport {
  /// Worst-case hops over all pairs s < t, or -1 when some later token can
  /// never be reached.
  int64_t hops = 0;
  /// A worst-case pair: the first token of `sourceBlock` and a token of
  /// `targetBlock` (selection blocks).
  int64_t sourceBlock = 0, targetBlock = 0;
  /// The most forced blocks of any query, and the keys a query reads through
  /// the backbone and the window (`forcedBlocks * l' + w`, capped by T).
  int64_t forcedBlocks = 0, backboneKeys = 0;
  /// Nothing above was computed: the search would take more than
  /// kMaxReachSteps steps (a window far shorter than the selection blocks
  /// fills them w - 1 tokens a hop), or T is above kMaxReachTokens or has
  /// more than kMaxReachBlocks blocks. Callers refuse with a diagnostic.
  bool tooCostly = false;
};

/// The most steps (block updates) of analyzeReach's search, about a tenth
/// of a second.
constexpr int64_t kMaxReachSteps = int64_t(1) << 24;

/// The longest sequence analyzeReach takes (its positions are summed).
constexpr int64_t kMaxReachTokens = int64_t(1) << 60;

/// The most selection blocks analyzeReach takes (its tables hold n log n
/// entries, 4 MB at the limit). Callers refuse longer sequences with a
/// diagnostic instead of running out of time or memory.
constexpr int64_t kMaxReachBlocks = 32768;

/// The exact worst case for sequences of `seqLen` tokens, selection blocks of
/// `slcBlock` tokens and a window of `window` tokens; `seqLen / slcBlock`
/// (rounded up) must be at most kMaxReachBlocks.
ReachReport analyzeReach(int64_t seqLen, int64_t slcBlock, int64_t window,
                         const Backbone &backbone);

/// The same number by breadth-first search over the token graph from every
/// token: O(T^3), for tests on small T.
int64_t bruteForceHops(int64_t seqLen, int64_t slcBlock, int64_t window,
                       const Backbone &backbone);

} // namespace mlir::nsa::spec

#endif // NSA_REACH_H
