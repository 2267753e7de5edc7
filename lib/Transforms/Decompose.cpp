//===- Decompose.cpp - nsa.sparse_attention into branch ops ---------------===//
//
// First step of every nsa pipeline:
//
//   nsa.sparse_attention --nsa-decompose--> nsa.compress x2
//                                           nsa.compressed_attention
//                                           nsa.select_blocks
//                                           nsa.selected_attention
//                                           nsa.window_attention
//                                           nsa.combine
//
// The branch ops are then tiled (nsa-tile) for the CPU and GPU back ends.
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::nsa {
#define GEN_PASS_DEF_NSADECOMPOSE
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;
using namespace mlir::nsa;

namespace {

/// `[dims...]` with the element type `elt`.
RankedTensorType tensorOf(ArrayRef<int64_t> dims, Type elt) {
  return RankedTensorType::get(dims, elt);
}

/// Slices `weights[index]` of `cmp_weights [2, H, l]` into `[H, l]`.
Value sliceWeights(PatternRewriter &rewriter, Location loc, Value weights,
                   int64_t index) {
  auto type = cast<RankedTensorType>(weights.getType());
  auto resultType = tensorOf(type.getShape().drop_front(), type.getElementType());
  SmallVector<OpFoldResult> offsets = {rewriter.getIndexAttr(index),
                                       rewriter.getIndexAttr(0),
                                       rewriter.getIndexAttr(0)};
  SmallVector<OpFoldResult> sizes = {rewriter.getIndexAttr(1),
                                     rewriter.getIndexAttr(type.getDimSize(1)),
                                     rewriter.getIndexAttr(type.getDimSize(2))};
  SmallVector<OpFoldResult> strides(3, rewriter.getIndexAttr(1));
  return tensor::ExtractSliceOp::create(rewriter, loc, resultType, weights,
                                        offsets, sizes, strides);
}

struct DecomposeSparseAttention : OpRewritePattern<SparseAttentionOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(SparseAttentionOp op,
                                PatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    ConfigAttr config = op.getConfig();
    auto qType = op.getQuery().getType();
    auto kType = op.getKey().getType();
    auto vType = op.getValue().getType();
    Value cu = op.getCuSeqlens();
    int64_t qkDim = qType.getDimSize(3);
    if (ShapedType::isDynamic(qkDim))
      return rewriter.notifyMatchFailure(op, "dynamic Dqk: no default scale");

    Type f32 = rewriter.getF32Type();
    Type elt = qType.getElementType();
    int64_t batch = qType.getDimSize(0), tokens = qType.getDimSize(1),
            qHeads = qType.getDimSize(2), kvHeads = kType.getDimSize(2),
            vDim = vType.getDimSize(3);

    FloatAttr scale = rewriter.getF32FloatAttr(config.getScaleOr(qkDim));
    IntegerAttr cmpBlock = rewriter.getI64IntegerAttr(config.getCmpBlock());
    IntegerAttr cmpStride = rewriter.getI64IntegerAttr(config.getCmpStride());
    auto pool = PoolKindAttr::get(getContext(), config.getPool());

    // Compression (phi) of keys and values.
    Value kWeights, vWeights;
    if (Value w = op.getCmpWeights()) {
      kWeights = sliceWeights(rewriter, loc, w, 0);
      vWeights = sliceWeights(rewriter, loc, w, 1);
    }
    auto compress = [&](Value input, Value weights) -> Value {
      auto type = cast<RankedTensorType>(input.getType());
      SmallVector<int64_t> shape(type.getShape());
      shape[1] = ShapedType::kDynamic;
      if (!ShapedType::isDynamic(tokens))
        shape[1] = cu ? spec::numPackedCompressedRows(tokens,
                                                      config.getCmpStride())
                      : spec::numCompressedBlocks(tokens, config.getCmpBlock(),
                                                  config.getCmpStride());
      return CompressOp::create(rewriter, loc,
                                tensorOf(shape, type.getElementType()), input,
                                weights, cu, cmpBlock, cmpStride, pool);
    };
    Value kc = compress(op.getKey(), kWeights);
    Value vc = compress(op.getValue(), vWeights);

    auto outType = tensorOf({batch, tokens, qHeads, vDim}, elt);
    auto lseType = tensorOf({batch, tokens, qHeads}, f32);
    auto cmp = CompressedAttentionOp::create(rewriter, loc, outType, lseType,
                                             op.getQuery(), kc, vc, cu,
                                             cmpBlock, cmpStride, scale);

    auto idxType = tensorOf({batch, tokens, kvHeads, config.getNumSelected()},
                            rewriter.getI32Type());
    Value idx = SelectBlocksOp::create(
        rewriter, loc, idxType, op.getQuery(), kc, cmp.getLse(), cu, cmpBlock,
        cmpStride, rewriter.getI64IntegerAttr(config.getSlcBlock()),
        rewriter.getI64IntegerAttr(config.getNumSelected()), scale,
        config.getBackbone());

    auto slc = SelectedAttentionOp::create(
        rewriter, loc, outType, lseType, op.getQuery(), op.getKey(),
        op.getValue(), idx, cu,
        rewriter.getI64IntegerAttr(config.getSlcBlock()), scale);
    auto win = WindowAttentionOp::create(
        rewriter, loc, outType, lseType, op.getQuery(), op.getKey(),
        op.getValue(), cu, rewriter.getI64IntegerAttr(config.getWindow()),
        scale);

    rewriter.replaceOpWithNewOp<CombineOp>(
        op, op.getResult().getType(), cmp.getOutput(), slc.getOutput(),
        win.getOutput(), op.getGates());
    return success();
  }
};

struct NSADecomposePass : mlir::nsa::impl::NSADecomposeBase<NSADecomposePass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateDecomposePatterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};

} // namespace

void mlir::nsa::populateDecomposePatterns(RewritePatternSet &patterns) {
  patterns.add<DecomposeSparseAttention>(patterns.getContext());
}
