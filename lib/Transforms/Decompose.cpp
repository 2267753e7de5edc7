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

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
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

/// The forward branches of one layer, as nsa-decompose builds them.
struct LayerBranches {
  Value kWeights, vWeights, kc, vc, indices;
  CompressedAttentionOp cmp;
  SelectedAttentionOp slc;
  WindowAttentionOp win;
};

/// Builds the branch ops of `op` (nsa.sparse_attention or its gradient) in
/// the order of the pass description; fails for a dynamic Dqk.
template <typename LayerOp>
FailureOr<LayerBranches> buildBranches(LayerOp op, PatternRewriter &rewriter) {
  Location loc = op.getLoc();
  ConfigAttr config = op.getConfig();
  auto qType = op.getQuery().getType();
  auto kType = op.getKey().getType();
  auto vType = op.getValue().getType();
  Value cu = op.getCuSeqlens();
  int64_t qkDim = qType.getDimSize(3);
  if (ShapedType::isDynamic(qkDim))
    return failure();

  Type f32 = rewriter.getF32Type();
  Type elt = qType.getElementType();
  int64_t batch = qType.getDimSize(0), tokens = qType.getDimSize(1),
          qHeads = qType.getDimSize(2), kvHeads = kType.getDimSize(2),
          vDim = vType.getDimSize(3);

  FloatAttr scale = rewriter.getF32FloatAttr(config.getScaleOr(qkDim));
  IntegerAttr cmpBlock = rewriter.getI64IntegerAttr(config.getCmpBlock());
  IntegerAttr cmpStride = rewriter.getI64IntegerAttr(config.getCmpStride());
  auto pool = PoolKindAttr::get(op.getContext(), config.getPool());

  LayerBranches br;
  // Compression (phi) of keys and values.
  if (Value w = op.getCmpWeights()) {
    br.kWeights = sliceWeights(rewriter, loc, w, 0);
    br.vWeights = sliceWeights(rewriter, loc, w, 1);
  }
  auto compress = [&](Value input, Value weights) -> Value {
    auto type = cast<RankedTensorType>(input.getType());
    SmallVector<int64_t> shape(type.getShape());
    shape[1] = ShapedType::kDynamic;
    if (!ShapedType::isDynamic(tokens))
      shape[1] =
          cu ? spec::numPackedCompressedRows(tokens, config.getCmpStride())
             : spec::numCompressedBlocks(tokens, config.getCmpBlock(),
                                         config.getCmpStride());
    return CompressOp::create(rewriter, loc,
                              tensorOf(shape, type.getElementType()), input,
                              weights, cu, cmpBlock, cmpStride, pool);
  };
  br.kc = compress(op.getKey(), br.kWeights);
  br.vc = compress(op.getValue(), br.vWeights);

  auto outType = tensorOf({batch, tokens, qHeads, vDim}, elt);
  auto lseType = tensorOf({batch, tokens, qHeads}, f32);
  br.cmp = CompressedAttentionOp::create(rewriter, loc, outType, lseType,
                                         op.getQuery(), br.kc, br.vc, cu,
                                         cmpBlock, cmpStride, scale);

  auto idxType = tensorOf({batch, tokens, kvHeads, config.getNumSelected()},
                          rewriter.getI32Type());
  br.indices = SelectBlocksOp::create(
      rewriter, loc, idxType, op.getQuery(), br.kc, br.cmp.getLse(), cu,
      cmpBlock, cmpStride, rewriter.getI64IntegerAttr(config.getSlcBlock()),
      rewriter.getI64IntegerAttr(config.getNumSelected()), scale,
      config.getBackbone());

  br.slc = SelectedAttentionOp::create(
      rewriter, loc, outType, lseType, op.getQuery(), op.getKey(),
      op.getValue(), br.indices, cu,
      rewriter.getI64IntegerAttr(config.getSlcBlock()), scale);
  br.win = WindowAttentionOp::create(
      rewriter, loc, outType, lseType, op.getQuery(), op.getKey(),
      op.getValue(), cu, rewriter.getI64IntegerAttr(config.getWindow()), scale);
  return br;
}

struct DecomposeSparseAttention : OpRewritePattern<SparseAttentionOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(SparseAttentionOp op,
                                PatternRewriter &rewriter) const override {
    FailureOr<LayerBranches> br = buildBranches(op, rewriter);
    if (failed(br))
      return rewriter.notifyMatchFailure(op, "dynamic Dqk: no default scale");
    rewriter.replaceOpWithNewOp<CombineOp>(
        op, op.getResult().getType(), br->cmp.getOutput(), br->slc.getOutput(),
        br->win.getOutput(), op.getGates());
    return success();
  }
};

/// `sum(terms)` elementwise in f32, rounded once to `type`'s element type.
Value sumAndRound(PatternRewriter &rewriter, Location loc, ValueRange terms,
                  RankedTensorType type) {
  SmallVector<OpFoldResult> sizes;
  for (int64_t d = 0; d < type.getRank(); ++d)
    sizes.push_back(
        type.isDynamicDim(d)
            ? OpFoldResult(
                  tensor::DimOp::create(rewriter, loc, terms[0], d).getResult())
            : OpFoldResult(rewriter.getIndexAttr(type.getDimSize(d))));
  Value init =
      tensor::EmptyOp::create(rewriter, loc, sizes, type.getElementType());
  AffineMap id =
      AffineMap::getMultiDimIdentityMap(type.getRank(), rewriter.getContext());
  SmallVector<AffineMap> maps(terms.size() + 1, id);
  auto generic = linalg::GenericOp::create(
      rewriter, loc, TypeRange{type}, terms, ValueRange{init}, maps,
      SmallVector<utils::IteratorType>(type.getRank(),
                                       utils::IteratorType::parallel),
      [&](OpBuilder &b, Location nloc, ValueRange args) {
        Value sum = args[0];
        for (Value term : args.drop_front().drop_back())
          sum = arith::AddFOp::create(b, nloc, sum, term);
        Type elt = type.getElementType();
        if (elt != sum.getType())
          sum = arith::TruncFOp::create(b, nloc, elt, sum);
        linalg::YieldOp::create(b, nloc, sum);
      });
  return generic.getResult(0);
}

/// `x`'s shape with element type f32.
RankedTensorType f32Like(Value x) {
  auto type = cast<RankedTensorType>(x.getType());
  return tensorOf(type.getShape(), Float32Type::get(type.getContext()));
}

struct DecomposeSparseAttentionGrad : OpRewritePattern<SparseAttentionGradOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(SparseAttentionGradOp op,
                                PatternRewriter &rewriter) const override {
    FailureOr<LayerBranches> br = buildBranches(op, rewriter);
    if (failed(br))
      return rewriter.notifyMatchFailure(op, "dynamic Dqk: no default scale");
    Location loc = op.getLoc();
    ConfigAttr config = op.getConfig();
    Value q = op.getQuery(), k = op.getKey(), v = op.getValue(),
          cu = op.getCuSeqlens();
    Type outType = br->cmp.getOutput().getType();
    auto grads = CombineGradOp::create(
        rewriter, loc,
        TypeRange{outType, outType, outType, op.getGates().getType()},
        br->cmp.getOutput(), br->slc.getOutput(), br->win.getOutput(),
        op.getGates(), op.getGrad());

    RankedTensorType dq = f32Like(q), dk = f32Like(k), dv = f32Like(v);
    auto cmp = CompressedAttentionGradOp::create(
        rewriter, loc, TypeRange{dq, f32Like(br->kc), f32Like(br->vc)}, q,
        br->kc, br->vc, br->cmp.getOutput(), br->cmp.getLse(),
        grads.getCompressedGrad(), cu, br->cmp.getBlockAttr(),
        br->cmp.getStrideAttr(), br->cmp.getScaleAttr());
    auto slc = SelectedAttentionGradOp::create(
        rewriter, loc, TypeRange{dq, dk, dv}, q, k, v, br->indices,
        br->slc.getOutput(), br->slc.getLse(), grads.getSelectedGrad(), cu,
        br->slc.getBlockAttr(), br->slc.getScaleAttr());
    auto win = WindowAttentionGradOp::create(
        rewriter, loc, TypeRange{dq, dk, dv}, q, k, v, br->win.getOutput(),
        br->win.getLse(), grads.getWindowGrad(), cu, br->win.getWindowAttr(),
        br->win.getScaleAttr());

    // Through phi to the tokens (and the learned weights).
    auto pool = PoolKindAttr::get(getContext(), config.getPool());
    auto compressGrad = [&](Value dxc, Value input, Value weights) {
      SmallVector<Type> types = {f32Like(input)};
      if (weights)
        types.push_back(f32Like(weights));
      return CompressGradOp::create(
          rewriter, loc, types, dxc, input, weights, cu,
          rewriter.getI64IntegerAttr(config.getCmpBlock()),
          rewriter.getI64IntegerAttr(config.getCmpStride()), pool);
    };
    auto kGrad = compressGrad(cmp.getKeyGrad(), k, br->kWeights);
    auto vGrad = compressGrad(cmp.getValueGrad(), v, br->vWeights);

    SmallVector<Value> results = {
        sumAndRound(
            rewriter, loc,
            {cmp.getQueryGrad(), slc.getQueryGrad(), win.getQueryGrad()},
            op.getQueryGrad().getType()),
        sumAndRound(rewriter, loc,
                    {kGrad.getInputGrad(), slc.getKeyGrad(), win.getKeyGrad()},
                    op.getKeyGrad().getType()),
        sumAndRound(
            rewriter, loc,
            {vGrad.getInputGrad(), slc.getValueGrad(), win.getValueGrad()},
            op.getValueGrad().getType()),
        grads.getGatesGrad()};
    if (Value w = op.getCmpWeightsGrad()) {
      // [2, H, l]: the key weights' gradient, then the value weights'.
      auto type = cast<RankedTensorType>(w.getType());
      Value all = tensor::EmptyOp::create(rewriter, loc, type.getShape(),
                                          type.getElementType());
      Value parts[] = {kGrad.getWeightsGrad(), vGrad.getWeightsGrad()};
      for (auto [i, part] : llvm::enumerate(parts)) {
        SmallVector<OpFoldResult> offsets = {
            rewriter.getIndexAttr(static_cast<int64_t>(i)),
            rewriter.getIndexAttr(0), rewriter.getIndexAttr(0)};
        SmallVector<OpFoldResult> sizes = {
            rewriter.getIndexAttr(1), rewriter.getIndexAttr(type.getDimSize(1)),
            rewriter.getIndexAttr(type.getDimSize(2))};
        SmallVector<OpFoldResult> strides(3, rewriter.getIndexAttr(1));
        all = tensor::InsertSliceOp::create(rewriter, loc, part, all, offsets,
                                            sizes, strides);
      }
      results.push_back(all);
    }
    rewriter.replaceOp(op, results);
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
  patterns.add<DecomposeSparseAttention, DecomposeSparseAttentionGrad>(
      patterns.getContext());
}
