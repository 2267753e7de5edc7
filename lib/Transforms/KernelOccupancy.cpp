//===- KernelOccupancy.cpp - registers per thread for the nsa kernels -----===//
//
// `nsa-kernel-occupancy` runs after outlining: it puts `nvvm.minctasm` on the
// kernels, which the NVVM target emits as `.minnctapersm` and ptxas reads
// as the number of resident blocks to plan registers for.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/SymbolTable.h"

#include <algorithm>

namespace mlir::nsa {
#define GEN_PASS_DEF_KERNELOCCUPANCY
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;

namespace {

constexpr StringLiteral kMinBlocksAttr = "nvvm.minctasm";
/// Shared memory of one sm_90 SM, and what the driver reserves per block.
constexpr int64_t kSharedPerSM = 228 * 1024, kReservedPerBlock = 1024;

std::optional<int64_t> constant(Value v) {
  APInt value;
  if (v && matchPattern(v, m_ConstantInt(&value)))
    return value.getSExtValue();
  return std::nullopt;
}

struct KernelOccupancyPass
    : mlir::nsa::impl::KernelOccupancyBase<KernelOccupancyPass> {
  using Base::Base;

  /// Blocks of `launch` that fit on one SM, if its sizes are constant.
  std::optional<int64_t> residentBlocks(gpu::LaunchFuncOp launch) {
    std::optional<int64_t> shared =
        launch.getDynamicSharedMemorySize()
            ? constant(launch.getDynamicSharedMemorySize())
            : std::optional<int64_t>(0);
    gpu::KernelDim3 block = launch.getBlockSizeOperandValues();
    std::optional<int64_t> x = constant(block.x), y = constant(block.y),
                           z = constant(block.z);
    if (!shared || !x || !y || !z || *x * *y * *z <= 0)
      return std::nullopt;
    int64_t bySharedMemory = kSharedPerSM / (*shared + kReservedPerBlock);
    int64_t byThreads = threadsPerSM / (*x * *y * *z);
    return std::clamp<int64_t>(std::min(bySharedMemory, byThreads), 1, 32);
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t threads = threadsPerSM;
    if (threads < 64 || threads > 2048) {
      module.emitError(
          "nsa-kernel-occupancy: threads-per-sm must be in 64..2048, found ")
          << threads;
      return signalPassFailure();
    }
    // The fewest resident blocks over each kernel's launches; 0: unknown.
    llvm::DenseMap<Operation *, int64_t> blocks;
    SymbolTableCollection symbols;
    module.walk([&](gpu::LaunchFuncOp launch) {
      Operation *kernel =
          symbols.lookupNearestSymbolFrom(launch, launch.getKernel());
      if (!kernel)
        return;
      std::optional<int64_t> n = residentBlocks(launch);
      auto [it, inserted] = blocks.try_emplace(kernel, n.value_or(0));
      if (!inserted)
        it->second = (!n || !it->second) ? 0 : std::min(it->second, *n);
    });
    Builder b(&getContext());
    module.walk([&](gpu::GPUFuncOp func) {
      if (!func.isKernel() || func->hasAttr(kMinBlocksAttr))
        return;
      int64_t n = blocks.lookup(func.getOperation());
      func->setAttr(kMinBlocksAttr, b.getI32IntegerAttr(static_cast<int32_t>(
                                        std::max<int64_t>(n, 1))));
    });
  }
};

} // namespace
