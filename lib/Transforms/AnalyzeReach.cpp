//===- AnalyzeReach.cpp - hop bound of each layer's backbone --------------===//
//
// `nsa-analyze-reach`: states, for each nsa.sparse_attention, how many layers
// information needs in the worst case to reach every later token through the
// always-on blocks and the window (include/NSA/Reach.h), as a remark and as
// the attribute `nsa.reach`. An analysis: the IR is otherwise unchanged.
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Reach.h"
#include "NSA/Transforms/Passes.h"

namespace mlir::nsa {
#define GEN_PASS_DEF_ANALYZEREACH
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;
using namespace mlir::nsa;

namespace {

struct AnalyzeReachPass
    : mlir::nsa::impl::AnalyzeReachBase<AnalyzeReachPass> {
  using Base::Base;

  void runOnOperation() override {
    WalkResult result = getOperation()->walk([&](SparseAttentionOp op) {
      ConfigAttr config = op.getConfig();
      int64_t tokens = seqLen;
      if (tokens <= 0)
        tokens = config.getMaxTokens();
      if (tokens <= 0)
        tokens = op.getQuery().getType().getDimSize(1);
      if (tokens <= 0 || ShapedType::isDynamic(tokens)) {
        op.emitError() << "nsa-analyze-reach: no sequence length: pass "
                          "seq-len, declare max_tokens or use a static T";
        return WalkResult::interrupt();
      }
      int64_t blocks =
          spec::numSelectionBlocks(tokens, config.getSlcBlock());
      if (blocks > spec::kMaxReachBlocks) {
        op.emitError() << "nsa-analyze-reach: the hop bound is computed for "
                          "at most "
                       << spec::kMaxReachBlocks << " selection blocks, found "
                       << blocks << " at T = " << tokens;
        return WalkResult::interrupt();
      }
      spec::ReachReport r = spec::analyzeReach(
          tokens, config.getSlcBlock(), config.getWindow(),
          config.getBackbone().getSpec());
      if (r.tooCostly) {
        op.emitError() << "nsa-analyze-reach: the hop bound at T = " << tokens
                       << " (l' = " << config.getSlcBlock()
                       << ", w = " << config.getWindow()
                       << ") is not computed: it takes more than "
                       << spec::kMaxReachSteps
                       << " search steps (or T is above 2^60)";
        return WalkResult::interrupt();
      }
      InFlightDiagnostic remark = op.emitRemark() << "nsa-analyze-reach: ";
      if (r.hops < 0)
        remark << "some later token is never reached";
      else
        remark << "worst case " << r.hops << " hops";
      remark << " at T = " << tokens << " (from the first token of block "
             << r.sourceBlock << " to block " << r.targetBlock << "); "
             << r.forcedBlocks << " forced blocks, " << r.backboneKeys
             << " backbone + window keys per query";
      op->setAttr("nsa.reach",
                  ReachAttr::get(&getContext(), tokens, r.hops,
                                 r.forcedBlocks, r.backboneKeys));
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
