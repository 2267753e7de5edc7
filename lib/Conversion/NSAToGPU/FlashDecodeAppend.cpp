//===- FlashDecodeAppend.cpp - a decoding step's compressed rows ----------===//
//
// nsa.compress_append in a decoding step (FlashDecode.h): the compressed
// caches' new rows, pooled from the step's last l tokens of the caches,
// either by a launch of their own before the step's kernels, or (at small
// B on sm_90, in place) by the `_cluster` blocks whose compressed chunks
// hold them, which saves that launch:
//   - at its start, such a block pools the row's K and V (a pair of
//     columns a thread, the l rows' loads issued first) into shared memory
//     and the caches, while the chunk's copies are in flight;
//   - once the chunk's K (then V) has come, it puts the pooled row in
//     place of the row's copy, which may have read the cache before or
//     after the store.
// The append launch is then built under an scf.if that skips it exactly
// where `_cluster` pools (foldAppendsCondition, computed the same way on
// both sides).
//
//===----------------------------------------------------------------------===//

#include "FlashDecodeBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;
using namespace mlir::nsa::detail::decode;

/// Columns [col, col + 2) of compressed block `block` of head `h` of batch
/// row `batch` of `a`'s input, pooled (weights [h, j], or the mean) in f32
/// and rounded to bf16. The l rows' loads are all issued first (one round
/// of latency, not l), then added in row order.
static Value poolPair(Emit &e, const AppendOperands &a, int64_t l, int64_t d,
                      Value batch, Value block, Value h, Value col) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  auto pairType = VectorType::get({2}, bf16);
  auto pairF32 = VectorType::get({2}, f32);
  SmallVector<Value> rows, weights;
  for (int64_t j = 0; j < l; ++j) {
    rows.push_back(vector::LoadOp::create(
        b, loc, pairType, a.input,
        ValueRange{batch, e.add(e.mul(block, e.idx(d)), e.idx(j)), h, col}));
    weights.push_back(a.weights ? e.load(a.weights, {h, e.idx(j)})
                                : e.f32(1.0 / l));
  }
  Value sum = arith::ConstantOp::create(
      b, loc, pairF32, DenseElementsAttr::get(pairF32, b.getF32FloatAttr(0)));
  for (int64_t j = 0; j < l; ++j)
    sum = vector::FMAOp::create(
        b, loc, arith::ExtFOp::create(b, loc, pairF32, rows[j]),
        vector::BroadcastOp::create(b, loc, pairF32, weights[j]), sum);
  return arith::TruncFOp::create(b, loc, pairType, sum);
}

/// The compressed blocks [first, end) a step of `appended` tokens
/// completes for a cache of `len` tokens and `rows` rows.
static std::pair<Value, Value> newBlocks(Emit &e, const AppendConfig &c,
                                         Value len, Value rows) {
  Value before = e.max(e.sub(len, e.idx(c.appended)), e.idx(0));
  Value first = e.compressedBlocks(before, c.block, c.stride);
  Value end = e.min(
      e.compressedBlocks(e.max(len, e.idx(0)), c.block, c.stride), rows);
  return {first, end};
}

bool mlir::nsa::detail::appendsFoldable(const DecodeConfig &config,
                                        const AppendConfig &appendConfig,
                                        ArrayRef<AppendOperands> appends) {
  return mayCluster(config) && appends.size() == 2 &&
         appendConfig.appended > 0 &&
         appendConfig.appended <= appendConfig.stride &&
         appendConfig.block == config.cmpBlock &&
         appendConfig.stride == config.cmpStride &&
         appendConfig.heads == config.kvHeads &&
         appends[0].dim == config.qkDim && appends[1].dim == config.vDim;
}

Value mlir::nsa::detail::decodeTakesCluster(OpBuilder &b, Location loc,
                                            const DecodeConfig &c, Value batch,
                                            Value cacheTokens) {
  Emit e{b, loc};
  // With clusterSelect each block of the cluster holds its share of the
  // token's blocks as candidates, and the selected ones all blocks' n
  // best, in the buffers before the statistics (scoreInCluster,
  // gatherChosen).
  int64_t candidates = PartialLayout(c).clusterCandidates();
  if (!mayCluster(c) ||
      (c.clusterSelect && c.clusterBlocks * c.numSelected > candidates))
    return arith::ConstantIntOp::create(b, loc, 0, 1);
  Value few = e.le(e.mul(batch, e.idx(c.tiles() * c.clusterBlocks)),
                   e.idx(c.targetBlocks / 2));
  if (!c.clusterSelect)
    return few;
  Value blocks = e.ceilDiv(cacheTokens, c.slcBlock);
  Value share = e.ceilDiv(blocks, c.clusterBlocks);
  return e.andi(few, e.le(share, e.idx(candidates)));
}

Value mlir::nsa::detail::foldAppendsCondition(OpBuilder &b, Location loc,
                                              const DecodeConfig &config,
                                              ArrayRef<AppendOperands> appends,
                                              Value kvLens) {
  Emit e{b, loc};
  Value fold = decodeTakesCluster(
      b, loc, config, memref::DimOp::create(b, loc, kvLens, 0),
      memref::DimOp::create(b, loc, appends[0].input, 1));
  for (const AppendOperands &a : appends) {
    Value src = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, a.src);
    Value dst = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, a.dst);
    fold = e.andi(fold, e.cmp(arith::CmpIPredicate::eq, src, dst));
  }
  return fold;
}

DecodeBuilder::PooledRow DecodeBuilder::poolAppended(Value batch, Tile tile,
                                                     Value tid,
                                                     Value chunkBegin,
                                                     Value chunkEnd) {
  const AppendConfig &ac = ops.append;
  int64_t ks = c.chunkKeys, threads = partialThreads();
  auto [first, end] =
      newBlocks(e, ac, e.toIndex(e.load(ops.kvLens, {batch})), p.cmpRows);
  PooledRow row{first, e.divs(first, e.idx(ks)), Value()};
  // (At most one new row: appended <= d.)
  Value here = e.andi(e.eq(p.foldedAppends, e.idx(1)), e.lt(first, end));
  here = e.andi(here, e.andi(e.le(chunkBegin, row.chunk),
                             e.lt(row.chunk, chunkEnd)));
  row.here = here;
  e.ifThen(here, [&] {
    Value pooled = view(sharedBytes(), lay.pooled, {c.qkDim + c.vDim},
                        b.getBF16Type());
    // The last token's row tiles store the row (each head's once).
    Value stores = e.eq(tile.token, e.idx(c.queries - 1));
    int64_t kPairs = c.qkDim / 2;
    auto pool = [&](const AppendOperands &a, Value start, int64_t at) {
      e.forEach(start, e.idx(a.dim / 2), e.idx(threads), [&](Value pair) {
        Value col = e.mul(pair, e.idx(2));
        Value v = poolPair(e, a, ac.block, ac.stride, batch, first, tile.head,
                           col);
        vector::StoreOp::create(b, loc, v, pooled,
                                ValueRange{e.add(col, e.idx(at))}, false,
                                llvm::MaybeAlign(4));
        e.ifThen(stores, [&] {
          vector::StoreOp::create(b, loc, v, a.dst,
                                  ValueRange{batch, first, tile.head, col},
                                  false, llvm::MaybeAlign(4));
        });
      });
    };
    // K's pairs on the first threads, V's on the ones after them.
    pool(ops.kcAppend, tid, 0);
    pool(ops.vcAppend,
         e.rems(e.add(tid, e.idx(threads - kPairs % threads)),
                e.idx(threads)),
         c.qkDim);
  });
  return row;
}

void DecodeBuilder::placeAppended(const PooledRow &row, Value chunk,
                                  bool values, Value into, Value tid) {
  e.ifThen(e.andi(row.here, e.eq(chunk, row.chunk)), [&] {
    Type bf16 = b.getBF16Type();
    Value pooled =
        view(sharedBytes(), lay.pooled, {c.qkDim + c.vDim}, bf16);
    Value r = e.sub(row.first, e.mul(chunk, e.idx(c.chunkKeys)));
    int64_t dim = values ? c.vDim : c.qkDim, at = values ? c.qkDim : 0;
    auto piece = VectorType::get({8}, bf16);
    e.forEach(tid, e.idx(dim / 8), e.idx(partialThreads()), [&](Value i) {
      Value col = e.mul(i, e.idx(8));
      Value v = vector::LoadOp::create(b, loc, piece, pooled,
                                       ValueRange{e.add(col, e.idx(at))},
                                       false, b.getI64IntegerAttr(16));
      vector::StoreOp::create(b, loc, v, into, ValueRange{r, col}, false,
                              llvm::MaybeAlign(16));
    });
    e.barrier();
  });
}

void mlir::nsa::detail::buildCompressAppendKernel(
    OpBuilder &b, Location loc, const AppendConfig &c,
    ArrayRef<AppendOperands> appends, Value kvLens, StringRef kernelName) {
  Emit e{b, loc};
  // Each thread pools two neighbouring columns of the row (as
  // buildCompressKernel does), reading its l tokens' rows coalesced.
  int64_t widest = 0;
  for (const AppendOperands &a : appends)
    widest = std::max(widest, a.dim);
  int64_t threads = std::min<int64_t>(alignUp(widest / 2, 32), 256);
  int64_t slots = (c.appended + c.stride - 1) / c.stride;
  Value batches = memref::DimOp::create(b, loc, appends[0].input, 0);
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch = createNamedLaunch(
      b, loc,
      {e.idx(slots), e.idx(c.heads),
       e.mul(batches, e.idx(static_cast<int64_t>(appends.size())))},
      threads, 0, kernelName);
  if (c.gridDeps)
    NVVM::GriddepcontrolOp::create(b, loc,
                                   NVVM::GridDepActionKind::launch_dependents);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value tid = launch.getThreadIds().x;
  Value h = ids.y, batch = e.rems(ids.z, batches);
  Value which = e.divs(ids.z, batches);
  Value len = e.toIndex(e.load(kvLens, {batch}));
  for (auto [index, a] : llvm::enumerate(appends)) {
    e.ifThen(e.eq(which, e.idx(index)), [&] {
      Value rows = memref::DimOp::create(b, loc, a.dst, 1);
      auto [first, end] = newBlocks(e, c, len, rows);
      Value i = e.add(first, ids.x);
      e.ifThen(e.lt(i, end), [&] {
        e.forEach(tid, e.idx(a.dim / 2), e.idx(threads), [&](Value pr) {
          Value col = e.mul(pr, e.idx(2));
          vector::StoreOp::create(
              b, loc, poolPair(e, a, c.block, c.stride, batch, i, h, col),
              a.dst, ValueRange{batch, i, h, col}, /*nontemporal=*/false,
              llvm::MaybeAlign(4));
        });
      });
      // Out of place: the blocks of each (slot, head) copy the batch row's
      // other rows of their head (grid-stride over the rows), never a new
      // one.
      Value srcAt =
          memref::ExtractAlignedPointerAsIndexOp::create(b, loc, a.src);
      Value dstAt =
          memref::ExtractAlignedPointerAsIndexOp::create(b, loc, a.dst);
      e.ifThen(e.cmp(arith::CmpIPredicate::ne, srcAt, dstAt), [&] {
        e.forEach(ids.x, rows, e.idx(slots), [&](Value row) {
          Value fresh = e.andi(e.le(first, row), e.lt(row, end));
          scf::IfOp::create(
              b, loc, fresh,
              [&](OpBuilder &, Location) { scf::YieldOp::create(b, loc); },
              [&](OpBuilder &, Location) {
                e.forEach(tid, e.idx(a.dim), e.idx(threads), [&](Value col) {
                  e.store(e.load(a.src, {batch, row, h, col}), a.dst,
                          {batch, row, h, col});
                });
                scf::YieldOp::create(b, loc);
              });
        });
      });
    });
  }
}
