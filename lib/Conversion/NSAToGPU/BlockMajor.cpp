//===- BlockMajor.cpp - block-major selected attention -------------------===//
//
// Selected attention with the selected blocks outermost (FlashKeys::
// Gathered), for small groups, where a token-major kernel reads each
// selected block of K and V for G rows only:
//
//   count, scan, place   an inverted index of `indices`: per (batch, KV
//                        head, block) the (token, slot) entries that chose
//                        it, in one array, and the work items over them
//   attention            a work item loads its block's K and V once by TMA
//                        and walks up to kGatheredChunks chunks of 64 rows
//                        (64 / G entries, their Q rows gathered by cp.async
//                        into one buffer, refilled once the chunk's S is
//                        done); per chunk S and P V by wgmma and a one-tile
//                        softmax; each entry's (O, lse) goes to its own
//                        partial row t * n + slot; three blocks an SM
//   merge                per (token, query head) its valid entries' partial
//                        rows, weighted by exp(lse), all n loads at once
//
// The entries of a block are placed by atomics in any order; the results do
// not depend on it (every entry has its own partial row).
//
//===----------------------------------------------------------------------===//

#include "FlashBuilder.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

namespace {

constexpr int64_t kThreads = 256;

/// Whether slot `slot` of a token at `t` whose slots hold `blocks` (i32) is
/// a valid entry: 0 <= j <= t / l' and no earlier slot holds j.
Value validEntry(Emit &e, ArrayRef<Value> blocks, int64_t slot, Value t,
                 int64_t slcBlock) {
  Value j = blocks[slot];
  Value own = e.toI32(e.divs(t, e.idx(slcBlock)));
  Value ok = e.andi(e.le(e.i32(0), j), e.le(j, own));
  for (int64_t s = 0; s < slot; ++s)
    ok = e.andi(ok, e.cmp(arith::CmpIPredicate::ne, blocks[s], j));
  return ok;
}

/// The list of (batch, KV head h, block j): (batch * H + h) * NB + j.
Value listOf(Emit &e, Value batch, Value h, Value j, int64_t heads, Value nb) {
  return e.add(e.mul(e.add(e.mul(batch, e.idx(heads)), h), nb), e.toIndex(j));
}

/// One launch with a thread per (batch, token, KV head) of `indices`:
/// `body(t, slot, list)` for each of its slots that is a valid entry
/// (blocks of `slcBlock` tokens), with the list of the slot's block.
void forEachEntry(OpBuilder &b, Location loc, Value indices, int64_t heads,
                  int64_t n, int64_t slcBlock, StringRef kernelName,
                  function_ref<void(Emit &, Value, int64_t, Value)> body) {
  launchPerRow(b, loc, indices, heads, kThreads, kernelName,
               [&](Emit &e, Value batch, Value t, Value h, Value tokens) {
                 SmallVector<Value> blocks;
                 for (int64_t s = 0; s < n; ++s)
                   blocks.push_back(e.load(indices, {batch, t, h, e.idx(s)}));
                 Value nb = e.ceilDiv(tokens, slcBlock);
                 for (int64_t s = 0; s < n; ++s)
                   e.ifThen(validEntry(e, blocks, s, t, slcBlock), [&] {
                     body(e, t, s, listOf(e, batch, h, blocks[s], heads, nb));
                   });
               });
}

/// One block of 1024 threads: entryStart and itemStart (with the total
/// after the last list) as exclusive prefix sums of the counts and of the
/// work items per list (ceil(count / perItem)).
void buildScanKernel(OpBuilder &b, Location loc, Value counts, Value entryStart,
                     Value itemStart, int64_t perItem, StringRef kernelName) {
  constexpr int64_t kScanThreads = 1024;
  Emit e{b, loc};
  Type i32 = b.getI32Type();
  Value lists = memref::DimOp::create(b, loc, counts, 0);
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch =
      createNamedLaunch(b, loc, {e.idx(1), e.idx(1), e.idx(1)}, kScanThreads,
                        2 * kScanThreads * 4, kernelName);
  auto space = gpu::AddressSpaceAttr::get(
      b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  Value base = gpu::DynamicSharedMemoryOp::create(
      b, loc,
      MemRefType::get({ShapedType::kDynamic}, b.getI8Type(), AffineMap(),
                      space));
  Value sums = memref::ViewOp::create(
      b, loc, MemRefType::get({2, kScanThreads}, i32, AffineMap(), space), base,
      e.idx(0), ValueRange{});
  Value tid = launch.getThreadIds().x;
  Value seg = e.ceilDiv(lists, kScanThreads);
  Value lo = e.min(e.mul(tid, seg), lists);
  Value hi = e.min(e.add(lo, seg), lists);
  auto items = [&](Value count) {
    return e.divs(e.add(count, e.i32(perItem - 1)), e.i32(perItem));
  };
  // This thread's segment, summed.
  auto local = scf::ForOp::create(
      b, loc, lo, hi, e.idx(1), ValueRange{e.i32(0), e.i32(0)},
      [&](OpBuilder &, Location, Value k, ValueRange acc) {
        Value count = e.load(counts, {k});
        scf::YieldOp::create(
            b, loc,
            ValueRange{e.add(acc[0], count), e.add(acc[1], items(count))});
      });
  e.store(local.getResult(0), sums, {e.idx(0), tid});
  e.store(local.getResult(1), sums, {e.idx(1), tid});
  e.barrier();
  // The segments' exclusive prefixes (1024 steps by one thread).
  e.ifThen(e.eq(tid, e.idx(0)), [&] {
    scf::ForOp::create(b, loc, e.idx(0), e.idx(kScanThreads), e.idx(1),
                       ValueRange{e.i32(0), e.i32(0)},
                       [&](OpBuilder &, Location, Value i, ValueRange acc) {
                         Value c0 = e.load(sums, {e.idx(0), i});
                         Value c1 = e.load(sums, {e.idx(1), i});
                         e.store(acc[0], sums, {e.idx(0), i});
                         e.store(acc[1], sums, {e.idx(1), i});
                         scf::YieldOp::create(
                             b, loc,
                             ValueRange{e.add(acc[0], c0), e.add(acc[1], c1)});
                       });
  });
  e.barrier();
  auto run = scf::ForOp::create(
      b, loc, lo, hi, e.idx(1),
      ValueRange{e.load(sums, {e.idx(0), tid}), e.load(sums, {e.idx(1), tid})},
      [&](OpBuilder &, Location, Value k, ValueRange acc) {
        Value count = e.load(counts, {k});
        e.store(acc[0], entryStart, {k});
        e.store(acc[1], itemStart, {k});
        scf::YieldOp::create(
            b, loc,
            ValueRange{e.add(acc[0], count), e.add(acc[1], items(count))});
      });
  // The last thread's segment is the last (or empty): its end is the total.
  e.ifThen(e.eq(tid, e.idx(kScanThreads - 1)),
           [&] { e.store(run.getResult(1), itemStart, {lists}); });
}

} // namespace

void FlashBuilder::buildGathered(Value x) {
  int64_t g = c.group, perChunk = c.tokensPerBlock(), n = c.numSlots;
  int64_t perItem = perChunk * kGatheredChunks;
  Value lists = memref::DimOp::create(b, loc, ops.counts, 0);
  Value total = e.toIndex(e.load(ops.itemStart, {lists}));
  e.ifThen(e.lt(x, total), [&] {
    // The list of item x: the last whose first item is at most x
    // (itemStart[lo] <= x < itemStart[hi] throughout).
    auto search = scf::ForOp::create(
        b, loc, e.idx(0), e.idx(32), e.idx(1), ValueRange{e.idx(0), lists},
        [&](OpBuilder &, Location, Value, ValueRange range) {
          Value lo = range[0], hi = range[1];
          Value mid = e.divs(e.add(lo, hi), e.idx(2));
          Value more = e.lt(e.idx(1), e.sub(hi, lo));
          Value first = e.toIndex(e.load(ops.itemStart, {mid}));
          scf::YieldOp::create(
              b, loc,
              ValueRange{e.sel(e.andi(more, e.le(first, x)), mid, lo),
                         e.sel(e.andi(more, e.lt(x, first)), mid, hi)});
        });
    Value list = search.getResult(0);
    Value tokens = memref::DimOp::create(b, loc, ops.q, 1);
    Value nb = e.ceilDiv(tokens, c.slcBlock);
    gBlock = e.rems(list, nb);
    Value bh = e.divs(list, nb);
    h = e.rems(bh, e.idx(c.kvHeads));
    batch = e.divs(bh, e.idx(c.kvHeads));
    headOff = e.mul(h, e.idx(g));
    start = cmpStart = t0 = keyBase = e.idx(0);
    len = keyLimit = tokens;
    Value listStart = e.toIndex(e.load(ops.entryStart, {list}));
    Value item = e.sub(x, e.toIndex(e.load(ops.itemStart, {list})));
    Value first = e.add(listStart, e.mul(item, e.idx(perItem)));
    Value end = e.min(e.add(first, e.idx(perItem)),
                      e.add(listStart, e.toIndex(e.load(ops.counts, {list}))));
    Value chunks = e.ceilDiv(e.sub(end, first), perChunk);

    // Row r of chunk ch: its entry's token (-1 past the entries) and
    // partial row t * n + slot.
    auto entryOf = [&](Value ch, Value r) {
      Value at =
          e.add(e.add(first, e.mul(ch, e.idx(perChunk))), e.divs(r, e.idx(g)));
      Value live = e.lt(at, end);
      Value code =
          e.toIndex(e.load(ops.entries, {e.min(at, e.sub(end, e.idx(1)))}));
      return std::make_pair(e.sel(live, e.divs(code, e.idx(n)), e.idx(-1)),
                            code);
    };
    auto copyQ = [&](Value ch) {
      copyRowsSwizzled(
          e.idx(0), c.rows(), c.qkDim, ops.q,
          [&](Value r) {
            return std::make_pair(e.max(entryOf(ch, r).first, e.idx(0)),
                                  headOf(r));
          },
          [&](Value r) { return e.le(e.idx(0), entryOf(ch, r).first); });
    };
    // The block's K and V, once; the first chunk's Q.
    issueTile(e.idx(0), e.idx(0));
    copyQ(e.idx(0));
    rowA = e.add(e.mul(wm, e.idx(16)), group4);
    rowB = e.add(rowA, e.idx(8));
    waitTile(e.idx(0), e.idx(0));
    curStage = e.idx(0);
    qDesc = wgmmaDescriptor(b, loc, sharedAddr, 16, kSwizzleAtomBytes);
    e.forEach(e.idx(0), chunks, e.idx(1), [&](Value ch) {
      // This chunk's Q has landed (and is visible to the async proxy).
      nvgpu::DeviceAsyncWaitOp::create(b, loc, commit(),
                                       b.getI32IntegerAttr(0));
      fenceProxyAsync(b, loc);
      e.barrier();
      std::tie(tokA, outRowA) = entryOf(ch, rowA);
      std::tie(tokB, outRowB) = entryOf(ch, rowB);
      Scores s = scoresWgmma(e.idx(0));
      // Every warp's S is complete: the one Q buffer takes the next chunk's
      // rows during this chunk's softmax and P V. (One buffer, not two,
      // leaves room for three blocks an SM, which is faster at G = 4.)
      e.barrier();
      Value next = e.add(ch, e.idx(1));
      e.ifThen(e.lt(next, chunks), [&] { copyQ(next); });
      attendFinish(attendTile(e.idx(0), s, Value(), e.idx(0), attendInit(),
                              /*mask=*/true, /*deferPV=*/false));
    });
  });
}

void mlir::nsa::detail::buildBlockMajorSelected(OpBuilder &b, Location loc,
                                                const FlashConfig &c,
                                                const FlashOperands &ops,
                                                StringRef kernelName) {
  Emit e{b, loc};
  Type i32 = b.getI32Type(), f32 = b.getF32Type(), bf16 = b.getBF16Type();
  int64_t heads = c.kvHeads, n = c.numSlots, qHeads = c.kvHeads * c.group;
  int64_t perItem = c.tokensPerBlock() * kGatheredChunks;
  auto qType = cast<MemRefType>(ops.q.getType());
  Value batches = memref::DimOp::create(b, loc, ops.q, 0);
  Value tokens = memref::DimOp::create(b, loc, ops.q, 1);
  Value nb = e.ceilDiv(tokens, c.slcBlock);
  Value lists = e.mul(e.mul(batches, e.idx(heads)), nb);
  auto vector1 = [&](Value size) {
    return memref::AllocOp::create(
        b, loc, MemRefType::get({ShapedType::kDynamic}, i32), size);
  };
  Value counts = vector1(lists), cursor = vector1(lists);
  Value entryStart = vector1(lists);
  Value itemStart = vector1(e.add(lists, e.idx(1)));
  Value entries = vector1(e.mul(e.mul(batches, tokens), e.idx(heads * n)));
  // The partial rows [B, T * n, HQ, Dv] and [B, T * n, HQ].
  SmallVector<Value> dynamic;
  if (qType.isDynamicDim(0))
    dynamic.push_back(batches);
  dynamic.push_back(e.mul(tokens, e.idx(n)));
  int64_t b0 = qType.getDimSize(0);
  Value partialOut = memref::AllocOp::create(
      b, loc, MemRefType::get({b0, ShapedType::kDynamic, qHeads, c.vDim}, bf16),
      dynamic);
  Value partialLse = memref::AllocOp::create(
      b, loc, MemRefType::get({b0, ShapedType::kDynamic, qHeads}, f32),
      dynamic);

  std::string name = kernelName.str();
  {
    // counts and cursor zeroed, a thread per list.
    OpBuilder::InsertionGuard guard(b);
    gpu::LaunchOp zero = createNamedLaunch(
        b, loc, {e.ceilDiv(lists, kThreads), e.idx(1), e.idx(1)}, kThreads, 0,
        name + "_zero");
    Value list = e.add(e.mul(zero.getBlockIds().x, e.idx(kThreads)),
                       zero.getThreadIds().x);
    e.ifThen(e.lt(list, lists), [&] {
      e.store(e.i32(0), counts, {list});
      e.store(e.i32(0), cursor, {list});
    });
  }
  forEachEntry(b, loc, ops.indices, heads, n, c.slcBlock, name + "_count",
               [&](Emit &e, Value, int64_t, Value list) {
                 memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi,
                                             e.i32(1), counts, list);
               });
  buildScanKernel(b, loc, counts, entryStart, itemStart, perItem,
                  name + "_scan");
  forEachEntry(
      b, loc, ops.indices, heads, n, c.slcBlock, name + "_place",
      [&](Emit &e, Value t, int64_t s, Value list) {
        Value pos =
            memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi,
                                        e.i32(1), cursor, ValueRange{list});
        Value at = e.add(e.toIndex(e.load(entryStart, {list})), e.toIndex(pos));
        e.store(e.toI32(e.add(e.mul(t, e.idx(n)), e.idx(s))), entries, {at});
      });

  FlashOperands attend = ops;
  attend.out = partialOut;
  attend.lse = partialLse;
  attend.entries = entries;
  attend.entryStart = entryStart;
  attend.counts = counts;
  attend.itemStart = itemStart;
  buildFlashKernel(b, loc, c, attend, name);

  // The merge: a thread per 8 elements of one (batch, token, query head).
  int64_t chunks = c.vDim / 8, rowsPerBlock = kThreads / chunks;
  Value rows = e.mul(e.mul(batches, tokens), e.idx(qHeads));
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch = createNamedLaunch(
      b, loc, {e.ceilDiv(rows, rowsPerBlock), e.idx(1), e.idx(1)},
      rowsPerBlock * chunks, 0, name + "_merge");
  Value tid = launch.getThreadIds().x;
  Value row = e.add(e.mul(launch.getBlockIds().x, e.idx(rowsPerBlock)),
                    e.divs(tid, e.idx(chunks)));
  Value col = e.mul(e.rems(tid, e.idx(chunks)), e.idx(8));
  auto vecBF16 = VectorType::get({8}, bf16), vecF32 = VectorType::get({8}, f32);
  e.ifThen(e.lt(row, rows), [&] {
    Value hq = e.rems(row, e.idx(qHeads));
    Value bt = e.divs(row, e.idx(qHeads));
    Value t = e.rems(bt, tokens), batch = e.divs(bt, tokens);
    Value h = e.divs(hq, e.idx(c.group));
    SmallVector<Value> blocks;
    for (int64_t s = 0; s < n; ++s)
      blocks.push_back(e.load(ops.indices, {batch, t, h, e.idx(s)}));
    Value negInf = e.f32(-INFINITY);
    // Every slot's partial row exists (unwritten where the slot is not a
    // valid entry): all 2n loads are issued at once, the invalid ones'
    // values selected away (they may hold anything, NaN included).
    SmallVector<Value> valid, lse, rowsIn;
    for (int64_t s = 0; s < n; ++s) {
      valid.push_back(validEntry(e, blocks, s, t, c.slcBlock));
      Value partialRow = e.add(e.mul(t, e.idx(n)), e.idx(s));
      lse.push_back(e.load(partialLse, {batch, partialRow, hq}));
      rowsIn.push_back(vector::LoadOp::create(
          b, loc, vecBF16, partialOut, ValueRange{batch, partialRow, hq, col},
          /*nontemporal=*/false, llvm::MaybeAlign(16)));
    }
    Value m = negInf;
    for (int64_t s = 0; s < n; ++s) {
      lse[s] = e.sel(valid[s], lse[s], negInf);
      m = e.fmax(m, lse[s]);
    }
    Value finite = e.fcmp(arith::CmpFPredicate::ONE, m, negInf);
    Value base = e.sel(finite, m, e.f32(0));
    Value zeros = arith::ConstantOp::create(
        b, loc, vecF32, DenseElementsAttr::get(vecF32, b.getF32FloatAttr(0)));
    Value acc = zeros, sum = e.f32(0);
    for (int64_t s = 0; s < n; ++s) {
      // An invalid slot's weight is 0 (its lse is -inf), and a valid one's
      // 0 only where it underflows: testing the weight, not the slot's
      // flag, keeps no predicate alive across the loads (at 128 registers
      // for G <= 2 and n = 16, the flags spilled).
      Value w = e.ex2(e.fmul(e.fsub(lse[s], base), e.f32(M_LOG2E)));
      Value x = e.sel(e.fcmp(arith::CmpFPredicate::OGT, w, e.f32(0)),
                      arith::ExtFOp::create(b, loc, vecF32, rowsIn[s]), zeros);
      acc = vector::FMAOp::create(
          b, loc, x, vector::BroadcastOp::create(b, loc, vecF32, w), acc);
      sum = e.fadd(sum, w);
    }
    // A NaN sum (Spec section 14) stays NaN; 0 means no slot.
    Value nonEmpty = e.fcmp(arith::CmpFPredicate::UNE, sum, e.f32(0));
    Value inv =
        e.sel(nonEmpty, arith::DivFOp::create(b, loc, e.f32(1), sum), e.f32(0));
    Value o = arith::MulFOp::create(
        b, loc, acc, vector::BroadcastOp::create(b, loc, vecF32, inv));
    vector::StoreOp::create(b, loc, arith::TruncFOp::create(b, loc, vecBF16, o),
                            ops.out, ValueRange{batch, t, hq, col},
                            /*nontemporal=*/false, llvm::MaybeAlign(16));
    e.ifThen(e.eq(col, e.idx(0)), [&] {
      Value l = e.fadd(base, math::LogOp::create(b, loc, sum));
      e.store(e.sel(nonEmpty, l, negInf), ops.lse, {batch, t, hq});
    });
  });
}
