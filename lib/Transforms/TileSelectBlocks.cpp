//===- TileSelectBlocks.cpp - nsa.select_blocks into per-token loops ------===//
//
// Part of `nsa-tile` (see Tile.cpp): one forall iteration per (sequence, KV
// head, token) walks the token's causal selection blocks in chunks of a
// static size. For each chunk it recomputes the compression probabilities of
// the token's G query heads on the compressed blocks that overlap the chunk,
// sums them into the chunk's scores with the overlap weights of Eq. 9 (Spec
// 5.2, 5.3), gives the backbone's blocks +inf, and merges the chunk into a
// running top-n (Spec 5.4; ties to the lower block). Every tile has a static
// size, so the same IR maps onto GPU thread blocks with on-chip tiles.
//
//===----------------------------------------------------------------------===//

#include "TileBuilder.h"

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"
#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::nsa;
using namespace mlir::nsa::detail;

namespace {

using utils::IteratorType;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// A 1-D scf.for over `[lo, hi)` carrying `init`; `body` returns the new
/// values.
scf::ForOp loop(OpBuilder &b, Location loc, Value lo, Value hi,
                ValueRange init,
                function_ref<SmallVector<Value>(TileBuilder &, Value,
                                                ValueRange)>
                    body) {
  return scf::ForOp::create(
      b, loc, lo, hi, arith::ConstantIndexOp::create(b, loc, 1), init,
      [&](OpBuilder &nb, Location nloc, Value iv, ValueRange args) {
        TileBuilder t(nb, nloc);
        scf::YieldOp::create(nb, nloc, body(t, iv, args));
      });
}

Value extract(TileBuilder &t, Value tensor, Value i) {
  return tensor::ExtractOp::create(t.b, t.loc, tensor, ValueRange{i});
}
Value insert(TileBuilder &t, Value scalar, Value tensor, Value i) {
  return tensor::InsertOp::create(t.b, t.loc, scalar, tensor, ValueRange{i});
}

/// `j` (a causal block of the query's block `c`) is forced: the patterns of
/// spec::Backbone::isForced as index arithmetic.
Value isForcedBlock(TileBuilder &m, Value j, Value c,
                    const spec::Backbone &bb) {
  OpBuilder &b = m.b;
  Location loc = m.loc;
  auto cmp = [&](arith::CmpIPredicate pred, Value x, Value y) -> Value {
    return arith::CmpIOp::create(b, loc, pred, x, y);
  };
  auto orI = [&](Value x, Value y) -> Value {
    return arith::OrIOp::create(b, loc, x, y);
  };
  Value back = m.sub(c, j);
  Value forced = orI(m.lt(j, m.idx(bb.initial)), m.lt(back, m.idx(bb.local)));
  if (bb.logLevels > 0) {
    // back = 2^i, i < logLevels: a positive power of two below 2^levels.
    Value pow2 = cmp(arith::CmpIPredicate::eq,
                     arith::AndIOp::create(b, loc, back,
                                           m.sub(back, m.idx(1))),
                     m.idx(0));
    Value inRange = arith::AndIOp::create(
        b, loc, m.lt(m.idx(0), back),
        m.lt(back, m.idx(int64_t(1) << bb.logLevels)));
    forced = orI(forced, arith::AndIOp::create(b, loc, pow2, inRange));
  }
  if (bb.hubStride > 0)
    forced = orI(forced, cmp(arith::CmpIPredicate::eq,
                             arith::RemSIOp::create(b, loc, j,
                                                    m.idx(bb.hubStride)),
                             m.idx(0)));
  for (int64_t block : bb.blocks)
    forced = orI(forced, cmp(arith::CmpIPredicate::eq, j, m.idx(block)));
  return forced;
}

/// Emits the pieces of the per-token selection loop.
struct SelectBuilder {
  int64_t l, d, lp, n, group, chunk, cmpRows;
  double scale;
  Value kc;
  Type f32, i32;

  /// Spec 5.1-5.3: the scores of selection blocks j0 .. j0 + chunk - 1.
  Value chunkScores(TileBuilder &t, Value j0, Value current, Value visible,
                    Value qTile, Value lseRows, const SequenceView &seq,
                    Value h) const {
    MLIRContext *ctx = t.b.getContext();
    // Compressed blocks that overlap the chunk and are visible:
    // i*d + l > j0*l' and i*d < (j0 + chunk)*l'.
    Value iLo = t.max(t.idx(0), arith::CeilDivSIOp::create(
                                    t.b, t.loc,
                                    t.sub(t.mul(j0, lp), t.idx(l - 1)),
                                    t.idx(d)));
    Value iHi = t.min(visible,
                      t.add(t.div(t.sub(t.mul(t.add(j0, t.idx(chunk)), lp),
                                        t.idx(1)),
                                  d),
                            t.idx(1)));
    Value kCount = t.clamp(t.sub(iHi, iLo), 0, t.idx(cmpRows));
    Value kTile = t.loadTile(kc, seq.batch,
                             t.add(seq.cmpStart, t.min(iLo, visible)), kCount,
                             h, 1, cmpRows);
    Value s = t.matmulTransposeB(qTile, kTile);
    // Column sums over the group of p_cmp (Eq. 10 before Eq. 9: both are
    // sums, so the order is free).
    AffineMap gc = AffineMap::getMultiDimIdentityMap(2, ctx);
    AffineMap g = AffineMap::get(2, 0, {getAffineDimExpr(0, ctx)}, ctx);
    AffineMap c = AffineMap::get(2, 0, {getAffineDimExpr(1, ctx)}, ctx);
    Value colSum =
        linalg::GenericOp::create(
            t.b, t.loc, TypeRange{RankedTensorType::get({cmpRows}, f32)},
            ValueRange{s, lseRows},
            ValueRange{t.fill({t.b.getIndexAttr(cmpRows)}, f32, 0.0)},
            ArrayRef<AffineMap>{gc, g, c},
            ArrayRef<IteratorType>{IteratorType::reduction,
                                   IteratorType::parallel},
            [&](OpBuilder &nb, Location nloc, ValueRange a) {
              TileBuilder m(nb, nloc);
              Value col = linalg::IndexOp::create(nb, nloc, 1);
              Value z = arith::MulFOp::create(nb, nloc, a[0], m.f32(scale));
              Value p = math::ExpOp::create(
                  nb, nloc, arith::SubFOp::create(nb, nloc, z, a[1]));
              Value sum = arith::AddFOp::create(nb, nloc, a[2], p);
              linalg::YieldOp::create(
                  nb, nloc,
                  ValueRange{arith::SelectOp::create(nb, nloc,
                                                     m.lt(col, kCount), sum,
                                                     a[2])
                                 .getResult()});
            })
            .getResult(0);
    // Eq. 9 with overlap weights: block i adds w(i, j) p to each selection
    // block j of the chunk that it overlaps.
    Value scores0 = t.fill({t.b.getIndexAttr(chunk)}, f32, 0.0);
    Value chunkEnd = t.min(t.add(j0, t.idx(chunk - 1)), current);
    scf::ForOp spread = loop(
        t.b, t.loc, t.idx(0), kCount, scores0,
        [&](TileBuilder &ct, Value col, ValueRange sc) {
          Value i = ct.add(iLo, col);
          Value p = extract(ct, colSum, col);
          Value start = ct.mul(i, d);
          Value first = ct.max(ct.div(start, lp), j0);
          Value last =
              ct.min(ct.div(ct.add(start, ct.idx(l - 1)), lp), chunkEnd);
          scf::ForOp js = loop(
              ct.b, ct.loc, first, ct.add(last, ct.idx(1)), sc[0],
              [&](TileBuilder &jt, Value j, ValueRange acc) {
                Value lo = jt.max(start, jt.mul(j, lp));
                Value hi = jt.min(jt.add(start, jt.idx(l)),
                                  jt.mul(jt.add(j, jt.idx(1)), lp));
                Value w = arith::SIToFPOp::create(
                    jt.b, jt.loc, f32,
                    arith::IndexCastOp::create(jt.b, jt.loc,
                                               jt.b.getI64Type(),
                                               jt.div(jt.sub(hi, lo), d)));
                Value jj = jt.sub(j, j0);
                Value add = arith::AddFOp::create(
                    jt.b, jt.loc, extract(jt, acc[0], jj),
                    arith::MulFOp::create(jt.b, jt.loc, w, p));
                return SmallVector<Value>{insert(jt, add, acc[0], jj)};
              });
          return SmallVector<Value>{js.getResult(0)};
        });
    return spread.getResult(0);
  }

  /// Spec 5.4: forced blocks score +inf (so they are always kept, and
  /// should there be more than n, the lowest ones); blocks past the query's
  /// own block are no candidates (-inf).
  Value markForced(TileBuilder &t, Value scores, Value j0, Value current,
                   const spec::Backbone &backbone) const {
    AffineMap id = AffineMap::getMultiDimIdentityMap(1, t.b.getContext());
    return linalg::GenericOp::create(
               t.b, t.loc, TypeRange{scores.getType()}, ValueRange{},
               ValueRange{scores}, ArrayRef<AffineMap>{id},
               ArrayRef<IteratorType>{IteratorType::parallel},
               [&](OpBuilder &nb, Location nloc, ValueRange a) {
                 TileBuilder m(nb, nloc);
                 Value j = m.add(j0, linalg::IndexOp::create(nb, nloc, 0));
                 Value forced = m.select(isForcedBlock(m, j, current, backbone),
                                         m.f32(kInf), a[0]);
                 Value value = m.select(m.lt(current, j), m.f32(-kInf), forced);
                 linalg::YieldOp::create(nb, nloc, value);
               })
        .getResult(0);
  }

  /// Merges the chunk starting at block j0 into the running best n: a
  /// candidate replaces the worst kept entry (lowest score, then highest
  /// block) when its score is strictly higher. Chunks come in increasing
  /// block order, so on equal scores the lower block stays.
  SmallVector<Value> mergeTopN(TileBuilder &t, Value scores, Value j0,
                               Value bestScores, Value bestBlocks) const {
    scf::ForOp merged = loop(
        t.b, t.loc, t.idx(0), t.idx(chunk), ValueRange{bestScores, bestBlocks},
        [&](TileBuilder &ct, Value jj, ValueRange best) {
          Value score = extract(ct, scores, jj);
          scf::ForOp worst = loop(
              ct.b, ct.loc, ct.idx(0), ct.idx(n),
              ValueRange{ct.f32(kInf), arith::ConstantOp::create(
                                           ct.b, ct.loc,
                                           ct.b.getI32IntegerAttr(-1))
                                           .getResult(),
                         ct.idx(0)},
              [&](TileBuilder &wt, Value p, ValueRange acc) {
                Value s = extract(wt, best[0], p);
                Value blk = extract(wt, best[1], p);
                Value lower = arith::CmpFOp::create(
                    wt.b, wt.loc, arith::CmpFPredicate::OLT, s, acc[0]);
                Value tie = arith::AndIOp::create(
                    wt.b, wt.loc,
                    arith::CmpFOp::create(wt.b, wt.loc,
                                          arith::CmpFPredicate::OEQ, s,
                                          acc[0]),
                    arith::CmpIOp::create(wt.b, wt.loc,
                                          arith::CmpIPredicate::sgt, blk,
                                          acc[1]));
                Value take = arith::OrIOp::create(wt.b, wt.loc, lower, tie);
                return SmallVector<Value>{wt.select(take, s, acc[0]),
                                          wt.select(take, blk, acc[1]),
                                          wt.select(take, p, acc[2])};
              });
          Value better = arith::CmpFOp::create(ct.b, ct.loc,
                                               arith::CmpFPredicate::OGT,
                                               score, worst.getResult(0));
          Value pos = worst.getResult(2);
          Value block = arith::IndexCastOp::create(ct.b, ct.loc, i32,
                                                   ct.add(j0, jj));
          auto replace = scf::IfOp::create(
              ct.b, ct.loc, better,
              [&](OpBuilder &ib, Location iloc) {
                TileBuilder it(ib, iloc);
                scf::YieldOp::create(
                    ib, iloc,
                    ValueRange{insert(it, score, best[0], pos),
                               insert(it, block, best[1], pos)});
              },
              [&](OpBuilder &eb, Location eloc) {
                scf::YieldOp::create(eb, eloc, best);
              });
          return SmallVector<Value>(replace.getResults());
        });
    return SmallVector<Value>(merged.getResults());
  }

  /// The kept blocks in increasing order, then -1 (Spec 5.4).
  Value sortBlocks(TileBuilder &t, Value blocks) const {
    Value sorted0 = t.fill({t.b.getIndexAttr(n)}, i32, -1.0);
    Value none = arith::ConstantOp::create(
        t.b, t.loc, t.b.getI32IntegerAttr(std::numeric_limits<int32_t>::max()));
    Value minusOne =
        arith::ConstantOp::create(t.b, t.loc, t.b.getI32IntegerAttr(-1));
    scf::ForOp sorted = loop(
        t.b, t.loc, t.idx(0), t.idx(n), ValueRange{sorted0, minusOne},
        [&](TileBuilder &st, Value pos, ValueRange acc) {
          // The smallest kept block above the previous one.
          scf::ForOp next = loop(
              st.b, st.loc, st.idx(0), st.idx(n), ValueRange{none},
              [&](TileBuilder &nt, Value p, ValueRange m) {
                Value blk = extract(nt, blocks, p);
                Value above = arith::CmpIOp::create(
                    nt.b, nt.loc, arith::CmpIPredicate::sgt, blk, acc[1]);
                Value smaller = arith::CmpIOp::create(
                    nt.b, nt.loc, arith::CmpIPredicate::slt, blk, m[0]);
                Value take = arith::AndIOp::create(nt.b, nt.loc, above,
                                                   smaller);
                return SmallVector<Value>{nt.select(take, blk, m[0])};
              });
          Value found = arith::CmpIOp::create(st.b, st.loc,
                                              arith::CmpIPredicate::ne,
                                              next.getResult(0), none);
          Value value = st.select(found, next.getResult(0), minusOne);
          return SmallVector<Value>{insert(st, value, acc[0], pos),
                                    st.select(found, value, acc[1])};
        });
    return sorted.getResult(0);
  }
};

struct TileSelectBlocks : OpRewritePattern<SelectBlocksOp> {
  TileSelectBlocks(MLIRContext *ctx, int64_t kvTile)
      : OpRewritePattern(ctx), kvTile(kvTile) {}

  LogicalResult matchAndRewrite(SelectBlocksOp op,
                                PatternRewriter &rewriter) const override {
    Value q = op.getQuery(), kc = op.getKey(), lse = op.getLse(),
          cu = op.getCuSeqlens();
    auto qType = cast<RankedTensorType>(q.getType());
    auto kType = cast<RankedTensorType>(kc.getType());
    if (qType.isDynamicDim(2) || qType.isDynamicDim(3) ||
        kType.isDynamicDim(2))
      return rewriter.notifyMatchFailure(op, "dynamic heads or dims");
    int64_t qHeads = qType.getDimSize(2), kvHeads = kType.getDimSize(2);
    int64_t l = op.getCmpBlock(), d = op.getCmpStride(),
            lp = op.getSlcBlock(), n = op.getNumSelected();
    // Selection blocks per chunk: about kv-tile compressed blocks each.
    int64_t chunk = std::max<int64_t>(1, kvTile * d / lp);
    SelectBuilder sb{l, d, lp, n, qHeads / kvHeads, chunk,
                     // Rounded up to 8 rows: the score contraction then
                     // has the shape tensor cores take (m16n8k16).
                     static_cast<int64_t>(
                         llvm::alignTo(chunk * lp / d + l / d, 8)),
                     op.getScale().convertToDouble(), kc,
                     rewriter.getF32Type(), rewriter.getI32Type()};
    spec::Backbone backbone = op.getBackbone().getSpec();
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    Type f32 = sb.f32, i32 = sb.i32;
    int64_t group = sb.group;
    TileBuilder t(b, loc);
    Value tokenDim = t.dim(q, 1);
    Value init = t.empty({t.mixedDim(q, 0), t.mixedDim(q, 1),
                          b.getIndexAttr(kvHeads), b.getIndexAttr(n)},
                         i32);
    scf::ForallOp forall = scf::ForallOp::create(
        b, kernelLoc(b, loc, "select_blocks"),
        ArrayRef<OpFoldResult>{t.numSequences(q, cu),
                               b.getIndexAttr(kvHeads), tokenDim},
        ValueRange{init}, std::nullopt);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPoint(forall.getTerminator());
      ValueRange ivs = forall.getInductionVars();
      Value h = ivs[1];
      SequenceView seq = t.sequence(ivs[0], q, cu, l, d);
      TokenView tv = t.tokenOf(seq, ivs[2], q);
      Value count = tv.count, row = tv.row, safeRow = tv.safeRow;
      // A token past its sequence computes on token 0 and writes nothing.
      Value token = t.select(tv.live, ivs[2], t.idx(0));
      Value head0 = t.mul(h, group);
      Value current = t.div(token, lp);
      Value numCand = t.add(current, t.idx(1));
      Value visible = t.numCompressedBlocks(t.add(token, t.idx(1)), l, d);

      Value qTile = t.loadTile(q, seq.batch, row, count, head0, group, 1);
      Value lseRows = tensor::ExtractSliceOp::create(
          b, loc, RankedTensorType::get({group}, f32), lse,
          ArrayRef<OpFoldResult>{seq.batch, safeRow, head0},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1),
                                 b.getIndexAttr(group)},
          SmallVector<OpFoldResult>(3, b.getIndexAttr(1)));

      // The best n (score, block) so far; empty slots are (-inf, -1). Every
      // tensor below has a static size, so tiles fit in on-chip memory.
      Value bestScores = t.fill({b.getIndexAttr(n)}, f32, -kInf);
      Value bestBlocks = t.fill({b.getIndexAttr(n)}, i32, -1.0);
      scf::ForOp chunks = loop(
          b, loc, t.idx(0), t.ceilDiv(numCand, chunk),
          ValueRange{bestScores, bestBlocks},
          [&](TileBuilder &ct, Value chunkIv, ValueRange best) {
            Value j0 = ct.mul(chunkIv, chunk);
            Value scores = sb.chunkScores(ct, j0, current, visible, qTile,
                                       lseRows, seq, h);
            scores = sb.markForced(ct, scores, j0, current, backbone);
            return sb.mergeTopN(ct, scores, j0, best[0], best[1]);
          });
      Value sorted = sb.sortBlocks(t, chunks.getResult(1));
      Value expanded = tensor::ExpandShapeOp::create(
          b, loc, RankedTensorType::get({1, n}, i32), sorted,
          ArrayRef<ReassociationIndices>{{0, 1}});
      Value tile = tensor::ExtractSliceOp::create(
          b, loc, RankedTensorType::get({ShapedType::kDynamic, n}, i32),
          expanded, ArrayRef<OpFoldResult>{b.getIndexAttr(0), b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{count, b.getIndexAttr(n)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToEnd(forall.getTerminator().getBody());
      tensor::ParallelInsertSliceOp::create(
          b, loc, tile, forall.getRegionIterArgs()[0],
          ArrayRef<OpFoldResult>{seq.batch, row, h, b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), count, b.getIndexAttr(1),
                                 b.getIndexAttr(n)},
          SmallVector<OpFoldResult>(4, b.getIndexAttr(1)));
    }
    rewriter.replaceOp(op, forall.getResult(0));
    return success();
  }

  int64_t kvTile;
};

} // namespace

void mlir::nsa::populateTileSelectBlocksPattern(RewritePatternSet &patterns,
                                                int64_t kvTile) {
  patterns.add<TileSelectBlocks>(patterns.getContext(), kvTile);
}
