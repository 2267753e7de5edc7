//===- AsyncLaunches.cpp - one stream for a function's GPU work -----------===//
//
// `nsa-async-launches` runs after nsa-map-to-gpu: it chains the GPU work of
// each block of host code (allocations, copies, launches, deallocations)
// on one async token, so that the generated code enqueues it on one stream
// and waits once, where the host needs the results, instead of creating,
// synchronizing and destroying a stream for every op.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::nsa {
#define GEN_PASS_DEF_ASYNCLAUNCHES
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;

namespace {

/// Host ops the chain passes over: they touch no memory the GPU work may
/// use. A TMA descriptor reads only a memref's metadata (the runtime may
/// copy the descriptor to the device, synchronously and into memory of its
/// own).
bool isTransparent(Operation *op) {
  if (op->hasTrait<OpTrait::IsTerminator>() || op->getNumRegions())
    return false;
  return isa<nvgpu::TmaCreateDescriptorOp>(op) || isMemoryEffectFree(op);
}

/// `op` (a gpu.launch without a token) recreated to return one, after
/// `dependency`.
Operation *withToken(Operation *op, Value dependency) {
  auto async = cast<gpu::AsyncOpInterface>(op);
  async.addAsyncDependency(dependency);
  OpBuilder b(op);
  OperationState state(op->getLoc(), op->getName());
  state.addOperands(op->getOperands());
  state.addTypes(op->getResultTypes());
  state.addTypes(gpu::AsyncTokenType::get(op->getContext()));
  state.propertiesAttr = op->getPropertiesAsAttribute();
  state.addAttributes(op->getDiscardableAttrDictionary().getValue());
  for (unsigned i = 0; i < op->getNumRegions(); ++i)
    state.addRegion();
  Operation *created = b.create(state);
  for (unsigned i = 0; i < op->getNumRegions(); ++i)
    created->getRegion(i).takeBody(op->getRegion(i));
  op->replaceAllUsesWith(created->getResults().drop_back());
  op->erase();
  return created;
}

struct AsyncLaunchesPass
    : mlir::nsa::impl::AsyncLaunchesBase<AsyncLaunchesPass> {
  void runOnOperation() override {
    // Host code only: not the kernels' bodies.
    getOperation()->walk([&](Block *block) {
      Operation *parent = block->getParentOp();
      if (!isa<gpu::LaunchOp>(parent) &&
          !parent->getParentOfType<gpu::LaunchOp>())
        chain(*block);
    });
  }

  /// Threads one token through the GPU ops of `block`, waiting for it (on
  /// the host) before any other op that may touch memory, ops with regions
  /// and the terminator.
  void chain(Block &block) {
    Value current;
    for (Operation &op : llvm::make_early_inc_range(block)) {
      if (auto wait = dyn_cast<gpu::WaitOp>(&op)) {
        ValueRange deps = wait.getAsyncDependencies();
        if (Value token = wait.getAsyncToken()) {
          // `gpu.wait async`: a new token (without dependencies) continues
          // the chain; one after other tokens also waits for the chain.
          if (current && deps.empty()) {
            token.replaceAllUsesWith(current);
            wait.erase();
            continue;
          }
          if (current)
            wait.addAsyncDependency(current);
          current = token;
          continue;
        }
        // A host wait for the chain alone: the chain keeps the order.
        if (current && deps.size() == 1 && deps.front() == current) {
          wait.erase();
          continue;
        }
        if (current && !llvm::is_contained(deps, current))
          wait.addAsyncDependency(current);
        current = {};
        continue;
      }
      if (auto async = dyn_cast<gpu::AsyncOpInterface>(&op)) {
        if (Value token = async.getAsyncToken()) {
          // Already async: after the chain, unless it waits for it.
          if (current &&
              !llvm::is_contained(async.getAsyncDependencies(), current))
            async.addAsyncDependency(current);
          current = token;
          continue;
        }
        if (!current) {
          OpBuilder b(&op);
          current = gpu::WaitOp::create(
                        b, op.getLoc(),
                        gpu::AsyncTokenType::get(op.getContext()), ValueRange{})
                        .getAsyncToken();
        }
        current = withToken(&op, current)->getResults().back();
        continue;
      }
      if (!current || isTransparent(&op))
        continue;
      OpBuilder b(&op);
      gpu::WaitOp::create(b, op.getLoc(), Type(), ValueRange{current});
      current = {};
    }
  }
};

} // namespace
