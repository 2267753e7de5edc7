//===- Tile.cpp - nsa branch ops into block-aligned, GQA-grouped loops ----===//
//
// Second step of the pipelines:
//
//   nsa.compress / *_attention / select_blocks / combine
//     --nsa-tile-->  scf.forall (sequence, KV head, query tile)
//                      tile loads (tensor.extract_slice + pad)
//                      scf.for over key tiles: online softmax in linalg.generic
//                      tensor.parallel_insert_slice of the output and lse
//
// One forall iteration owns the G query heads of one KV head for a tile of
// query tokens, so its rows are (token, head) pairs: `query-tile * G` rows
// share every key tile it loads. That is the unit the GPU mapping turns into
// one thread block, with key tiles staged in shared memory and the softmax
// state in registers. Selected attention gathers per token (its blocks
// differ from token to token), so its tile is one token's G heads.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/TileBuilder.h"

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <limits>

namespace mlir::nsa {
#define GEN_PASS_DEF_TILE
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;
using namespace mlir::nsa;
using namespace mlir::nsa::detail;

namespace {

using utils::IteratorType;

//===----------------------------------------------------------------------===//
// Query-tiled attention: compressed and window branches
//===----------------------------------------------------------------------===//

std::pair<Value, Value>
buildQueryTiledAttention(OpBuilder &b, Location loc, StringRef kernel, Value q,
                         Value k, Value v, Value cu, Value kvLens,
                         int64_t queryTile, int64_t queryRows, double scale,
                         const KeySet &keys) {
  Sizes sz = sizesOf(q, k, v);
  // 0: as many tokens as make query-rows rows (token, head) with the
  // group's heads.
  if (queryTile == 0)
    queryTile = std::max<int64_t>(1, queryRows / sz.group);
  TileBuilder t(b, loc);
  OpFoldResult batchDim = t.mixedDim(q, 0), tokenDim = t.mixedDim(q, 1);
  Value outInit = t.empty({batchDim, tokenDim, b.getIndexAttr(sz.qHeads),
                           b.getIndexAttr(sz.vDim)},
                          sz.elt);
  Value lseInit = t.empty({batchDim, tokenDim, b.getIndexAttr(sz.qHeads)},
                          b.getF32Type());
  TileGrid grid = t.sequenceTiles(q, cu, tokenDim, queryTile, /*unit=*/1);
  SmallVector<OpFoldResult> bounds = {grid.sequences,
                                      b.getIndexAttr(sz.kvHeads), grid.tiles};
  OpBuilder::InsertionGuard guard(b);
  scf::ForallOp forall =
      createTileLoop(b, loc, kernel, bounds, ValueRange{outInit, lseInit});
  SmallVector<Value> ivs = forall.getInductionVars();
  Value h = ivs[1];
  SequenceTile st = t.sequenceTile(ivs[0], ivs[2], cu, queryTile, 1);

  SequenceView seq =
      t.sequence(st.sequence, q, cu, keys.cmpBlock, keys.cmpStride, kvLens);
  auto [t0, count, row0] =
      t.queryTile(seq, t.mul(st.tile, queryTile), queryTile);
  Value head0 = t.mul(h, sz.group);
  Value qTile =
      t.loadTile(q, seq.batch, row0, count, head0, sz.group, queryTile);

  auto [keyBase, keyLimit] = keyRows(t, keys, seq);
  auto [lo, hi] = keys.keyTiles(t, t0, count);
  int64_t kvTile = keys.keyTile;
  SoftmaxState init = t.initSoftmax(queryTile * sz.group, sz.vDim);
  auto loop = scf::ForOp::create(
      b, loc, lo, hi, t.idx(1), ValueRange{init.max, init.sum, init.acc},
      [&](OpBuilder &nb, Location nloc, Value kb, ValueRange args) {
        TileBuilder kt(nb, nloc);
        Value k0 = kt.mul(kb, kvTile);
        Value kCount = kt.clamp(kt.sub(keyLimit, k0), 0, kt.idx(kvTile));
        Value kRow0 = kt.add(keyBase, kt.min(k0, keyLimit));
        Value kTile = kt.loadTile(k, seq.batch, kRow0, kCount, h, 1, kvTile);
        Value vTile = kt.loadTile(v, seq.batch, kRow0, kCount, h, 1, kvTile);
        auto mask = [&](OpBuilder &mb, Location mloc, Value r,
                        Value c) -> Value {
          TileBuilder m(mb, mloc);
          Value token = m.add(t0, m.div(r, sz.group));
          return andI1(mb, mloc, m.lt(c, kCount),
                       keys.visible(m, token, m.add(k0, c)));
        };
        SoftmaxState next = kt.attendTile(qTile, kTile, vTile, scale, mask,
                                          {args[0], args[1], args[2]});
        scf::YieldOp::create(nb, nloc,
                             ValueRange{next.max, next.sum, next.acc});
      });
  auto [out, lse] = t.finishSoftmax(
      {loop.getResult(0), loop.getResult(1), loop.getResult(2)}, sz.elt);
  ValueRange shared = forall.getRegionIterArgs();
  insertTile(b, loc, forall,
             t.unflattenTile(out, count, sz.group, queryTile), shared[0],
             seq.batch, row0, count, head0);
  insertTile(b, loc, forall,
             t.unflattenTile(lse, count, sz.group, queryTile), shared[1],
             seq.batch, row0, count, head0);
  return {forall.getResult(0), forall.getResult(1)};
}

struct TileSizes {
  int64_t queryTile, kvTile, queryRows;
};

struct TileCompressedAttention : OpRewritePattern<CompressedAttentionOp> {
  TileCompressedAttention(MLIRContext *ctx, TileSizes opts)
      : OpRewritePattern(ctx), opts(opts) {}

  LogicalResult matchAndRewrite(CompressedAttentionOp op,
                                PatternRewriter &rewriter) const override {
    if (!hasStaticHeads(op.getQuery(), op.getKey(), op.getValue()))
      return rewriter.notifyMatchFailure(op, "dynamic head counts or dims");
    auto [out, lse] = buildQueryTiledAttention(
        rewriter, op.getLoc(), "compressed_attention", op.getQuery(),
        op.getKey(), op.getValue(), op.getCuSeqlens(), op.getKvLens(),
        opts.queryTile, opts.queryRows, op.getScale().convertToDouble(),
        compressedKeySet(op.getBlock(), op.getStride(), opts.kvTile));
    rewriter.replaceOp(op, {out, lse});
    return success();
  }
  TileSizes opts;
};

struct TileWindowAttention : OpRewritePattern<WindowAttentionOp> {
  TileWindowAttention(MLIRContext *ctx, TileSizes opts)
      : OpRewritePattern(ctx), opts(opts) {}

  LogicalResult matchAndRewrite(WindowAttentionOp op,
                                PatternRewriter &rewriter) const override {
    if (!hasStaticHeads(op.getQuery(), op.getKey(), op.getValue()))
      return rewriter.notifyMatchFailure(op, "dynamic head counts or dims");
    auto [out, lse] = buildQueryTiledAttention(
        rewriter, op.getLoc(), "window_attention", op.getQuery(), op.getKey(),
        op.getValue(), op.getCuSeqlens(), op.getKvLens(), opts.queryTile,
        opts.queryRows, op.getScale().convertToDouble(),
        windowKeySet(op.getWindow(), opts.kvTile));
    rewriter.replaceOp(op, {out, lse});
    return success();
  }
  TileSizes opts;
};

//===----------------------------------------------------------------------===//
// Selected attention: one token's G heads, gathering its blocks
//===----------------------------------------------------------------------===//

struct TileSelectedAttention : OpRewritePattern<SelectedAttentionOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(SelectedAttentionOp op,
                                PatternRewriter &rewriter) const override {
    Value q = op.getQuery(), k = op.getKey(), v = op.getValue(),
          indices = op.getIndices(), cu = op.getCuSeqlens();
    if (!hasStaticHeads(q, k, v))
      return rewriter.notifyMatchFailure(op, "dynamic head counts or dims");
    Sizes sz = sizesOf(q, k, v);
    int64_t block = op.getBlock();
    double scale = op.getScale().convertToDouble();
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    TileBuilder t(b, loc);
    Value tokenDim = t.dim(q, 1);
    Value numSlots = t.dim(indices, 3);
    Value outInit = t.empty({t.mixedDim(q, 0), t.mixedDim(q, 1),
                             b.getIndexAttr(sz.qHeads),
                             b.getIndexAttr(sz.vDim)},
                            sz.elt);
    Value lseInit = t.empty(
        {t.mixedDim(q, 0), t.mixedDim(q, 1), b.getIndexAttr(sz.qHeads)},
        b.getF32Type());
    TileGrid grid = t.sequenceTiles(q, cu, tokenDim, 1, 1);
    SmallVector<OpFoldResult> bounds = {grid.sequences,
                                        b.getIndexAttr(sz.kvHeads), grid.tiles};
    scf::ForallOp forall;
    {
      OpBuilder::InsertionGuard guard(b);
      forall = createTileLoop(b, loc, "selected_attention", bounds,
                              ValueRange{outInit, lseInit});
      SmallVector<Value> ivs = forall.getInductionVars();
      Value h = ivs[1];
      SequenceTile st = t.sequenceTile(ivs[0], ivs[2], cu, 1, 1);
      SequenceView seq = t.sequence(st.sequence, q, cu, 1, 1, op.getKvLens());
      TokenView tv = t.tokenOf(seq, st.tile, q);
      Value live = tv.live, count = tv.count, row = tv.row,
            safeRow = tv.safeRow, token = tv.pos;
      Value head0 = t.mul(h, sz.group);
      Value qTile = t.loadTile(q, seq.batch, row, count, head0, sz.group, 1);
      auto blockAt = [&](TileBuilder &m, Value slot) -> Value {
        Value j = m.loadIndex(indices, {seq.batch, safeRow, h, slot});
        return m.select(live, j, m.idx(-1));
      };
      // Whether no slot before `slot` lists block `j`.
      auto firstListing = [&](OpBuilder &db, Location dloc, Value j,
                              Value slot) -> Value {
        TileBuilder dt(db, dloc);
        auto dupLoop = scf::ForOp::create(
            db, dloc, dt.idx(0), slot, dt.idx(1),
            ValueRange{arith::ConstantOp::create(db, dloc,
                                                 db.getBoolAttr(false))
                           .getResult()},
            [&](OpBuilder &lb, Location lloc, Value p, ValueRange dup) {
              TileBuilder lt(lb, lloc);
              Value same = arith::CmpIOp::create(
                  lb, lloc, arith::CmpIPredicate::eq, blockAt(lt, p), j);
              Value any = arith::OrIOp::create(lb, lloc, dup[0], same);
              scf::YieldOp::create(lb, lloc, any);
            });
        return arith::XOrIOp::create(
            db, dloc, dupLoop.getResult(0),
            arith::ConstantOp::create(db, dloc, db.getBoolAttr(true)));
      };
      SoftmaxState init = t.initSoftmax(sz.group, sz.vDim);
      auto loop = scf::ForOp::create(
          b, loc, t.idx(0), numSlots, t.idx(1),
          ValueRange{init.max, init.sum, init.acc},
          [&](OpBuilder &nb, Location nloc, Value slot, ValueRange args) {
            TileBuilder st(nb, nloc);
            Value j = blockAt(st, slot);
            // Spec 6: -1 is ignored, a block past the token's has no key
            // it sees, and a repeated block counts once: the earlier
            // slots are searched for the others only.
            Value listed = arith::CmpIOp::create(
                nb, nloc, arith::CmpIPredicate::sge, j, st.idx(0));
            Value causal = arith::CmpIOp::create(
                nb, nloc, arith::CmpIPredicate::sle, st.mul(j, block), token);
            Value seen = andI1(nb, nloc, listed, causal);
            auto active = scf::IfOp::create(
                nb, nloc, seen,
                [&](OpBuilder &ib, Location iloc) {
                  scf::YieldOp::create(
                      ib, iloc, ValueRange{firstListing(ib, iloc, j, slot)});
                },
                [&](OpBuilder &eb, Location eloc) {
                  scf::YieldOp::create(eb, eloc, ValueRange{seen});
                });
            auto ifOp = scf::IfOp::create(
                nb, nloc, active.getResult(0),
                [&](OpBuilder &ib, Location iloc) {
                  TileBuilder it(ib, iloc);
                  Value k0 = it.mul(j, block);
                  Value kCount =
                      it.clamp(it.sub(seq.length, k0), 0, it.idx(block));
                  Value kRow0 =
                      it.add(seq.tokenStart, it.min(k0, seq.length));
                  Value kTile =
                      it.loadTile(k, seq.batch, kRow0, kCount, h, 1, block);
                  Value vTile =
                      it.loadTile(v, seq.batch, kRow0, kCount, h, 1, block);
                  // Causal inside the block: key <= token.
                  auto mask = [&](OpBuilder &mb, Location mloc, Value,
                                  Value c) -> Value {
                    TileBuilder m(mb, mloc);
                    Value key = m.add(k0, c);
                    Value causal = arith::CmpIOp::create(
                        mb, mloc, arith::CmpIPredicate::sle, key, token);
                    return andI1(mb, mloc, m.lt(c, kCount), causal);
                  };
                  SoftmaxState next = it.attendTile(
                      qTile, kTile, vTile, scale, mask,
                      {args[0], args[1], args[2]});
                  scf::YieldOp::create(
                      ib, iloc, ValueRange{next.max, next.sum, next.acc});
                },
                [&](OpBuilder &eb, Location eloc) {
                  scf::YieldOp::create(eb, eloc, args);
                });
            scf::YieldOp::create(nb, nloc, ifOp.getResults());
          });
      auto [out, lse] = t.finishSoftmax(
          {loop.getResult(0), loop.getResult(1), loop.getResult(2)}, sz.elt);
      ValueRange shared = forall.getRegionIterArgs();
      insertTile(b, loc, forall, t.unflattenTile(out, count, sz.group, 1),
                 shared[0], seq.batch, row, count, head0);
      insertTile(b, loc, forall, t.unflattenTile(lse, count, sz.group, 1),
                 shared[1], seq.batch, row, count, head0);
    }
    rewriter.replaceOp(op, forall.getResults());
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Compression: the compressed rows of about kv-tile tokens of one sequence
// and KV head
//===----------------------------------------------------------------------===//

/// Spec section 3: `rowTile` compressed rows `[rowTile, depth]` (element
/// type `elt`) pooled with `weights [l]` from `xTile [(rowTile - 1) * d + l,
/// depth]`, the tokens from the first row's block on.
Value poolTile(TileBuilder &t, Value xTile, Value weights, int64_t rowTile,
               int64_t d, int64_t depth, Type elt) {
  OpBuilder &b = t.b;
  Location loc = t.loc;
  MLIRContext *ctx = b.getContext();
  Type f32 = b.getF32Type();
  // (i, e, j): out[i, e] += w[j] * x[i*d + j, e] (Spec section 3).
  AffineExpr i = getAffineDimExpr(0, ctx), e = getAffineDimExpr(1, ctx),
             j = getAffineDimExpr(2, ctx);
  SmallVector<AffineMap> maps = {AffineMap::get(3, 0, {i * d + j, e}, ctx),
                                 AffineMap::get(3, 0, {j}, ctx),
                                 AffineMap::get(3, 0, {i, e}, ctx)};
  Value acc =
      t.fill({b.getIndexAttr(rowTile), b.getIndexAttr(depth)}, f32, 0.0);
  Value pooled =
      linalg::GenericOp::create(
          b, loc, TypeRange{acc.getType()}, ValueRange{xTile, weights},
          ValueRange{acc}, maps,
          ArrayRef<IteratorType>{IteratorType::parallel, IteratorType::parallel,
                                 IteratorType::reduction},
          [&](OpBuilder &nb, Location nloc, ValueRange args) {
            Value prod = arith::MulFOp::create(nb, nloc, args[1],
                                               t.toF32(nb, nloc, args[0]));
            linalg::YieldOp::create(
                nb, nloc,
                ValueRange{arith::AddFOp::create(nb, nloc, args[2], prod)
                               .getResult()});
          })
          .getResult(0);
  if (!elt.isF32()) {
    AffineMap id = AffineMap::getMultiDimIdentityMap(2, ctx);
    pooled =
        linalg::GenericOp::create(
            b, loc, TypeRange{RankedTensorType::get({rowTile, depth}, elt)},
            ValueRange{pooled},
            ValueRange{
                t.empty({b.getIndexAttr(rowTile), b.getIndexAttr(depth)}, elt)},
            ArrayRef<AffineMap>{id, id},
            ArrayRef<IteratorType>{IteratorType::parallel,
                                   IteratorType::parallel},
            [&](OpBuilder &nb, Location nloc, ValueRange args) {
              linalg::YieldOp::create(nb, nloc,
                                      t.fromF32(nb, nloc, args[0], elt));
            })
            .getResult(0);
  }
  return pooled;
}

struct TileCompress : OpRewritePattern<CompressOp> {
  TileCompress(MLIRContext *ctx, int64_t tokenTile)
      : OpRewritePattern(ctx), tokenTile(tokenTile) {}

  LogicalResult matchAndRewrite(CompressOp op,
                                PatternRewriter &rewriter) const override {
    Value x = op.getInput(), cu = op.getCuSeqlens();
    auto xType = cast<RankedTensorType>(x.getType());
    if (xType.isDynamicDim(2) || xType.isDynamicDim(3))
      return rewriter.notifyMatchFailure(op, "dynamic heads or dim");
    int64_t heads = xType.getDimSize(2), depth = xType.getDimSize(3);
    int64_t l = op.getBlock(), d = op.getStride();
    // A tile of compressed rows reads about `tokenTile` tokens (at least
    // one block): rowTile rows span (rowTile - 1) * d + l tokens.
    int64_t rowTile = std::max<int64_t>(1, (tokenTile - l) / d + 1);
    int64_t span = (rowTile - 1) * d + l;
    Type elt = xType.getElementType();
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    TileBuilder t(b, loc);

    // Rows past the last block (packed layout) stay zero.
    Value tokens = t.dim(x, 1);
    OpFoldResult rows = t.mixedDim(op.getResult(), 1);
    if (op.getType().isDynamicDim(1))
      rows = cu ? t.div(tokens, d) : t.numCompressedBlocks(tokens, l, d);
    Value init = t.fill({t.mixedDim(x, 0), rows, b.getIndexAttr(heads),
                         b.getIndexAttr(depth)},
                        elt, 0.0);
    Value maxRows = t.numCompressedBlocks(tokens, l, d);
    scf::ForallOp forall;
    {
      OpBuilder::InsertionGuard guard(b);
      // (A sequence of L tokens has at most L / min(l, d) blocks.)
      int64_t unit = std::min(l, d);
      TileGrid grid = t.sequenceTiles(x, cu, maxRows, rowTile, unit);
      forall = createTileLoop(
          b, loc, "compress",
          {grid.sequences, b.getIndexAttr(heads), grid.tiles}, init);
      SmallVector<Value> ivs = forall.getInductionVars();
      Value h = ivs[1];
      SequenceTile st = t.sequenceTile(ivs[0], ivs[2], cu, rowTile, unit);
      SequenceView seq = t.sequence(st.sequence, x, cu, l, d);
      Value r0 = t.mul(st.tile, rowTile);
      Value count = t.clamp(
          t.sub(t.numCompressedBlocks(seq.length, l, d), r0), 0,
          t.idx(rowTile));
      Value first = t.mul(r0, d);
      Value avail = t.clamp(t.sub(seq.length, first), 0, t.idx(span));
      Value xTile =
          t.loadTile(x, seq.batch, t.add(seq.tokenStart, t.min(first,
                                                               seq.length)),
                     avail, h, 1, span);
      Value pooled = poolTile(t, xTile, t.poolWeights(op.getWeights(), h, l),
                              rowTile, d, depth, elt);
      // The first `count` rows, as [count, 1 head, D].
      insertTile(b, loc, forall, t.unflattenTile(pooled, count, 1, rowTile),
                 forall.getRegionIterArgs()[0], seq.batch,
                 t.add(seq.cmpStart, r0), count, h);
    }
    rewriter.replaceOp(op, forall.getResult(0));
    return success();
  }

  int64_t tokenTile;
};

/// Spec section 12: the blocks a decoding step completed. A forall over
/// (batch row, KV head, new block) whose shared out is the compressed cache
/// itself, so every row the step did not complete keeps its value.
struct TileCompressAppend : OpRewritePattern<CompressAppendOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(CompressAppendOp op,
                                PatternRewriter &rewriter) const override {
    Value x = op.getInput(), lens = op.getKvLens();
    auto xType = cast<RankedTensorType>(x.getType());
    if (xType.isDynamicDim(2) || xType.isDynamicDim(3))
      return rewriter.notifyMatchFailure(op, "dynamic heads or dim");
    int64_t heads = xType.getDimSize(2), depth = xType.getDimSize(3);
    int64_t l = op.getBlock(), d = op.getStride(), appended = op.getAppended();
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    TileBuilder t(b, loc);
    // Blocks i with L - a < i*d + l <= L: at most ceil(a / d) of them.
    int64_t slots = llvm::divideCeil(appended, d);
    scf::ForallOp forall;
    {
      OpBuilder::InsertionGuard guard(b);
      forall = createTileLoop(
          b, loc, "compress_append",
          {t.mixedDim(x, 0), b.getIndexAttr(heads), b.getIndexAttr(slots)},
          op.getCompressed());
      SmallVector<Value> ivs = forall.getInductionVars();
      Value batch = ivs[0], h = ivs[1];
      Value length = t.loadIndex(lens, batch);
      Value before = t.max(t.sub(length, t.idx(appended)), t.idx(0));
      Value i = t.add(t.numCompressedBlocks(before, l, d), ivs[2]);
      Value live = t.lt(i, t.numCompressedBlocks(length, l, d));
      Value count = t.select(live, t.idx(1), t.idx(0));
      Value first = t.min(t.mul(i, d), t.dim(x, 1));
      Value xTile = t.loadTile(x, batch, first,
                               t.select(live, t.idx(l), t.idx(0)), h, 1, l);
      Value pooled = poolTile(t, xTile, t.poolWeights(op.getWeights(), h, l), 1,
                              d, depth, xType.getElementType());
      insertTile(b, loc, forall, t.unflattenTile(pooled, count, 1, 1),
                 forall.getRegionIterArgs()[0], batch,
                 t.min(i, t.dim(op.getCompressed(), 1)), count, h);
    }
    rewriter.replaceOp(op, forall.getResult(0));
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Gating: elementwise over the whole output
//===----------------------------------------------------------------------===//

struct TileCombine : OpRewritePattern<CombineOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(CombineOp op,
                                PatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    MLIRContext *ctx = b.getContext();
    TileBuilder t(b, loc);
    auto type = cast<RankedTensorType>(op.getType());
    SmallVector<OpFoldResult> sizes;
    for (int64_t d = 0; d < 4; ++d)
      sizes.push_back(type.isDynamicDim(d)
                          ? OpFoldResult(t.dim(op.getCompressed(), d))
                          : OpFoldResult(b.getIndexAttr(type.getDimSize(d))));
    AffineMap id = AffineMap::getMultiDimIdentityMap(4, ctx);
    auto gate = [&](int64_t which) {
      return AffineMap::get(
          4, 0,
          {getAffineDimExpr(0, ctx), getAffineDimExpr(1, ctx),
           getAffineDimExpr(2, ctx), getAffineConstantExpr(which, ctx)},
          ctx);
    };
    Value g = op.getGates();
    auto generic = linalg::GenericOp::create(
        b, kernelLoc(b, loc, "combine"), TypeRange{type},
        ValueRange{op.getCompressed(), op.getSelected(), op.getWindow(), g, g,
                   g},
        ValueRange{t.empty(sizes, type.getElementType())},
        ArrayRef<AffineMap>{id, id, id, gate(0), gate(1), gate(2), id},
        SmallVector<IteratorType>(4, IteratorType::parallel),
        [&](OpBuilder &nb, Location nloc, ValueRange args) {
          Value sum;
          for (int i = 0; i < 3; ++i) {
            Value sig = sigmoidOf(nb, nloc, t.toF32(nb, nloc, args[3 + i]));
            Value term = arith::MulFOp::create(nb, nloc, sig,
                                               t.toF32(nb, nloc, args[i]));
            sum = sum ? arith::AddFOp::create(nb, nloc, sum, term).getResult()
                      : term;
          }
          linalg::YieldOp::create(
              nb, nloc, t.fromF32(nb, nloc, sum, type.getElementType()));
        });
    rewriter.replaceOp(op, generic.getResult(0));
    return success();
  }
};

struct TilePass : mlir::nsa::impl::TileBase<TilePass> {
  using Base::Base;

  void runOnOperation() override {
    if (failed(checkSupportedSizes(getOperation())))
      return signalPassFailure();
    if (queryTile < 0 || kvTile <= 0) {
      getOperation()->emitError() << "nsa-tile: query-tile must be "
                                     "non-negative and kv-tile positive, "
                                     "found "
                                  << static_cast<int64_t>(queryTile) << " and "
                                  << static_cast<int64_t>(kvTile);
      return signalPassFailure();
    }
    if (queryRows <= 0) {
      getOperation()->emitError()
          << "nsa-tile: query-rows must be positive, found "
          << static_cast<int64_t>(queryRows);
      return signalPassFailure();
    }
    RewritePatternSet patterns(&getContext());
    populateTilePatterns(patterns, queryTile, kvTile, queryRows);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
    // Whatever could not be tiled (dynamic head counts) is an error: later
    // stages have no lowering for it.
    WalkResult left = getOperation()->walk([](Operation *op) {
      if (isa<CompressOp, CompressAppendOp, CompressedAttentionOp,
              SelectBlocksOp, SelectedAttentionOp, WindowAttentionOp, CombineOp,
              CompressGradOp, CompressedAttentionGradOp,
              SelectedAttentionGradOp, WindowAttentionGradOp, CombineGradOp>(
              op)) {
        op->emitError() << "nsa-tile: cannot tile an op with dynamic head "
                           "counts or head dims";
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    if (left.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace

void mlir::nsa::populateTilePatterns(RewritePatternSet &patterns,
                                     int64_t queryTile, int64_t kvTile,
                                     int64_t queryRows) {
  MLIRContext *ctx = patterns.getContext();
  TileSizes opts{queryTile, kvTile, queryRows};
  patterns.add<TileCompressedAttention, TileWindowAttention>(ctx, opts);
  patterns.add<TileSelectedAttention, TileCombine>(ctx);
  patterns.add<TileCompress>(ctx, kvTile);
  patterns.add<TileCompressAppend>(ctx);
  populateTileSelectBlocksPattern(patterns, queryTile, kvTile, queryRows);
  populateTileGradientPatterns(patterns, queryTile, kvTile, queryRows);
}
