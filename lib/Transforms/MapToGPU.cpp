//===- MapToGPU.cpp - bufferized nsa tiles onto GPU thread blocks ---------===//
//
//   nsa-tile -> one-shot-bufferize -> nsa-map-to-gpu -> nsa-to-ptx tail
//
// A forall iteration of nsa-tile owns one tile (the G query heads of one KV
// head for a tile of tokens); it becomes one thread block. Its tile buffers,
// all of static shape, are carved out of dynamic shared memory; linalg ops
// and copies on them are distributed over the block's threads with a
// barrier after each; scalar bookkeeping that writes memory (the running
// top-n of block selection) runs on thread 0. Tile contractions go to
// tensor cores (TensorCore.cpp).
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/Passes.h"

#include "NSA/Transforms/TensorCore.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/PatternMatch.h"

#include <limits>

namespace mlir::nsa {
#define GEN_PASS_DEF_MAPTOGPU
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;

namespace {

constexpr int64_t kSharedMemoryLimit = 227 * 1024;

bool isDistributed(Operation *op) {
  return isa<linalg::LinalgOp, memref::CopyOp>(op);
}

bool contains(Operation *op, function_ref<bool(Operation *)> pred) {
  return op
      ->walk([&](Operation *inner) {
        return pred(inner) ? WalkResult::interrupt() : WalkResult::advance();
      })
      .wasInterrupted();
}

Value cst(OpBuilder &b, Location loc, int64_t v) {
  return arith::ConstantIndexOp::create(b, loc, v);
}

/// The threads that share the work of one distributed op: `tid` in
/// [0, count).
struct Threads {
  Value tid, count;
  int64_t blockSize = 0; ///< threads per block, when they form one block
};

/// `linear` as a point of the row-major index space `sizes`; the first
/// coordinate is not reduced modulo sizes[0]. An empty space divides by 1
/// instead of 0 (its points are never used).
SmallVector<Value> delinearize(OpBuilder &b, Location loc, Value linear,
                               ArrayRef<Value> sizes) {
  SmallVector<Value> point(sizes.size());
  Value rest = linear;
  for (int64_t d = sizes.size() - 1; d > 0; --d) {
    Value size = sizes[d];
    std::optional<int64_t> known = getConstantIntValue(size);
    if (!known || *known < 1)
      size = arith::MaxUIOp::create(b, loc, size, cst(b, loc, 1));
    point[d] = arith::RemUIOp::create(b, loc, rest, size);
    rest = arith::DivUIOp::create(b, loc, rest, size);
  }
  point[0] = rest;
  return point;
}

/// Calls `body` for every point of the index space `sizes`, the points dealt
/// out round-robin to the threads. Each thread divides only twice per
/// dimension, before its loop (its first point and the stride as points);
/// the loop then adds the stride coordinate-wise with carries.
void forEachPoint(OpBuilder &b, Location loc, const Threads &threads,
                  ArrayRef<Value> sizes,
                  function_ref<void(OpBuilder &, Location, ValueRange)> body) {
  Value total = cst(b, loc, 1);
  for (Value s : sizes)
    total = arith::MulIOp::create(b, loc, total, s);
  SmallVector<Value> first = delinearize(b, loc, threads.tid, sizes);
  SmallVector<Value> step = delinearize(b, loc, threads.count, sizes);
  scf::ForOp::create(
      b, loc, threads.tid, total, threads.count, first,
      [&](OpBuilder &nb, Location nloc, Value, ValueRange point) {
        body(nb, nloc, point);
        // point + step, each coordinate below its size (both were), the
        // first one left to the loop bound.
        SmallVector<Value> next(point.size());
        Value carry = cst(nb, nloc, 0);
        for (int64_t d = point.size() - 1; d >= 0; --d) {
          Value v = arith::AddIOp::create(
              nb, nloc, arith::AddIOp::create(nb, nloc, point[d], step[d]),
              carry);
          if (d == 0) {
            next[d] = v;
            break;
          }
          Value over = arith::CmpIOp::create(
              nb, nloc, arith::CmpIPredicate::uge, v, sizes[d]);
          next[d] = arith::SelectOp::create(
              nb, nloc, over, arith::SubIOp::create(nb, nloc, v, sizes[d]), v);
          carry = arith::SelectOp::create(nb, nloc, over, cst(nb, nloc, 1),
                                          cst(nb, nloc, 0));
        }
        scf::YieldOp::create(nb, nloc, next);
      });
}

/// Indices of `map` applied to the loop dimensions `dims`.
SmallVector<Value> applyMap(OpBuilder &b, Location loc, AffineMap map,
                            ValueRange dims) {
  SmallVector<Value> out;
  for (AffineExpr e : map.getResults())
    out.push_back(affine::AffineApplyOp::create(
        b, loc, AffineMap::get(map.getNumDims(), 0, e), dims));
  return out;
}

/// The values `op`'s body yields at the loop point `dims` with output
/// values `accs`, its inputs loaded from their buffers.
SmallVector<Value> evaluateBody(linalg::GenericOp op, OpBuilder &nb,
                                Location nloc, ValueRange dims,
                                ValueRange accs) {
  Block &body = op.getRegion().front();
  IRMapping map;
  for (OpOperand *in : op.getDpsInputOperands()) {
    Value arg = body.getArgument(in->getOperandNumber());
    Value v = in->get();
    if (isa<MemRefType>(v.getType()))
      v = memref::LoadOp::create(
          nb, nloc, v, applyMap(nb, nloc, op.getMatchingIndexingMap(in), dims));
    map.map(arg, v);
  }
  for (auto [init, acc] : llvm::zip(op.getDpsInitsMutable(), accs))
    map.map(body.getArgument(init.getOperandNumber()), acc);
  for (Operation &inner : body.without_terminator()) {
    if (auto index = dyn_cast<linalg::IndexOp>(inner)) {
      map.map(index.getResult(), dims[index.getDim()]);
      continue;
    }
    nb.clone(inner, map);
  }
  return llvm::map_to_vector(body.getTerminator()->getOperands(),
                             [&](Value v) { return map.lookupOrDefault(v); });
}

/// How partial results of a reduction combine, when a generic's body is
/// `acc = combine(x, acc)` with its output used nowhere else.
enum class Combiner { None, MaxF, AddF, AddI };

Combiner combinerOf(linalg::GenericOp op) {
  Block &body = op.getRegion().front();
  Value out = body.getArguments().back();
  Value yielded = body.getTerminator()->getOperand(0);
  Operation *def = yielded.getDefiningOp();
  if (!def || def->getNumOperands() != 2 || !out.hasOneUse() ||
      (def->getOperand(0) != out && def->getOperand(1) != out))
    return Combiner::None;
  if (isa<arith::MaximumFOp>(def) && out.getType().isF32())
    return Combiner::MaxF;
  if (isa<arith::AddFOp>(def) && out.getType().isF32())
    return Combiner::AddF;
  if (isa<arith::AddIOp>(def) && out.getType().isInteger(32))
    return Combiner::AddI;
  return Combiner::None;
}

/// A reduction generic with few output points and a combinable body (max
/// or sum, e.g. a row max over a score tile of 16 rows) on a block of
/// threads: `lanes` lanes of one warp share each point, each folds every
/// lanes-th reduction step, and warp shuffles combine the partials.
/// Floating-point sums then add in another order than one thread would.
/// Returns false (and leaves `op`) where it does not apply.
bool distributeSplitReduction(linalg::GenericOp op, const Threads &threads) {
  if (op.getNumDpsInits() != 1 || !op.hasPureBufferSemantics() ||
      op.getNumReductionLoops() != 1 || threads.blockSize % 32)
    return false;
  Combiner kind = combinerOf(op);
  if (kind == Combiner::None)
    return false;
  SmallVector<int64_t> bounds = op.getStaticLoopRanges();
  SmallVector<int64_t> parDims;
  int64_t points = 1, redDim = -1;
  for (auto [i, it] : llvm::enumerate(op.getIteratorTypesArray())) {
    if (ShapedType::isDynamic(bounds[i]))
      return false;
    if (it == utils::IteratorType::parallel) {
      parDims.push_back(i);
      points *= bounds[i];
    } else {
      redDim = i;
    }
  }
  int64_t steps = bounds[redDim];
  int64_t lanes = 1;
  while (lanes < 32 && 2 * lanes <= steps &&
         points * 2 * lanes <= threads.blockSize)
    lanes *= 2;
  if (lanes < 2)
    return false;
  OpBuilder b(op);
  Location loc = op.getLoc();
  int64_t groups = threads.blockSize / lanes;
  Value lane = arith::RemUIOp::create(b, loc, threads.tid, cst(b, loc, lanes));
  Value group = arith::DivUIOp::create(b, loc, threads.tid, cst(b, loc, lanes));
  Value first = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, lane,
                                      cst(b, loc, 0));
  TypedAttr identityAttr =
      kind == Combiner::AddI
          ? TypedAttr(b.getI32IntegerAttr(0))
          : TypedAttr(b.getF32FloatAttr(
                kind == Combiner::MaxF ? -std::numeric_limits<float>::infinity()
                                       : -0.0f));
  Value identity = arith::ConstantOp::create(b, loc, identityAttr);
  auto combine = [&](OpBuilder &cb, Location cloc, Value x,
                     Value y) -> Value {
    switch (kind) {
    case Combiner::MaxF:
      return arith::MaximumFOp::create(cb, cloc, x, y);
    case Combiner::AddF:
      return arith::AddFOp::create(cb, cloc, x, y);
    default:
      return arith::AddIOp::create(cb, cloc, x, y);
    }
  };
  OpOperand *init = op.getDpsInitOperand(0);
  AffineMap initMap = op.getMatchingIndexingMap(init);
  // Every thread runs the same number of rounds, so that whole warps take
  // part in each shuffle.
  int64_t rounds = (points + groups - 1) / groups;
  scf::ForOp::create(
      b, loc, cst(b, loc, 0), cst(b, loc, rounds), cst(b, loc, 1),
      ValueRange{},
      [&](OpBuilder &nb, Location nloc, Value round, ValueRange) {
        Value linear = arith::AddIOp::create(
            nb, nloc,
            arith::MulIOp::create(nb, nloc, round, cst(nb, nloc, groups)),
            group);
        Value live = arith::CmpIOp::create(nb, nloc, arith::CmpIPredicate::ult,
                                           linear, cst(nb, nloc, points));
        Value safe =
            arith::SelectOp::create(nb, nloc, live, linear, cst(nb, nloc, 0));
        SmallVector<Value> parSizes;
        for (int64_t d : parDims)
          parSizes.push_back(cst(nb, nloc, bounds[d]));
        SmallVector<Value> point = delinearize(nb, nloc, safe, parSizes);
        SmallVector<Value> dims(bounds.size(), cst(nb, nloc, 0));
        for (auto [k, d] : llvm::enumerate(parDims))
          dims[d] = point[k];
        SmallVector<Value> outIdx = applyMap(nb, nloc, initMap, dims);
        // Lane 0 alone reads the old value (the others start from the
        // identity): no lane reads the element lane 0 writes below, so the
        // store needs no ordering beyond the shuffles (racecheck reported
        // the read of lane 1 and the write of lane 0 as a warp-level WAR
        // hazard when every lane read it).
        Value start =
            scf::IfOp::create(
                nb, nloc, first,
                [&](OpBuilder &tb, Location tloc) {
                  Value old =
                      memref::LoadOp::create(tb, tloc, init->get(), outIdx);
                  scf::YieldOp::create(tb, tloc, old);
                },
                [&](OpBuilder &eb, Location eloc) {
                  scf::YieldOp::create(eb, eloc, identity);
                })
                .getResult(0);
        auto fold = scf::ForOp::create(
            nb, nloc, lane, cst(nb, nloc, steps), cst(nb, nloc, lanes),
            ValueRange{start},
            [&](OpBuilder &lb, Location lloc, Value r, ValueRange acc) {
              dims[redDim] = r;
              scf::YieldOp::create(lb, lloc,
                                   evaluateBody(op, lb, lloc, dims, acc));
            });
        Value acc = fold.getResult(0);
        for (int64_t offset = lanes / 2; offset >= 1; offset /= 2) {
          Value other =
              gpu::ShuffleOp::create(nb, nloc, acc,
                                     static_cast<int32_t>(offset), 32,
                                     gpu::ShuffleMode::XOR)
                  .getShuffleResult();
          acc = combine(nb, nloc, acc, other);
        }
        Value store = arith::AndIOp::create(nb, nloc, live, first);
        scf::IfOp::create(nb, nloc, store, [&](OpBuilder &ib, Location iloc) {
          memref::StoreOp::create(ib, iloc, acc, init->get(), outIdx);
          scf::YieldOp::create(ib, iloc);
        });
        scf::YieldOp::create(nb, nloc);
      });
  op.erase();
  return true;
}

/// Replaces a linalg.generic on buffers by a thread-distributed loop nest:
/// the parallel iterations dealt out to the threads, the reductions run
/// sequentially by each thread in a register.
LogicalResult distributeGeneric(linalg::GenericOp op, const Threads &threads) {
  if (op.getNumDpsInits() < 1 || !op.hasPureBufferSemantics())
    return op.emitError("nsa-map-to-gpu: expected a generic on buffers");
  OpBuilder b(op);
  Location loc = op.getLoc();
  SmallVector<Range, 4> ranges =
      cast<linalg::LinalgOp>(op.getOperation()).createLoopRanges(b, loc);
  SmallVector<Value> sizes, parSizes;
  SmallVector<int64_t> parDims, redDims;
  for (auto [i, it] : llvm::enumerate(op.getIteratorTypesArray())) {
    Value size = getValueOrCreateConstantIndexOp(b, loc, ranges[i].size);
    sizes.push_back(size);
    if (it == utils::IteratorType::parallel) {
      parDims.push_back(i);
      parSizes.push_back(size);
    } else {
      redDims.push_back(i);
    }
  }
  auto evaluate = [&](OpBuilder &nb, Location nloc, ValueRange dims,
                      ValueRange accs) {
    return evaluateBody(op, nb, nloc, dims, accs);
  };

  forEachPoint(
      b, loc, threads, parSizes,
      [&](OpBuilder &nb, Location nloc, ValueRange point) {
        SmallVector<Value> dims(sizes.size(), cst(nb, nloc, 0));
        for (auto [k, d] : llvm::enumerate(parDims))
          dims[d] = point[k];
        SmallVector<SmallVector<Value>> outIdx;
        SmallVector<Value> accs;
        for (OpOperand &init : op.getDpsInitsMutable()) {
          outIdx.push_back(
              applyMap(nb, nloc, op.getMatchingIndexingMap(&init), dims));
          accs.push_back(
              memref::LoadOp::create(nb, nloc, init.get(), outIdx.back()));
        }
        // Nested sequential loops over the reduction dimensions.
        std::function<SmallVector<Value>(OpBuilder &, Location, size_t,
                                         ValueRange)>
            reduce = [&](OpBuilder &rb, Location rloc, size_t k,
                         ValueRange values) -> SmallVector<Value> {
          if (k == redDims.size())
            return evaluate(rb, rloc, dims, values);
          auto loop = scf::ForOp::create(
              rb, rloc, cst(rb, rloc, 0), sizes[redDims[k]], cst(rb, rloc, 1),
              values,
              [&](OpBuilder &lb, Location lloc, Value iv, ValueRange args) {
                dims[redDims[k]] = iv;
                scf::YieldOp::create(lb, lloc, reduce(lb, lloc, k + 1, args));
              });
          return SmallVector<Value>(loop.getResults());
        };
        SmallVector<Value> results = reduce(nb, nloc, 0, accs);
        for (auto [init, result, idx] :
             llvm::zip(op.getDpsInitsMutable(), results, outIdx))
          memref::StoreOp::create(nb, nloc, result, init.get(), idx);
      });
  op.erase();
  return success();
}

/// Whether the innermost dimension of `type` is contiguous and its rows
/// can start at `width`-element boundaries: no static offset or outer
/// stride says otherwise (dynamic ones are the tiles' token and head
/// offsets, multiples of the row length).
bool hasAlignedRows(MemRefType type, int64_t width) {
  SmallVector<int64_t> strides;
  int64_t offset;
  if (failed(type.getStridesAndOffset(strides, offset)) || strides.empty() ||
      strides.back() != 1)
    return false;
  auto misaligned = [&](int64_t v) {
    return !ShapedType::isDynamic(v) && v % width != 0;
  };
  return !misaligned(offset) &&
         llvm::none_of(ArrayRef(strides).drop_back(), misaligned);
}

/// Elements of `type` per 16-byte vector access, or 1 where vectors do not
/// apply: a vector of sub-byte elements (i1) is bit-packed in memory, while
/// the buffer holds one byte per element.
int64_t vectorWidth(MemRefType type) {
  int64_t bits = type.getElementTypeBitWidth();
  return bits >= 8 && bits <= 128 && 128 % bits == 0 ? 128 / bits : 1;
}

/// Writes `dst` over the threads: 16-byte vectors along a contiguous
/// innermost dimension whose size and alignment allow it (tiles start at
/// 16-byte aligned rows), single elements otherwise. `value(point)` gives
/// the element at `point`, `vector(point, type)` the vector from it (the
/// innermost coordinate scaled); `alsoAligned` must allow vectors too.

void distributeStores(
    OpBuilder &b, Location loc, Value dst, const Threads &threads,
    bool alsoAligned,
    function_ref<Value(OpBuilder &, Location, ValueRange)> value,
    function_ref<Value(OpBuilder &, Location, ValueRange, VectorType)>
        vector) {
  auto type = cast<MemRefType>(dst.getType());
  int64_t rank = type.getRank();
  int64_t inner = rank ? type.getDimSize(rank - 1) : 0;
  int64_t width = vectorWidth(type);
  bool vectorize = alsoAligned && rank > 0 && width > 1 &&
                   !ShapedType::isDynamic(inner) && inner % width == 0 &&
                   hasAlignedRows(type, width);
  SmallVector<Value> sizes;
  for (int64_t d = 0; d < rank; ++d)
    sizes.push_back(memref::DimOp::create(b, loc, dst, d));
  if (vectorize)
    sizes.back() = cst(b, loc, inner / width);
  auto vecType = VectorType::get({width}, type.getElementType());
  forEachPoint(b, loc, threads, sizes,
               [&](OpBuilder &nb, Location nloc, ValueRange point) {
                 if (!vectorize) {
                   memref::StoreOp::create(nb, nloc, value(nb, nloc, point),
                                           dst, point);
                   return;
                 }
                 SmallVector<Value> idx(point);
                 idx.back() = arith::MulIOp::create(nb, nloc, idx.back(),
                                                    cst(nb, nloc, width));
                 vector::StoreOp::create(nb, nloc,
                                         vector(nb, nloc, idx, vecType), dst,
                                         idx, false, llvm::MaybeAlign(16));
               });
}

/// memref.copy distributed over the threads (distributeStores).
void distributeCopy(memref::CopyOp op, const Threads &threads) {
  OpBuilder b(op);
  Value src = op.getSource();
  auto srcType = cast<MemRefType>(src.getType());
  int64_t width = vectorWidth(srcType);
  distributeStores(
      b, op.getLoc(), op.getTarget(), threads, hasAlignedRows(srcType, width),
      [&](OpBuilder &nb, Location nloc, ValueRange point) -> Value {
        return memref::LoadOp::create(nb, nloc, src, point);
      },
      [&](OpBuilder &nb, Location nloc, ValueRange idx,
          VectorType type) -> Value {
        return vector::LoadOp::create(nb, nloc, type, src, idx, false,
                                      llvm::MaybeAlign(16));
      });
  op.erase();
}

/// linalg.fill on a buffer distributed over the threads (distributeStores).
void distributeFill(linalg::FillOp op, const Threads &threads) {
  OpBuilder b(op);
  Value scalar = op.value();
  distributeStores(
      b, op.getLoc(), op.output(), threads, /*alsoAligned=*/true,
      [&](OpBuilder &, Location, ValueRange) { return scalar; },
      [&](OpBuilder &nb, Location nloc, ValueRange,
          VectorType type) -> Value {
        return vector::BroadcastOp::create(nb, nloc, type, scalar);
      });
  op.erase();
}

/// Whether `value`, yielded by a loop body, is the buffer of the body's
/// iteration argument `arg`: the argument itself, or what nested loops and
/// branches return after updating it in place.
bool isSameBuffer(Value value, Value arg) {
  if (value == arg)
    return true;
  auto result = dyn_cast<OpResult>(value);
  if (!result)
    return false;
  unsigned i = result.getResultNumber();
  if (auto loop = dyn_cast<scf::ForOp>(result.getOwner())) {
    auto yield = cast<scf::YieldOp>(loop.getBody()->getTerminator());
    return isSameBuffer(loop.getInitArgs()[i], arg) &&
           isSameBuffer(yield.getOperand(i), loop.getRegionIterArgs()[i]);
  }
  if (auto ifOp = dyn_cast<scf::IfOp>(result.getOwner()))
    return ifOp.elseBlock() &&
           isSameBuffer(ifOp.thenYield().getOperand(i), arg) &&
           isSameBuffer(ifOp.elseYield().getOperand(i), arg);
  return false;
}

/// Marks a contraction whose output a zero fill just before it
/// initialised (the fill is dropped).
constexpr StringLiteral kZeroInitAttr = "nsa.zero_init";

/// Whether `op` is a zero fill of the output of the tensor-core contraction
/// right after it.
bool feedsMMA(Operation *op) {
  auto fill = dyn_cast<linalg::FillOp>(op);
  auto next = dyn_cast_or_null<linalg::GenericOp>(op->getNextNode());
  if (!fill || !next || !fill.hasPureBufferSemantics())
    return false;
  FloatAttr value;
  if (!matchPattern(fill.value(), m_Constant(&value)) ||
      !value.getValue().isZero())
    return false;
  std::optional<nsa::detail::Contraction> con =
      nsa::detail::matchContraction(next);
  return con && con->c == fill.output();
}

/// Distributes every linalg op and copy in `region` (recursively through
/// loops and branches that hold them), each followed by a barrier, and runs
/// the other memory-writing loops and branches on thread 0.
LogicalResult distributeRegion(Region &region, const Threads &threads,
                               bool serialize) {
  for (Block &block : region) {
    for (Operation &op : llvm::make_early_inc_range(block)) {
      if (isDistributed(&op)) {
        if (serialize && threads.blockSize % 32 == 0 && feedsMMA(&op)) {
          // The contraction starts from zero accumulators instead.
          op.getNextNode()->setAttr(kZeroInitAttr,
                                    UnitAttr::get(op.getContext()));
          op.erase();
          continue;
        }
        OpBuilder b(op.getContext());
        b.setInsertionPointAfter(&op);
        if (serialize)
          gpu::BarrierOp::create(b, op.getLoc());
        if (auto copy = dyn_cast<memref::CopyOp>(op)) {
          distributeCopy(copy, threads);
          continue;
        }
        if (auto fill = dyn_cast<linalg::FillOp>(op);
            fill && fill.hasPureBufferSemantics()) {
          distributeFill(fill, threads);
          continue;
        }
        IRRewriter rewriter(op.getContext());
        rewriter.setInsertionPoint(&op);
        auto linalgOp = cast<linalg::LinalgOp>(op);
        linalg::GenericOp generic = dyn_cast<linalg::GenericOp>(op);
        if (!generic) {
          FailureOr<linalg::GenericOp> g =
              linalg::generalizeNamedOp(rewriter, linalgOp);
          if (failed(g))
            return op.emitError("nsa-map-to-gpu: cannot generalize");
          generic = *g;
        }
        if (serialize && threads.blockSize % 32 == 0)
          if (std::optional<nsa::detail::Contraction> con =
                  nsa::detail::matchContraction(generic)) {
            bool zeroInit = generic->hasAttr(kZeroInitAttr);
            nsa::detail::lowerToMMA(generic, *con, threads.tid,
                                    threads.blockSize, zeroInit);
            continue;
          }
        if (serialize && distributeSplitReduction(generic, threads))
          continue;
        if (failed(distributeGeneric(generic, threads)))
          return failure();
        continue;
      }
      bool hasDistributed = contains(&op, isDistributed);
      if (hasDistributed) {
        for (Region &inner : op.getRegions())
          if (failed(distributeRegion(inner, threads, serialize)))
            return failure();
        continue;
      }
      if (!serialize || !contains(&op, [](Operation *o) {
            return isa<memref::StoreOp>(o);
          }))
        continue;
      // Thread 0 runs it; buffers it updates in place are the same for all
      // threads afterwards, other results must be unused.
      if (auto loop = dyn_cast<scf::ForOp>(op)) {
        auto yield = cast<scf::YieldOp>(loop.getBody()->getTerminator());
        for (auto [i, result] : llvm::enumerate(loop.getResults())) {
          if (result.use_empty())
            continue;
          if (!isSameBuffer(yield.getOperand(i), loop.getRegionIterArgs()[i]))
            return op.emitError("nsa-map-to-gpu: a loop that writes memory "
                                "yields a value other threads would need");
          result.replaceAllUsesWith(loop.getInitArgs()[i]);
        }
      } else if (op.getNumResults() && !op.use_empty()) {
        return op.emitError("nsa-map-to-gpu: an op that writes memory "
                            "returns a value other threads would need");
      }
      OpBuilder b(&op);
      Location loc = op.getLoc();
      Value first = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                          threads.tid, cst(b, loc, 0));
      auto ifOp = scf::IfOp::create(b, loc, first, /*withElse=*/false);
      op.moveBefore(ifOp.thenBlock()->getTerminator());
      b.setInsertionPointAfter(ifOp);
      gpu::BarrierOp::create(b, loc);
    }
  }
  return success();
}

/// Carves every memref.alloc in the launch body out of dynamic shared
/// memory; returns the bytes used.
FailureOr<int64_t> placeInSharedMemory(gpu::LaunchOp launch) {
  SmallVector<memref::AllocOp> allocs;
  launch.getBody().walk([&](memref::AllocOp a) { allocs.push_back(a); });
  OpBuilder b(launch.getContext());
  b.setInsertionPointToStart(&launch.getBody().front());
  Location loc = launch.getLoc();
  auto workgroup = gpu::AddressSpaceAttr::get(
      launch.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  Value base = gpu::DynamicSharedMemoryOp::create(
      b, loc,
      MemRefType::get({ShapedType::kDynamic}, b.getI8Type(), AffineMap(),
                      workgroup));
  int64_t offset = 0;
  for (memref::AllocOp alloc : allocs) {
    MemRefType type = alloc.getType();
    if (!type.hasStaticShape() || !type.getLayout().isIdentity())
      return alloc.emitError("nsa-map-to-gpu: a tile buffer needs a static "
                             "shape, found ")
             << type;
    int64_t bytes =
        type.getNumElements() * ((type.getElementTypeBitWidth() + 7) / 8);
    auto sharedType = MemRefType::get(type.getShape(), type.getElementType(),
                                      AffineMap(), workgroup);
    Value view = memref::ViewOp::create(b, loc, sharedType, base,
                                        cst(b, loc, offset), ValueRange{});
    Value generic =
        memref::MemorySpaceCastOp::create(b, loc, type, view).getResult();
    alloc.replaceAllUsesWith(generic);
    alloc.erase();
    offset += (bytes + 15) / 16 * 16;
  }
  if (offset > kSharedMemoryLimit)
    return launch.emitError("nsa-map-to-gpu: the tiles need ")
           << offset << " bytes of shared memory, more than the "
           << kSharedMemoryLimit << " a block can have";
  return offset;
}

/// Runs `build(token)` as an async GPU op after a fresh token and waits for
/// it: the host-side ops are synchronous, as the bufferized code expects.
template <typename BuildFn>
void synchronously(OpBuilder &b, Location loc, BuildFn build) {
  Type tokenType = gpu::AsyncTokenType::get(b.getContext());
  Value start =
      gpu::WaitOp::create(b, loc, tokenType, ValueRange{}).getAsyncToken();
  Value done = build(tokenType, start);
  gpu::WaitOp::create(b, loc, Type(), ValueRange{done});
}

/// A gpu.launch of `grid` blocks of `blockSize` threads with an empty body;
/// the builder is left inside it.
gpu::LaunchOp createLaunch(OpBuilder &b, Location loc, ArrayRef<Value> grid,
                           int64_t blockSize) {
  Value one = cst(b, loc, 1);
  auto launch = gpu::LaunchOp::create(b, loc, grid[0], grid[1], grid[2],
                                      cst(b, loc, blockSize), one, one,
                                      arith::ConstantIntOp::create(
                                          b, loc, b.getI32Type(), 0));
  b.setInsertionPointToStart(&launch.getBody().front());
  gpu::TerminatorOp::create(b, loc);
  b.setInsertionPointToStart(&launch.getBody().front());
  return launch;
}

struct MapToGPUPass : mlir::nsa::impl::MapToGPUBase<MapToGPUPass> {
  using Base::Base;

  /// Names the kernel `launch` becomes (and its gpu.module): the function,
  /// what it computes (the NameLoc nsa-tile put on the loop, else
  /// `fallback`) and a counter, e.g. `layer_select_blocks_3`. Profilers,
  /// compute-sanitizer and the runtime's kernel timings report these names.
  /// What `origin` computes: the NameLoc nsa-tile put on the loop, else
  /// `fallback`.
  static std::string opName(Location origin, StringRef fallback) {
    std::string what = fallback.str();
    origin->walk([&](Location l) {
      if (auto named = dyn_cast<NameLoc>(l)) {
        what = named.getName().str();
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    return what;
  }

  /// Names the kernel `launch` becomes (and its gpu.module): the function,
  /// what it computes and a counter, e.g. `layer_select_blocks_3`.
  /// Profilers, compute-sanitizer and the runtime's kernel timings report
  /// these names.
  void nameKernel(gpu::LaunchOp launch, Location origin, StringRef fallback) {
    std::string name = (getOperation().getName() + "_" +
                        opName(origin, fallback) + "_" + Twine(numKernels++))
                           .str();
    auto symbol = FlatSymbolRefAttr::get(launch.getContext(), name);
    launch.setFunctionAttr(symbol);
    launch.setModuleAttr(symbol);
  }
  int64_t numKernels = 0;
  llvm::StringMap<int64_t> blockSizes;

  LogicalResult mapForall(scf::ForallOp forall) {
    if (forall.getNumResults() || forall.getRank() > 3 ||
        !forall.isNormalized())
      return forall.emitError("nsa-map-to-gpu: expected a bufferized, "
                              "normalized forall of rank 1 to 3");
    OpBuilder b(forall);
    Location loc = forall.getLoc();
    SmallVector<Value> bounds = getValueOrCreateConstantIndexOp(
        b, loc, forall.getMixedUpperBound());
    // The last (largest) dimension on grid x, which allows 2^31 - 1 blocks.
    SmallVector<Value> grid(bounds.rbegin(), bounds.rend());
    while (grid.size() < 3)
      grid.push_back(cst(b, loc, 1));
    std::string what = opName(loc, "tile");
    int64_t threadsPerBlock = blockSizes.lookup(what);
    if (!threadsPerBlock)
      threadsPerBlock = blockSize;
    gpu::LaunchOp launch = createLaunch(b, loc, grid, threadsPerBlock);
    nameKernel(launch, loc, what);
    gpu::KernelDim3 ids = launch.getBlockIds();
    Value blockIds[3] = {ids.x, ids.y, ids.z};
    IRMapping map;
    for (auto [i, iv] : llvm::enumerate(forall.getInductionVars()))
      map.map(iv, blockIds[forall.getRank() - 1 - i]);
    for (Operation &op : forall.getBody()->without_terminator())
      b.clone(op, map);
    forall.erase();

    // Host globals (constant tensors, possibly hoisted out of the loop)
    // are not device memory.
    WalkResult hostData = launch.getBody().walk([&](Operation *op) {
      for (Value operand : op->getOperands()) {
        auto global = operand.getDefiningOp<memref::GetGlobalOp>();
        if (global) {
          op->emitError("nsa-map-to-gpu: a tile reads a host global (a "
                        "constant tensor); build it in the tile instead");
          return WalkResult::interrupt();
        }
      }
      return WalkResult::advance();
    });
    if (hostData.wasInterrupted())
      return failure();
    b.setInsertionPointToStart(&launch.getBody().front());
    Threads threads{launch.getThreadIds().x, cst(b, loc, threadsPerBlock),
                    threadsPerBlock};
    if (failed(distributeRegion(launch.getBody(), threads, true)))
      return failure();
    FailureOr<int64_t> bytes = placeInSharedMemory(launch);
    if (failed(bytes))
      return failure();
    b.setInsertionPoint(launch);
    launch.getDynamicSharedMemorySizeMutable().assign(
        arith::ConstantIntOp::create(b, loc, b.getI32Type(), *bytes));
    return success();
  }

  /// A copy outside any tile between buffers that are not both identity
  /// layouts (a subview with an offset or strides): gpu.memcpy lowers to a
  /// byte copy from each buffer's aligned pointer, without its offset, so
  /// such a copy is a kernel of its own instead.
  static bool isStridedCopy(Operation *op) {
    auto copy = dyn_cast<memref::CopyOp>(op);
    auto identity = [](Value buffer) {
      auto type = dyn_cast<MemRefType>(buffer.getType());
      return type && type.getLayout().isIdentity();
    };
    return copy && !(identity(copy.getSource()) && identity(copy.getTarget()));
  }

  /// A linalg op (or a strided copy) outside any tile: its own launch over
  /// the whole grid.
  LogicalResult mapHostLinalg(Operation *op) {
    OpBuilder b(op);
    Location loc = op->getLoc();
    Value grid[3] = {cst(b, loc, 1024), cst(b, loc, 1), cst(b, loc, 1)};
    gpu::LaunchOp launch = createLaunch(b, loc, grid, blockSize);
    nameKernel(launch, loc,
               isa<linalg::FillOp>(op) ? "fill" : op->getName().stripDialect());
    op->moveBefore(launch.getBody().front().getTerminator());
    b.setInsertionPointToStart(&launch.getBody().front());
    Value tid = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, launch.getBlockIds().x,
                              cst(b, loc, blockSize)),
        launch.getThreadIds().x);
    Threads threads{tid, cst(b, loc, 1024 * blockSize)};
    return distributeRegion(launch.getBody(), threads, false);
  }

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    numKernels = 0;
    if (blockSize <= 0 || blockSize > 1024) {
      func.emitError("nsa-map-to-gpu: block-size must be in 1..1024");
      return signalPassFailure();
    }
    blockSizes.clear();
    if (failed(nsa::parseKernelBlockSizes(
            kernelBlockSizes,
            [&](StringRef op, int64_t threads) { blockSizes[op] = threads; },
            [&](const Twine &message) {
              return func.emitError(message);
            })))
      return signalPassFailure();
    SmallVector<Operation *> topLevel;
    for (Operation &op : func.getBody().getOps())
      topLevel.push_back(&op);
    SmallVector<Value> deviceBuffers;
    for (Operation *op : topLevel) {
      LogicalResult result = success();
      if (auto forall = dyn_cast<scf::ForallOp>(op)) {
        result = mapForall(forall);
      } else if (isa<linalg::LinalgOp>(op) || isStridedCopy(op)) {
        result = mapHostLinalg(op);
      } else if (auto copy = dyn_cast<memref::CopyOp>(op)) {
        OpBuilder b(copy);
        synchronously(b, copy.getLoc(), [&](Type token, Value dep) {
          return gpu::MemcpyOp::create(b, copy.getLoc(), token,
                                       ValueRange{dep}, copy.getTarget(),
                                       copy.getSource())
              .getAsyncToken();
        });
        copy.erase();
      } else if (auto alloc = dyn_cast<memref::AllocOp>(op)) {
        OpBuilder b(alloc);
        Value buffer;
        synchronously(b, alloc.getLoc(), [&](Type token, Value dep) {
          auto device = gpu::AllocOp::create(
              b, alloc.getLoc(), alloc.getType(), token, ValueRange{dep},
              alloc.getDynamicSizes(), alloc.getSymbolOperands());
          buffer = device.getMemref();
          return device.getAsyncToken();
        });
        alloc.replaceAllUsesWith(buffer);
        alloc.erase();
        deviceBuffers.push_back(buffer);
      } else if (contains(op, [](Operation *o) {
                   return isa<scf::ForallOp, linalg::LinalgOp,
                              memref::AllocOp>(o);
                 })) {
        result = op->emitError("nsa-map-to-gpu: cannot map this op");
      }
      if (failed(result))
        return signalPassFailure();
    }
    // Free the device buffers that are not returned.
    func.walk([&](func::ReturnOp ret) {
      OpBuilder b(ret);
      for (Value buffer : deviceBuffers)
        if (!llvm::is_contained(ret.getOperands(), buffer))
          synchronously(b, ret.getLoc(), [&](Type token, Value dep) {
            return gpu::DeallocOp::create(b, ret.getLoc(), token,
                                          ValueRange{dep}, buffer)
                .getAsyncToken();
          });
    });
  }
};

} // namespace

LogicalResult nsa::parseKernelBlockSizes(
    ArrayRef<std::string> entries,
    function_ref<void(StringRef op, int64_t threads)> each,
    function_ref<LogicalResult(const Twine &)> error) {
  for (StringRef entry : entries) {
    auto [op, number] = entry.split('=');
    int64_t threads = 0;
    if (op.empty() || number.getAsInteger(10, threads) || threads < 32 ||
        threads > 1024 || threads % 32)
      return error("nsa-map-to-gpu: kernel-block-sizes entries are "
                   "op=threads with threads a multiple of 32 in 32..1024, "
                   "found '" +
                   entry + "'");
    each(op, threads);
  }
  return success();
}
