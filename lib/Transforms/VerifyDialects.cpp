//===- VerifyDialects.cpp - the contract check at the end of a pipeline ---===//
//
// `nsa-verify-dialects{allowed=...}` ends every nsa pipeline: nothing but the
// dialects the next consumer understands (LLVM for the CPU; GPU, NVVM and
// LLVM for the GPU path) may remain.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/Passes.h"

#include "mlir/IR/Dialect.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::nsa {
#define GEN_PASS_DEF_VERIFYDIALECTS
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;

namespace {

struct VerifyDialectsPass
    : mlir::nsa::impl::VerifyDialectsBase<VerifyDialectsPass> {
  using Base::Base;

  void runOnOperation() override {
    WalkResult result = getOperation()->walk([&](Operation *op) {
      StringRef ns = op->getName().getDialectNamespace();
      if (llvm::is_contained(forbidden, ns)) {
        op->emitError() << "nsa-verify-dialects: '" << op->getName()
                        << "' must be lowered before this point ("
                        << llvm::join(forbidden, ", ")
                        << " not accepted here)";
        return WalkResult::interrupt();
      }
      if (allowed.empty() || llvm::is_contained(allowed, ns))
        return WalkResult::advance();
      op->emitError() << "nsa-verify-dialects: '" << op->getName()
                      << "' remains after lowering; only "
                      << llvm::join(allowed, ", ") << " may remain";
      return WalkResult::interrupt();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
