//===- Pipelines.h - named nsa pipelines -------------------------*- C++ -*-===//
//
// The named pipelines of the project, each built by one function from a
// typed option struct and registered once with the pass registry.
//
//   nsa-to-cpu: nsa ops on tensors -> LLVM dialect for the host CPU
//               (run by mlir-runner or the ExecutionEngine).
//
//===----------------------------------------------------------------------===//

#ifndef NSA_PIPELINES_PIPELINES_H
#define NSA_PIPELINES_PIPELINES_H

#include "mlir/Pass/PassOptions.h"

namespace mlir {
class DialectRegistry;
class OpPassManager;
namespace nsa {

/// Inserts the nsa dialect, every dialect the nsa pipelines produce, and the
/// interface models their passes need (bufferization, deallocation,
/// LLVM IR translation) into `registry`.
void registerNSAPipelineDialects(DialectRegistry &registry);

struct NSAToCPUOptions : public PassPipelineOptions<NSAToCPUOptions> {
  Option<int64_t> queryTile{*this, "query-tile",
                            llvm::cl::desc("query tokens per tile"),
                            llvm::cl::init(16)};
  Option<int64_t> kvTile{*this, "kv-tile",
                         llvm::cl::desc("keys or compressed blocks per tile"),
                         llvm::cl::init(64)};
};

/// nsa.sparse_attention (or branch ops) on tensors -> LLVM dialect:
/// decompose, tile, bufferize, free buffers, lower loops, lower to LLVM, and
/// check that only the LLVM and builtin dialects remain.
void buildNSAToCPUPipeline(OpPassManager &pm, const NSAToCPUOptions &options);

struct NSAToPTXOptions : public PassPipelineOptions<NSAToPTXOptions> {
  Option<std::string> chip{*this, "chip",
                           llvm::cl::desc("target: sm_90a (default), sm_80"),
                           llvm::cl::init("sm_90a")};
  Option<std::string> features{*this, "features",
                               llvm::cl::desc("PTX features"),
                               llvm::cl::init("+ptx81")};
  Option<int> optLevel{*this, "opt-level", llvm::cl::desc("NVVM opt level"),
                       llvm::cl::init(3)};
  Option<std::string> format{
      *this, "format",
      llvm::cl::desc("isa (PTX, JIT-compiled by the driver), bin (cubin, "
                     "needs ptxas) or fatbin"),
      llvm::cl::init("bin")};
  Option<std::string> toolkit{
      *this, "toolkit",
      llvm::cl::desc("CUDA toolkit (libdevice, ptxas); default: the one "
                     "found when nsa was built"),
      llvm::cl::init("")};
  Option<std::string> ptxasOptions{*this, "ptxas-options",
                                   llvm::cl::desc("extra ptxas options"),
                                   llvm::cl::init("")};
  Option<int64_t> queryTile{
      *this, "query-tile",
      llvm::cl::desc("query tokens per tile (0: query-rows (token, head) "
                     "rows)"),
      llvm::cl::init(0)};
  Option<int64_t> queryRows{
      *this, "query-rows",
      llvm::cl::desc("(token, head) rows per query tile when query-tile is 0"),
      llvm::cl::init(128)};
  Option<int64_t> kvTile{*this, "kv-tile",
                         llvm::cl::desc("keys or compressed blocks per tile"),
                         llvm::cl::init(32)};
  Option<int64_t> blockSize{*this, "block-size",
                            llvm::cl::desc("threads per thread block"),
                            llvm::cl::init(384)};
  Option<std::string> kernelBlockSizes{
      *this, "kernel-block-sizes",
      llvm::cl::desc("threads per block of the kernels of some ops, as "
                     "op=threads,... (nsa-map-to-gpu)"),
      llvm::cl::init("select_blocks=256,selected_attention=128")};
  Option<std::string> attentionStrategy{
      *this, "attention-strategy",
      llvm::cl::desc("GPU strategy of the attention branches: flash-sm90 "
                     "(hand-built FlashAttention kernels on wgmma, "
                     "nsa-flash-attention; sm_90a), flash-sm80 (the same on "
                     "mma.sync; sm_80+), flash (flash-sm90 on sm_90a, else "
                     "flash-sm80) or generic (nsa-tile + nsa-map-to-gpu)"),
      llvm::cl::init("flash")};
  Option<int64_t> flashQueryRows{
      *this, "flash-query-rows",
      llvm::cl::desc("rows per block of the flash window and compressed "
                     "kernels (0: chosen per kernel, see nsa-flash-attention)"),
      llvm::cl::init(0)};
  Option<int64_t> flashSelectRows{
      *this, "flash-select-rows",
      llvm::cl::desc("rows per block of the flash block-selection kernel "
                     "(0: 128 with flash-sm90, else 64)"),
      llvm::cl::init(0)};
  Option<int64_t> flashSelectedRows{
      *this, "flash-selected-rows",
      llvm::cl::desc("rows per block of the flash token-major selected "
                     "attention kernel (0: chosen per kernel, see "
                     "nsa-flash-attention)"),
      llvm::cl::init(0)};
  Option<int64_t> flashKvTile{
      *this, "flash-kv-tile",
      llvm::cl::desc("keys per tile of the flash window and compressed "
                     "kernels (0: chosen per kernel, see nsa-flash-attention)"),
      llvm::cl::init(0)};
  Option<int64_t> flashStages{
      *this, "flash-stages",
      llvm::cl::desc("shared-memory buffers of the flash key-tile ring (3 "
                     "or more: the wgmma attention kernels issue the next "
                     "tile's S before this tile's softmax)"),
      llvm::cl::init(2)};
  Option<bool> flashOverlap{
      *this, "flash-overlap",
      llvm::cl::desc("two-warpgroup wgmma attention issues a tile's S with "
                     "the last tile's P V and runs the softmax under P V "
                     "(see nsa-flash-attention's overlap)"),
      llvm::cl::init(true)};
  Option<bool> flashPingpong{
      *this, "flash-pingpong",
      llvm::cl::desc("with flash-overlap, the two warpgroups take turns "
                     "issuing their products (see nsa-flash-attention's "
                     "pingpong)"),
      llvm::cl::init(false)};
  Option<bool> flashFuseCombine{
      *this, "flash-fuse-combine",
      llvm::cl::desc("the flash window kernel computes the layer's combine "
                     "in its epilogue (see nsa-flash-attention's "
                     "fuse-combine)"),
      llvm::cl::init(true)};
  Option<std::string> flashSelectedOrder{
      *this, "flash-selected-order",
      llvm::cl::desc("loop order of flash selected attention: token (a "
                     "block per query tile, reading its tokens' blocks), "
                     "block (a block per selected block, its tokens' rows "
                     "gathered; sm_90a, no cu_seqlens) or auto (block for "
                     "G <= 4, see nsa-flash-attention)"),
      llvm::cl::init("auto")};
  Option<int64_t> flashDecodeChunkKeys{
      *this, "flash-decode-chunk-keys",
      llvm::cl::desc("keys a block of the flash decoding kernels stages at "
                     "once (64 or 128; see nsa-flash-attention's "
                     "decode-chunk-keys)"),
      llvm::cl::init(128)};
  Option<int64_t> flashDecodeTargetBlocks{
      *this, "flash-decode-target-blocks",
      llvm::cl::desc("blocks a flash decoding launch aims for (see "
                     "nsa-flash-attention's decode-target-blocks)"),
      llvm::cl::init(528)};
  Option<bool> flashDecodeClusterSelect{
      *this, "flash-decode-cluster-select",
      llvm::cl::desc("one-launch decoding steps choose the selection "
                     "blocks across the cluster (see nsa-flash-attention's "
                     "decode-cluster-select)"),
      llvm::cl::init(false)};
  Option<bool> flashDecodeClusterPush{
      *this, "flash-decode-cluster-push",
      llvm::cl::desc("one-launch decoding steps merge the late splits "
                     "pushed into their owners' shared memory (see "
                     "nsa-flash-attention's decode-cluster-push; taken "
                     "with features=+ptx81 or later)"),
      llvm::cl::init(true)};
  Option<bool> flashDecodeTrace{
      *this, "flash-decode-trace",
      llvm::cl::desc("profiling: one-launch decoding steps print phase "
                     "stamps (see nsa-flash-attention's decode-trace)"),
      llvm::cl::init(false)};
  Option<int64_t> flashGradChunkTokens{
      *this, "flash-grad-chunk-tokens",
      llvm::cl::desc("tokens per dk, dv block of the flash compressed and "
                     "selected attention gradients (a multiple of 256, 0: "
                     "unchunked; see nsa-flash-attention's "
                     "grad-chunk-tokens)"),
      llvm::cl::init(4096)};
  Option<bool> flashGradDeterministic{
      *this, "flash-grad-deterministic",
      llvm::cl::desc("the chunks of a key block add into dk, dv in a fixed "
                     "order (the same bits on every call); off, as they "
                     "finish (see nsa-flash-attention's "
                     "grad-deterministic)"),
      llvm::cl::init(true)};
  Option<bool> flashGradWgmma{
      *this, "flash-grad-wgmma",
      llvm::cl::desc("on sm_90a, the dq kernels of the flash window and "
                     "compressed attention gradients by wgmma (see "
                     "nsa-flash-attention's grad-wgmma)"),
      llvm::cl::init(true)};
  Option<bool> flashGradTma{
      *this, "flash-grad-tma",
      llvm::cl::desc("on sm_90a with flash-grad-wgmma, the gradient "
                     "kernels' walked tiles by TMA (see nsa-flash-attention's "
                     "grad-tma)"),
      llvm::cl::init(true)};
  Option<bool> flashGradFuseSum{
      *this, "flash-grad-fuse-sum",
      llvm::cl::desc("the last flash attention gradient's dq kernel writes "
                     "the sum of the branches' dq (see nsa-flash-attention's "
                     "grad-fuse-sum)"),
      llvm::cl::init(true)};
  Option<bool> flashGradFuseDelta{
      *this, "flash-grad-fuse-delta",
      llvm::cl::desc("the flash combine_grad kernel writes the attention "
                     "gradients' D (see nsa-flash-attention's "
                     "grad-fuse-delta)"),
      llvm::cl::init(true)};
  Option<int64_t> flashGradSelectedRows{
      *this, "flash-grad-selected-rows",
      llvm::cl::desc("rows per block of the flash selected attention "
                     "gradient's dq kernel (0, 16 or 32; see "
                     "nsa-flash-attention's grad-selected-rows)"),
      llvm::cl::init(0)};
  Option<int64_t> flashGradKeyTile{
      *this, "flash-grad-key-tile",
      llvm::cl::desc("keys per tile of the flash window and compressed "
                     "attention gradients' dq kernels (0 or a multiple of 16 "
                     "in 16..128; see nsa-flash-attention's grad-key-tile)"),
      llvm::cl::init(0)};
  Option<int64_t> threadsPerSM{
      *this, "threads-per-sm",
      llvm::cl::desc("resident threads per SM ptxas plans registers for, "
                     "where shared memory allows (nsa-kernel-occupancy)"),
      llvm::cl::init(512)};
};

/// nsa ops on tensors (whose function arguments live in device memory) ->
/// decompose, tile, bufferize, map the tiles onto thread blocks
/// (nsa-map-to-gpu) -> NVVM -> PTX/cubin embedded in a gpu.binary, host code
/// in the LLVM dialect calling the mgpu* ABI of runtime/gpu; ends by
/// checking that only builtin, gpu, llvm and nvvm remain. GPU-dialect input
/// passes through the first stages unchanged.
void buildNSAToPTXPipeline(OpPassManager &pm, const NSAToPTXOptions &options);

/// Checks the options of nsa-to-ptx (chip, PTX version, format, opt level)
/// before anything runs; reports the first problem through `error`.
LogicalResult
verifyNSAToPTXOptions(const NSAToPTXOptions &options,
                      function_ref<LogicalResult(const Twine &)> error);

/// Registers every nsa pipeline with the global pass registry.
void registerNSAPipelines();

} // namespace nsa
} // namespace mlir

#endif // NSA_PIPELINES_PIPELINES_H
