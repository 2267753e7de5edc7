//===- Wgmma.h - warpgroup tensor-core instructions (sm_90a) ---*- C++ -*-===//
//
// The sm_90a pieces of the flash kernels, emitted as inline PTX: wgmma
// matrix descriptors of 128-byte-swizzled shared-memory tiles, wgmma with A
// from shared memory or from registers (MLIR 22's nvvm.wgmma.mma_async has
// no register-A form), and the fences around them.
//
// Shared-memory tiles are stored the way the 128-byte swizzle expects: a
// tile of R rows x C bf16 columns (C a multiple of 64) is C / 64 blocks of
// R x 64, each row 128 bytes, whose 16-byte chunk c of row r sits at chunk
// c ^ (r % 8); every block starts 1024-byte aligned.
//
// Values whose registers a wgmma reads or writes asynchronously pass
// through the fence and the wait as tied operands, so that no other
// instruction touches them between the two.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_LIB_CONVERSION_NSATOGPU_WGMMA_H
#define NSA_LIB_CONVERSION_NSATOGPU_WGMMA_H

#include "mlir/IR/Builders.h"

namespace mlir::nsa::detail {

/// Bytes of one 128-byte-swizzled row and of its 8-row pattern.
constexpr int64_t kSwizzleRowBytes = 128;
constexpr int64_t kSwizzleAtomBytes = 1024;

/// A wgmma matrix descriptor: a run-time 64-bit value and a compile-time
/// offset of its start address, added inside the wgmma (advancing emits
/// nothing, so a loop keeps one descriptor per tile live rather than one
/// per k16 step) unless materialized.
struct WgmmaDesc {
  Value base;         ///< i64
  int64_t offset = 0; ///< 16-byte units added to the start address
};

/// The descriptor of a 128-byte-swizzled tile whose first block starts at
/// shared address `address` (i32): `leadingBytes` (LBO) and `strideBytes`
/// (SBO) as the PTX ISA defines them for the tile's major mode.
WgmmaDesc wgmmaDescriptor(OpBuilder &b, Location loc, Value address,
                          int64_t leadingBytes, int64_t strideBytes);

/// `desc` with its start address moved by `bytes` (a multiple of 16).
WgmmaDesc wgmmaAdvance(WgmmaDesc desc, int64_t bytes);

/// `desc` with its offset added here (an i64 add that may be hoisted out
/// of loops: no add in the wgmma, one more live value).
WgmmaDesc wgmmaMaterialize(OpBuilder &b, Location loc, WgmmaDesc desc);

/// D[64 x n] += A B for one k16 step, A and B from shared memory (B
/// K-major, A K-major or, with `transA`, M-major); `acc` holds the n / 2
/// f32 of the thread's accumulator fragment, in mma.sync's order per 8
/// columns. Without `accumulate`, D = A B (scale-d 0): `acc` only names the
/// registers, its values unread.
SmallVector<Value> wgmmaSS(OpBuilder &b, Location loc, int64_t n,
                           WgmmaDesc descA, WgmmaDesc descB, ValueRange acc,
                           bool accumulate = true, bool transA = false);

/// D[64 x n] += A B for one k16 step, A from registers (4 x bf16x2 in
/// mma.sync's A layout), B from shared memory, MN-major if `transB`.
SmallVector<Value> wgmmaRS(OpBuilder &b, Location loc, int64_t n, ValueRange a,
                           WgmmaDesc descB, bool transB, ValueRange acc);

/// D[64 x n] = A B^T over `kDim` (a multiple of 16), a wgmmaSS per k16
/// step: A and B K-major tiles of `aRows` and `bRows` rows (their 64-column
/// blocks aRows x 128 and bRows x 128 bytes apart). The first step
/// overwrites `acc` unless `accumulate`; with `materializeA` A's
/// descriptor of each step is added outside the wgmma.
SmallVector<Value> wgmmaChainSS(OpBuilder &b, Location loc, int64_t n,
                                WgmmaDesc descA, int64_t aRows,
                                WgmmaDesc descB, int64_t bRows, int64_t kDim,
                                ValueRange acc, bool accumulate,
                                bool materializeA);
/// D[64 x n] += A B, a wgmmaRS per k16 step: A four fragments a step in
/// `a` (fenced), B MN-major from `descB` (rows of K, 128 bytes apart).
SmallVector<Value> wgmmaChainRS(OpBuilder &b, Location loc, int64_t n,
                                ArrayRef<Value> a, WgmmaDesc descB,
                                ValueRange acc);
/// wgmma.fence; `values` (f32 or i32) come back pinned behind it.
SmallVector<Value> wgmmaFence(OpBuilder &b, Location loc, ValueRange values);

/// wgmma.commit_group.
void wgmmaCommit(OpBuilder &b, Location loc);

/// wgmma.wait_group `pending`; `values` come back pinned behind it.
SmallVector<Value> wgmmaWait(OpBuilder &b, Location loc, int64_t pending,
                             ValueRange values);

/// wgmma.wait_group `pending`, then `values` moved into new registers: the
/// accumulators waited on are free at once, so the next in-flight group
/// can take them (a loop carrying accumulators in flight needs no copies
/// of live wgmma registers, which ptxas would serialize).
SmallVector<Value> wgmmaWaitMoved(OpBuilder &b, Location loc, int64_t pending,
                                  ValueRange values);

/// fence.mbarrier_init: mbarrier initialisation becomes visible to the
/// async proxy (TMA completion).
void fenceBarrierInit(OpBuilder &b, Location loc);

/// fence.proxy.async.shared::cta: this thread's generic shared-memory
/// writes (cp.async included) become visible to wgmma.
void fenceProxyAsync(OpBuilder &b, Location loc);

} // namespace mlir::nsa::detail

#endif // NSA_LIB_CONVERSION_NSATOGPU_WGMMA_H
