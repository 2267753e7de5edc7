//===- FlashKernel.h - hand-scheduled FlashAttention-2 kernels --*- C++ -*-===//
//
// The kernel builder of the `flash` GPU strategy (nsa-flash-attention): one
// gpu.launch computing a whole attention branch with the online softmax in
// registers. What distinguishes the branches is which keys a query row
// sees, given here as the key source and its parameters.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_LIB_CONVERSION_NSATOGPU_FLASHKERNEL_H
#define NSA_LIB_CONVERSION_NSATOGPU_FLASHKERNEL_H

#include "NSA/Conversion/FlashOptions.h"
#include "NSA/Spec.h"

#include "mlir/IR/Builders.h"

#include <string>

namespace mlir::gpu {
class LaunchOp;
} // namespace mlir::gpu

namespace mlir::nsa::detail {

/// Which keys the rows of a branch see (docs/Spec.md sections 4, 6, 7).
enum class FlashKeys {
  Window,     ///< tokens s with t - w < s <= t
  Compressed, ///< compressed blocks i with i d + l - 1 <= t
  Selected,   ///< tokens s <= t of the blocks the row's token selected
  /// Block-major selected attention: a block holds one selected block's
  /// keys (s <= t) and walks the (token, slot) entries that chose it, G
  /// rows each; every entry's (O, lse) goes to its own partial row, merged
  /// per token afterwards (buildSelectedMergeKernel).
  Gathered,
};

/// Shared memory of an sm_90 SM, and what the driver reserves per block.
constexpr int64_t kSharedBytesPerSM = 228 * 1024;
constexpr int64_t kSharedReservedPerBlock = 1024;

/// Entries (token, slot) a Gathered block walks, 64 / G per 64-row chunk:
/// up to this many chunks per block, sharing one load of the keys.
constexpr int64_t kGatheredChunks = 8;

/// The shape of one flash kernel.
struct FlashConfig {
  FlashKeys keys;
  int64_t window = 0;                  ///< w (Window)
  int64_t cmpBlock = 1, cmpStride = 1; ///< l, d (Compressed; packed offsets)
  int64_t slcBlock = 0, numSlots = 0;  ///< l', n (Selected)
  double scale = 1.0;
  int64_t kvHeads = 0, group = 0, qkDim = 0, vDim = 0;
  /// Warps along query rows (16 rows each) and along the keys of a tile.
  int64_t warpsM = 4, warpsN = 1;
  /// Keys per tile (Selected: l'), split evenly over warpsN.
  int64_t keyTile = 64;
  int64_t stages = 2;
  /// sm_90a: S = Q K^T and O += P V by wgmma (a warpgroup per 64 rows, Q
  /// and the key tiles in 128-byte-swizzled shared memory, P from
  /// registers) instead of mma.sync, the key tiles loaded by TMA into a
  /// ring of `stages` buffers on mbarriers. See wgmmaFits.
  bool wgmma = false;
  /// sm_90a: the key tiles come by TMA (128-byte-swizzled, an mbarrier
  /// ring) also for mma.sync kernels; wgmma implies it. See tmaFits.
  bool tma = false;
  /// wgmma window or compressed attention of two warpgroups with a 2-stage
  /// ring (FlashBuilder::overlappedLoop): K and V of a tile on their own
  /// mbarriers and released apart, per warp (releaseStage); an iteration
  /// issues this tile's S and the last tile's P V, and its softmax runs
  /// while P V is in flight.
  bool overlap = false;
  /// With overlap and two warpgroups: they take turns issuing their
  /// products (named barriers 1 and 2), so that one's softmax runs while
  /// the other's products do.
  bool pingpong = false;
  /// Block selection (nsa.select_blocks, keys Compressed) instead of
  /// attention: scores from the compression probabilities (Spec 5.1-5.3),
  /// the top `numSelected` with the backbone forced (5.4) into `indices`.
  bool select = false;
  int64_t numSelected = 0;
  spec::Backbone backbone;

  int64_t warps() const { return warpsM * warpsN; }
  int64_t rows() const { return 16 * warpsM; }
  /// Query heads of one token in a block, and tokens per block.
  int64_t headsPerBlock() const { return group < rows() ? group : rows(); }
  /// Rows a token takes: its heads, or (selection) 16, one warp, whose
  /// rows past G are padding.
  int64_t rowsPerToken() const { return select ? 16 : headsPerBlock(); }
  int64_t tokensPerBlock() const { return rows() / rowsPerToken(); }
  /// Selected attention whose warps each hold heads of one token (G a
  /// multiple of 16, several tokens a block): the block loads the union of
  /// its tokens' blocks once, and a warp skips those its token did not
  /// choose.
  bool warpSkips() const {
    return keys == FlashKeys::Selected && tokensPerBlock() > 1 &&
           rowsPerToken() % 16 == 0;
  }
  /// wgmma kernels of two warpgroups: no block barrier per key tile, each
  /// warp counts itself out of a ring stage and the last one refills it
  /// (FlashBuilder::releaseStage), so that the warpgroups need not keep in
  /// step. That is faster for compressed attention and block selection,
  /// slower with one warpgroup (window attention) and four mma.sync warps
  /// (selected attention), so those keep the barrier.
  bool releasesStages() const { return wgmma && warps() > 4; }
  /// Whether S's wgmmas take Q's descriptor of each k16 step from before
  /// the key-tile loop (hoisted: one 64-bit value a step held across it)
  /// rather than adding the step's offset inside the wgmma. Kernels with
  /// registers to spare hoist (block selection, one-warpgroup attention:
  /// two blocks an SM either way); two-warpgroup attention does not, which
  /// keeps 128-key tiles within 255 registers.
  bool hoistsQDescriptors() const { return select || warps() <= 4; }
  /// The per-warp release counts in shared memory: one a stage, or with
  /// overlap one for its keys and one for its values; 0 without releases.
  int64_t releaseCounts() const {
    return releasesStages() || overlap ? stages * (overlap ? 2 : 1) : 0;
  }
  /// Selected attention whose warps hold rows of several tokens (G < 16):
  /// each row is masked to the blocks its own token chose.
  bool masksByToken() const {
    return keys == FlashKeys::Selected && tokensPerBlock() > 1 && !warpSkips();
  }
};


/// Why `config` cannot be built, or "" if it can.
std::string checkFlashConfig(const FlashConfig &config);

/// Whether `config` (window or compressed attention, or block selection)
/// can take the wgmma kernel: one or two warpgroups along the rows (4 or 8
/// warps, one along the keys), 64-key tiles (attention: also 96 or 128),
/// Dqk and Dv multiples of 64.
bool wgmmaFits(const FlashConfig &config);

/// Whether the key tiles of `config` can come by TMA: Dqk and Dv multiples
/// of 64 and key tiles a multiple of 8 rows.
bool tmaFits(const FlashConfig &config);

/// The operands, all memrefs in device memory: q [B, T, HQ, Dqk], k and v
/// [B, Tk, H, D] (compressed rows for Compressed), indices [B, T, H, n] i32
/// (Selected), cuSeqlens [S + 1] i32 or null, out [B, T, HQ, Dv] (bf16) and
/// lse [B, T, HQ] f32. Selection reads k (the compressed keys) and lse (of
/// the compressed attention) and writes indices.
struct FlashOperands {
  Value q, k, v, indices, cuSeqlens, out, lse;
  /// Gathered: the inverted index (buildBlockMajorSelected): per
  /// (batch, KV head, block) its entries' first position in `entries`
  /// (t * n + slot, i32), their count, and its first work item
  /// (`itemStart`, one more: the total). out and lse are the partial rows
  /// [B, T * n, HQ, Dv] and [B, T * n, HQ].
  Value entries, entryStart, counts, itemStart;
  /// wgmma: TMA tensor maps of k and v (made by buildFlashKernel).
  Value kMap, vMap;
  /// Where set, nsa.combine is the epilogue (Spec section 8): `out` is the
  /// layer's output, sigmoid(g0) * cmp + sigmoid(g1) * slc + sigmoid(g2) *
  /// this kernel's O (f32, before rounding), with `gates` [B, T, HQ, 3] and
  /// the other branches' O, all in `out`'s layout.
  Value combineCmp, combineSlc, combineGates;
};

/// Builds the launch at the builder's insertion point and names its kernel
/// `kernelName`. `config` must pass checkFlashConfig.
gpu::LaunchOp buildFlashKernel(OpBuilder &b, Location loc,
                               const FlashConfig &config,
                               const FlashOperands &operands,
                               StringRef kernelName);

/// Compression (nsa.compress, Spec section 3) of bf16 keys or values
/// [B, T, H, dim]: `block` = l tokens every `stride` = d tokens.
struct CompressConfig {
  int64_t heads = 0, dim = 0, block = 0, stride = 0;
};

/// One launch that pools every compressed row straight from device memory
/// (no shared memory): the mean, or the weights [H, l] f32 when given. The
/// packed layout's rows past the last sequence are left alone.
gpu::LaunchOp buildCompressKernel(OpBuilder &b, Location loc,
                                  const CompressConfig &config, Value input,
                                  Value weights, Value cuSeqlens, Value out,
                                  StringRef kernelName);

/// Gating (nsa.combine, Spec section 8) of bf16 branch outputs
/// [B, T, HQ, Dv] (Dv a multiple of 8, rows 16-byte aligned) with the gate
/// logits [B, T, HQ, 3] into `out`.
gpu::LaunchOp buildCombineKernel(OpBuilder &b, Location loc, int64_t qHeads,
                                 int64_t vDim, Value cmp, Value slc, Value win,
                                 Value gates, Value out, StringRef kernelName);

/// Whether buildCombineGradKernel takes rows of `vDim`: Dv / 8 threads a
/// row, a power of two of at most 32 (the lanes of one warp).
bool combineGradFits(int64_t vDim);

/// The gradient of the gating (nsa.combine_grad, Spec section 9) of bf16
/// `branches` (compressed, selected, window) [B, T, HQ, Dv] with the gate
/// logits `gates` [B, T, HQ, 3] for the output gradient `grad`: writes
/// `branchGrads[b] = sigmoid(g_b) grad` and `gatesGrad[.., b] =
/// sigmoid'(g_b) (o_b . grad)`, evaluated in f32 and rounded once. Dv / 8
/// must be a power of two of at most 32 (combineGradFits). Where
/// `deltas[b]` is not null ([B, T, HQ] f32) it also writes there the
/// branch's D = rowsum(branchGrads[b] * o_b), with branchGrads[b] rounded as
/// stored: what that branch's attention gradient computes first
/// (FlashGradOperands::deltaReady).
gpu::LaunchOp buildCombineGradKernel(OpBuilder &b, Location loc, int64_t qHeads,
                                     int64_t vDim, ArrayRef<Value> branches,
                                     Value gates, Value grad,
                                     ArrayRef<Value> branchGrads,
                                     Value gatesGrad, ArrayRef<Value> deltas,
                                     StringRef kernelName);

/// Block-major selected attention (`config.keys` Gathered, no cu_seqlens):
/// the inverted index of `ops.indices` (per batch, KV head and block, the
/// (token, slot) entries that chose it: counted, scanned and placed), one
/// launch of the Gathered kernel writing each entry's partial (O, lse), and
/// their merge per (token, query head) into `ops.out` and `ops.lse`. An
/// entry is valid if its block j has 0 <= j <= t / l' and no earlier slot
/// of t holds j (Spec section 6); tokens without one get 0 and -inf.
void buildBlockMajorSelected(OpBuilder &b, Location loc,
                             const FlashConfig &config,
                             const FlashOperands &ops, StringRef kernelName);

/// The gradient kernels of window, compressed or selected attention
/// (nsa.*_attention_grad; FlashGrad.cpp): FlashAttention-2's backward
/// without atomics, in three launches. The first computes per (token, head)
/// row `D = rowsum(grad * output)` and the lse in log2 units; the second,
/// query-major, `dq` (S and dP recomputed per key tile; selected attention
/// walks the distinct blocks the block's tokens chose); the third,
/// key-major, `dk` and `dv` of one KV head's keys (selected: one selection
/// block) over the query rows that see them, in increasing token order.
/// Each output element is accumulated by one thread in a fixed order and
/// written once: the results are deterministic.
struct FlashGradConfig {
  FlashKeys keys = FlashKeys::Window; ///< Window, Compressed or Selected
  int64_t window = 0;
  int64_t cmpBlock = 1, cmpStride = 1;
  int64_t slcBlock = 0, numSlots = 0; ///< l', n (Selected)
  double scale = 1.0;
  int64_t kvHeads = 0, group = 0, qkDim = 0, vDim = 0;
  /// dq: warps (16 query rows each; selected: 16 keys each of a block) and
  /// keys per tile (selected: one block).
  int64_t queryWarps = 4, queryKeyTile = 32;
  /// dk, dv: warps (16 keys each) and query rows per step.
  int64_t keyWarps = 4, keyQueryRows = 32;
  /// dk, dv: where positive, a key block's tokens are split into chunks of
  /// this many, one thread block each (the first chunks of a compressed or
  /// selected key block see far more tokens than the last ones); the
  /// chunks add their sums into dk and dv (zeroed by the caller) in chunk
  /// order, each waiting for its turn on a counter in `turns`.
  int64_t chunkTokens = 0;
  /// With chunkTokens: the chunks add in chunk order, each waiting for its
  /// turn (the same bits on every call); off, as they finish.
  bool deterministic = true;
  /// sm_90a: the products of every gradient kernel by wgmma (see
  /// gradWgmmaFits). A kernel's warpgroup holds its resident rows (dq: Q
  /// and dO; dk, dv: K and V) and a 2-stage cp.async ring of what it walks
  /// (dq: key tiles of K and V; dk, dv: query rows of Q and dO), all in
  /// 128-byte-swizzled shared memory. Both score products (S and dP, or
  /// their transposes) are m64nNk16 chains from shared memory; the
  /// gradients' (dq += dS K; dv += P^T dO, dk += dS^T Q) take the A
  /// operand from registers and read B transposed. Selected attention's dq
  /// (selectedQueryRows resident rows) takes the transposes: S^T = K Q^T and
  /// dP^T = V dO^T with the block's 64 keys as M, then dq^T += K^T dS^T with K
  /// read transposed and dS^T through shared memory.
  bool wgmma = false;
  /// With wgmma: the tiles the kernels walk (dq: K and V; window and
  /// compressed dk, dv: Q and dO) by TMA into an mbarrier ring, from tensor
  /// maps made on the host, instead of cp.async from every thread.
  bool tma = false;
  /// Selected attention's dq: (token, head) rows a block, the G heads of
  /// selectedQueryRows / G tokens, whose chosen blocks it walks once: 16,
  /// or with wgmma 32 (the N of its transposed products).
  int64_t selectedQueryRows = 16;

  /// (token, head) rows of a dq block: 16 per warp, or (selected: the
  /// warps split each block's keys) selectedQueryRows.
  int64_t queryRows() const {
    return keys == FlashKeys::Selected ? selectedQueryRows : 16 * queryWarps;
  }
};

/// Operands (memrefs in device memory): q, k, v, indices, out and lse as
/// for the forward kernel, grad [B, T, HQ, Dv] (bf16), cuSeqlens or null;
/// results dq [B, T, HQ, Dqk], dk and dv with the shapes of k and v, all f32,
/// and the rows' D and log2 lse, [B, T, HQ] f32 each, which the first launch
/// writes. In the packed layout the caller zeroes dq, dk and dv: rows
/// outside every sequence are not written.
struct FlashGradOperands {
  Value q, k, v, out, lse, grad, cuSeqlens;
  Value indices; ///< Selected: [B, T, H, n] i32
  Value dq, dk, dv, delta, lse2;
  /// With chunkTokens: per (sequence, KV head, key block) i32, zero.
  Value turns;
  /// With tma, the tensor maps buildFlashGradKernels makes: of k and v
  /// (dq), of q and grad (window and compressed dk, dv).
  Value kMap, vMap, qMap, gradMap;
  /// Where the dq kernel's store takes in the sum of the branches' dq
  /// (nsa-decompose's linalg.generic, which the kernel replaces): the terms
  /// of the sum in its order, this kernel's dq a null Value among them (the
  /// others f32 buffers of dq's shape). dq is then the sum's buffer, f32 or
  /// bf16: every element is summed in the generic's order and rounded once,
  /// as the generic would. Empty: dq is this kernel's own f32 dq.
  SmallVector<Value, 3> dqTerms;
  /// delta already holds D (the combine_grad kernel wrote it): the first
  /// launch writes lse2 alone.
  bool deltaReady = false;
};

/// Whether the gradient kernels of `config` can take wgmma: Dqk and Dv
/// multiples of 64, four warps in the dq and the dk, dv kernels.
bool gradWgmmaFits(const FlashGradConfig &config);

/// Why the gradient kernels cannot take `config`, or "" if they can.
std::string checkFlashGradConfig(const FlashGradConfig &config);

/// Builds the three launches at the builder's insertion point, named
/// `kernelName` with suffixes `_delta`, `_dq` and `_dkv`.
void buildFlashGradKernels(OpBuilder &b, Location loc,
                           const FlashGradConfig &config,
                           const FlashGradOperands &operands,
                           StringRef kernelName);

/// The first of them (FlashGradDelta.cpp): D = rowsum(grad * output) and
/// lse2 of every (batch, token, head) row, a thread each.
void buildFlashGradDeltaKernel(OpBuilder &b, Location loc,
                               const FlashGradConfig &config,
                               const FlashGradOperands &operands,
                               StringRef kernelName);

/// Bytes of dynamic shared memory the kernel of `config` uses.
int64_t flashSharedMemoryBytes(const FlashConfig &config);

} // namespace mlir::nsa::detail

#endif // NSA_LIB_CONVERSION_NSATOGPU_FLASHKERNEL_H
