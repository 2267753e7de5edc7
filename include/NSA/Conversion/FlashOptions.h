//===- FlashOptions.h - the ranges of the flash strategy's options -*- C++ -*-===//
//
// What nsa-flash-attention and nsa-to-ptx's flash-* options accept, shared
// by the pass (lib/Conversion/NSAToGPU) and the pipeline's option checks
// (lib/Conversion/NSAToPTX).
//
//===----------------------------------------------------------------------===//

#ifndef NSA_CONVERSION_FLASHOPTIONS_H
#define NSA_CONVERSION_FLASHOPTIONS_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>

namespace mlir::nsa::detail {

/// The ranges of the flash strategy's options, for nsa-flash-attention and
/// nsa-to-ptx's flash-* options alike: rows per block and keys per tile are
/// multiples of 16 in 16..128; the key-tile ring has 2 to 4 stages.
constexpr bool isFlashTileSize(int64_t n) {
  return n >= 16 && n <= 128 && n % 16 == 0;
}
constexpr bool isFlashStageCount(int64_t n) { return n >= 2 && n <= 4; }
/// A rows/keys option: a tile size, or 0 for the choice per kernel.
constexpr bool isFlashTileOrDefault(int64_t n) {
  return n == 0 || isFlashTileSize(n);
}
/// The loop orders of selected attention (`selected-order`): auto, token
/// or block.
inline bool isSelectedOrder(llvm::StringRef order) {
  return order == "auto" || order == "token" || order == "block";
}

} // namespace mlir::nsa::detail

#endif // NSA_CONVERSION_FLASHOPTIONS_H
