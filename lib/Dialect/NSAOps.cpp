//===- NSAOps.cpp - nsa operation verifiers -------------------------------===//
//
// Verifiers of the nsa ops. Each check cites the constraint id of
// docs/Spec.md ("Constraints") that it enforces. Dynamic dimensions match
// anything; every static dimension is checked.
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Dialect/NSAVerify.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::nsa;

#define GET_OP_CLASSES
#include "NSA/Dialect/NSAOps.cpp.inc"

namespace {

constexpr int64_t kDyn = ShapedType::kDynamic;

bool dimsMatch(int64_t a, int64_t b) { return a == kDyn || b == kDyn || a == b; }

/// Prints a shape as `[2, ?, 8]`.
std::string formatShape(ArrayRef<int64_t> shape) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << '[';
  llvm::interleaveComma(shape, os, [&](int64_t d) {
    if (d == kDyn)
      os << '?';
    else
      os << d;
  });
  os << ']';
  return s;
}

/// Merges two observations of one logical dimension; a static value wins.
int64_t mergeDim(int64_t a, int64_t b) { return a == kDyn ? b : a; }

/// The logical sizes of an attention op, gathered from its operands.
struct Dims {
  int64_t batch = kDyn, tokens = kDyn, qHeads = kDyn, kvHeads = kDyn,
          qkDim = kDyn, vDim = kDyn, kvRows = kDyn;
};

class Checker {
public:
  explicit Checker(Operation *op) : op(op) {}

  /// op_c1: `value` is a rank-`rank` tensor; returns its type or null.
  RankedTensorType ranked(Value value, StringRef name, unsigned rank,
                          StringRef layout) {
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getRank() != rank) {
      op->emitOpError() << "expects " << name << " to be a rank-" << rank
                        << " tensor " << layout << ", found " << type;
      return {};
    }
    return type;
  }

  /// op_c3/op_c8/op_c9: `type` has shape `expected` (dynamic matches all).
  LogicalResult shape(RankedTensorType type, StringRef name,
                      ArrayRef<int64_t> expected, StringRef layout) {
    if (type.getRank() == static_cast<int64_t>(expected.size()) &&
        llvm::all_of(llvm::zip(type.getShape(), expected), [](auto pair) {
          return dimsMatch(std::get<0>(pair), std::get<1>(pair));
        }))
      return success();
    return op->emitOpError()
           << "expects " << name << " of shape " << layout << " = "
           << formatShape(expected) << ", found "
           << formatShape(type.getShape());
  }

  /// op_c7: static sizes of `type` other than `allowZero` are positive.
  LogicalResult positive(RankedTensorType type, StringRef name,
                         int64_t allowZero = -1) {
    for (auto [i, d] : llvm::enumerate(type.getShape()))
      if (d == 0 && static_cast<int64_t>(i) != allowZero)
        return op->emitOpError() << "expects " << name
                                 << " to have positive sizes, found "
                                 << formatShape(type.getShape());
    return success();
  }

  /// op_c2: `type` has element type `expected`.
  LogicalResult elementType(RankedTensorType type, StringRef name,
                            Type expected) {
    if (type.getElementType() == expected)
      return success();
    return op->emitOpError() << "expects " << name << " element type "
                             << expected << ", found "
                             << type.getElementType();
  }

  /// op_c1, op_c2, op_c7: `value` is a rank-4 f16, bf16 or f32 tensor whose
  /// static sizes are positive (dimension `allowZero` may be 0).
  RankedTensorType activation(Value value, StringRef name, StringRef layout,
                              int64_t allowZero = -1) {
    RankedTensorType type = ranked(value, name, 4, layout);
    if (!type)
      return {};
    Type elt = type.getElementType();
    if (!elt.isF16() && !elt.isBF16() && !elt.isF32()) {
      op->emitOpError() << "expects " << name
                        << " element type f16, bf16 or f32, found " << elt;
      return {};
    }
    if (failed(positive(type, name, allowZero)))
      return {};
    return type;
  }

  /// Verifies query, key and value and returns their sizes. When
  /// `compressedKV`, keys/values have `Nc` rows instead of `T` tokens.
  /// With `cache` (decoding), keys/values are caches of `Lmax >= T` rows.
  FailureOr<Dims> qkv(Value q, Value k, Value v, bool compressedKV,
                      bool cache = false) {
    StringRef kLayout = compressedKV ? "[B, Nc, H, Dqk]"
                        : cache      ? "[B, Lmax, H, Dqk]"
                                     : "[B, T, H, Dqk]";
    StringRef vLayout = compressedKV ? "[B, Nc, H, Dv]"
                        : cache      ? "[B, Lmax, H, Dv]"
                                     : "[B, T, H, Dv]";
    RankedTensorType qt = activation(q, "query", "[B, T, HQ, Dqk]");
    if (!qt)
      return failure();
    RankedTensorType kt = ranked(k, "key", 4, kLayout);
    if (!kt)
      return failure();
    RankedTensorType vt = ranked(v, "value", 4, vLayout);
    if (!vt)
      return failure();
    // op_c2
    Type elt = qt.getElementType();
    if (failed(elementType(kt, "key", elt)) ||
        failed(elementType(vt, "value", elt)))
      return failure();
    // op_c7
    int64_t rowsDim = compressedKV ? 1 : -1;
    if (failed(positive(kt, "key", rowsDim)) ||
        failed(positive(vt, "value", rowsDim)))
      return failure();

    Dims d;
    d.batch = qt.getDimSize(0);
    d.tokens = qt.getDimSize(1);
    d.qHeads = qt.getDimSize(2);
    d.qkDim = qt.getDimSize(3);
    d.kvHeads = mergeDim(kt.getDimSize(2), vt.getDimSize(2));
    d.kvRows = mergeDim(kt.getDimSize(1), vt.getDimSize(1));
    d.vDim = vt.getDimSize(3);
    // op_c3, op_c5, op_c6: key and value agree with query and each other.
    bool freeRows = compressedKV || cache;
    SmallVector<int64_t> kExpected = {d.batch, freeRows ? d.kvRows : d.tokens,
                                      d.kvHeads, d.qkDim};
    SmallVector<int64_t> vExpected = {d.batch, kExpected[1], d.kvHeads,
                                      d.vDim};
    if (failed(shape(kt, "key", kExpected, kLayout)) ||
        failed(shape(vt, "value", vExpected, vLayout)))
      return failure();
    // op_c19: a cache holds at least the query's tokens.
    if (cache && !compressedKV && d.tokens != kDyn && d.kvRows != kDyn &&
        d.kvRows < d.tokens)
      return op->emitOpError()
             << "expects the key cache to hold at least the T = " << d.tokens
             << " query tokens, found Lmax = " << d.kvRows;
    // op_c4
    if (d.qHeads != kDyn && d.kvHeads != kDyn && d.qHeads % d.kvHeads != 0)
      return op->emitOpError()
             << "expects the query head count (HQ = " << d.qHeads
             << ") to be a multiple of the KV head count (H = " << d.kvHeads
             << ")";
    return d;
  }

  /// op_c8: an attention output `[B, T, HQ, Dv]` with the query's type.
  LogicalResult output(Value out, const Dims &d, Type elt) {
    RankedTensorType t = ranked(out, "the output", 4, "[B, T, HQ, Dv]");
    if (!t || failed(shape(t, "the output", {d.batch, d.tokens, d.qHeads, d.vDim},
                           "[B, T, HQ, Dv]")))
      return failure();
    return elementType(t, "the output", elt);
  }

  /// op_c9: a log-sum-exp `[B, T, HQ]` in f32.
  LogicalResult lse(Value lse, StringRef name, const Dims &d) {
    RankedTensorType t = ranked(lse, name, 3, "[B, T, HQ]");
    if (!t ||
        failed(shape(t, name, {d.batch, d.tokens, d.qHeads}, "[B, T, HQ]")))
      return failure();
    return elementType(t, name, Float32Type::get(op->getContext()));
  }

  /// op_c10: `cu_seqlens` is a 1-D i32 tensor of at least two entries and
  /// the batch is 1.
  LogicalResult cuSeqlens(Value cu, const Dims &d) {
    if (!cu)
      return success();
    RankedTensorType t = ranked(cu, "cu_seqlens", 1, "[S + 1]");
    if (!t || failed(elementType(t, "cu_seqlens",
                                 IntegerType::get(op->getContext(), 32))))
      return failure();
    if (t.getDimSize(0) != kDyn && t.getDimSize(0) < 2)
      return op->emitOpError()
             << "expects cu_seqlens to hold at least 2 offsets, found "
             << t.getDimSize(0);
    if (d.batch != kDyn && d.batch != 1)
      return op->emitOpError()
             << "expects batch size 1 with cu_seqlens (packed sequences), "
                "found "
             << d.batch;
    return success();
  }

  /// op_c19: decoding's `kv_lens` is `[B]` i32 and excludes `cu_seqlens`.
  LogicalResult kvLens(Value lens, Value cu, const Dims &d) {
    if (!lens)
      return success();
    if (cu)
      return op->emitOpError()
             << "takes kv_lens (decoding) or cu_seqlens (packed), not both";
    RankedTensorType t = ranked(lens, "kv_lens", 1, "[B]");
    if (!t || failed(shape(t, "kv_lens", {d.batch}, "[B]")))
      return failure();
    return elementType(t, "kv_lens", IntegerType::get(op->getContext(), 32));
  }

  /// op_c13: gate logits `[B, T, HQ, 3]` with the query's type or f32.
  LogicalResult gates(Value gates, const Dims &d, Type elt) {
    RankedTensorType t = ranked(gates, "gates", 4, "[B, T, HQ, 3]");
    if (!t || failed(shape(t, "gates", {d.batch, d.tokens, d.qHeads, 3},
                           "[B, T, HQ, 3]")))
      return failure();
    if (t.getElementType() != elt && !t.getElementType().isF32())
      return op->emitOpError() << "expects gates element type " << elt
                               << " or f32, found " << t.getElementType();
    return success();
  }

  /// op_c11: the compressed key/value rows match the token count.
  LogicalResult compressedRows(const Dims &d, int64_t block, int64_t stride,
                               bool packed) {
    if (d.tokens == kDyn || d.kvRows == kDyn)
      return success();
    int64_t expected =
        packed ? spec::numPackedCompressedRows(d.tokens, stride)
               : spec::numCompressedBlocks(d.tokens, block, stride);
    if (d.kvRows == expected)
      return success();
    return op->emitOpError()
           << "expects " << expected << " compressed rows for T = " << d.tokens
           << " (l = " << block << ", d = " << stride
           << (packed ? ", packed" : "") << "), found " << d.kvRows;
  }

  /// op_c12: the index rows of selected attention, `[B, T, H, n]` i32 with
  /// any positive `n`.
  LogicalResult selectedIndices(Value indices, const Dims &d) {
    RankedTensorType idx = ranked(indices, "indices", 4, "[B, T, H, n]");
    if (!idx ||
        failed(shape(idx, "indices", {d.batch, d.tokens, d.kvHeads, kDyn},
                     "[B, T, H, n]")) ||
        failed(elementType(idx, "indices",
                           IntegerType::get(op->getContext(), 32))))
      return failure();
    return positive(idx, "indices");
  }

  /// op_c17: the gradient `grad` of `of` has its type (shape and element
  /// type).
  LogicalResult gradientOf(Value grad, StringRef name, Value of,
                           StringRef ofName) {
    auto got = cast<RankedTensorType>(grad.getType());
    auto want = cast<RankedTensorType>(of.getType());
    if (got.getRank() != want.getRank())
      return op->emitOpError()
             << "expects " << name << " to be a rank-" << want.getRank()
             << " tensor shaped as " << ofName << ", found rank "
             << got.getRank();
    if (failed(shape(got, name, want.getShape(), ofName)))
      return failure();
    return elementType(got, name, want.getElementType());
  }

  /// op_c17: an f32 gradient of shape `expected`.
  LogicalResult f32Gradient(Value grad, StringRef name,
                            ArrayRef<int64_t> expected, StringRef layout) {
    RankedTensorType t =
        ranked(grad, name, static_cast<unsigned>(expected.size()), layout);
    if (!t || failed(shape(t, name, expected, layout)))
      return failure();
    return elementType(t, name, Float32Type::get(op->getContext()));
  }

  auto errorFn() {
    return [this]() { return op->emitOpError(); };
  }

private:
  Operation *op;
};

} // namespace

//===----------------------------------------------------------------------===//
// SparseAttentionOp
//===----------------------------------------------------------------------===//

namespace {

/// The operand checks nsa.sparse_attention and its gradient share; returns
/// the layer's sizes.
template <typename LayerOp>
FailureOr<Dims> verifyLayerOperands(LayerOp op, Checker &c) {
  FailureOr<Dims> d = c.qkv(op.getQuery(), op.getKey(), op.getValue(), false);
  if (failed(d))
    return failure();
  Type elt = op.getQuery().getType().getElementType();
  if (failed(c.gates(op.getGates(), *d, elt)) ||
      failed(c.cuSeqlens(op.getCuSeqlens(), *d)))
    return failure();
  // op_c14
  ConfigAttr config = op.getConfig();
  bool learned = config.getPool() == PoolKind::Linear;
  if (learned != static_cast<bool>(op.getCmpWeights()))
    return op.emitOpError()
           << "pool " << stringifyPoolKind(config.getPool())
           << (learned ? " requires" : " takes no") << " cmp_weights";
  if (Value w = op.getCmpWeights()) {
    RankedTensorType t = c.ranked(w, "cmp_weights", 3, "[2, H, l]");
    if (!t ||
        failed(c.shape(t, "cmp_weights", {2, d->kvHeads, config.getCmpBlock()},
                       "[2, H, l]")) ||
        failed(
            c.elementType(t, "cmp_weights", Float32Type::get(op.getContext()))))
      return failure();
  }
  return d;
}

/// op_c18: the saved state of a training forward (docs/Spec.md section 9.1)
/// is absent or its seven tensors: per branch the output and lse, the
/// selected indices after the compressed branch's.
template <typename LayerOp>
LogicalResult verifySavedState(LayerOp op, Checker &c, ValueRange saved,
                               const Dims &d) {
  if (saved.empty())
    return success();
  enum Kind { Output, Lse, Indices };
  static constexpr std::pair<Kind, StringLiteral> kState[] = {
      {Output, "the saved compressed output"},
      {Lse, "the saved compressed lse"},
      {Indices, "the saved indices"},
      {Output, "the saved selected output"},
      {Lse, "the saved selected lse"},
      {Output, "the saved window output"},
      {Lse, "the saved window lse"}};
  if (saved.size() != std::size(kState))
    return op.emitOpError()
           << "expects the saved state to be 7 tensors (compressed output "
              "and lse, indices, selected output and lse, window output and "
              "lse), found "
           << saved.size();
  Type elt = op.getQuery().getType().getElementType();
  for (auto [value, state] : llvm::zip(saved, kState)) {
    auto [kind, name] = state;
    if (kind == Lse) {
      if (failed(c.lse(value, name, d)))
        return failure();
      continue;
    }
    bool indices = kind == Indices;
    StringRef layout = indices ? "[B, T, H, n]" : "[B, T, HQ, Dv]";
    SmallVector<int64_t> shape =
        indices ? SmallVector<int64_t>{d.batch, d.tokens, d.kvHeads,
                                       op.getConfig().getNumSelected()}
                : SmallVector<int64_t>{d.batch, d.tokens, d.qHeads, d.vDim};
    RankedTensorType t = c.ranked(value, name, 4, layout);
    if (!t || failed(c.shape(t, name, shape, layout)) ||
        failed(c.elementType(
            t, name, indices ? IntegerType::get(op.getContext(), 32) : elt)))
      return failure();
  }
  return success();
}

} // namespace

LogicalResult SparseAttentionOp::verify() {
  Checker c(*this);
  FailureOr<Dims> d = verifyLayerOperands(*this, c);
  if (failed(d) ||
      failed(c.output(getResult(), *d, getQuery().getType().getElementType())))
    return failure();
  return verifySavedState(*this, c, getSaved(), *d);
}

//===----------------------------------------------------------------------===//
// SparseAttentionDecodeOp
//===----------------------------------------------------------------------===//

LogicalResult SparseAttentionDecodeOp::verify() {
  Checker c(*this);
  FailureOr<Dims> d = c.qkv(getQuery(), getKeyCache(), getValueCache(),
                            /*compressedKV=*/false, /*cache=*/true);
  if (failed(d))
    return failure();
  ConfigAttr config = getConfig();
  // op_c11: Nc(Lmax) compressed rows; op_c5, op_c6: the same heads and dims.
  int64_t cmpRows =
      d->kvRows == kDyn
          ? kDyn
          : spec::numCompressedBlocks(d->kvRows, config.getCmpBlock(),
                                      config.getCmpStride());
  auto kc = getCmpKeyCache().getType(), vc = getCmpValueCache().getType();
  if (failed(c.shape(kc, "the compressed key cache",
                     {d->batch, cmpRows, d->kvHeads, d->qkDim},
                     "[B, Nc(Lmax), H, Dqk]")) ||
      failed(c.shape(vc, "the compressed value cache",
                     {d->batch, cmpRows, d->kvHeads, d->vDim},
                     "[B, Nc(Lmax), H, Dv]")))
    return failure();
  // op_c2, op_c7 on the compressed caches (their shapes are checked above).
  if (failed(c.qkv(getQuery(), getCmpKeyCache(), getCmpValueCache(),
                   /*compressedKV=*/true)))
    return failure();
  Type elt = getQuery().getType().getElementType();
  return success(succeeded(c.gates(getGates(), *d, elt)) &&
                 succeeded(c.kvLens(getKvLens(), {}, *d)) &&
                 succeeded(c.output(getResult(), *d, elt)));
}

//===----------------------------------------------------------------------===//
// CompressOp
//===----------------------------------------------------------------------===//

namespace {

/// op_c14: phi weights `[H, l]` f32 exactly for the linear pool.
template <typename PoolOp>
LogicalResult verifyPoolWeights(PoolOp op, Checker &c, int64_t heads) {
  bool learned = op.getPool() == PoolKind::Linear;
  if (learned != static_cast<bool>(op.getWeights()))
    return op.emitOpError()
           << "pool " << stringifyPoolKind(op.getPool())
           << (learned ? " requires" : " takes no") << " weights";
  Value w = op.getWeights();
  if (!w)
    return success();
  RankedTensorType t = c.ranked(w, "weights", 2, "[H, l]");
  if (!t ||
      failed(c.shape(t, "weights", {heads, static_cast<int64_t>(op.getBlock())},
                     "[H, l]")))
    return failure();
  return c.elementType(t, "weights", Float32Type::get(op.getContext()));
}

} // namespace

int64_t CompressOp::getNumRows(int64_t seqLen) {
  if (seqLen == kDyn)
    return kDyn;
  return getCuSeqlens()
             ? spec::numPackedCompressedRows(seqLen, getStride())
             : spec::numCompressedBlocks(seqLen, getBlock(), getStride());
}

LogicalResult CompressOp::verify() {
  Checker c(*this);
  // config_c2
  if (failed(verifyBlockParams(c.errorFn(), getBlock(), getStride(),
                               getBlock(), 1, {})))
    return failure();
  RankedTensorType in = c.activation(getInput(), "input", "[B, T, H, D]");
  if (!in)
    return failure();
  Type elt = in.getElementType();
  Dims d;
  d.batch = in.getDimSize(0);
  if (failed(c.cuSeqlens(getCuSeqlens(), d)))
    return failure();
  // op_c11
  RankedTensorType out = c.ranked(getResult(), "the result", 4, "[B, Nc, H, D]");
  if (!out ||
      failed(c.shape(out, "the result",
                     {d.batch, getNumRows(in.getDimSize(1)), in.getDimSize(2),
                      in.getDimSize(3)},
                     "[B, Nc, H, D]")) ||
      failed(c.elementType(out, "the result", elt)))
    return failure();
  return verifyPoolWeights(*this, c, in.getDimSize(2));
}

//===----------------------------------------------------------------------===//
// CompressAppendOp
//===----------------------------------------------------------------------===//

LogicalResult CompressAppendOp::verify() {
  Checker c(*this);
  // config_c2
  if (failed(verifyBlockParams(c.errorFn(), getBlock(), getStride(), getBlock(),
                               1, {})))
    return failure();
  // The cache is the keys, the compressed cache the "compressed keys" of
  // a decoding step: the same checks as a layer's, with no query.
  RankedTensorType in = c.activation(getInput(), "input", "[B, Lmax, H, D]");
  if (!in)
    return failure();
  Dims d;
  d.batch = in.getDimSize(0);
  RankedTensorType cache = c.ranked(getCompressed(), "the compressed cache", 4,
                                    "[B, Nc(Lmax), H, D]");
  if (!cache)
    return failure();
  int64_t rows = cache.getDimSize(1);
  if (in.getDimSize(1) != kDyn)
    rows = spec::numCompressedBlocks(in.getDimSize(1), getBlock(), getStride());
  SmallVector<int64_t> expected = {d.batch, rows, in.getDimSize(2),
                                   in.getDimSize(3)};
  // op_c11 (Nc(Lmax) rows), op_c20 (the result is the updated cache).
  for (auto [value, name] :
       {std::pair<Value, StringRef>{getCompressed(), "the compressed cache"},
        {getResult(), "the result"}}) {
    RankedTensorType t = c.ranked(value, name, 4, "[B, Nc(Lmax), H, D]");
    if (!t || failed(c.shape(t, name, expected, "[B, Nc(Lmax), H, D]")) ||
        failed(c.elementType(t, name, in.getElementType())))
      return failure();
  }
  if (getResult().getType() != getCompressed().getType())
    return emitOpError() << "expects the result to have the compressed "
                            "cache's type "
                         << getCompressed().getType() << ", found "
                         << getResult().getType();
  if (failed(c.kvLens(getKvLens(), {}, d)))
    return failure();
  return verifyPoolWeights(*this, c, in.getDimSize(2));
}

//===----------------------------------------------------------------------===//
// CompressedAttentionOp
//===----------------------------------------------------------------------===//

LogicalResult CompressedAttentionOp::verify() {
  Checker c(*this);
  if (failed(verifyBlockParams(c.errorFn(), getBlock(), getStride(),
                               getBlock(), 1, {})) ||
      failed(verifyScale(c.errorFn(), getScaleAttr())))
    return failure();
  FailureOr<Dims> d = c.qkv(getQuery(), getKey(), getValue(), true);
  if (failed(d))
    return failure();
  Type elt = getQuery().getType().getElementType();
  return success(succeeded(c.cuSeqlens(getCuSeqlens(), *d)) &&
                 succeeded(c.kvLens(getKvLens(), getCuSeqlens(), *d)) &&
                 (getKvLens() || succeeded(c.compressedRows(
                                     *d, getBlock(), getStride(),
                                     static_cast<bool>(getCuSeqlens())))) &&
                 succeeded(c.output(getOutput(), *d, elt)) &&
                 succeeded(c.lse(getLse(), "lse", *d)));
}

//===----------------------------------------------------------------------===//
// SelectBlocksOp
//===----------------------------------------------------------------------===//

LogicalResult SelectBlocksOp::verify() {
  Checker c(*this);
  // (I64Attr's getter is unsigned: read the signed value.)
  int64_t tokens = getMaxTokensAttr().getInt();
  if (tokens < 0)
    return emitOpError() << "max_tokens must be non-negative, found "
                         << tokens;
  // config_c5 at the declared maximum T, as #nsa.config checks it; else at
  // the static T (with kv_lens the positions are not bounded by T).
  if (tokens == 0 && !getKvLens() &&
      !ShapedType::isDynamic(getQuery().getType().getDimSize(1)))
    tokens = getQuery().getType().getDimSize(1);
  if (failed(verifyBlockParams(c.errorFn(), getCmpBlock(), getCmpStride(),
                               getSlcBlock(), getNumSelected(), getBackbone(),
                               tokens)) ||
      failed(verifyScale(c.errorFn(), getScaleAttr())))
    return failure();
  // The compressed keys stand in for the values: only their shape matters.
  FailureOr<Dims> d = c.qkv(getQuery(), getKey(), getKey(), true);
  if (failed(d))
    return failure();
  if (failed(c.cuSeqlens(getCuSeqlens(), *d)) ||
      failed(c.kvLens(getKvLens(), getCuSeqlens(), *d)) ||
      (!getKvLens() &&
       failed(c.compressedRows(*d, getCmpBlock(), getCmpStride(),
                               static_cast<bool>(getCuSeqlens())))) ||
      failed(c.lse(getLse(), "lse", *d)))
    return failure();
  // op_c12
  RankedTensorType idx = c.ranked(getIndices(), "the indices", 4, "[B, T, H, n]");
  if (!idx ||
      failed(c.shape(idx, "the indices",
                     {d->batch, d->tokens, d->kvHeads,
                      static_cast<int64_t>(getNumSelected())},
                     "[B, T, H, n]")))
    return failure();
  return c.elementType(idx, "the indices", IntegerType::get(getContext(), 32));
}

//===----------------------------------------------------------------------===//
// SelectedAttentionOp
//===----------------------------------------------------------------------===//

LogicalResult SelectedAttentionOp::verify() {
  Checker c(*this);
  if (failed(verifyScale(c.errorFn(), getScaleAttr())))
    return failure();
  FailureOr<Dims> d = c.qkv(getQuery(), getKey(), getValue(), false,
                            static_cast<bool>(getKvLens()));
  if (failed(d))
    return failure();
  if (failed(c.selectedIndices(getIndices(), *d)))
    return failure();
  Type elt = getQuery().getType().getElementType();
  return success(succeeded(c.cuSeqlens(getCuSeqlens(), *d)) &&
                 succeeded(c.kvLens(getKvLens(), getCuSeqlens(), *d)) &&
                 succeeded(c.output(getOutput(), *d, elt)) &&
                 succeeded(c.lse(getLse(), "lse", *d)));
}

//===----------------------------------------------------------------------===//
// WindowAttentionOp
//===----------------------------------------------------------------------===//

LogicalResult WindowAttentionOp::verify() {
  Checker c(*this);
  if (failed(verifyScale(c.errorFn(), getScaleAttr())))
    return failure();
  FailureOr<Dims> d = c.qkv(getQuery(), getKey(), getValue(), false,
                            static_cast<bool>(getKvLens()));
  if (failed(d))
    return failure();
  Type elt = getQuery().getType().getElementType();
  return success(succeeded(c.cuSeqlens(getCuSeqlens(), *d)) &&
                 succeeded(c.kvLens(getKvLens(), getCuSeqlens(), *d)) &&
                 succeeded(c.output(getOutput(), *d, elt)) &&
                 succeeded(c.lse(getLse(), "lse", *d)));
}

//===----------------------------------------------------------------------===//
// CombineOp
//===----------------------------------------------------------------------===//

LogicalResult CombineOp::verify() {
  Checker c(*this);
  RankedTensorType cmp =
      c.activation(getCompressed(), "the compressed output", "[B, T, HQ, Dv]");
  if (!cmp)
    return failure();
  Type elt = cmp.getElementType();
  Dims d;
  d.batch = cmp.getDimSize(0);
  d.tokens = cmp.getDimSize(1);
  d.qHeads = cmp.getDimSize(2);
  d.vDim = cmp.getDimSize(3);
  // op_c15: every branch output and the result agree.
  for (auto [value, name] :
       {std::pair<Value, StringRef>{getSelected(), "the selected output"},
        {getWindow(), "the window output"},
        {getResult(), "the result"}}) {
    RankedTensorType t = c.ranked(value, name, 4, "[B, T, HQ, Dv]");
    if (!t ||
        failed(c.shape(t, name, {d.batch, d.tokens, d.qHeads, d.vDim},
                       "[B, T, HQ, Dv]")) ||
        failed(c.elementType(t, name, elt)))
      return failure();
  }
  return c.gates(getGates(), d, elt);
}

//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//

LogicalResult SparseAttentionGradOp::verify() {
  Checker c(*this);
  FailureOr<Dims> d = verifyLayerOperands(*this, c);
  if (failed(d))
    return failure();
  // op_c16: grad is the gradient of the layer's output.
  if (failed(c.output(getGrad(), *d, getQuery().getType().getElementType())))
    return failure();
  // op_c17
  if (failed(c.gradientOf(getQueryGrad(), "query_grad", getQuery(), "query")) ||
      failed(c.gradientOf(getKeyGrad(), "key_grad", getKey(), "key")) ||
      failed(c.gradientOf(getValueGrad(), "value_grad", getValue(), "value")) ||
      failed(c.gradientOf(getGatesGrad(), "gates_grad", getGates(), "gates")))
    return failure();
  if (static_cast<bool>(getCmpWeights()) !=
      static_cast<bool>(getCmpWeightsGrad()))
    return emitOpError() << "expects cmp_weights_grad exactly when "
                            "cmp_weights is given";
  if (Value w = getCmpWeightsGrad())
    if (failed(c.gradientOf(w, "cmp_weights_grad", getCmpWeights(),
                            "cmp_weights")))
      return failure();
  return verifySavedState(*this, c, getSaved(), *d);
}

LogicalResult CombineGradOp::verify() {
  Checker c(*this);
  RankedTensorType cmp =
      c.activation(getCompressed(), "the compressed output", "[B, T, HQ, Dv]");
  if (!cmp)
    return failure();
  Dims d;
  d.batch = cmp.getDimSize(0);
  d.tokens = cmp.getDimSize(1);
  d.qHeads = cmp.getDimSize(2);
  d.vDim = cmp.getDimSize(3);
  // op_c15, op_c16: the branch outputs and grad agree.
  for (auto [value, name] :
       {std::pair<Value, StringRef>{getSelected(), "the selected output"},
        {getWindow(), "the window output"},
        {getGrad(), "grad"}})
    if (failed(c.gradientOf(value, name, getCompressed(),
                            "the compressed output")))
      return failure();
  if (failed(c.gates(getGates(), d, cmp.getElementType())))
    return failure();
  // op_c17
  for (auto [value, name] :
       {std::pair<Value, StringRef>{getCompressedGrad(), "compressed_grad"},
        {getSelectedGrad(), "selected_grad"},
        {getWindowGrad(), "window_grad"}})
    if (failed(c.gradientOf(value, name, getCompressed(),
                            "the compressed output")))
      return failure();
  return c.gradientOf(getGatesGrad(), "gates_grad", getGates(), "gates");
}

namespace {

/// The checks every attention gradient op shares, after its key set's own:
/// output, lse and grad of the forward op (op_c8, op_c9, op_c16),
/// cu_seqlens, and f32 gradients of query, key and value (op_c17).
template <typename GradOp>
LogicalResult verifyAttentionGrad(GradOp op, Checker &c, const Dims &d) {
  Type elt = op.getQuery().getType().getElementType();
  if (failed(c.cuSeqlens(op.getCuSeqlens(), d)) ||
      failed(c.output(op.getOutput(), d, elt)) ||
      failed(c.lse(op.getLse(), "lse", d)) ||
      failed(c.gradientOf(op.getGrad(), "grad", op.getOutput(), "the output")))
    return failure();
  return success(
      succeeded(c.f32Gradient(op.getQueryGrad(), "query_grad",
                              {d.batch, d.tokens, d.qHeads, d.qkDim},
                              "[B, T, HQ, Dqk]")) &&
      succeeded(c.f32Gradient(op.getKeyGrad(), "key_grad",
                              op.getKey().getType().getShape(), "key")) &&
      succeeded(c.f32Gradient(op.getValueGrad(), "value_grad",
                              op.getValue().getType().getShape(), "value")));
}

} // namespace

LogicalResult CompressedAttentionGradOp::verify() {
  Checker c(*this);
  if (failed(verifyBlockParams(c.errorFn(), getBlock(), getStride(), getBlock(),
                               1, {})) ||
      failed(verifyScale(c.errorFn(), getScaleAttr())))
    return failure();
  FailureOr<Dims> d = c.qkv(getQuery(), getKey(), getValue(), true);
  if (failed(d) || failed(c.compressedRows(*d, getBlock(), getStride(),
                                           static_cast<bool>(getCuSeqlens()))))
    return failure();
  return verifyAttentionGrad(*this, c, *d);
}

LogicalResult SelectedAttentionGradOp::verify() {
  Checker c(*this);
  if (failed(verifyScale(c.errorFn(), getScaleAttr())))
    return failure();
  FailureOr<Dims> d = c.qkv(getQuery(), getKey(), getValue(), false);
  if (failed(d))
    return failure();
  if (failed(c.selectedIndices(getIndices(), *d)))
    return failure();
  return verifyAttentionGrad(*this, c, *d);
}

LogicalResult WindowAttentionGradOp::verify() {
  Checker c(*this);
  if (failed(verifyScale(c.errorFn(), getScaleAttr())))
    return failure();
  FailureOr<Dims> d = c.qkv(getQuery(), getKey(), getValue(), false);
  if (failed(d))
    return failure();
  return verifyAttentionGrad(*this, c, *d);
}

LogicalResult CompressGradOp::verify() {
  Checker c(*this);
  // config_c2
  if (failed(verifyBlockParams(c.errorFn(), getBlock(), getStride(), getBlock(),
                               1, {})))
    return failure();
  RankedTensorType in = c.activation(getInput(), "input", "[B, T, H, D]");
  if (!in)
    return failure();
  Dims d;
  d.batch = in.getDimSize(0);
  if (failed(c.cuSeqlens(getCuSeqlens(), d)))
    return failure();
  // op_c11, op_c16: grad has the rows of the compressed input.
  RankedTensorType g = c.ranked(getGrad(), "grad", 4, "[B, Nc, H, D]");
  if (!g)
    return failure();
  int64_t tokens = in.getDimSize(1), rows = kDyn;
  if (tokens != kDyn)
    rows = getCuSeqlens()
               ? spec::numPackedCompressedRows(tokens, getStride())
               : spec::numCompressedBlocks(tokens, getBlock(), getStride());
  if (failed(c.shape(g, "grad",
                     {d.batch, rows, in.getDimSize(2), in.getDimSize(3)},
                     "[B, Nc, H, D]")))
    return failure();
  if (g.getElementType() != in.getElementType() && !g.getElementType().isF32())
    return emitOpError() << "expects grad element type " << in.getElementType()
                         << " or f32, found " << g.getElementType();
  // op_c14
  bool learned = getPool() == PoolKind::Linear;
  if (learned != static_cast<bool>(getWeights()))
    return emitOpError() << "pool " << stringifyPoolKind(getPool())
                         << (learned ? " requires" : " takes no") << " weights";
  if (learned != static_cast<bool>(getWeightsGrad()))
    return emitOpError() << "expects weights_grad exactly for pool linear";
  SmallVector<int64_t> wShape = {in.getDimSize(2),
                                 static_cast<int64_t>(getBlock())};
  if (Value w = getWeights())
    if (failed(c.f32Gradient(w, "weights", wShape, "[H, l]")) ||
        failed(
            c.f32Gradient(getWeightsGrad(), "weights_grad", wShape, "[H, l]")))
      return failure();
  // op_c17
  return c.f32Gradient(getInputGrad(), "input_grad", in.getShape(), "input");
}
