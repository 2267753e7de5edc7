//===- TileSelectBlocks.cpp - nsa.select_blocks into per-token loops ------===//
//
// Part of `nsa-tile` (see Tile.cpp): one forall iteration per (sequence, KV
// head, tile of consecutive tokens) walks the tile's causal selection blocks
// in chunks of a static size. For each chunk it recomputes the compression
// probabilities of the tokens' G query heads on the compressed blocks that
// overlap the chunk (one contraction for the whole tile: the tokens share
// the chunk's keys), sums them into each token's chunk scores with the
// overlap weights of Eq. 9 (Spec 5.2, 5.3), gives the backbone's blocks
// +inf, and merges the chunk into each token's running top-n (Spec 5.4; ties
// to the lower block). Every tile has a static size and every per-element
// step is a parallel linalg.generic, so the same IR maps onto GPU thread
// blocks with on-chip tiles.
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


/// A tensor of shape `sizes` and element `type`: element p (a point of
/// `sizes`) folds `body(p, r, acc)` over r in [0, reach) from `init`, as a
/// linalg.generic (parallel over p, sequential over r), so that a GPU block
/// shares the points among its threads.
Value reduce(
    TileBuilder &t, Type type, double init, ArrayRef<int64_t> sizes,
    int64_t reach,
    function_ref<Value(TileBuilder &, ValueRange, Value, Value)> body) {
  MLIRContext *ctx = t.b.getContext();
  unsigned rank = sizes.size();
  AffineMap out =
      AffineMap::getMultiDimIdentityMap(rank + 1, ctx).getMajorSubMap(rank);
  // The reduction dimension's size comes from this input, unused.
  AffineMap extent =
      AffineMap::get(rank + 1, 0, {getAffineDimExpr(rank, ctx)}, ctx);
  Value range = tensor::EmptyOp::create(t.b, t.loc, ArrayRef<int64_t>{reach},
                                        t.b.getI1Type());
  SmallVector<OpFoldResult> shape = llvm::map_to_vector(
      sizes, [&](int64_t v) -> OpFoldResult { return t.b.getIndexAttr(v); });
  SmallVector<utils::IteratorType> iterators(rank,
                                             utils::IteratorType::parallel);
  iterators.push_back(utils::IteratorType::reduction);
  return linalg::GenericOp::create(
             t.b, t.loc, TypeRange{RankedTensorType::get(sizes, type)},
             ValueRange{range}, ValueRange{t.fill(shape, type, init)},
             ArrayRef<AffineMap>{extent, out}, iterators,
             [&](OpBuilder &nb, Location nloc, ValueRange a) {
               TileBuilder m(nb, nloc);
               SmallVector<Value> p;
               for (unsigned d = 0; d < rank; ++d)
                 p.push_back(linalg::IndexOp::create(nb, nloc, d));
               Value r = linalg::IndexOp::create(nb, nloc, rank);
               linalg::YieldOp::create(nb, nloc, body(m, p, r, a[1]));
             })
      .getResult(0);
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

/// Emits the pieces of the selection loop of a tile of `tokens` tokens.
struct SelectBuilder {
  int64_t l, d, lp, n, group, chunk, cmpRows, tokens;
  double scale;
  Value kc;
  Type f32, i32;
  /// The tile's first token (a position in its sequence) and its last live
  /// one.
  Value t0, last;

  /// Token u of the tile; dead ones (past the sequence) act as the last
  /// live one, and their results are not written.
  Value token(TileBuilder &m, Value u) const {
    return m.min(m.add(t0, u), last);
  }
  Value current(TileBuilder &m, Value u) const {
    return m.div(token(m, u), lp);
  }
  Value visible(TileBuilder &m, Value u) const {
    return m.numCompressedBlocks(m.add(token(m, u), m.idx(1)), l, d);
  }

  /// Spec 5.1-5.3: the scores `[tokens, chunk]` of selection blocks j0 ..
  /// j0 + chunk - 1.
  Value chunkScores(TileBuilder &t, Value j0, Value qTile, Value lseTile,
                    const SequenceView &seq, Value h) const {
    MLIRContext *ctx = t.b.getContext();
    // Compressed blocks that overlap the chunk and that the last token
    // sees: i*d + l > j0*l' and i*d < (j0 + chunk)*l'.
    Value iLo = t.max(t.idx(0), arith::CeilDivSIOp::create(
                                    t.b, t.loc,
                                    t.sub(t.mul(j0, lp), t.idx(l - 1)),
                                    t.idx(d)));
    Value lastVisible = visible(t, t.idx(tokens - 1));
    Value iHi = t.min(lastVisible,
                      t.add(t.div(t.sub(t.mul(t.add(j0, t.idx(chunk)), lp),
                                        t.idx(1)),
                                  d),
                            t.idx(1)));
    Value kCount = t.clamp(t.sub(iHi, iLo), 0, t.idx(cmpRows));
    Value kTile = t.loadTile(kc, seq.batch,
                             t.add(seq.cmpStart, t.min(iLo, lastVisible)),
                             kCount, h, 1, cmpRows);
    // [tokens * G, cmpRows]: row u * G + g.
    Value s = t.matmulTransposeB(qTile, kTile);
    // Column sums over the group of p_cmp (Eq. 10 before Eq. 9: both are
    // sums, so the order is free): (u, col, g).
    auto dim = [&](unsigned i) { return getAffineDimExpr(i, ctx); };
    AffineMap sMap = AffineMap::get(3, 0, {dim(0) * group + dim(2), dim(1)},
                                    ctx);
    AffineMap lseMap = AffineMap::get(3, 0, {dim(0), dim(2)}, ctx);
    AffineMap outMap = AffineMap::get(3, 0, {dim(0), dim(1)}, ctx);
    Value colSum =
        linalg::GenericOp::create(
            t.b, t.loc,
            TypeRange{RankedTensorType::get({tokens, cmpRows}, f32)},
            ValueRange{s, lseTile},
            ValueRange{t.fill({t.b.getIndexAttr(tokens),
                               t.b.getIndexAttr(cmpRows)},
                              f32, 0.0)},
            ArrayRef<AffineMap>{sMap, lseMap, outMap},
            ArrayRef<IteratorType>{IteratorType::parallel,
                                   IteratorType::parallel,
                                   IteratorType::reduction},
            [&](OpBuilder &nb, Location nloc, ValueRange a) {
              TileBuilder m(nb, nloc);
              Value u = linalg::IndexOp::create(nb, nloc, 0);
              Value col = linalg::IndexOp::create(nb, nloc, 1);
              Value z = arith::MulFOp::create(nb, nloc, a[0], m.f32(scale));
              Value p = math::ExpOp::create(
                  nb, nloc, arith::SubFOp::create(nb, nloc, z, a[1]));
              Value sum = arith::AddFOp::create(nb, nloc, a[2], p);
              Value seen = arith::AndIOp::create(
                  nb, nloc, m.lt(col, kCount),
                  m.lt(m.add(iLo, col), visible(m, u)));
              linalg::YieldOp::create(
                  nb, nloc,
                  ValueRange{m.select(seen, sum, a[2])});
            })
            .getResult(0);
    // Eq. 9 with overlap weights: selection block j gathers w(i, j) p_i
    // from the compressed blocks i that overlap it, in increasing i (the
    // order of the reference). At most (l' + l) / d + 1 of them do, the
    // first being floor((j l' - l) / d) + 1.
    int64_t reach = (lp + l) / d + 1;
    return reduce(
        t, f32, 0.0, {tokens, chunk}, reach,
        [&](TileBuilder &m, ValueRange p, Value r, Value acc) -> Value {
          Value u = p[0], jj = p[1];
          Value j = m.add(j0, jj);
          Value jStart = m.mul(j, lp);
          Value i = m.add(arith::FloorDivSIOp::create(
                              m.b, m.loc, m.sub(jStart, m.idx(l)), m.idx(d)),
                          m.add(r, m.idx(1)));
          Value col = m.sub(i, iLo);
          Value start = m.mul(i, d);
          Value lo = m.max(start, jStart);
          Value hi = m.min(m.add(start, m.idx(l)), m.add(jStart, m.idx(lp)));
          auto andI = [&](Value x, Value y) -> Value {
            return arith::AndIOp::create(m.b, m.loc, x, y);
          };
          Value valid = andI(andI(m.lt(j, m.add(current(m, u), m.idx(1))),
                                  m.lt(lo, hi)),
                             andI(m.lt(col, kCount),
                                  m.lt(m.idx(-1), col)));
          Value w = arith::SIToFPOp::create(
              m.b, m.loc, f32,
              arith::IndexCastOp::create(m.b, m.loc, m.b.getI64Type(),
                                         m.div(m.sub(hi, lo), d)));
          Value pcol = tensor::ExtractOp::create(
              m.b, m.loc, colSum,
              ValueRange{u, m.clamp(col, 0, m.idx(cmpRows - 1))});
          Value sum = arith::AddFOp::create(
              m.b, m.loc, acc, arith::MulFOp::create(m.b, m.loc, w, pcol));
          return m.select(valid, sum, acc);
        });
  }

  /// Spec 5.4: forced blocks score above every importance (local ones
  /// +inf, others spec::kForcedScore: should there be more than n, the
  /// local ones and then the lowest); blocks past the token's own block are
  /// no candidates (-inf); a NaN importance scores spec::kNaNScore (Spec
  /// section 14), which keeps the order total.
  Value markForced(TileBuilder &t, Value scores, Value j0,
                   const spec::Backbone &backbone) const {
    AffineMap id = AffineMap::getMultiDimIdentityMap(2, t.b.getContext());
    return linalg::GenericOp::create(
               t.b, t.loc, TypeRange{scores.getType()}, ValueRange{},
               ValueRange{scores}, ArrayRef<AffineMap>{id},
               ArrayRef<IteratorType>{IteratorType::parallel,
                                      IteratorType::parallel},
               [&](OpBuilder &nb, Location nloc, ValueRange a) {
                 TileBuilder m(nb, nloc);
                 Value u = linalg::IndexOp::create(nb, nloc, 0);
                 Value j = m.add(j0, linalg::IndexOp::create(nb, nloc, 1));
                 Value c = current(m, u);
                 Value nan = arith::CmpFOp::create(
                     nb, nloc, arith::CmpFPredicate::UNO, a[0], a[0]);
                 Value score = m.select(nan, m.f32(spec::kNaNScore), a[0]);
                 Value local = m.lt(m.sub(c, j), m.idx(backbone.local));
                 Value forcedScore = m.select(local, m.f32(spec::kLocalScore),
                                              m.f32(spec::kForcedScore));
                 Value forced = m.select(isForcedBlock(m, j, c, backbone),
                                         forcedScore, score);
                 Value value = m.select(m.lt(c, j), m.f32(-kInf), forced);
                 linalg::YieldOp::create(nb, nloc, value);
               })
        .getResult(0);
  }

  /// Merges the chunk starting at block j0 into each token's running best
  /// n: of the n kept and the chunk's candidates, the n first in the order
  /// (score descending, block ascending) stay, which is what replacing the
  /// worst kept entry by each strictly better candidate in increasing block
  /// order keeps (Spec 5.4). Candidate c's rank is the number of candidates
  /// before it; the new entry p is the candidate of rank p. Both steps are
  /// parallel over (token, candidate) or (token, entry).
  SmallVector<Value> mergeTopN(TileBuilder &t, Value scores, Value j0,
                               Value bestScores, Value bestBlocks) const {
    int64_t count = n + chunk;
    // Candidate c of token u: kept entry c, or block j0 + c - n.
    auto candidate = [&](TileBuilder &m, Value u,
                         Value c) -> std::pair<Value, Value> {
      Value kept = m.lt(c, m.idx(n));
      Value k = m.min(c, m.idx(n - 1));
      Value jj = m.clamp(m.sub(c, m.idx(n)), 0, m.idx(chunk - 1));
      auto at = [&](Value tensor, Value i) -> Value {
        return tensor::ExtractOp::create(m.b, m.loc, tensor, ValueRange{u, i});
      };
      Value score = m.select(kept, at(bestScores, k), at(scores, jj));
      Value block = m.select(
          kept, at(bestBlocks, k),
          arith::IndexCastOp::create(m.b, m.loc, i32, m.add(j0, jj)));
      return {score, block};
    };
    auto cmpF = [](TileBuilder &m, arith::CmpFPredicate p, Value x, Value y) {
      return arith::CmpFOp::create(m.b, m.loc, p, x, y).getResult();
    };
    auto cmpI = [](TileBuilder &m, arith::CmpIPredicate p, Value x, Value y) {
      return arith::CmpIOp::create(m.b, m.loc, p, x, y).getResult();
    };
    Value ranks = reduce(
        t, i32, 0.0, {tokens, count}, count,
        [&](TileBuilder &m, ValueRange p, Value other, Value acc) -> Value {
          Value u = p[0], c = p[1];
          auto [s, blk] = candidate(m, u, c);
          auto [so, blko] = candidate(m, u, other);
          // Ties of (score, block) only among empty slots: index order.
          Value sameBlock = cmpI(m, arith::CmpIPredicate::eq, blko, blk);
          Value blockFirst = arith::OrIOp::create(
              m.b, m.loc, cmpI(m, arith::CmpIPredicate::slt, blko, blk),
              arith::AndIOp::create(m.b, m.loc, sameBlock, m.lt(other, c)));
          Value before = arith::OrIOp::create(
              m.b, m.loc, cmpF(m, arith::CmpFPredicate::OGT, so, s),
              arith::AndIOp::create(
                  m.b, m.loc, cmpF(m, arith::CmpFPredicate::OEQ, so, s),
                  blockFirst));
          Value one = arith::ExtUIOp::create(m.b, m.loc, i32, before);
          return arith::AddIOp::create(m.b, m.loc, acc, one);
        });
    // Entry p: the candidate of rank p (exactly one has it).
    auto entry = [&](Type type, double init, bool block) {
      return reduce(
          t, type, init, {tokens, n}, count,
          [&](TileBuilder &m, ValueRange p, Value c, Value acc) -> Value {
            Value u = p[0];
            Value rank = arith::IndexCastOp::create(
                m.b, m.loc, m.b.getIndexType(),
                tensor::ExtractOp::create(m.b, m.loc, ranks,
                                          ValueRange{u, c}));
            auto [s, blk] = candidate(m, u, c);
            return m.select(cmpI(m, arith::CmpIPredicate::eq, rank, p[1]),
                            block ? blk : s, acc);
          });
    };
    // Written back into the loop's buffers once all reads are done, so that
    // the running best stays in place across chunks.
    Value newScores = entry(f32, -kInf, false);
    Value newBlocks = entry(i32, -1.0, true);
    return {linalg::CopyOp::create(t.b, t.loc, newScores, bestScores)
                .getResult(0),
            linalg::CopyOp::create(t.b, t.loc, newBlocks, bestBlocks)
                .getResult(0)};
  }

  /// Each token's n best blocks in increasing order (Spec 5.4): the
  /// `numCand` causal blocks of the tile's last token in chunks, each
  /// merged into the running best n, then sorted.
  Value topN(TileBuilder &t, const spec::Backbone &backbone, Value count,
             Value numCand, Value qTile, Value lseTile,
             const SequenceView &seq, Value h) const {
    // Each token's best n (score, block) so far; empty slots are (-inf,
    // -1). Every tensor below has a static size, so tiles fit in on-chip
    // memory. Chunks run up to the last live token's block (none for a
    // tile past its sequence).
    SmallVector<OpFoldResult> shape = {t.b.getIndexAttr(tokens),
                                       t.b.getIndexAttr(n)};
    Value bestScores = t.fill(shape, f32, -kInf);
    Value bestBlocks = t.fill(shape, i32, -1.0);
    Value numChunks = t.select(t.lt(t.idx(0), count),
                               t.ceilDiv(numCand, chunk), t.idx(0));
    scf::ForOp chunks = loop(
        t.b, t.loc, t.idx(0), numChunks, ValueRange{bestScores, bestBlocks},
        [&](TileBuilder &ct, Value chunkIv, ValueRange best) {
          Value j0 = ct.mul(chunkIv, chunk);
          Value scores = chunkScores(ct, j0, qTile, lseTile, seq, h);
          scores = markForced(ct, scores, j0, backbone);
          return mergeTopN(ct, scores, j0, best[0], best[1]);
        });
    return sortBlocks(t, chunks.getResult(1));
  }

  /// Each token's kept blocks in increasing order, then -1 (Spec 5.4):
  /// entry p is the kept block with p kept blocks below it (empty slots,
  /// -1, sort last among themselves by position).
  Value sortBlocks(TileBuilder &t, Value blocks) const {
    auto key = [&](TileBuilder &m, Value u, Value c) -> Value {
      Value blk =
          tensor::ExtractOp::create(m.b, m.loc, blocks, ValueRange{u, c});
      Value empty = arith::CmpIOp::create(
          m.b, m.loc, arith::CmpIPredicate::slt, blk,
          arith::ConstantOp::create(m.b, m.loc, m.b.getI32IntegerAttr(0)));
      return m.select(
          empty,
          arith::ConstantOp::create(
              m.b, m.loc,
              m.b.getI32IntegerAttr(std::numeric_limits<int32_t>::max())),
          blk);
    };
    Value ranks = reduce(
        t, i32, 0.0, {tokens, n}, n,
        [&](TileBuilder &m, ValueRange p, Value other, Value acc) -> Value {
          Value u = p[0], c = p[1];
          Value kc = key(m, u, c), ko = key(m, u, other);
          Value before = arith::OrIOp::create(
              m.b, m.loc,
              arith::CmpIOp::create(m.b, m.loc, arith::CmpIPredicate::slt, ko,
                                    kc),
              arith::AndIOp::create(
                  m.b, m.loc,
                  arith::CmpIOp::create(m.b, m.loc, arith::CmpIPredicate::eq,
                                        ko, kc),
                  m.lt(other, c)));
          return arith::AddIOp::create(
              m.b, m.loc, acc, arith::ExtUIOp::create(m.b, m.loc, i32, before));
        });
    return reduce(
        t, i32, -1.0, {tokens, n}, n,
        [&](TileBuilder &m, ValueRange p, Value c, Value acc) -> Value {
          Value u = p[0];
          Value rank = arith::IndexCastOp::create(
              m.b, m.loc, m.b.getIndexType(),
              tensor::ExtractOp::create(m.b, m.loc, ranks, ValueRange{u, c}));
          Value hit = arith::CmpIOp::create(m.b, m.loc,
                                            arith::CmpIPredicate::eq, rank,
                                            p[1]);
          return m.select(
              hit,
              tensor::ExtractOp::create(m.b, m.loc, blocks, ValueRange{u, c}),
              acc);
        });
  }
};

struct TileSelectBlocks : OpRewritePattern<SelectBlocksOp> {
  TileSelectBlocks(MLIRContext *ctx, int64_t queryTile, int64_t kvTile,
                   int64_t queryRows)
      : OpRewritePattern(ctx), queryTile(queryTile), kvTile(kvTile),
        queryRows(queryRows) {}

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
    int64_t group = qHeads / kvHeads;
    // Selection blocks per chunk: about kv-tile compressed blocks each.
    int64_t chunk = std::max<int64_t>(1, kvTile * d / lp);
    // Tokens per tile: as the attention tiles (0: query-rows rows of
    // (token, head)).
    int64_t tokens =
        queryTile > 0 ? queryTile : std::max<int64_t>(1, queryRows / group);
    SelectBuilder sb{l, d, lp, n, group, chunk,
                     // Rounded up to 8 rows: the score contraction then
                     // has the shape tensor cores take (m16n8k16).
                     static_cast<int64_t>(
                         llvm::alignTo(chunk * lp / d + l / d, 8)),
                     tokens, op.getScale().convertToDouble(), kc,
                     rewriter.getF32Type(), rewriter.getI32Type(), {}, {}};
    spec::Backbone backbone = op.getBackbone().getSpec();
    Location loc = op.getLoc();
    OpBuilder &b = rewriter;
    Type f32 = sb.f32, i32 = sb.i32;
    TileBuilder t(b, loc);
    Value init = t.empty({t.mixedDim(q, 0), t.mixedDim(q, 1),
                          b.getIndexAttr(kvHeads), b.getIndexAttr(n)},
                         i32);
    TileGrid grid = t.sequenceTiles(q, cu, t.mixedDim(q, 1), tokens, 1);
    scf::ForallOp forall = scf::ForallOp::create(
        b, kernelLoc(b, loc, "select_blocks"),
        ArrayRef<OpFoldResult>{grid.sequences, b.getIndexAttr(kvHeads),
                               grid.tiles},
        ValueRange{init}, std::nullopt);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPoint(forall.getTerminator());
      SmallVector<Value> ivs = forall.getInductionVars();
      Value h = ivs[1];
      SequenceTile st = t.sequenceTile(ivs[0], ivs[2], cu, tokens, 1);
      SequenceView seq = t.sequence(st.sequence, q, cu, l, d, op.getKvLens());
      QueryTileView qv = t.queryTile(seq, t.mul(st.tile, tokens), tokens);
      sb.t0 = qv.t0;
      Value count = qv.count, row0 = qv.row0;
      sb.last = t.add(sb.t0, t.sub(t.max(count, t.idx(1)), t.idx(1)));
      Value head0 = t.mul(h, group);

      Value qTile = t.loadTile(q, seq.batch, row0, count, head0, group, tokens);
      // The tokens' log-sum-exp rows [tokens, G], zeros past the end.
      Value lseRows = tensor::ExtractSliceOp::create(
          b, loc, RankedTensorType::get({ShapedType::kDynamic, group}, f32),
          lse, ArrayRef<OpFoldResult>{seq.batch, row0, head0},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), count,
                                 b.getIndexAttr(group)},
          SmallVector<OpFoldResult>(3, b.getIndexAttr(1)));
      Value lseTile = tensor::InsertSliceOp::create(
          b, loc, lseRows,
          t.fill({b.getIndexAttr(tokens), b.getIndexAttr(group)}, f32, 0.0),
          ArrayRef<OpFoldResult>{b.getIndexAttr(0), b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{count, b.getIndexAttr(group)},
          SmallVector<OpFoldResult>(2, b.getIndexAttr(1)));

      // Each token's best n (score, block) so far; empty slots are (-inf,
      // -1). Every tensor below has a static size, so tiles fit in on-chip
      // memory. Chunks run up to the last live token's block (none for a
      // tile past its sequence).
      Value numCand = t.add(t.div(sb.last, lp), t.idx(1));
      // Where every causal block of the tile's last token fits in n (n
      // large against T / l'), each token keeps its blocks 0 .. c whatever
      // their scores (Spec 5.4): no scores, no merge.
      auto sorted = scf::IfOp::create(
          b, loc, t.lt(numCand, t.idx(n + 1)),
          [&](OpBuilder &ib, Location iloc) {
            TileBuilder it(ib, iloc);
            Value all = reduce(
                it, i32, -1.0, {tokens, n}, 1,
                [&](TileBuilder &m, ValueRange p, Value, Value acc) -> Value {
                  Value j = arith::IndexCastOp::create(m.b, m.loc, i32, p[1]);
                  return m.select(
                      m.lt(p[1], m.add(sb.current(m, p[0]), m.idx(1))), j, acc);
                });
            scf::YieldOp::create(ib, iloc, all);
          },
          [&](OpBuilder &eb, Location eloc) {
            TileBuilder et(eb, eloc);
            scf::YieldOp::create(
                eb, eloc,
                sb.topN(et, backbone, count, numCand, qTile, lseTile, seq, h));
          });
      Value tile = tensor::ExtractSliceOp::create(
          b, loc, RankedTensorType::get({ShapedType::kDynamic, n}, i32),
          sorted.getResult(0),
          ArrayRef<OpFoldResult>{b.getIndexAttr(0), b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{count, b.getIndexAttr(n)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToEnd(forall.getTerminator().getBody());
      tensor::ParallelInsertSliceOp::create(
          b, loc, tile, forall.getRegionIterArgs()[0],
          ArrayRef<OpFoldResult>{seq.batch, row0, h, b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), count, b.getIndexAttr(1),
                                 b.getIndexAttr(n)},
          SmallVector<OpFoldResult>(4, b.getIndexAttr(1)));
    }
    rewriter.replaceOp(op, forall.getResult(0));
    return success();
  }

  int64_t queryTile, kvTile, queryRows;
};

} // namespace

void mlir::nsa::populateTileSelectBlocksPattern(RewritePatternSet &patterns,
                                                int64_t queryTile,
                                                int64_t kvTile,
                                                int64_t queryRows) {
  patterns.add<TileSelectBlocks>(patterns.getContext(), queryTile, kvTile,
                                 queryRows);
}
