//===- TileSelectBlocks.cpp - nsa.select_blocks into per-token loops ------===//
//
// Part of `nsa-tile` (see Tile.cpp): one forall iteration per (sequence, KV
// head, token) recomputes the compression probabilities of the token's G
// query heads over key tiles of compressed blocks, sums them into the scores
// of the causal selection blocks with the overlap weights of Eq. 9 (Spec
// 5.2, 5.3), forces the backbone blocks and picks the top n (Spec 5.4).
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
    int64_t group = qHeads / kvHeads;
    int64_t l = op.getCmpBlock(), d = op.getCmpStride(),
            lp = op.getSlcBlock(), n = op.getNumSelected();
    spec::Backbone backbone = op.getBackbone().getSpec();
    double scale = op.getScale().convertToDouble();
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    MLIRContext *ctx = b.getContext();
    Type f32 = b.getF32Type(), i32 = b.getI32Type();
    TileBuilder t(b, loc);
    Value tokenDim = t.dim(q, 1);
    Value init = t.empty({t.mixedDim(q, 0), t.mixedDim(q, 1),
                          b.getIndexAttr(kvHeads), b.getIndexAttr(n)},
                         i32);
    scf::ForallOp forall = scf::ForallOp::create(
        b, loc,
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

      // Spec 5.1-5.3: scores of the causal selection blocks.
      Value scores0 = t.fill({numCand}, f32, 0.0);
      scf::ForOp tiles = loop(
          b, loc, t.idx(0), t.ceilDiv(visible, kvTile), scores0,
          [&](TileBuilder &kt, Value kb, ValueRange args) {
            Value i0 = kt.mul(kb, kvTile);
            Value kCount = kt.clamp(kt.sub(visible, i0), 0, kt.idx(kvTile));
            Value kTile = kt.loadTile(kc, seq.batch, kt.add(seq.cmpStart, i0),
                                      kCount, h, 1, kvTile);
            Value s = kt.matmulTransposeB(qTile, kTile);
            // Column sums over the group of p_cmp (Eq. 10 before Eq. 9:
            // both are sums, so the order is free).
            AffineMap gc = AffineMap::getMultiDimIdentityMap(2, ctx);
            AffineMap g = AffineMap::get(2, 0, {getAffineDimExpr(0, ctx)}, ctx);
            AffineMap c = AffineMap::get(2, 0, {getAffineDimExpr(1, ctx)}, ctx);
            Value colSum =
                linalg::GenericOp::create(
                    kt.b, kt.loc, TypeRange{RankedTensorType::get({kvTile}, f32)},
                    ValueRange{s, lseRows},
                    ValueRange{kt.fill({kt.b.getIndexAttr(kvTile)}, f32, 0.0)},
                    ArrayRef<AffineMap>{gc, g, c},
                    ArrayRef<IteratorType>{IteratorType::reduction,
                                           IteratorType::parallel},
                    [&](OpBuilder &nb, Location nloc, ValueRange a) {
                      TileBuilder m(nb, nloc);
                      Value col = linalg::IndexOp::create(nb, nloc, 1);
                      Value z = arith::MulFOp::create(nb, nloc, a[0],
                                                      m.f32(scale));
                      Value p = math::ExpOp::create(
                          nb, nloc, arith::SubFOp::create(nb, nloc, z, a[1]));
                      Value inRange = m.lt(col, kCount);
                      Value sum = arith::AddFOp::create(nb, nloc, a[2], p);
                      linalg::YieldOp::create(
                          nb, nloc,
                          ValueRange{arith::SelectOp::create(nb, nloc, inRange,
                                                             sum, a[2])
                                         .getResult()});
                    })
                    .getResult(0);
            // Eq. 9 with overlap weights: block i adds w(i, j) p to each
            // selection block j that it overlaps.
            scf::ForOp spread = loop(
                kt.b, kt.loc, kt.idx(0), kCount, args[0],
                [&](TileBuilder &ct, Value col, ValueRange sc) {
                  Value i = ct.add(i0, col);
                  Value p = extract(ct, colSum, col);
                  Value start = ct.mul(i, d);
                  Value first = ct.div(start, lp);
                  Value last = ct.min(ct.div(ct.add(start, ct.idx(l - 1)), lp),
                                      current);
                  scf::ForOp js = loop(
                      ct.b, ct.loc, first, ct.add(last, ct.idx(1)), sc[0],
                      [&](TileBuilder &jt, Value j, ValueRange acc) {
                        Value lo = jt.max(start, jt.mul(j, lp));
                        Value hi = jt.min(jt.add(start, jt.idx(l)),
                                          jt.mul(jt.add(j, jt.idx(1)), lp));
                        Value w = arith::SIToFPOp::create(
                            jt.b, jt.loc, f32,
                            arith::IndexCastOp::create(
                                jt.b, jt.loc, jt.b.getI64Type(),
                                jt.div(jt.sub(hi, lo), d)));
                        Value old = extract(jt, acc[0], j);
                        Value add = arith::AddFOp::create(
                            jt.b, jt.loc, old,
                            arith::MulFOp::create(jt.b, jt.loc, w, p));
                        return SmallVector<Value>{insert(jt, add, acc[0], j)};
                      });
                  return SmallVector<Value>{js.getResult(0)};
                });
            return SmallVector<Value>{spread.getResult(0)};
          });

      // Spec 5.4: forced blocks score +inf, so they are taken first (and,
      // should there be more than n, the lowest-indexed ones).
      AffineMap id = AffineMap::getMultiDimIdentityMap(1, ctx);
      Value forced =
          linalg::GenericOp::create(
              b, loc, TypeRange{tiles.getResult(0).getType()},
              ValueRange{}, ValueRange{tiles.getResult(0)},
              ArrayRef<AffineMap>{id},
              ArrayRef<IteratorType>{IteratorType::parallel},
              [&](OpBuilder &nb, Location nloc, ValueRange a) {
                TileBuilder m(nb, nloc);
                Value j = linalg::IndexOp::create(nb, nloc, 0);
                Value isForced = isForcedBlock(m, j, current, backbone);
                linalg::YieldOp::create(
                    nb, nloc,
                    ValueRange{arith::SelectOp::create(nb, nloc, isForced,
                                                       m.f32(kInf), a[0])
                                   .getResult()});
              })
              .getResult(0);
      // Top-n: repeatedly take the best untaken block (strictly better wins,
      // so ties go to the lower index) and mark it with -inf.
      Value picks = t.min(numCand, t.idx(n));
      scf::ForOp topn = loop(
          b, loc, t.idx(0), picks, forced,
          [&](TileBuilder &pt, Value, ValueRange sc) {
            scf::ForOp best = loop(
                pt.b, pt.loc, pt.idx(0), numCand,
                ValueRange{pt.f32(-1.0), pt.idx(0)},
                [&](TileBuilder &jt, Value j, ValueRange acc) {
                  Value score = extract(jt, sc[0], j);
                  Value better = arith::CmpFOp::create(
                      jt.b, jt.loc, arith::CmpFPredicate::OGT, score, acc[0]);
                  return SmallVector<Value>{
                      jt.select(better, score, acc[0]),
                      jt.select(better, j, acc[1])};
                });
            return SmallVector<Value>{
                insert(pt, pt.f32(-kInf), sc[0], best.getResult(1))};
          });
      // The taken blocks in increasing order, then -1.
      Value row0 = t.fill({b.getIndexAttr(n)}, i32, -1.0);
      scf::ForOp compact = loop(
          b, loc, t.idx(0), numCand, ValueRange{row0, t.idx(0)},
          [&](TileBuilder &jt, Value j, ValueRange acc) {
            Value taken = arith::CmpFOp::create(
                jt.b, jt.loc, arith::CmpFPredicate::OEQ,
                extract(jt, topn.getResult(0), j), jt.f32(-kInf));
            Value j32 = arith::IndexCastOp::create(jt.b, jt.loc, i32, j);
            auto ifOp = scf::IfOp::create(
                jt.b, jt.loc, taken,
                [&](OpBuilder &ib, Location iloc) {
                  TileBuilder it(ib, iloc);
                  scf::YieldOp::create(
                      ib, iloc,
                      ValueRange{insert(it, j32, acc[0], acc[1]),
                                 it.add(acc[1], it.idx(1))});
                },
                [&](OpBuilder &eb, Location eloc) {
                  scf::YieldOp::create(eb, eloc, acc);
                });
            return SmallVector<Value>(ifOp.getResults());
          });
      Value expanded = tensor::ExpandShapeOp::create(
          b, loc, RankedTensorType::get({1, n}, i32), compact.getResult(0),
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
