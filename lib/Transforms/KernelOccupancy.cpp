//===- KernelOccupancy.cpp - registers per thread for the nsa kernels -----===//
//
// `nsa-kernel-occupancy` runs on each gpu.module after outlining: it puts
// `nvvm.minctasm` on the kernels, which the NVVM target emits as
// `.minnctapersm` and ptxas reads as the occupancy to plan registers for.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"

namespace mlir::nsa {
#define GEN_PASS_DEF_NSAKERNELOCCUPANCY
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;

namespace {

constexpr StringLiteral kMinBlocksAttr = "nvvm.minctasm";

struct NSAKernelOccupancyPass
    : mlir::nsa::impl::NSAKernelOccupancyBase<NSAKernelOccupancyPass> {
  using Base::Base;

  void runOnOperation() override {
    int64_t blocks = minBlocksPerSM;
    if (blocks < 1 || blocks > 32) {
      getOperation().emitError(
          "nsa-kernel-occupancy: min-blocks-per-sm must be in 1..32, found ")
          << blocks;
      return signalPassFailure();
    }
    Builder b(&getContext());
    for (auto func : getOperation().getOps<gpu::GPUFuncOp>())
      if (func.isKernel() && !func->hasAttr(kMinBlocksAttr))
        func->setAttr(kMinBlocksAttr,
                      b.getI32IntegerAttr(static_cast<int32_t>(blocks)));
  }
};

} // namespace
