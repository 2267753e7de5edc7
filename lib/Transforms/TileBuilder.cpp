//===- TileBuilder.cpp - building blocks of the tiled nsa IR --------------===//
//
// See TileBuilder.h. Everything here emits ops on tensors; bufferization and
// the CPU or GPU back end decide where tiles live.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/TileBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::nsa::detail;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
using utils::IteratorType;
} // namespace

//===----------------------------------------------------------------------===//
// Index arithmetic
//===----------------------------------------------------------------------===//

Value TileBuilder::idx(int64_t v) {
  return arith::ConstantIndexOp::create(b, loc, v);
}
Value TileBuilder::add(Value x, Value y) {
  return arith::AddIOp::create(b, loc, x, y);
}
Value TileBuilder::sub(Value x, Value y) {
  return arith::SubIOp::create(b, loc, x, y);
}
Value TileBuilder::mul(Value x, Value y) {
  return arith::MulIOp::create(b, loc, x, y);
}
Value TileBuilder::div(Value x, int64_t y) {
  return arith::DivSIOp::create(b, loc, x, idx(y));
}
Value TileBuilder::ceilDiv(Value x, int64_t y) {
  return arith::CeilDivSIOp::create(b, loc, x, idx(y));
}
Value TileBuilder::min(Value x, Value y) {
  return arith::MinSIOp::create(b, loc, x, y);
}
Value TileBuilder::max(Value x, Value y) {
  return arith::MaxSIOp::create(b, loc, x, y);
}
Value TileBuilder::lt(Value x, Value y) {
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, x, y);
}
Value TileBuilder::select(Value cond, Value x, Value y) {
  return arith::SelectOp::create(b, loc, cond, x, y);
}
Value TileBuilder::clamp(Value v, int64_t lo, Value hi) {
  return max(idx(lo), min(v, hi));
}
Value TileBuilder::dim(Value tensor, int64_t d) {
  return tensor::DimOp::create(b, loc, tensor, d);
}

OpFoldResult TileBuilder::mixedDim(Value tensor, int64_t d) {
  auto type = cast<RankedTensorType>(tensor.getType());
  if (!type.isDynamicDim(d))
    return b.getIndexAttr(type.getDimSize(d));
  return dim(tensor, d);
}

Value TileBuilder::loadIndex(Value tensor, ValueRange indices) {
  Value v = tensor::ExtractOp::create(b, loc, tensor, indices);
  return arith::IndexCastOp::create(b, loc, b.getIndexType(), v);
}

Value TileBuilder::numCompressedBlocks(Value seqLen, int64_t block,
                                       int64_t stride) {
  // Spec section 3: len < l ? 0 : (len - l) / d + 1.
  Value blocks = add(div(sub(seqLen, idx(block)), stride), idx(1));
  return select(lt(seqLen, idx(block)), idx(0), blocks);
}

Value TileBuilder::numSequences(Value tokens4d, Value cuSeqlens) {
  if (!cuSeqlens)
    return dim(tokens4d, 0);
  return sub(dim(cuSeqlens, 0), idx(1));
}

TileGrid TileBuilder::sequenceTiles(Value tokens4d, Value cuSeqlens,
                                    OpFoldResult extent, int64_t tile,
                                    int64_t unit) {
  if (!cuSeqlens) {
    Value sizeOf = getValueOrCreateConstantIndexOp(b, loc, extent);
    return {OpFoldResult(numSequences(tokens4d, cuSeqlens)),
            OpFoldResult(ceilDiv(sizeOf, tile))};
  }
  Value sequences = numSequences(tokens4d, cuSeqlens);
  Value tiles = add(div(dim(tokens4d, 1), tile * unit), sequences);
  return {b.getIndexAttr(1), select(lt(sequences, idx(1)), idx(0), tiles)};
}

SequenceTile TileBuilder::sequenceTile(Value iv0, Value iv2, Value cuSeqlens,
                                       int64_t tile, int64_t unit) {
  if (!cuSeqlens)
    return {iv0, iv2};
  // The sequences' first tiles cu[s] / (tile * unit) + s ascend: the last
  // sequence whose first tile is at most iv2, by 31 halvings of [0, S)
  // (positions are i32).
  auto firstTile = [&](TileBuilder &t, Value s) {
    return t.add(t.div(t.loadIndex(cuSeqlens, s), tile * unit), s);
  };
  auto search = scf::ForOp::create(
      b, loc, idx(0), idx(31), idx(1),
      ValueRange{idx(0), numSequences(Value(), cuSeqlens)},
      [&](OpBuilder &nb, Location nloc, Value, ValueRange range) {
        TileBuilder t(nb, nloc);
        Value mid = t.div(t.add(range[0], range[1]), 2);
        Value before = arith::CmpIOp::create(
            nb, nloc, arith::CmpIPredicate::sle, firstTile(t, mid), iv2);
        scf::YieldOp::create(nb, nloc,
                             ValueRange{t.select(before, mid, range[0]),
                                        t.select(before, range[1], mid)});
      });
  Value s = search.getResult(0), first = firstTile(*this, s);
  // (Only where cu_seqlens does not ascend is iv2 before the first tile.)
  Value local = select(lt(iv2, first),
                       idx(std::numeric_limits<int32_t>::max()),
                       sub(iv2, first));
  return {s, local};
}

SequenceView TileBuilder::sequence(Value s, Value tokens4d, Value cuSeqlens,
                                   int64_t cmpBlock, int64_t cmpStride,
                                   Value kvLens) {
  if (kvLens) {
    // Spec section 12: the queries are the last tokens of the cache's.
    Value length = loadIndex(kvLens, s), queries = dim(tokens4d, 1);
    return {s, idx(0), length, idx(0), idx(0), sub(length, queries), queries};
  }
  if (!cuSeqlens) {
    Value length = dim(tokens4d, 1);
    return {s, idx(0), length, idx(0), idx(0), idx(0), length};
  }
  Value start = loadIndex(cuSeqlens, s),
        end = loadIndex(cuSeqlens, add(s, idx(1)));
  // Spec section 3, packed layout: the blocks of earlier sequences first.
  auto prefix = scf::ForOp::create(
      b, loc, idx(0), s, idx(1), ValueRange{idx(0)},
      [&](OpBuilder &nb, Location nloc, Value i, ValueRange args) {
        TileBuilder t(nb, nloc);
        Value len = t.sub(t.loadIndex(cuSeqlens, t.add(i, t.idx(1))),
                          t.loadIndex(cuSeqlens, i));
        Value sum =
            t.add(args[0], t.numCompressedBlocks(len, cmpBlock, cmpStride));
        scf::YieldOp::create(nb, nloc, sum);
      });
  Value length = sub(end, start);
  return {idx(0), start, length, prefix.getResult(0), start, idx(0), length};
}

TokenView TileBuilder::tokenOf(const SequenceView &seq, Value token,
                               Value tokens4d) {
  Value live = lt(token, seq.queryLength);
  Value row = add(seq.queryRowStart, min(token, seq.queryLength));
  return {live, select(live, idx(1), idx(0)), row,
          min(row, sub(dim(tokens4d, 1), idx(1))), add(seq.queryStart, token)};
}

QueryTileView TileBuilder::queryTile(const SequenceView &seq, Value r0,
                                     int64_t tileRows) {
  return {add(seq.queryStart, r0),
          clamp(sub(seq.queryLength, r0), 0, idx(tileRows)),
          add(seq.queryRowStart, min(r0, seq.queryLength))};
}

//===----------------------------------------------------------------------===//
// Tensors
//===----------------------------------------------------------------------===//

Value TileBuilder::empty(ArrayRef<OpFoldResult> sizes, Type elt) {
  return tensor::EmptyOp::create(b, loc, sizes, elt);
}

Value TileBuilder::tile(int64_t rows, int64_t cols, Type elt) {
  int64_t pad = rowPadding(cols, elt);
  if (!pad)
    return empty({b.getIndexAttr(rows), b.getIndexAttr(cols)}, elt);
  Value full = empty({b.getIndexAttr(rows), b.getIndexAttr(cols + pad)}, elt);
  return tensor::ExtractSliceOp::create(
      b, loc, RankedTensorType::get({rows, cols}, elt), full,
      ArrayRef<OpFoldResult>{b.getIndexAttr(0), b.getIndexAttr(0)},
      ArrayRef<OpFoldResult>{b.getIndexAttr(rows), b.getIndexAttr(cols)},
      ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
}

int64_t TileBuilder::rowPadding(int64_t cols, Type elt) {
  int64_t bits = elt.getIntOrFloatBitWidth();
  if (bits % 8 || 128 % (bits / 8))
    return 0;
  int64_t bytes = bits / 8;
  return (cols * bytes) % 128 == 0 ? 16 / bytes : 0;
}

Value TileBuilder::f32(double v) {
  return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
}

Value TileBuilder::fill(ArrayRef<OpFoldResult> sizes, Type elt, double value) {
  Value init = empty(sizes, elt);
  TypedAttr attr;
  if (auto intType = dyn_cast<IntegerType>(elt))
    attr = b.getIntegerAttr(intType, static_cast<int64_t>(value));
  else
    attr = b.getFloatAttr(elt, value);
  Value scalar = arith::ConstantOp::create(b, loc, attr);
  return linalg::FillOp::create(b, loc, ValueRange{scalar}, ValueRange{init})
      .getResult(0);
}

Value TileBuilder::poolWeights(Value weights, Value h, int64_t l) {
  Type f32 = b.getF32Type();
  if (!weights)
    return fill({b.getIndexAttr(l)}, f32, 1.0 / l);
  return tensor::ExtractSliceOp::create(
      b, loc, RankedTensorType::get({l}, f32), weights,
      ArrayRef<OpFoldResult>{h, b.getIndexAttr(0)},
      ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(l)},
      ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
}

Value TileBuilder::loadTile(Value src, Value batch, Value row0, Value count,
                            Value head0, int64_t heads, int64_t rows) {
  auto srcType = cast<RankedTensorType>(src.getType());
  int64_t depth = srcType.getDimSize(3);
  Type elt = srcType.getElementType();
  SmallVector<OpFoldResult> offsets = {batch, row0, head0, b.getIndexAttr(0)};
  SmallVector<OpFoldResult> sizes = {b.getIndexAttr(1), count,
                                     b.getIndexAttr(heads),
                                     b.getIndexAttr(depth)};
  SmallVector<OpFoldResult> strides(4, b.getIndexAttr(1));
  auto sliceType =
      RankedTensorType::get({ShapedType::kDynamic, heads, depth}, elt);
  Value slice = tensor::ExtractSliceOp::create(b, loc, sliceType, src, offsets,
                                               sizes, strides);
  // The rows, then zeros in the rows past the end (they are masked, and
  // zeros keep them finite); only those are filled, and not the 16 bytes
  // tile() adds to each row, which nothing reads.
  int64_t rowPad = rowPadding(depth, elt);
  Value full = empty({b.getIndexAttr(rows), b.getIndexAttr(heads),
                      b.getIndexAttr(depth + rowPad)},
                     elt);
  SmallVector<OpFoldResult> origin(3, b.getIndexAttr(0));
  full = tensor::InsertSliceOp::create(
      b, loc, slice, full, origin,
      ArrayRef<OpFoldResult>{count, b.getIndexAttr(heads),
                             b.getIndexAttr(depth)},
      SmallVector<OpFoldResult>(3, b.getIndexAttr(1)));
  SmallVector<OpFoldResult> restOffsets = {count, b.getIndexAttr(0),
                                           b.getIndexAttr(0)};
  SmallVector<OpFoldResult> restSizes = {sub(idx(rows), count),
                                         b.getIndexAttr(heads),
                                         b.getIndexAttr(depth)};
  SmallVector<OpFoldResult> ones(3, b.getIndexAttr(1));
  Value rest = tensor::ExtractSliceOp::create(
      b, loc, RankedTensorType::get({ShapedType::kDynamic, heads, depth}, elt),
      full, restOffsets, restSizes, ones);
  Value zero = arith::ConstantOp::create(b, loc, b.getZeroAttr(elt));
  rest = linalg::FillOp::create(b, loc, ValueRange{zero}, ValueRange{rest})
             .getResult(0);
  full = tensor::InsertSliceOp::create(b, loc, rest, full, restOffsets,
                                       restSizes, ones);
  auto flatType = RankedTensorType::get({rows * heads, depth + rowPad}, elt);
  Value flat = tensor::CollapseShapeOp::create(b, loc, flatType, full,
                                               ArrayRef<ReassociationIndices>{
                                                   {0, 1}, {2}});
  if (!rowPad)
    return flat;
  return tensor::ExtractSliceOp::create(
      b, loc, RankedTensorType::get({rows * heads, depth}, elt), flat,
      ArrayRef<OpFoldResult>{b.getIndexAttr(0), b.getIndexAttr(0)},
      ArrayRef<OpFoldResult>{b.getIndexAttr(rows * heads),
                             b.getIndexAttr(depth)},
      ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
}

Value TileBuilder::unflattenTile(Value tile, Value count, int64_t heads,
                                 int64_t rows) {
  auto type = cast<RankedTensorType>(tile.getType());
  SmallVector<int64_t> shape = {rows, heads};
  SmallVector<ReassociationIndices> reassoc = {{0, 1}};
  for (int64_t d = 1; d < type.getRank(); ++d) {
    shape.push_back(type.getDimSize(d));
    reassoc.push_back({static_cast<int64_t>(d + 1)});
  }
  Value expanded = tensor::ExpandShapeOp::create(
      b, loc, RankedTensorType::get(shape, type.getElementType()), tile,
      reassoc);
  SmallVector<OpFoldResult> offsets(shape.size(), b.getIndexAttr(0));
  SmallVector<OpFoldResult> sizes = {count};
  for (int64_t d = 1, e = shape.size(); d < e; ++d)
    sizes.push_back(b.getIndexAttr(shape[d]));
  SmallVector<OpFoldResult> strides(shape.size(), b.getIndexAttr(1));
  shape[0] = ShapedType::kDynamic;
  return tensor::ExtractSliceOp::create(
      b, loc, RankedTensorType::get(shape, type.getElementType()), expanded,
      offsets, sizes, strides);
}

//===----------------------------------------------------------------------===//
// Online softmax
//===----------------------------------------------------------------------===//

Value TileBuilder::toF32(OpBuilder &nb, Location nloc, Value v) {
  if (v.getType().isF32())
    return v;
  return arith::ExtFOp::create(nb, nloc, nb.getF32Type(), v);
}

Value TileBuilder::fromF32(OpBuilder &nb, Location nloc, Value v, Type elt) {
  if (elt.isF32())
    return v;
  return arith::TruncFOp::create(nb, nloc, elt, v);
}

namespace {

/// A linalg.generic with one output `init`.
Value generic(OpBuilder &b, Location loc, ValueRange ins, Value init,
              ArrayRef<AffineMap> maps, ArrayRef<IteratorType> iterators,
              function_ref<Value(OpBuilder &, Location, ValueRange)> body) {
  auto op = linalg::GenericOp::create(
      b, loc, TypeRange{init.getType()}, ins, ValueRange{init}, maps,
      iterators, [&](OpBuilder &nb, Location nloc, ValueRange args) {
        linalg::YieldOp::create(nb, nloc, body(nb, nloc, args));
      });
  return op.getResult(0);
}

/// Maps of a rank-`rank` iteration space: identity and projections.
AffineMap proj(MLIRContext *ctx, unsigned rank, ArrayRef<unsigned> dims) {
  SmallVector<AffineExpr> exprs;
  for (unsigned d : dims)
    exprs.push_back(getAffineDimExpr(d, ctx));
  return AffineMap::get(rank, 0, exprs, ctx);
}

/// `max == -inf ? 0 : max`, so that fully masked rows stay NaN-free.
Value safeMax(OpBuilder &b, Location loc, Value m) {
  Value negInf = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(-kInf));
  Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0));
  Value isNegInf =
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, m, negInf);
  return arith::SelectOp::create(b, loc, isNegInf, zero, m);
}

} // namespace

Value TileBuilder::matmulTransposeB(Value a, Value bT) {
  MLIRContext *ctx = b.getContext();
  auto aType = cast<RankedTensorType>(a.getType());
  auto bType = cast<RankedTensorType>(bT.getType());
  Value zero = f32(0.0);
  Value init = linalg::FillOp::create(
                   b, loc, ValueRange{zero},
                   ValueRange{tile(aType.getDimSize(0), bType.getDimSize(0),
                                   b.getF32Type())})
                   .getResult(0);
  // (r, c, e): s[r, c] += a[r, e] * b[c, e].
  return generic(b, loc, {a, bT}, init,
                 {proj(ctx, 3, {0, 2}), proj(ctx, 3, {1, 2}),
                  proj(ctx, 3, {0, 1})},
                 {IteratorType::parallel, IteratorType::parallel,
                  IteratorType::reduction},
                 [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
                   Value prod = arith::MulFOp::create(
                       nb, nloc, toF32(nb, nloc, args[0]),
                       toF32(nb, nloc, args[1]));
                   return arith::AddFOp::create(nb, nloc, args[2], prod);
                 });
}

Value TileBuilder::contract(Value a, Value bMat, Value acc, bool transposeA) {
  MLIRContext *ctx = b.getContext();
  // (i, e, c): acc[i, e] += a[i, c] (or a[c, i]) * b[c, e].
  AffineMap aMap = transposeA ? proj(ctx, 3, {2, 0}) : proj(ctx, 3, {0, 2});
  return generic(
      b, loc, {a, bMat}, acc,
      {aMap, proj(ctx, 3, {2, 1}), proj(ctx, 3, {0, 1})},
      {IteratorType::parallel, IteratorType::parallel, IteratorType::reduction},
      [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
        Value prod = arith::MulFOp::create(nb, nloc, toF32(nb, nloc, args[0]),
                                           toF32(nb, nloc, args[1]));
        return arith::AddFOp::create(nb, nloc, args[2], prod);
      });
}

Value TileBuilder::loadRowTile(Value src, Value batch, Value row0, Value count,
                               Value head0, int64_t heads, int64_t rows) {
  Type elt = cast<RankedTensorType>(src.getType()).getElementType();
  auto sliceType = RankedTensorType::get({ShapedType::kDynamic, heads}, elt);
  Value slice = tensor::ExtractSliceOp::create(
      b, loc, sliceType, src, ArrayRef<OpFoldResult>{batch, row0, head0},
      ArrayRef<OpFoldResult>{b.getIndexAttr(1), count, b.getIndexAttr(heads)},
      SmallVector<OpFoldResult>(3, b.getIndexAttr(1)));
  Value full = fill({b.getIndexAttr(rows), b.getIndexAttr(heads)}, elt, 0.0);
  full = tensor::InsertSliceOp::create(
      b, loc, slice, full,
      ArrayRef<OpFoldResult>{b.getIndexAttr(0), b.getIndexAttr(0)},
      ArrayRef<OpFoldResult>{count, b.getIndexAttr(heads)},
      SmallVector<OpFoldResult>(2, b.getIndexAttr(1)));
  return tensor::CollapseShapeOp::create(
      b, loc, RankedTensorType::get({rows * heads}, elt), full,
      ArrayRef<ReassociationIndices>{{0, 1}});
}

std::pair<Value, Value>
TileBuilder::attendGradTile(Value q, Value dOut, Value lse, Value delta,
                            Value k, Value v, double scale, TileMaskFn valid) {
  MLIRContext *ctx = b.getContext();
  Type elt = cast<RankedTensorType>(q.getType()).getElementType();
  int64_t rows = cast<RankedTensorType>(q.getType()).getDimSize(0);
  int64_t keys = cast<RankedTensorType>(k.getType()).getDimSize(0);
  AffineMap id2 = proj(ctx, 2, {0, 1}), row2 = proj(ctx, 2, {0});
  Value s = matmulTransposeB(q, k);
  Value dp = matmulTransposeB(dOut, v);
  Value scaleV = f32(scale);
  Value pInit = tile(rows, keys, elt), dsInit = tile(rows, keys, elt);
  auto op = linalg::GenericOp::create(
      b, loc, TypeRange{pInit.getType(), dsInit.getType()},
      ValueRange{s, dp, lse, delta}, ValueRange{pInit, dsInit},
      ArrayRef<AffineMap>{id2, id2, row2, row2, id2, id2},
      ArrayRef<IteratorType>{IteratorType::parallel, IteratorType::parallel},
      [&](OpBuilder &nb, Location nloc, ValueRange args) {
        Value r = linalg::IndexOp::create(nb, nloc, 0);
        Value c = linalg::IndexOp::create(nb, nloc, 1);
        Value zero =
            arith::ConstantOp::create(nb, nloc, nb.getF32FloatAttr(0.0));
        Value scaled = arith::MulFOp::create(nb, nloc, args[0], scaleV);
        Value e = math::ExpOp::create(
            nb, nloc, arith::SubFOp::create(nb, nloc, scaled, args[2]));
        // Masked scores give 0, not exp of anything: a row without keys
        // has lse -inf and must not produce inf * 0.
        Value p =
            arith::SelectOp::create(nb, nloc, valid(nb, nloc, r, c), e, zero);
        Value ds = arith::MulFOp::create(
            nb, nloc, arith::MulFOp::create(nb, nloc, p, scaleV),
            arith::SubFOp::create(nb, nloc, args[1], args[3]));
        linalg::YieldOp::create(
            nb, nloc,
            ValueRange{fromF32(nb, nloc, p, elt), fromF32(nb, nloc, ds, elt)});
      });
  return {op.getResult(0), op.getResult(1)};
}

SoftmaxState TileBuilder::initSoftmax(int64_t rows, int64_t vDim) {
  Type f32Type = b.getF32Type();
  return {fill({b.getIndexAttr(rows)}, f32Type, -kInf),
          fill({b.getIndexAttr(rows)}, f32Type, 0.0),
          linalg::FillOp::create(b, loc, ValueRange{f32(0.0)},
                                 ValueRange{tile(rows, vDim, f32Type)})
              .getResult(0)};
}

SoftmaxState TileBuilder::attendTile(Value q, Value k, Value v, double scale,
                                     TileMaskFn valid,
                                     const SoftmaxState &state) {
  MLIRContext *ctx = b.getContext();
  Type elt = cast<RankedTensorType>(q.getType()).getElementType();
  auto par = IteratorType::parallel, red = IteratorType::reduction;
  int64_t rows = cast<RankedTensorType>(q.getType()).getDimSize(0);
  int64_t keys = cast<RankedTensorType>(k.getType()).getDimSize(0);
  AffineMap id2 = proj(ctx, 2, {0, 1}), row2 = proj(ctx, 2, {0});
  AffineMap id1 = proj(ctx, 1, {0});
  Value scaleV = f32(scale);

  // Raw scores; scaling and masking happen inline where they are read, so
  // that no pass over the tile only rewrites it.
  Value s = matmulTransposeB(q, k);
  auto masked = [&](OpBuilder &nb, Location nloc, Value score) -> Value {
    Value r = linalg::IndexOp::create(nb, nloc, 0);
    Value c = linalg::IndexOp::create(nb, nloc, 1);
    Value scaled = arith::MulFOp::create(nb, nloc, score, scaleV);
    Value negInf =
        arith::ConstantOp::create(nb, nloc, nb.getF32FloatAttr(-kInf));
    return arith::SelectOp::create(nb, nloc, valid(nb, nloc, r, c), scaled,
                                   negInf);
  };
  // exp(masked score - new max): the probabilities relative to the new max.
  auto prob = [&](OpBuilder &nb, Location nloc, Value score,
                  Value max) -> Value {
    Value shifted = arith::SubFOp::create(nb, nloc, masked(nb, nloc, score),
                                          safeMax(nb, nloc, max));
    return math::ExpOp::create(nb, nloc, shifted);
  };
  // New running max.
  Value tileMax = generic(
      b, loc, {s}, fill({b.getIndexAttr(rows)}, b.getF32Type(), -kInf),
      {id2, row2}, {par, red},
      [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
        return arith::MaximumFOp::create(nb, nloc, masked(nb, nloc, args[0]),
                                         args[1]);
      });
  // The new running max, written over the old one, and the rescale of the
  // old state: one pass over the rows.
  auto stats = linalg::GenericOp::create(
      b, loc, TypeRange{state.max.getType(), state.max.getType()},
      ValueRange{tileMax},
      ValueRange{state.max, empty({b.getIndexAttr(rows)}, b.getF32Type())},
      ArrayRef<AffineMap>{id1, id1, id1}, ArrayRef<IteratorType>{par},
      [&](OpBuilder &nb, Location nloc, ValueRange args) {
        Value newMax = arith::MaximumFOp::create(nb, nloc, args[1], args[0]);
        Value shifted = arith::SubFOp::create(nb, nloc, args[1],
                                              safeMax(nb, nloc, newMax));
        Value alpha = math::ExpOp::create(nb, nloc, shifted);
        linalg::YieldOp::create(nb, nloc, ValueRange{newMax, alpha});
      });
  Value newMax = stats.getResult(0), alpha = stats.getResult(1);
  // Row sums of the f32 probabilities, and the probabilities rounded to the
  // input type, as tensor cores consume them: each pass computes them.
  Value tileSum = generic(
      b, loc, {s, newMax}, fill({b.getIndexAttr(rows)}, b.getF32Type(), 0.0),
      {id2, row2, row2}, {par, red},
      [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
        return arith::AddFOp::create(nb, nloc, prob(nb, nloc, args[0], args[1]),
                                     args[2]);
      });
  Value p = generic(
      b, loc, {s, newMax}, tile(rows, keys, elt), {id2, row2, id2}, {par, par},
      [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
        return fromF32(nb, nloc, prob(nb, nloc, args[0], args[1]), elt);
      });
  // The new sum over the old one.
  Value newSum = generic(
      b, loc, {alpha, tileSum}, state.sum, {id1, id1, id1}, {par},
      [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
        Value scaled = arith::MulFOp::create(nb, nloc, args[2], args[0]);
        return arith::AddFOp::create(nb, nloc, scaled, args[1]);
      });
  Value acc = generic(
      b, loc, {alpha}, state.acc, {row2, id2}, {par, par},
      [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
        return arith::MulFOp::create(nb, nloc, args[1], args[0]);
      });
  // (r, e, c): acc[r, e] += p[r, c] * v[c, e].
  acc = generic(b, loc, {p, v}, acc,
                {proj(ctx, 3, {0, 2}), proj(ctx, 3, {2, 1}),
                 proj(ctx, 3, {0, 1})},
                {par, par, red},
                [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
                  Value prod = arith::MulFOp::create(
                      nb, nloc, toF32(nb, nloc, args[0]),
                      toF32(nb, nloc, args[1]));
                  return arith::AddFOp::create(nb, nloc, args[2], prod);
                });
  // The statistics were written over the loop-carried ones: the state
  // stays in the same buffers across key tiles after bufferization (no
  // allocation per iteration; on the GPU, one on-chip tile each).
  return {newMax, newSum, acc};
}

std::pair<Value, Value> TileBuilder::finishSoftmax(const SoftmaxState &state,
                                                   Type elt) {
  MLIRContext *ctx = b.getContext();
  auto par = IteratorType::parallel;
  auto accType = cast<RankedTensorType>(state.acc.getType());
  int64_t rows = accType.getDimSize(0), vDim = accType.getDimSize(1);
  AffineMap id2 = proj(ctx, 2, {0, 1}), row2 = proj(ctx, 2, {0});
  AffineMap id1 = proj(ctx, 1, {0});
  // A row with keys has a positive sum; a NaN sum (a NaN it read) stays
  // NaN (Spec section 14), only an empty row is 0.
  auto nonEmpty = [](OpBuilder &nb, Location nloc, Value sum) -> Value {
    Value zero = arith::ConstantOp::create(nb, nloc, nb.getF32FloatAttr(0.0));
    return arith::CmpFOp::create(nb, nloc, arith::CmpFPredicate::UNE, sum,
                                 zero);
  };
  Value out =
      generic(b, loc, {state.acc, state.sum},
              empty({b.getIndexAttr(rows), b.getIndexAttr(vDim)}, elt),
              {id2, row2, id2}, {par, par},
              [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
                Value zero = arith::ConstantOp::create(nb, nloc,
                                                       nb.getF32FloatAttr(0.0));
                Value norm = arith::DivFOp::create(nb, nloc, args[0], args[1]);
                Value value = arith::SelectOp::create(
                    nb, nloc, nonEmpty(nb, nloc, args[1]), norm, zero);
                return fromF32(nb, nloc, value, elt);
              });
  Value lse = generic(
      b, loc, {state.max, state.sum},
      empty({b.getIndexAttr(rows)}, b.getF32Type()), {id1, id1, id1}, {par},
      [&](OpBuilder &nb, Location nloc, ValueRange args) -> Value {
        Value negInf =
            arith::ConstantOp::create(nb, nloc, nb.getF32FloatAttr(-kInf));
        Value log = math::LogOp::create(nb, nloc, args[1]);
        Value value = arith::AddFOp::create(nb, nloc, args[0], log);
        return arith::SelectOp::create(nb, nloc, nonEmpty(nb, nloc, args[1]),
                                       value, negInf);
      });
  return {out, lse};
}

//===----------------------------------------------------------------------===//
// Loops and sizes
//===----------------------------------------------------------------------===//

Sizes nsa::detail::sizesOf(Value q, Value k, Value v) {
  auto qt = cast<RankedTensorType>(q.getType());
  auto kt = cast<RankedTensorType>(k.getType());
  auto vt = cast<RankedTensorType>(v.getType());
  return {
      qt.getDimSize(2), kt.getDimSize(2), qt.getDimSize(2) / kt.getDimSize(2),
      qt.getDimSize(3), vt.getDimSize(3), qt.getElementType()};
}

bool nsa::detail::hasStaticHeads(Value q, Value k, Value v) {
  for (Value x : {q, k, v}) {
    auto t = cast<RankedTensorType>(x.getType());
    if (t.isDynamicDim(2) || t.isDynamicDim(3))
      return false;
  }
  return true;
}

Value nsa::detail::sigmoidOf(OpBuilder &b, Location loc, Value x) {
  Value one = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(1));
  Value neg = arith::NegFOp::create(b, loc, x);
  return arith::DivFOp::create(
      b, loc, one,
      arith::AddFOp::create(b, loc, one, math::ExpOp::create(b, loc, neg)));
}

scf::ForallOp nsa::detail::createTileLoop(OpBuilder &b, Location loc,
                                          StringRef kernel,
                                          ArrayRef<OpFoldResult> bounds,
                                          ValueRange outputs) {
  auto forall = scf::ForallOp::create(b, kernelLoc(b, loc, kernel), bounds,
                                      outputs, std::nullopt);
  b.setInsertionPoint(forall.getTerminator());
  return forall;
}

void nsa::detail::insertTile(OpBuilder &b, Location loc, scf::ForallOp forall,
                             Value tile, Value dest, Value batch, Value row0,
                             Value count, Value head0) {
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(forall.getTerminator().getBody());
  auto tileType = cast<RankedTensorType>(tile.getType());
  auto destType = cast<RankedTensorType>(dest.getType());
  SmallVector<OpFoldResult> offsets = {batch, row0, head0};
  SmallVector<OpFoldResult> sizes = {b.getIndexAttr(1), count,
                                     b.getIndexAttr(tileType.getDimSize(1))};
  for (int64_t d = 3; d < destType.getRank(); ++d) {
    offsets.push_back(b.getIndexAttr(0));
    sizes.push_back(b.getIndexAttr(tileType.getDimSize(d - 1)));
  }
  SmallVector<OpFoldResult> strides(destType.getRank(), b.getIndexAttr(1));
  tensor::ParallelInsertSliceOp::create(b, loc, tile, dest, offsets, sizes,
                                        strides);
}

//===----------------------------------------------------------------------===//
// Key sets
//===----------------------------------------------------------------------===//

std::pair<Value, Value> nsa::detail::keyRows(TileBuilder &t, const KeySet &keys,
                                             const SequenceView &seq) {
  if (!keys.compressed)
    return {seq.tokenStart, seq.length};
  return {seq.cmpStart,
          t.numCompressedBlocks(seq.length, keys.cmpBlock, keys.cmpStride)};
}

KeySet nsa::detail::compressedKeySet(int64_t l, int64_t d, int64_t bn) {
  KeySet keys;
  keys.compressed = true;
  keys.cmpBlock = l;
  keys.cmpStride = d;
  keys.keyTile = bn;
  keys.visible = [l, d](TileBuilder &m, Value t, Value i) {
    return arith::CmpIOp::create(m.b, m.loc, arith::CmpIPredicate::sle,
                                 m.add(m.mul(i, d), m.idx(l - 1)), t);
  };
  keys.keyTiles = [l, d, bn](TileBuilder &m, Value t0, Value count) {
    Value visible =
        m.numCompressedBlocks(m.add(t0, count), l, d); // of the last token
    return std::make_pair(m.idx(0), m.ceilDiv(visible, bn));
  };
  // Block i is seen by tokens i*d + l - 1 onwards.
  keys.queryTokens = [l, d](TileBuilder &m, Value k0, Value, Value length) {
    return std::make_pair(m.add(m.mul(k0, d), m.idx(l - 1)), length);
  };
  return keys;
}

KeySet nsa::detail::windowKeySet(int64_t w, int64_t bn) {
  KeySet keys;
  keys.keyTile = bn;
  keys.visible = [w](TileBuilder &m, Value t, Value key) {
    Value notFuture =
        arith::CmpIOp::create(m.b, m.loc, arith::CmpIPredicate::sle, key, t);
    Value inWindow = m.lt(t, m.add(key, m.idx(w)));
    return andI1(m.b, m.loc, notFuture, inWindow);
  };
  keys.keyTiles = [w, bn](TileBuilder &m, Value t0, Value count) {
    Value first = m.max(m.idx(0), m.sub(t0, m.idx(w - 1)));
    Value end = m.add(t0, count); // one past the last token
    Value hi = m.ceilDiv(end, bn);
    Value lo = m.min(m.div(first, bn), hi);
    return std::make_pair(lo, hi);
  };
  // Key s is seen by tokens s .. s + w - 1.
  keys.queryTokens = [w](TileBuilder &m, Value k0, Value kCount, Value length) {
    Value end = m.add(m.add(k0, kCount), m.idx(w - 1));
    return std::make_pair(k0, m.min(end, length));
  };
  return keys;
}

KeySet nsa::detail::selectedKeySet(int64_t block) {
  KeySet keys;
  keys.keyTile = block;
  keys.visible = [](TileBuilder &m, Value t, Value key) {
    return arith::CmpIOp::create(m.b, m.loc, arith::CmpIPredicate::sle, key, t);
  };
  keys.keyTiles = [block](TileBuilder &m, Value t0, Value count) {
    return std::make_pair(m.idx(0), m.ceilDiv(m.add(t0, count), block));
  };
  keys.queryTokens = [](TileBuilder &, Value k0, Value, Value length) {
    return std::make_pair(k0, length);
  };
  return keys;
}
