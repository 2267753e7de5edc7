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
#define GEN_PASS_DEF_DECOMPOSE
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

/// The forward branches of one layer, as nsa-decompose builds them: the
/// compressed keys and values, then the saved state of docs/Spec.md section
/// 9.1 in its order (each branch's output and lse, the indices after the
/// compressed branch's).
struct LayerBranches {
  Value kWeights, vWeights, kc, vc;
  SmallVector<Value, 7> saved;
  Value cmpOutput() const { return saved[0]; }
  Value cmpLse() const { return saved[1]; }
  Value indices() const { return saved[2]; }
  Value slcOutput() const { return saved[3]; }
  Value slcLse() const { return saved[4]; }
  Value winOutput() const { return saved[5]; }
  Value winLse() const { return saved[6]; }
};

/// The attributes the branch ops of `config` share.
struct BranchAttrs {
  FloatAttr scale;
  IntegerAttr cmpBlock, cmpStride, slcBlock, window, numSelected;
  PoolKindAttr pool;

  BranchAttrs(ConfigAttr config, int64_t qkDim, Builder &b)
      : scale(b.getF32FloatAttr(config.getScaleOr(qkDim))),
        cmpBlock(b.getI64IntegerAttr(config.getCmpBlock())),
        cmpStride(b.getI64IntegerAttr(config.getCmpStride())),
        slcBlock(b.getI64IntegerAttr(config.getSlcBlock())),
        window(b.getI64IntegerAttr(config.getWindow())),
        numSelected(b.getI64IntegerAttr(config.getNumSelected())),
        pool(PoolKindAttr::get(b.getContext(), config.getPool())) {}
};

/// Builds the compression (phi) of keys and values of `op`
/// (nsa.sparse_attention or its gradient); fails for a dynamic Dqk.
template <typename LayerOp>
FailureOr<LayerBranches> buildCompression(LayerOp op,
                                          PatternRewriter &rewriter) {
  Location loc = op.getLoc();
  ConfigAttr config = op.getConfig();
  int64_t qkDim = op.getQuery().getType().getDimSize(3);
  if (ShapedType::isDynamic(qkDim))
    return failure();
  BranchAttrs attrs(config, qkDim, rewriter);
  Value cu = op.getCuSeqlens();
  int64_t tokens = op.getQuery().getType().getDimSize(1);

  LayerBranches br;
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
    return CompressOp::create(
        rewriter, loc, tensorOf(shape, type.getElementType()), input, weights,
        cu, attrs.cmpBlock, attrs.cmpStride, attrs.pool);
  };
  br.kc = compress(op.getKey(), br.kWeights);
  br.vc = compress(op.getValue(), br.vWeights);
  return br;
}

/// Builds the attention branches of one layer over `query`, the tokens `key`,
/// `value` and the compressed `br.kc`, `br.vc`, in the order of the pass
/// description, and fills `br.saved`. `cu` (packed) or `kvLens` (decoding)
/// goes to every branch op.
void buildAttention(PatternRewriter &rewriter, Location loc, ConfigAttr config,
                    TypedValue<RankedTensorType> query, Value key, Value value,
                    Value cu, Value kvLens, LayerBranches &br) {
  auto qType = query.getType();
  BranchAttrs attrs(config, qType.getDimSize(3), rewriter);
  Type f32 = rewriter.getF32Type();
  int64_t batch = qType.getDimSize(0), tokens = qType.getDimSize(1),
          qHeads = qType.getDimSize(2),
          kvHeads = cast<RankedTensorType>(key.getType()).getDimSize(2),
          vDim = cast<RankedTensorType>(value.getType()).getDimSize(3);

  auto outType =
      tensorOf({batch, tokens, qHeads, vDim}, qType.getElementType());
  auto lseType = tensorOf({batch, tokens, qHeads}, f32);
  auto cmp = CompressedAttentionOp::create(
      rewriter, loc, outType, lseType, query, br.kc, br.vc, cu, kvLens,
      attrs.cmpBlock, attrs.cmpStride, attrs.scale);

  auto idxType = tensorOf({batch, tokens, kvHeads, config.getNumSelected()},
                          rewriter.getI32Type());
  Value indices = SelectBlocksOp::create(
      rewriter, loc, idxType, query, br.kc, cmp.getLse(), cu, kvLens,
      attrs.cmpBlock, attrs.cmpStride, attrs.slcBlock, attrs.numSelected,
      attrs.scale, config.getBackbone(),
      rewriter.getI64IntegerAttr(config.getMaxTokens()));

  auto slc = SelectedAttentionOp::create(rewriter, loc, outType, lseType, query,
                                         key, value, indices, cu, kvLens,
                                         attrs.slcBlock, attrs.scale);
  auto win =
      WindowAttentionOp::create(rewriter, loc, outType, lseType, query, key,
                                value, cu, kvLens, attrs.window, attrs.scale);
  br.saved = {cmp.getOutput(), cmp.getLse(),    indices,     slc.getOutput(),
              slc.getLse(),    win.getOutput(), win.getLse()};
}

/// Builds the branch ops of `op` (nsa.sparse_attention or its gradient) in
/// the order of the pass description; fails for a dynamic Dqk.
template <typename LayerOp>
FailureOr<LayerBranches> buildBranches(LayerOp op, PatternRewriter &rewriter) {
  FailureOr<LayerBranches> br = buildCompression(op, rewriter);
  if (failed(br))
    return failure();
  buildAttention(rewriter, op.getLoc(), op.getConfig(), op.getQuery(),
                 op.getKey(), op.getValue(), op.getCuSeqlens(), Value(), *br);
  return br;
}

/// A decoding step: the branches over the caches, each with `kv_lens`
/// (docs/Spec.md section 12); the compressed caches are given.
struct DecomposeSparseAttentionDecode
    : OpRewritePattern<SparseAttentionDecodeOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(SparseAttentionDecodeOp op,
                                PatternRewriter &rewriter) const override {
    if (op.getQuery().getType().isDynamicDim(3))
      return rewriter.notifyMatchFailure(op, "dynamic Dqk: no default scale");
    LayerBranches br;
    br.kc = op.getCmpKeyCache();
    br.vc = op.getCmpValueCache();
    buildAttention(rewriter, op.getLoc(), op.getConfig(), op.getQuery(),
                   op.getKeyCache(), op.getValueCache(), Value(),
                   op.getKvLens(), br);
    rewriter.replaceOpWithNewOp<CombineOp>(op, op.getResult().getType(),
                                           br.cmpOutput(), br.slcOutput(),
                                           br.winOutput(), op.getGates());
    return success();
  }
};

struct DecomposeSparseAttention : OpRewritePattern<SparseAttentionOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(SparseAttentionOp op,
                                PatternRewriter &rewriter) const override {
    FailureOr<LayerBranches> br = buildBranches(op, rewriter);
    if (failed(br))
      return rewriter.notifyMatchFailure(op, "dynamic Dqk: no default scale");
    auto combine = CombineOp::create(
        rewriter, op.getLoc(), op.getResult().getType(), br->cmpOutput(),
        br->slcOutput(), br->winOutput(), op.getGates());
    SmallVector<Value> results = {combine.getResult()};
    // A training forward also returns its saved state (op_c18), cast where
    // the op's results are more static than the branches' types.
    for (auto [value, result] : llvm::zip(br->saved, op.getSaved()))
      results.push_back(value.getType() == result.getType()
                            ? value
                            : tensor::CastOp::create(rewriter, op.getLoc(),
                                                     result.getType(), value)
                                  .getResult());
    rewriter.replaceOp(op, results);
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
    // With the forward's saved state only the compression is rebuilt;
    // without it, the whole forward.
    FailureOr<LayerBranches> br = op.getSaved().empty()
                                      ? buildBranches(op, rewriter)
                                      : buildCompression(op, rewriter);
    if (failed(br))
      return rewriter.notifyMatchFailure(op, "dynamic Dqk: no default scale");
    if (!op.getSaved().empty())
      br->saved.assign(op.getSaved().begin(), op.getSaved().end());
    Location loc = op.getLoc();
    ConfigAttr config = op.getConfig();
    BranchAttrs attrs(config, op.getQuery().getType().getDimSize(3), rewriter);
    Value q = op.getQuery(), k = op.getKey(), v = op.getValue(),
          cu = op.getCuSeqlens();
    Type outType = br->cmpOutput().getType();
    auto grads = CombineGradOp::create(
        rewriter, loc,
        TypeRange{outType, outType, outType, op.getGates().getType()},
        br->cmpOutput(), br->slcOutput(), br->winOutput(), op.getGates(),
        op.getGrad());

    RankedTensorType dq = f32Like(q), dk = f32Like(k), dv = f32Like(v);
    auto cmp = CompressedAttentionGradOp::create(
        rewriter, loc, TypeRange{dq, f32Like(br->kc), f32Like(br->vc)}, q,
        br->kc, br->vc, br->cmpOutput(), br->cmpLse(),
        grads.getCompressedGrad(), cu, attrs.cmpBlock, attrs.cmpStride,
        attrs.scale);
    auto slc = SelectedAttentionGradOp::create(
        rewriter, loc, TypeRange{dq, dk, dv}, q, k, v, br->indices(),
        br->slcOutput(), br->slcLse(), grads.getSelectedGrad(), cu,
        attrs.slcBlock, attrs.scale);
    auto win = WindowAttentionGradOp::create(
        rewriter, loc, TypeRange{dq, dk, dv}, q, k, v, br->winOutput(),
        br->winLse(), grads.getWindowGrad(), cu, attrs.window, attrs.scale);

    // Through phi to the tokens (and the learned weights).
    auto compressGrad = [&](Value dxc, Value input, Value weights) {
      SmallVector<Type> types = {f32Like(input)};
      if (weights)
        types.push_back(f32Like(weights));
      return CompressGradOp::create(rewriter, loc, types, dxc, input, weights,
                                    cu, attrs.cmpBlock, attrs.cmpStride,
                                    attrs.pool);
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

struct DecomposePass : mlir::nsa::impl::DecomposeBase<DecomposePass> {
  void runOnOperation() override {
    if (failed(checkSupportedSizes(getOperation())))
      return signalPassFailure();
    RewritePatternSet patterns(&getContext());
    populateDecomposePatterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};

} // namespace

void mlir::nsa::populateDecomposePatterns(RewritePatternSet &patterns) {
  patterns.add<DecomposeSparseAttention, DecomposeSparseAttentionDecode,
               DecomposeSparseAttentionGrad>(patterns.getContext());
}
