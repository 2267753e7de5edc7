//===- TileGradients.cpp - the gradient ops into block-aligned loops ------===//
//
// The nsa-tile patterns of the gradient ops (docs/Spec.md section 9):
//
//   nsa.*_attention_grad
//     --> delta = rowsum(grad * output)                 (one generic)
//         scf.forall (sequence, KV head, query tile)    dq: an scf.for over
//                                                       the key tiles it sees
//         scf.forall (sequence, KV head, key tile)      dk, dv: an scf.for
//                                                       over the query tiles
//                                                       that see it
//   nsa.compress_grad
//     --> scf.forall (sequence, KV head, token tile)    dx
//         scf.forall (KV head) over sequences           dw (linear phi)
//   nsa.combine_grad
//     --> elementwise generics
//
// Each forall iteration owns the rows it writes (query rows for dq, key
// rows for dk and dv): the key-major pass recomputes P from the lse instead
// of scattering into rows another iteration owns, as FlashAttention-2's
// backward does. Selected attention tiles its keys by selection block; a
// block is visible to a token when the token's index row lists it (a flag
// per token of the query tile), and pairs of tiles without a flag are
// skipped.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/TileBuilder.h"

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"

#include <type_traits>

using namespace mlir;
using namespace mlir::nsa;
using namespace mlir::nsa::detail;

namespace {

using utils::IteratorType;
constexpr int64_t kDyn = ShapedType::kDynamic;

/// The shape of `x` as sizes (static or tensor.dim), e.g. for a fill.
SmallVector<OpFoldResult> mixedShape(TileBuilder &t, Value x) {
  SmallVector<OpFoldResult> sizes;
  for (int64_t d = 0, e = cast<RankedTensorType>(x.getType()).getRank(); d < e;
       ++d)
    sizes.push_back(t.mixedDim(x, d));
  return sizes;
}

/// A linalg.generic with outputs `inits`.
ValueRange generic(
    OpBuilder &b, Location loc, ValueRange ins, ValueRange inits,
    ArrayRef<AffineMap> maps, ArrayRef<IteratorType> iterators,
    function_ref<SmallVector<Value>(OpBuilder &, Location, ValueRange)> body) {
  auto op = linalg::GenericOp::create(
      b, loc, TypeRange(inits), ins, inits, maps, iterators,
      [&](OpBuilder &nb, Location nloc, ValueRange args) {
        linalg::YieldOp::create(nb, nloc, body(nb, nloc, args));
      });
  return op.getResults();
}

AffineMap dims(MLIRContext *ctx, unsigned rank, ArrayRef<unsigned> which) {
  SmallVector<AffineExpr> exprs;
  for (unsigned d : which)
    exprs.push_back(getAffineDimExpr(d, ctx));
  return AffineMap::get(rank, 0, exprs, ctx);
}

/// `sum_e a[b, t, h, e] * c[b, t, h, e]` for each of `as`, as `[B, T, H]`
/// f32 tensors (one generic).
SmallVector<Value> rowDots(TileBuilder &t, ValueRange as, Value c) {
  MLIRContext *ctx = t.b.getContext();
  SmallVector<OpFoldResult> sizes = mixedShape(t, c);
  sizes.pop_back();
  SmallVector<Value> inits;
  for (size_t i = 0; i < as.size(); ++i)
    inits.push_back(t.fill(sizes, t.b.getF32Type(), 0.0));
  SmallVector<Value> ins(as);
  ins.push_back(c);
  SmallVector<AffineMap> maps(ins.size(), dims(ctx, 4, {0, 1, 2, 3}));
  maps.append(as.size(), dims(ctx, 4, {0, 1, 2}));
  ValueRange dots = generic(
      t.b, t.loc, ins, inits, maps,
      {IteratorType::parallel, IteratorType::parallel, IteratorType::parallel,
       IteratorType::reduction},
      [&](OpBuilder &nb, Location nloc, ValueRange args) {
        size_t n = as.size();
        Value cv = t.toF32(nb, nloc, args[n]);
        SmallVector<Value> sums;
        for (size_t i = 0; i < n; ++i)
          sums.push_back(arith::AddFOp::create(
              nb, nloc, args[n + 1 + i],
              arith::MulFOp::create(nb, nloc, t.toF32(nb, nloc, args[i]), cv)));
        return sums;
      });
  return SmallVector<Value>(dots);
}

//===----------------------------------------------------------------------===//
// Attention gradients
//===----------------------------------------------------------------------===//

/// The operands of one attention gradient op.
struct GradOperands {
  Value q, k, v, dOut, lse, delta, cu;
  /// Selected attention: the index rows (its key tiles are selection
  /// blocks); else null.
  Value indices;
  double scale;
  Sizes sz;
  int64_t queryTile;
};

/// One query tile's rows: `tokens` tokens x G heads.
struct QueryRows {
  Value q, dOut, lse, delta;
};

QueryRows loadQueryRows(TileBuilder &t, const GradOperands &op, Value batch,
                        Value row0, Value count, Value head0) {
  int64_t g = op.sz.group, n = op.queryTile;
  return {t.loadTile(op.q, batch, row0, count, head0, g, n),
          t.loadTile(op.dOut, batch, row0, count, head0, g, n),
          t.loadRowTile(op.lse, batch, row0, count, head0, g, n),
          t.loadRowTile(op.delta, batch, row0, count, head0, g, n)};
}

/// `flags[r]`: whether selection block `j` is listed in the index row of
/// token `row0 + r` (false for `r >= count`), as `[tokens]` i1; and whether
/// any flag is set.
std::pair<Value, Value> selectionFlags(TileBuilder &t, Value indices,
                                       Value batch, Value row0, Value count,
                                       Value h, Value j, int64_t tokens) {
  OpBuilder &b = t.b;
  Location loc = t.loc;
  MLIRContext *ctx = b.getContext();
  auto idxType = cast<RankedTensorType>(indices.getType());
  Type i1 = b.getI1Type();
  Value slots = tensor::ExtractSliceOp::create(
      b, loc,
      RankedTensorType::get({kDyn, idxType.getDimSize(3)},
                            idxType.getElementType()),
      indices, ArrayRef<OpFoldResult>{batch, row0, h, b.getIndexAttr(0)},
      ArrayRef<OpFoldResult>{b.getIndexAttr(1), count, b.getIndexAttr(1),
                             t.mixedDim(indices, 3)},
      SmallVector<OpFoldResult>(4, b.getIndexAttr(1)));
  Value flags = t.fill({b.getIndexAttr(tokens)}, i1, 0);
  Value part = tensor::ExtractSliceOp::create(
      b, loc, RankedTensorType::get({kDyn}, i1), flags,
      ArrayRef<OpFoldResult>{b.getIndexAttr(0)}, ArrayRef<OpFoldResult>{count},
      ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
  Value j32 = arith::IndexCastOp::create(b, loc, b.getI32Type(), j);
  part = generic(b, loc, {slots}, {part},
                 {dims(ctx, 2, {0, 1}), dims(ctx, 2, {0})},
                 {IteratorType::parallel, IteratorType::reduction},
                 [&](OpBuilder &nb, Location nloc, ValueRange args) {
                   Value same = arith::CmpIOp::create(
                       nb, nloc, arith::CmpIPredicate::eq, args[0], j32);
                   return SmallVector<Value>{
                       arith::OrIOp::create(nb, nloc, args[1], same)};
                 })[0];
  flags = tensor::InsertSliceOp::create(
      b, loc, part, flags, ArrayRef<OpFoldResult>{b.getIndexAttr(0)},
      ArrayRef<OpFoldResult>{count}, ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
  Value any = generic(b, loc, {flags}, {t.fill({}, i1, 0)},
                      {dims(ctx, 1, {0}), AffineMap::get(1, 0, {}, ctx)},
                      {IteratorType::reduction},
                      [&](OpBuilder &nb, Location nloc, ValueRange args) {
                        return SmallVector<Value>{
                            arith::OrIOp::create(nb, nloc, args[0], args[1])};
                      })[0];
  return {flags, tensor::ExtractOp::create(b, loc, any, ValueRange{})};
}

/// Runs `step(flags)` for a pair of tiles; for selected attention only when
/// some token of the query tile lists the block (else `carried` passes
/// through), with the flags it needs for its mask.
SmallVector<Value>
guardedStep(TileBuilder &t, Value indices, Value batch, Value row0, Value count,
            Value h, Value block, int64_t tokens, ValueRange carried,
            function_ref<SmallVector<Value>(TileBuilder &, Value flags)> step) {
  if (!indices)
    return step(t, Value());
  auto [flags, any] =
      selectionFlags(t, indices, batch, row0, count, h, block, tokens);
  auto ifOp = scf::IfOp::create(
      t.b, t.loc, any,
      [&](OpBuilder &ib, Location iloc) {
        TileBuilder it(ib, iloc);
        scf::YieldOp::create(ib, iloc, step(it, flags));
      },
      [&](OpBuilder &eb, Location eloc) {
        scf::YieldOp::create(eb, eloc, carried);
      });
  return SmallVector<Value>(ifOp.getResults());
}

/// The mask of one pair of tiles: a live query row (`r / G < count`), a
/// live key (`c < kCount`), visible, and (selected) listed in `flags`.
auto pairMask(const KeySet &keys, int64_t group, Value t0, Value count,
              Value k0, Value kCount, Value flags) {
  return [=, &keys](OpBuilder &mb, Location mloc, Value r, Value c) -> Value {
    TileBuilder m(mb, mloc);
    Value local = m.div(r, group);
    Value ok = andI1(mb, mloc, m.lt(local, count), m.lt(c, kCount));
    ok = andI1(mb, mloc, ok, keys.visible(m, m.add(t0, local), m.add(k0, c)));
    if (flags)
      ok = andI1(mb, mloc, ok,
                 tensor::ExtractOp::create(mb, mloc, flags, ValueRange{local}));
    return ok;
  };
}

/// dq: one iteration per (sequence, KV head, query tile), an scf.for over
/// the key tiles it sees.
Value buildQueryGrad(OpBuilder &b, Location loc, StringRef kernel,
                     const GradOperands &op, const KeySet &keys) {
  TileBuilder t(b, loc);
  const Sizes &sz = op.sz;
  int64_t tokens = op.queryTile, rows = tokens * sz.group;
  Value init = t.fill(mixedShape(t, op.q), b.getF32Type(), 0.0);
  TileGrid grid =
      t.sequenceTiles(op.q, op.cu, t.mixedDim(op.q, 1), tokens, /*unit=*/1);
  SmallVector<OpFoldResult> bounds = {grid.sequences,
                                      b.getIndexAttr(sz.kvHeads), grid.tiles};
  OpBuilder::InsertionGuard guard(b);
  scf::ForallOp forall = createTileLoop(b, loc, kernel, bounds, init);
  SmallVector<Value> ivs = forall.getInductionVars();
  Value h = ivs[1];
  SequenceTile st = t.sequenceTile(ivs[0], ivs[2], op.cu, tokens, 1);
  SequenceView seq = t.sequence(st.sequence, op.q, op.cu, keys.cmpBlock,
                                 keys.cmpStride);
  Value t0 = t.mul(st.tile, tokens);
  Value count = t.clamp(t.sub(seq.length, t0), 0, t.idx(tokens));
  Value row0 = t.add(seq.tokenStart, t.min(t0, seq.length));
  Value head0 = t.mul(h, sz.group);
  QueryRows qr = loadQueryRows(t, op, seq.batch, row0, count, head0);
  auto [keyBase, keyLimit] = keyRows(t, keys, seq);
  auto [lo, hi] = keys.keyTiles(t, t0, count);
  Value acc =
      linalg::FillOp::create(b, loc, ValueRange{t.f32(0.0)},
                             ValueRange{t.tile(rows, sz.qkDim, b.getF32Type())})
          .getResult(0);
  auto loop = scf::ForOp::create(
      b, loc, lo, hi, t.idx(1), ValueRange{acc},
      [&](OpBuilder &nb, Location nloc, Value kb, ValueRange args) {
        TileBuilder kt(nb, nloc);
        Value k0 = kt.mul(kb, keys.keyTile);
        Value kCount = kt.clamp(kt.sub(keyLimit, k0), 0, kt.idx(keys.keyTile));
        Value kRow0 = kt.add(keyBase, kt.min(k0, keyLimit));
        SmallVector<Value> next = guardedStep(
            kt, op.indices, seq.batch, row0, count, h, kb, tokens, args,
            [&](TileBuilder &st, Value flags) -> SmallVector<Value> {
              Value kTile = st.loadTile(op.k, seq.batch, kRow0, kCount, h, 1,
                                        keys.keyTile);
              Value vTile = st.loadTile(op.v, seq.batch, kRow0, kCount, h, 1,
                                        keys.keyTile);
              auto [p, ds] = st.attendGradTile(
                  qr.q, qr.dOut, qr.lse, qr.delta, kTile, vTile, op.scale,
                  pairMask(keys, sz.group, t0, count, k0, kCount, flags));
              return {st.contract(ds, kTile, args[0], false)};
            });
        scf::YieldOp::create(nb, nloc, next);
      });
  insertTile(b, loc, forall,
             t.unflattenTile(loop.getResult(0), count, sz.group, tokens),
             forall.getRegionIterArgs()[0], seq.batch, row0, count, head0);
  return forall.getResult(0);
}

/// dk, dv: one iteration per (sequence, KV head, key tile), an scf.for over
/// the query tiles that see it.
std::pair<Value, Value> buildKeyGrad(OpBuilder &b, Location loc,
                                     StringRef kernel, const GradOperands &op,
                                     const KeySet &keys) {
  TileBuilder t(b, loc);
  const Sizes &sz = op.sz;
  int64_t tokens = op.queryTile, kn = keys.keyTile;
  Type f32 = b.getF32Type();
  Value dkInit = t.fill(mixedShape(t, op.k), f32, 0.0);
  Value dvInit = t.fill(mixedShape(t, op.v), f32, 0.0);
  // (A sequence of L tokens has at most L / min(l, d) compressed keys.)
  int64_t unit =
      keys.compressed ? std::min(keys.cmpBlock, keys.cmpStride) : 1;
  TileGrid grid = t.sequenceTiles(op.q, op.cu, t.mixedDim(op.k, 1), kn, unit);
  SmallVector<OpFoldResult> bounds = {grid.sequences,
                                      b.getIndexAttr(sz.kvHeads), grid.tiles};
  OpBuilder::InsertionGuard guard(b);
  scf::ForallOp forall =
      createTileLoop(b, loc, kernel, bounds, ValueRange{dkInit, dvInit});
  SmallVector<Value> ivs = forall.getInductionVars();
  Value h = ivs[1];
  SequenceTile st = t.sequenceTile(ivs[0], ivs[2], op.cu, kn, unit);
  SequenceView seq = t.sequence(st.sequence, op.q, op.cu, keys.cmpBlock,
                                 keys.cmpStride);
  Value kb = st.tile;
  auto [keyBase, keyLimit] = keyRows(t, keys, seq);
  Value k0 = t.mul(kb, kn);
  Value kCount = t.clamp(t.sub(keyLimit, k0), 0, t.idx(kn));
  Value kRow0 = t.add(keyBase, t.min(k0, keyLimit));
  Value kTile = t.loadTile(op.k, seq.batch, kRow0, kCount, h, 1, kn);
  Value vTile = t.loadTile(op.v, seq.batch, kRow0, kCount, h, 1, kn);
  auto [first, end] = keys.queryTokens(t, k0, kCount, seq.length);
  Value hi = t.ceilDiv(end, tokens);
  Value lo = t.min(t.div(first, tokens), hi);
  auto zeros = [&](int64_t depth) {
    return linalg::FillOp::create(b, loc, ValueRange{t.f32(0.0)},
                                  ValueRange{t.tile(kn, depth, f32)})
        .getResult(0);
  };
  auto loop = scf::ForOp::create(
      b, loc, lo, hi, t.idx(1), ValueRange{zeros(sz.qkDim), zeros(sz.vDim)},
      [&](OpBuilder &nb, Location nloc, Value qb, ValueRange args) {
        TileBuilder qt(nb, nloc);
        Value t0 = qt.mul(qb, tokens);
        Value count = qt.clamp(qt.sub(seq.length, t0), 0, qt.idx(tokens));
        Value row0 = qt.add(seq.tokenStart, qt.min(t0, seq.length));
        SmallVector<Value> next = guardedStep(
            qt, op.indices, seq.batch, row0, count, h, kb, tokens, args,
            [&](TileBuilder &st, Value flags) -> SmallVector<Value> {
              QueryRows qr = loadQueryRows(st, op, seq.batch, row0, count,
                                           st.mul(h, sz.group));
              auto [p, ds] = st.attendGradTile(
                  qr.q, qr.dOut, qr.lse, qr.delta, kTile, vTile, op.scale,
                  pairMask(keys, sz.group, t0, count, k0, kCount, flags));
              return {st.contract(ds, qr.q, args[0], true),
                      st.contract(p, qr.dOut, args[1], true)};
            });
        scf::YieldOp::create(nb, nloc, next);
      });
  ValueRange shared = forall.getRegionIterArgs();
  for (int i = 0; i < 2; ++i)
    insertTile(b, loc, forall,
               t.unflattenTile(loop.getResult(i), kCount, 1, kn), shared[i],
               seq.batch, kRow0, kCount, h);
  return {forall.getResult(0), forall.getResult(1)};
}

struct GradTileOptions {
  int64_t queryTile, kvTile, queryRows;
};

/// The key set of each attention gradient op: its forward op's.
KeySet keySetOf(CompressedAttentionGradOp op, int64_t kvTile) {
  return compressedKeySet(op.getBlock(), op.getStride(), kvTile);
}
KeySet keySetOf(WindowAttentionGradOp op, int64_t kvTile) {
  return windowKeySet(op.getWindow(), kvTile);
}
KeySet keySetOf(SelectedAttentionGradOp op, int64_t) {
  return selectedKeySet(op.getBlock());
}

/// An attention gradient op: D once, then the dq and the dk/dv passes over
/// the key set of its branch.
template <typename GradOp> struct TileAttentionGrad : OpRewritePattern<GradOp> {
  TileAttentionGrad(MLIRContext *ctx, GradTileOptions opts)
      : OpRewritePattern<GradOp>(ctx), opts(opts) {}

  LogicalResult matchAndRewrite(GradOp op,
                                PatternRewriter &rewriter) const override {
    Value q = op.getQuery(), k = op.getKey(), v = op.getValue();
    if (!hasStaticHeads(q, k, v) ||
        !hasStaticHeads(op.getOutput(), op.getGrad(), op.getGrad()) ||
        op.getLse().getType().isDynamicDim(2))
      return rewriter.notifyMatchFailure(op, "dynamic head counts or dims");
    Location loc = op.getLoc();
    TileBuilder t(rewriter, loc);
    GradOperands ops;
    ops.q = q;
    ops.k = k;
    ops.v = v;
    ops.dOut = op.getGrad();
    ops.lse = op.getLse();
    ops.cu = op.getCuSeqlens();
    if constexpr (std::is_same_v<GradOp, SelectedAttentionGradOp>)
      ops.indices = op.getIndices();
    ops.scale = op.getScale().convertToDouble();
    ops.sz = sizesOf(q, k, v);
    ops.queryTile = opts.queryTile
                        ? opts.queryTile
                        : std::max<int64_t>(1, opts.queryRows / ops.sz.group);
    // D = rowsum(dO * O), once per row (FlashAttention-2's preprocessing).
    ops.delta = rowDots(t, {op.getOutput()}, op.getGrad())[0];
    KeySet keys = keySetOf(op, opts.kvTile);
    StringRef kernel = op->getName().stripDialect();
    Value dq = buildQueryGrad(rewriter, loc, (kernel + "_dq").str(), ops, keys);
    auto [dk, dv] =
        buildKeyGrad(rewriter, loc, (kernel + "_dkv").str(), ops, keys);
    rewriter.replaceOp(op, {dq, dk, dv});
    return success();
  }
  GradTileOptions opts;
};

//===----------------------------------------------------------------------===//
// Compression gradient
//===----------------------------------------------------------------------===//

struct TileCompressGrad : OpRewritePattern<CompressGradOp> {
  TileCompressGrad(MLIRContext *ctx, int64_t tokenTile)
      : OpRewritePattern(ctx), tokenTile(tokenTile) {}

  LogicalResult matchAndRewrite(CompressGradOp op,
                                PatternRewriter &rewriter) const override {
    Value x = op.getInput(), g = op.getGrad(), cu = op.getCuSeqlens();
    if (!hasStaticHeads(x, g, g))
      return rewriter.notifyMatchFailure(op, "dynamic heads or dim");
    int64_t l = op.getBlock(), d = op.getStride();
    Value dx = buildInputGrad(rewriter, op, l, d);
    if (!op.getWeights()) {
      rewriter.replaceOp(op, dx);
      return success();
    }
    Value dw = buildWeightsGrad(rewriter, op.getLoc(), x, g, cu, l, d);
    rewriter.replaceOp(op, {dx, dw});
    return success();
  }

  /// dx[t] = sum over the blocks i covering t of w[t - i*d] * grad[i]: a
  /// tile of `tt` tokens (a multiple of d) starting at t0 is covered by the
  /// blocks t0/d - (l/d - 1) .. (t0 + tt)/d - 1, which are loaded (zero
  /// where they do not exist) into one tile.
  Value buildInputGrad(PatternRewriter &rewriter, CompressGradOp op, int64_t l,
                       int64_t d) const {
    Value x = op.getInput(), g = op.getGrad(), cu = op.getCuSeqlens();
    auto xType = cast<RankedTensorType>(x.getType());
    int64_t heads = xType.getDimSize(2), depth = xType.getDimSize(3);
    int64_t span = l / d, tt = std::max<int64_t>(d, tokenTile / d * d);
    int64_t nb = tt / d + span - 1;
    Type gElt = cast<RankedTensorType>(g.getType()).getElementType();
    Type f32 = rewriter.getF32Type();
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    MLIRContext *ctx = b.getContext();
    TileBuilder t(b, loc);
    Value init = t.fill(mixedShape(t, x), f32, 0.0);
    OpBuilder::InsertionGuard guard(b);
    TileGrid grid = t.sequenceTiles(x, cu, t.mixedDim(x, 1), tt, /*unit=*/1);
    scf::ForallOp forall = createTileLoop(
        b, loc, "compress_grad",
        {grid.sequences, b.getIndexAttr(heads), grid.tiles}, init);
    SmallVector<Value> ivs = forall.getInductionVars();
    Value h = ivs[1];
    SequenceTile st = t.sequenceTile(ivs[0], ivs[2], cu, tt, 1);
    SequenceView seq = t.sequence(st.sequence, x, cu, l, d);
    Value t0 = t.mul(st.tile, tt);
    Value count = t.clamp(t.sub(seq.length, t0), 0, t.idx(tt));
    Value row0 = t.add(seq.tokenStart, t.min(t0, seq.length));
    Value blocks = t.numCompressedBlocks(seq.length, l, d);
    // Tile row m holds block first + m; only blocks 0 .. blocks-1 exist.
    Value first = t.sub(t.div(t0, d), t.idx(span - 1));
    Value start = t.min(t.max(first, t.idx(0)), blocks);
    Value stop = t.max(t.min(t.add(first, t.idx(nb)), blocks), start);
    Value have = t.sub(stop, start);
    Value gRows = tensor::ExtractSliceOp::create(
        b, loc, RankedTensorType::get({kDyn, depth}, gElt), g,
        ArrayRef<OpFoldResult>{seq.batch, t.add(seq.cmpStart, start), h,
                               b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{b.getIndexAttr(1), have, b.getIndexAttr(1),
                               b.getIndexAttr(depth)},
        SmallVector<OpFoldResult>(4, b.getIndexAttr(1)));
    Value gTile = t.fill({b.getIndexAttr(nb), b.getIndexAttr(depth)}, gElt, 0);
    gTile = tensor::InsertSliceOp::create(
        b, loc, gRows, gTile,
        ArrayRef<OpFoldResult>{t.sub(start, first), b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{have, b.getIndexAttr(depth)},
        SmallVector<OpFoldResult>(2, b.getIndexAttr(1)));
    // As [span, d]: weight m*d + p at (m, p).
    Value weights = tensor::ExpandShapeOp::create(
        b, loc, RankedTensorType::get({span, d}, f32),
        t.poolWeights(op.getWeights(), h, l),
        ArrayRef<ReassociationIndices>{{0, 1}});
    // (q, p, e, m): token t0 + q*d + p lies in block t0/d + q - m at offset
    // m*d + p, so out[q, p, e] += w[m, p] * g[q - m + span - 1, e].
    AffineExpr q = getAffineDimExpr(0, ctx), p = getAffineDimExpr(1, ctx),
               e = getAffineDimExpr(2, ctx), m = getAffineDimExpr(3, ctx);
    Value out = t.fill(
        {b.getIndexAttr(tt / d), b.getIndexAttr(d), b.getIndexAttr(depth)}, f32,
        0.0);
    out = generic(b, loc, {gTile, weights}, {out},
                  {AffineMap::get(4, 0, {q - m + (span - 1), e}, ctx),
                   AffineMap::get(4, 0, {m, p}, ctx),
                   AffineMap::get(4, 0, {q, p, e}, ctx)},
                  {IteratorType::parallel, IteratorType::parallel,
                   IteratorType::parallel, IteratorType::reduction},
                  [&](OpBuilder &nb, Location nloc, ValueRange args) {
                    Value prod = arith::MulFOp::create(
                        nb, nloc, args[1], t.toF32(nb, nloc, args[0]));
                    return SmallVector<Value>{
                        arith::AddFOp::create(nb, nloc, args[2], prod)};
                  })[0];
    out = tensor::CollapseShapeOp::create(
        b, loc, RankedTensorType::get({tt, depth}, f32), out,
        ArrayRef<ReassociationIndices>{{0, 1}, {2}});
    insertTile(b, loc, forall, t.unflattenTile(out, count, 1, tt),
               forall.getRegionIterArgs()[0], seq.batch, row0, count, h);
    return forall.getResult(0);
  }

  /// dw[h, j] = sum over sequences and blocks i of x[i*d + j, h] . g[i, h]:
  /// one iteration per KV head, walking every sequence's blocks in tiles.
  Value buildWeightsGrad(PatternRewriter &rewriter, Location loc, Value x,
                         Value g, Value cu, int64_t l, int64_t d) const {
    auto xType = cast<RankedTensorType>(x.getType());
    int64_t heads = xType.getDimSize(2);
    int64_t rowTile = std::max<int64_t>(1, (tokenTile - l) / d + 1);
    int64_t span = (rowTile - 1) * d + l;
    Type f32 = rewriter.getF32Type();
    OpBuilder &b = rewriter;
    MLIRContext *ctx = b.getContext();
    TileBuilder t(b, loc);
    Value init = t.empty({b.getIndexAttr(heads), b.getIndexAttr(l)}, f32);
    OpBuilder::InsertionGuard guard(b);
    auto forall =
        scf::ForallOp::create(b, kernelLoc(b, loc, "compress_weights_grad"),
                              ArrayRef<OpFoldResult>{b.getIndexAttr(heads)},
                              ValueRange{init}, std::nullopt);
    b.setInsertionPoint(forall.getTerminator());
    Value h = forall.getInductionVars()[0];
    Value acc = t.fill({b.getIndexAttr(l)}, f32, 0.0);
    AffineExpr j = getAffineDimExpr(0, ctx), i = getAffineDimExpr(1, ctx),
               e = getAffineDimExpr(2, ctx);
    auto seqLoop = scf::ForOp::create(
        b, loc, t.idx(0), t.numSequences(x, cu), t.idx(1), ValueRange{acc},
        [&](OpBuilder &sb, Location sloc, Value s, ValueRange sArgs) {
          TileBuilder st(sb, sloc);
          SequenceView seq = st.sequence(s, x, cu, l, d);
          Value blocks = st.numCompressedBlocks(seq.length, l, d);
          auto tileLoop = scf::ForOp::create(
              sb, sloc, st.idx(0), st.ceilDiv(blocks, rowTile), st.idx(1),
              sArgs,
              [&](OpBuilder &nb, Location nloc, Value rt, ValueRange args) {
                TileBuilder rt2(nb, nloc);
                Value r0 = rt2.mul(rt, rowTile);
                Value have =
                    rt2.clamp(rt2.sub(blocks, r0), 0, rt2.idx(rowTile));
                Value tokens0 = rt2.mul(r0, d);
                Value avail =
                    rt2.clamp(rt2.sub(seq.length, tokens0), 0, rt2.idx(span));
                Value xTile = rt2.loadTile(
                    x, seq.batch,
                    rt2.add(seq.tokenStart, rt2.min(tokens0, seq.length)),
                    avail, h, 1, span);
                Value gTile =
                    rt2.loadTile(g, seq.batch, rt2.add(seq.cmpStart, r0), have,
                                 h, 1, rowTile);
                // (j, i, e): acc[j] += x[i*d + j, e] * g[i, e].
                Value next = generic(
                    nb, nloc, {xTile, gTile}, {args[0]},
                    {AffineMap::get(3, 0, {i * d + j, e}, ctx),
                     AffineMap::get(3, 0, {i, e}, ctx),
                     AffineMap::get(3, 0, {j}, ctx)},
                    {IteratorType::parallel, IteratorType::reduction,
                     IteratorType::reduction},
                    [&](OpBuilder &gb, Location gloc, ValueRange gArgs) {
                      Value prod = arith::MulFOp::create(
                          gb, gloc, rt2.toF32(gb, gloc, gArgs[0]),
                          rt2.toF32(gb, gloc, gArgs[1]));
                      return SmallVector<Value>{
                          arith::AddFOp::create(gb, gloc, gArgs[2], prod)};
                    })[0];
                scf::YieldOp::create(nb, nloc, next);
              });
          scf::YieldOp::create(sb, sloc, tileLoop.getResults());
        });
    {
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToEnd(forall.getTerminator().getBody());
      tensor::ParallelInsertSliceOp::create(
          b, loc, seqLoop.getResult(0), forall.getRegionIterArgs()[0],
          ArrayRef<OpFoldResult>{h, b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(l)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
    }
    return forall.getResult(0);
  }

  int64_t tokenTile;
};

//===----------------------------------------------------------------------===//
// Gating gradient
//===----------------------------------------------------------------------===//

struct TileCombineGrad : OpRewritePattern<CombineGradOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(CombineGradOp op,
                                PatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    MLIRContext *ctx = b.getContext();
    TileBuilder t(b, loc);
    Value g = op.getGates(), grad = op.getGrad();
    auto outType = cast<RankedTensorType>(op.getCompressedGrad().getType());
    auto gType = cast<RankedTensorType>(g.getType());
    Type elt = outType.getElementType();
    SmallVector<IteratorType> par4(4, IteratorType::parallel);
    AffineMap id = AffineMap::getMultiDimIdentityMap(4, ctx);
    auto gate = [&](int64_t which) {
      return AffineMap::get(4, 0,
                            {getAffineDimExpr(0, ctx), getAffineDimExpr(1, ctx),
                             getAffineDimExpr(2, ctx),
                             getAffineConstantExpr(which, ctx)},
                            ctx);
    };
    // The branch gradients: sigmoid(g_b) * grad.
    SmallVector<OpFoldResult> outSizes = mixedShape(t, grad);
    SmallVector<Value> inits;
    for (int i = 0; i < 3; ++i)
      inits.push_back(t.empty(outSizes, elt));
    ValueRange branch = generic(
        b, kernelLoc(b, loc, "combine_grad"), {grad, g, g, g}, inits,
        {id, gate(0), gate(1), gate(2), id, id, id}, par4,
        [&](OpBuilder &nb, Location nloc, ValueRange args) {
          Value dOut = t.toF32(nb, nloc, args[0]);
          SmallVector<Value> grads;
          for (int i = 0; i < 3; ++i) {
            Value sig = sigmoidOf(nb, nloc, t.toF32(nb, nloc, args[1 + i]));
            grads.push_back(t.fromF32(
                nb, nloc, arith::MulFOp::create(nb, nloc, sig, dOut), elt));
          }
          return grads;
        });
    // The gate gradients: sigmoid'(g_b) * (o_b . grad).
    SmallVector<Value> dots = rowDots(
        t, {op.getCompressed(), op.getSelected(), op.getWindow()}, grad);
    AffineMap row =
        AffineMap::get(4, 0,
                       {getAffineDimExpr(0, ctx), getAffineDimExpr(1, ctx),
                        getAffineDimExpr(2, ctx)},
                       ctx);
    Value dg = generic(
        b, kernelLoc(b, loc, "combine_grad"), {g, dots[0], dots[1], dots[2]},
        {t.empty(mixedShape(t, g), gType.getElementType())},
        {id, row, row, row, id}, par4,
        [&](OpBuilder &nb, Location nloc, ValueRange args) {
          TileBuilder m(nb, nloc);
          Value which = linalg::IndexOp::create(nb, nloc, 3);
          Value dot = arith::SelectOp::create(
              nb, nloc,
              arith::CmpIOp::create(nb, nloc, arith::CmpIPredicate::eq, which,
                                    m.idx(0)),
              args[1],
              arith::SelectOp::create(
                  nb, nloc,
                  arith::CmpIOp::create(nb, nloc, arith::CmpIPredicate::eq,
                                        which, m.idx(1)),
                  args[2], args[3]));
          Value sig = sigmoidOf(nb, nloc, t.toF32(nb, nloc, args[0]));
          Value one = m.f32(1.0);
          Value slope = arith::MulFOp::create(
              nb, nloc, sig, arith::SubFOp::create(nb, nloc, one, sig));
          return SmallVector<Value>{
              t.fromF32(nb, nloc, arith::MulFOp::create(nb, nloc, slope, dot),
                        gType.getElementType())};
        })[0];
    rewriter.replaceOp(op, {branch[0], branch[1], branch[2], dg});
    return success();
  }
};

} // namespace

void mlir::nsa::populateTileGradientPatterns(RewritePatternSet &patterns,
                                             int64_t queryTile, int64_t kvTile,
                                             int64_t queryRows) {
  MLIRContext *ctx = patterns.getContext();
  GradTileOptions opts{queryTile, kvTile, queryRows};
  patterns.add<TileAttentionGrad<CompressedAttentionGradOp>,
               TileAttentionGrad<WindowAttentionGradOp>,
               TileAttentionGrad<SelectedAttentionGradOp>>(ctx, opts);
  patterns.add<TileCompressGrad>(ctx, kvTile);
  patterns.add<TileCombineGrad>(ctx);
}
