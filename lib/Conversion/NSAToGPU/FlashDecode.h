//===- FlashDecode.h - split-K kernels of a decoding step ------*- C++ -*-===//
//
// The decoding step of nsa-flash-attention (docs/Spec.md section 12,
// docs/Decode.md section 4): the branch ops of one
// nsa.sparse_attention_decode with `kv_lens` (compressed attention, block
// selection, selected and window attention) and their nsa.combine, as two
// launches whose work is split over the keys:
//
//   _partial  compressed and window attention: a block per (split, row
//             tile, batch row) walks its chunks of keys with an online
//             softmax and writes the split's (max, sum, O); compressed
//             chunks also write their Eq. 9 block partials (Spec 5.2)
//   _selected selected attention's splits, as _partial, over the blocks
//             each block chooses first: the compressed lse of the group's
//             rows from the splits, the block scores (Eq. 9, 10) from the
//             chunk partials, top-n with the backbone (5.4); then a share
//             of the compressed and window splits merged, and the row
//             tile's last block to finish merges the selected splits,
//             rounds each branch to bf16 as the branch ops' results are,
//             and gates them (Spec section 8)
//
// With `gridDeps` (sm_90) the two names end in `_pdl`: the runtime
// launches those with programmatic stream serialization (docs/Runtime.md).
// With `clusterBlocks` as well, a step with few row tiles instead takes
//
//   _cluster  one launch in clusters of clusterBlocks blocks, a cluster a
//             row tile: its blocks walk the compressed splits, wait at a
//             cluster barrier (the splits' results then visible to all of
//             them), walk the selected splits (each choosing the token's
//             blocks as _selected does) and the window splits, wait at a
//             second one, and merge and gate the rows, a share each; with
//             the caches updated in place it also pools the compressed
//             caches' new rows (the append folded in: DecodeOperands), so
//             a step at B = 1 is one launch, with no fence, count or
//             launch between the branches
//
// Private to lib/Conversion/NSAToGPU.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_LIB_CONVERSION_NSATOGPU_FLASHDECODE_H
#define NSA_LIB_CONVERSION_NSATOGPU_FLASHDECODE_H

#include "NSA/Spec.h"

#include "mlir/IR/Builders.h"

#include <string>

namespace mlir::nsa::detail {

/// The most selected blocks a decoding step's kernels choose on chip (a
/// step with more is left to the generic mapping).
constexpr int64_t kDecodeMaxSelected = 64;

/// The shapes of one decoding step.
struct DecodeConfig {
  int64_t kvHeads = 0, group = 0, qkDim = 0, vDim = 0;
  int64_t queries = 0;                   ///< Tq, the new tokens a batch row
  int64_t cmpBlock = 0, cmpStride = 0;   ///< l, d
  int64_t slcBlock = 0, numSelected = 0; ///< l', n
  int64_t window = 0;                    ///< w
  spec::Backbone backbone;
  double cmpScale = 1, slcScale = 1, winScale = 1;
  /// Keys a block stages in shared memory at once (a chunk): 64 or 128, a
  /// multiple of l'.
  int64_t chunkKeys = 128;
  /// Blocks a launch aims for: the chunks a split walks are chosen so that
  /// splits x row tiles x batch rows of all branches come near it.
  int64_t targetBlocks = 528;
  /// sm_90: the launches are named `*_pdl` and wait for their predecessor
  /// in griddepcontrol.wait, so that the runtime may launch them with
  /// programmatic stream serialization: each is placed on the SMs while
  /// the one before it ends. A step's first launch (`_partial`,
  /// `_cluster`; after the step's compress_append or the caller's work or
  /// the step before) waits at its entry, before any global access, then
  /// releases its successor; `_selected` waits where it reads `_partial`'s
  /// results and releases the next step's launch after its splits.
  bool gridDeps = false;
  /// sm_90 (with gridDeps), G <= 16: a step whose row tiles are few
  /// (batch rows x row tiles x clusterBlocks <= targetBlocks / 2) is one
  /// launch, `_cluster`, in clusters of clusterBlocks blocks a row tile:
  /// the compressed splits, a cluster barrier, the selected and window
  /// splits, a cluster barrier, then the merge shared by the cluster.
  /// Other steps take `_partial` and `_selected`. 0: never; at most 16.
  int64_t clusterBlocks = 0;
  /// `_cluster`: the cluster's blocks score a share of the token's
  /// selection blocks each and the selected ones take the n best of their
  /// lists (DSMEM), instead of each selected block choosing alone. Taken
  /// where every share fits the shared memory before the statistics.
  bool clusterSelect = false;
  /// `_cluster` without clusterSelect: the selected and window splits push
  /// their (max, sum, O) rows by `st.async` (PTX 8.1) into the shared
  /// memory of the cluster's blocks that attend to no late keys (the
  /// owners, a share of the rows each), which merge them once their
  /// mbarrier has counted the bytes, instead of a second cluster barrier
  /// and a merge through the global workspace. Taken where the cluster has
  /// such blocks and their share fits the K and V buffers.
  bool clusterPush = false;
  /// `_cluster`: thread 0 of each block of the first row tile's cluster
  /// records %globaltimer at the step's phases (DecodeBuilder::stamp) and
  /// prints them with printf where the block ends, a line a block:
  /// "NSA_TRACE rank s0 ... s11" (0 where the block did not pass). For
  /// profiling only: the prints cost microseconds.
  bool trace = false;

  /// Row tiles of 16 (token, head) rows per token and KV head: one token's
  /// G heads (for G < 16 padded with rows that are dropped).
  int64_t rowTiles() const { return (group + 15) / 16; }
  /// Row tiles of a batch row: Tq x H x rowTiles.
  int64_t tiles() const { return queries * kvHeads * rowTiles(); }
  /// Selection blocks a compressed chunk's Eq. 9 partials cover.
  int64_t slotsPerChunk() const {
    int64_t perSlc = slcBlock / cmpStride, perCmp = cmpBlock / cmpStride;
    return (chunkKeys + perCmp - 2) / perSlc + 1;
  }
};


/// nsa.compress_append (Spec section 12) of bf16 keys or values `input`
/// [B, Lmax, H, dim] (dim even): the blocks a step of `appended` tokens
/// completed, pooled (mean, or `weights` [H, l] f32 when given) into `dst`
/// [B, Nc, H, dim]; where `dst` is not `src` (the cache before the step,
/// compared by address on the device) every other row is copied from
/// `src`, else left alone (the runtime updates the cache in place).
struct AppendConfig {
  int64_t heads = 0, block = 0, stride = 0, appended = 0;
  /// sm_90: every block starts with griddepcontrol.launch_dependents, so
  /// that a `*_pdl` launch after it (which waits for it before reading the
  /// caches) starts at once.
  bool gridDeps = false;
};
struct AppendOperands {
  Value input, weights, src, dst;
  int64_t dim = 0;
};

/// The step's operands, memrefs in device memory: q [B, Tq, HQ, Dqk],
/// the caches k [B, Lmax, H, Dqk], v [B, Lmax, H, Dv], the compressed
/// caches kc, vc [B, Nc, H, D], gates [B, Tq, HQ, 3] (bf16 logits),
/// kvLens [B] i32, and out [B, Tq, HQ, Dv] bf16.
struct DecodeOperands {
  Value q, k, v, kc, vc, gates, kvLens, out;
  /// The compress_append launch that writes kc and vc (dst), when the
  /// step may take its place (appendsFoldable): `_cluster`, where the step
  /// takes it and both appends are in place, pools the new rows itself
  /// (the blocks whose compressed chunks hold them) and the launch is
  /// skipped (its guard, see foldAppendsCondition). `append.appended` is
  /// 0 where there is none.
  AppendOperands kcAppend, vcAppend;
  AppendConfig append;
};

/// Whether the step of `config` may take the place of the launch of
/// `appends` with `appendConfig` that writes its kc and vc (those two, a
/// new block a step at most: `appended` <= d).
bool appendsFoldable(const DecodeConfig &config,
                     const AppendConfig &appendConfig,
                     ArrayRef<AppendOperands> appends);

/// i1: the step of `batch` rows and caches of `cacheTokens` (Lmax) takes
/// `_cluster` (FlashDecode.h's rule; false where the config never does).
Value decodeTakesCluster(OpBuilder &b, Location loc, const DecodeConfig &config,
                         Value batch, Value cacheTokens);

/// i1: the step pools the appends' new rows itself: it takes `_cluster`
/// (for the batch rows of `kvLens`) and every append of `appends` writes
/// in place (dst is src).
Value foldAppendsCondition(OpBuilder &b, Location loc,
                           const DecodeConfig &config,
                           ArrayRef<AppendOperands> appends, Value kvLens);

/// Why the decode kernels cannot take `config`, or "" if they can.
std::string checkDecodeConfig(const DecodeConfig &config);

/// Builds the step's launches (and their workspace) at the builder's
/// insertion point, named `kernelName` with the suffixes above.
void buildDecodeKernels(OpBuilder &b, Location loc, const DecodeConfig &config,
                        const DecodeOperands &operands, StringRef kernelName);

/// One launch for every append of `appends` (the same lengths and config:
/// the keys' and the values' caches of a step), a block per (new block
/// slot, KV head, batch row and append).
void buildCompressAppendKernel(OpBuilder &b, Location loc,
                               const AppendConfig &config,
                               ArrayRef<AppendOperands> appends, Value kvLens,
                               StringRef kernelName);

} // namespace mlir::nsa::detail

#endif // NSA_LIB_CONVERSION_NSATOGPU_FLASHDECODE_H
