//===- NSAToPTX.cpp - the nsa-to-ptx pipeline -----------------------------===//
//
//   nsa ops on tensors (arguments in device memory), or GPU-dialect IR
//     nsa-decompose
//     nsa-flash-attention                  attention-strategy=flash: the
//                                          attention branches as hand-built
//                                          FlashAttention-2 kernels
//     nsa-tile                             the rest, as for the CPU
//     one-shot-bufferize                   tiles of static shape, in place
//     nsa-map-to-gpu                       forall -> gpu.launch, tiles in
//                                          shared memory, ops over threads
//     convert-nvgpu-to-nvvm                TMA descriptors, mbarriers, ...
//     gpu-launch-sink-index-computations   constants back into the launches
//     gpu-kernel-outlining, nvvm-attach-target (sm_90a, +ptx81),
//     scf/affine/memref lowering, convert-gpu-to-nvvm in the kernels,
//     gpu-to-llvm on the host, gpu-module-to-binary (PTX or cubin)
//     nsa-verify-dialects                  builtin, gpu, llvm, nvvm only
//
// The host side calls the mgpu* ABI implemented by runtime/gpu; translate
// the result with `mlir-translate --mlir-to-llvmir` and compile it with `llc`
// (runtime/gpu/CMakeLists.txt: nsa_add_gpu_object).
//
//===----------------------------------------------------------------------===//

#include "NSA/Conversion/FlashOptions.h"

#include "NSA/Pipelines/Pipelines.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

/// The comma-separated entries of `list`.
static SmallVector<std::string> splitList(StringRef list) {
  SmallVector<StringRef> parts;
  list.split(parts, ',', /*MaxSplit=*/-1, /*KeepEmpty=*/false);
  return llvm::map_to_vector(parts, [](StringRef p) { return p.trim().str(); });
}

/// The PTX ISA version (80 for 8.0) of features "+ptxNN", or 0.
static unsigned ptxVersion(StringRef features) {
  unsigned ptx = 0;
  if (!features.consume_front("+ptx") || features.consumeInteger(10, ptx) ||
      !features.empty())
    return 0;
  return ptx;
}

LogicalResult
nsa::verifyNSAToPTXOptions(const NSAToPTXOptions &options,
                           function_ref<LogicalResult(const Twine &)> error) {
  StringRef chip = options.chip;
  unsigned sm = 0;
  if (!chip.consume_front("sm_") || chip.consumeInteger(10, sm) ||
      !(chip.empty() || chip == "a") || sm < 70)
    return error("nsa-to-ptx: chip must be sm_NN or sm_NNa with NN >= 70, "
                 "found '" +
                 options.chip + "'");
  // The oldest PTX ISA that knows the chip (sm_90a needs 8.0).
  unsigned needed = sm >= 90   ? 80
                    : sm >= 89 ? 78
                    : sm >= 86 ? 71
                    : sm >= 80 ? 70
                               : 60;
  unsigned ptx = ptxVersion(options.features);
  if (!ptx)
    return error("nsa-to-ptx: features must be +ptxNN, found '" +
                 options.features + "'");
  if (ptx < needed)
    return error("nsa-to-ptx: " + options.chip + " needs PTX " +
                 Twine(needed / 10) + "." + Twine(needed % 10) +
                 " or newer (features=+ptx" + Twine(needed) + "), found " +
                 options.features);
  StringRef format = options.format;
  if (format != "isa" && format != "bin" && format != "fatbin")
    return error("nsa-to-ptx: format must be isa, bin or fatbin, found '" +
                 options.format + "'");
  if (options.queryRows <= 0 || options.kvTile <= 0 || options.queryTile < 0)
    return error("nsa-to-ptx: query-rows and kv-tile must be positive and "
                 "query-tile non-negative, found " +
                 Twine(options.queryRows) + ", " + Twine(options.kvTile) +
                 " and " + Twine(options.queryTile));
  if (options.threadsPerSM < 64 || options.threadsPerSM > 2048)
    return error("nsa-to-ptx: threads-per-sm must be 64..2048, found " +
                 Twine(options.threadsPerSM));
  if (failed(parseKernelBlockSizes(
          splitList(options.kernelBlockSizes), [](StringRef, int64_t) {},
          error)))
    return failure();
  StringRef strategy = options.attentionStrategy;
  if (strategy != "flash" && strategy != "flash-sm80" &&
      strategy != "flash-sm90" && strategy != "generic")
    return error("nsa-to-ptx: attention-strategy must be flash, flash-sm80, "
                 "flash-sm90 or generic, found '" +
                 strategy + "'");
  if (strategy.starts_with("flash") && sm < 80)
    return error("nsa-to-ptx: attention-strategy=" + strategy +
                 " needs sm_80 or newer (bf16 mma.sync), found " +
                 options.chip);
  if (strategy == "flash-sm90" && options.chip != "sm_90a")
    return error("nsa-to-ptx: attention-strategy=flash-sm90 needs sm_90a "
                 "(wgmma), found " +
                 options.chip);
  if (!nsa::detail::isFlashTileOrDefault(options.flashQueryRows) ||
      !nsa::detail::isFlashTileOrDefault(options.flashKvTile) ||
      !nsa::detail::isFlashStageCount(options.flashStages))
    return error("nsa-to-ptx: flash-query-rows and flash-kv-tile must be 0 "
                 "or multiples of 16 in 16..128 and flash-stages 2..4, "
                 "found " +
                 Twine(options.flashQueryRows) + ", " +
                 Twine(options.flashKvTile) + " and " +
                 Twine(options.flashStages));
  if (!nsa::detail::isFlashTileOrDefault(options.flashSelectRows))
    return error("nsa-to-ptx: flash-select-rows must be 0 or a multiple of "
                 "16 in 16..128, found " +
                 Twine(options.flashSelectRows));
  if (!nsa::detail::isFlashTileOrDefault(options.flashSelectedRows))
    return error("nsa-to-ptx: flash-selected-rows must be 0 or a multiple "
                 "of 16 in 16..128, found " +
                 Twine(options.flashSelectedRows));
  if (options.flashGradChunkTokens < 0 || options.flashGradChunkTokens % 256)
    return error("nsa-to-ptx: flash-grad-chunk-tokens must be 0 or a "
                 "positive multiple of 256, found " +
                 Twine(options.flashGradChunkTokens));
  if (!nsa::detail::isFlashTileOrDefault(options.flashGradKeyTile))
    return error("nsa-to-ptx: flash-grad-key-tile must be 0 or a multiple "
                 "of 16 in 16..128, found " +
                 Twine(options.flashGradKeyTile));
  if (!nsa::detail::isSelectedOrder(options.flashSelectedOrder))
    return error("nsa-to-ptx: flash-selected-order must be auto, token or "
                 "block, found '" +
                 options.flashSelectedOrder + "'");
  if (options.optLevel < 0 || options.optLevel > 3)
    return error("nsa-to-ptx: opt-level must be 0..3, found " +
                 Twine(options.optLevel));
  return success();
}

void nsa::buildNSAToPTXPipeline(OpPassManager &pm,
                                const NSAToPTXOptions &options) {
  // The tiles, as for the CPU, then onto thread blocks.
  pm.addPass(createDecompose());
  StringRef strategy = options.attentionStrategy;
  if (strategy.starts_with("flash")) {
    // The attention branches the flash kernels take; the rest is tiled.
    FlashAttentionOptions flash;
    flash.sm90 = strategy == "flash-sm90" ||
                  (strategy == "flash" && options.chip == "sm_90a");
    flash.queryRows = options.flashQueryRows;
    flash.selectRows = options.flashSelectRows;
    flash.selectedRows = options.flashSelectedRows;
    flash.kvTile = options.flashKvTile;
    flash.stages = options.flashStages;
    flash.overlap = options.flashOverlap;
    flash.pingpong = options.flashPingpong;
    flash.fuseCombine = options.flashFuseCombine;
    flash.selectedOrder = options.flashSelectedOrder;
    flash.decodeChunkKeys = options.flashDecodeChunkKeys;
    flash.decodeTargetBlocks = options.flashDecodeTargetBlocks;
    flash.decodeClusterSelect = options.flashDecodeClusterSelect;
    // (st.async needs PTX 8.1.)
    flash.decodeClusterPush =
        options.flashDecodeClusterPush && ptxVersion(options.features) >= 81;
    flash.decodeTrace = options.flashDecodeTrace;
    flash.gradChunkTokens = options.flashGradChunkTokens;
    flash.gradDeterministic = options.flashGradDeterministic;
    flash.gradWgmma = options.flashGradWgmma;
    flash.gradTma = options.flashGradTma;
    flash.gradFuseSum = options.flashGradFuseSum;
    flash.gradSelectedRows = options.flashGradSelectedRows;
    flash.gradFuseDelta = options.flashGradFuseDelta;
    flash.gradKeyTile = options.flashGradKeyTile;
    pm.addNestedPass<func::FuncOp>(createFlashAttention(flash));
  }
  buildNSATilePipeline(pm, options.queryTile, options.kvTile,
                       options.queryRows);
  buildNSABufferizePipeline(pm);
  MapToGPUOptions map;
  map.blockSize = options.blockSize;
  map.kernelBlockSizes = splitList(options.kernelBlockSizes);
  pm.addNestedPass<func::FuncOp>(createMapToGPU(map));
  pm.addPass(createCanonicalizerPass());
  VerifyDialectsOptions noNSA;
  noNSA.forbidden = {"nsa", "linalg", "tensor", "bufferization"};
  pm.addPass(createVerifyDialects(noNSA));
  // The host side: the GPU work of a call on one stream.
  pm.addNestedPass<func::FuncOp>(createAsyncLaunches());

  // Kernels: outline, attach the NVVM target, lower to NVVM. nvgpu goes
  // first, as in upstream's pipeline: a TMA descriptor made on the host and
  // used in a gpu.launch body becomes a pointer before it turns into a
  // kernel argument.
  pm.addPass(createConvertNVGPUToNVVMPass());
  // The canonicalizer hoisted the kernels' constants out of their launches:
  // sink them back, else each becomes a kernel argument (and divisions by
  // them 64-bit divisions at run time).
  pm.addPass(createGpuLaunchSinkIndexComputationsPass());
  pm.addPass(createGpuKernelOutliningPass());
  KernelOccupancyOptions occupancy;
  occupancy.threadsPerSM = options.threadsPerSM;
  pm.addPass(createKernelOccupancy(occupancy));
  GpuNVVMAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features;
  target.optLevel = options.optLevel;
  target.cmdOptions = options.ptxasOptions;
  pm.addPass(createGpuNVVMAttachTarget(target));
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createSCFToControlFlowPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createConvertGpuOpsToNVVMOps());
  pm.addPass(createConvertNVVMToLLVMPass());

  // Host: the launches become calls of the mgpu* ABI.
  pm.addPass(createGpuToLLVMConversionPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());

  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  // The toolkit provides libdevice (math functions such as __nv_expf) and
  // ptxas; without it exp/log would stay unresolved.
  binary.toolkitPath = options.toolkit.empty() ? std::string(NSA_CUDA_TOOLKIT)
                                               : std::string(options.toolkit);
  binary.cmdOptions = options.ptxasOptions;
  pm.addPass(createGpuModuleToBinaryPass(binary));

  VerifyDialectsOptions verify;
  verify.allowed = {"builtin", "gpu", "llvm", "nvvm"};
  pm.addPass(createVerifyDialects(verify));
}
