//===- FlashDecodePush.cpp - `_cluster`'s merge by pushes -----------------===//
//
// The merge of a `_cluster` step (FlashDecode.h, DecodeConfig::clusterPush)
// without a second cluster barrier. The cluster's blocks that attend to no
// late (selected or window) keys own the row tile's rows, a share each:
//   - before the first cluster barrier an owner initializes two mbarriers
//     (the window splits', the selected splits') and arrives on each
//     expecting the bytes those splits will push to it;
//   - each late split, at its end, stores its rows' (max, sum) and O with
//     `st.async` into its rows' owners' shared memory (their K and V
//     buffers, unused past the compressed splits), each store completing
//     its bytes on the owner's mbarrier of the split's branch; it then
//     exits;
//   - an owner, past the first barrier, merges its rows' compressed splits
//     from the workspace and loads their gates while the late splits run,
//     then merges the window's pushes once they are in, then the selected
//     splits' (4 lanes an item, every item in one round), and stores the
//     gated rows.
// The compressed and window results are clusterMerge's (the same splits in
// the same order); the selected splits' sum runs over 4 lanes instead of 8.
// What it saves on the step's critical path: the second barrier's fence
// over the workspace stores, the merge's loads from L2 and half of its
// rounds.
//
//===----------------------------------------------------------------------===//

#include "FlashDecodeBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;
using namespace mlir::nsa::detail::decode;

void DecodeBuilder::initPushed(Value rank, Value tid) {
  // Owner o's rows: [o rows, min((o + 1) rows, 16)); every late split
  // pushes (max, sum) and Dv columns of each.
  Value owner = e.sub(rank, e.idx(lateSplits()));
  Value first = e.mul(owner, e.idx(pushRows()));
  Value rows =
      e.max(e.min(e.sub(e.idx(16), first), e.idx(pushRows())), e.idx(0));
  // Two mbarriers: the window splits' bytes, then the selected splits'.
  Value perSplit = e.mul(rows, e.idx((c.vDim + 2) * 4));
  e.ifThen(e.andi(e.le(e.idx(lateSplits()), rank), e.eq(tid, e.idx(0))), [&] {
    for (auto [at, splits] :
         {std::make_pair(0, p.winSplits), std::make_pair(8, p.slcSplits)}) {
      Value bar = sharedAddress(lay.recvBar + at);
      ptx("mbarrier.init.shared::cta.b64 [$0], 1;", bar, "r");
      ptx("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
          {bar, e.toI32(e.mul(splits, perSplit))}, "r,r");
    }
    ptx("fence.mbarrier_init.release.cluster;", {}, "");
  });
}

void DecodeBuilder::pushSplit(Value late, Value stats, ArrayRef<Value> acc,
                              Value warp, Value tid, int64_t vGroups) {
  // Row r goes to owner lateSplits() + r / rows, at its local row r % rows.
  int64_t rows = pushRows(), lateAll = lateSplits();
  int64_t warps = partialThreads() / 32, vGroupsAll = c.vDim / 16;
  Value lane = e.rems(tid, e.idx(32));
  LaneFragments f = laneFragments(e, lane);
  // The window splits (late < winSplits) complete their bytes on the
  // owners' first mbarrier, the selected splits on the second.
  Value barAt = e.sel(e.lt(late, p.winSplits), e.idx(0), e.idx(8));
  auto ownerOf = [&](Value r) {
    return e.add(e.idx(lateAll), e.divs(r, e.idx(rows)));
  };
  // Element `col` of local row r's entry for this split, of `width` f32s.
  auto entry = [&](Value r, int64_t width, Value col) {
    Value at = e.add(e.mul(e.rems(r, e.idx(rows)), e.idx(lateAll)), late);
    return e.mul(e.add(e.mul(at, e.idx(width)), col), e.idx(4));
  };
  auto push = [&](int64_t offset, Value r, int64_t width, Value col, Value x,
                  Value y) {
    Value owner = ownerOf(r);
    Value to = peerAddress(offset, entry(r, width, col), owner);
    Value bar = peerAddress(lay.recvBar, barAt, owner);
    ptx("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 "
        "[$0], {$1, $2}, [$3];",
        {to, x, y, bar}, "r,f,f,r");
  };
  e.ifThen(e.lt(tid, e.idx(16)), [&] {
    push(pushStatsAt(), tid, 2, e.idx(0), e.load(stats, {e.idx(0), tid}),
         e.load(stats, {e.idx(1), tid}));
  });
  // The accumulators as attendSplit stores them: (row, column pair) k / 2
  // of each 8 columns n of each 16 columns i.
  for (int64_t i = 0; i < vGroups; ++i) {
    Value group = e.add(warp, e.idx(warps * i));
    e.ifThen(e.lt(group, e.idx(vGroupsAll)), [&] {
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t half = 0; half < 2; ++half) {
          Value r = half ? e.add(f.group4, e.idx(8)) : f.group4;
          Value col =
              e.add(e.add(e.mul(group, e.idx(16)), e.idx(8 * n)), f.pair);
          int64_t at = 8 * i + 4 * n + 2 * half;
          push(lay.k, r, c.vDim, col, acc[at], acc[at + 1]);
        }
    });
  }
}

void DecodeBuilder::clusterMergePushed(Value batch, Tile tile, Value tileIndex,
                                       Value rank, Value tid) {
  // clusterMerge's items (row, 8 columns) over the owner's rows only:
  // first every item's compressed result and gates (8 lanes an item, into
  // the stash: a slot an item and column), past the first mbarrier the
  // window's result (into the stash), past the second the selected splits'
  // and the gated rows.
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  int64_t threads = partialThreads(), groups = c.vDim / 8;
  int64_t rows = pushRows(), lateAll = lateSplits();
  int64_t items = rows * groups;
  int64_t perLane = (c.clusterBlocks + 7) / 8;
  int64_t latePer = clusterLatePer();
  int64_t winMax = (winChunks() + latePer - 1) / latePer;
  int64_t slcMax = (slcChunks() + latePer - 1) / latePer;
  Value shared = sharedBytes();
  Value pushedO = view(shared, lay.k, {rows * lateAll * c.vDim}, f32);
  Value pushedStats = view(shared, pushStatsAt(), {rows * lateAll * 2}, f32);
  // Per (item, lane): the compressed result, the three gates, the window's
  // result.
  Value stash = view(shared, pushStashAt(), {items * 8, 5}, f32);
  Value k = e.rems(tid, e.idx(8));
  Value first = e.mul(e.sub(rank, e.idx(lateAll)), e.idx(rows));
  auto itemOf = [&](Value local) {
    Value rowLocal = e.divs(local, e.idx(groups));
    Value r = e.add(first, rowLocal);
    Value col = e.mul(e.rems(local, e.idx(groups)), e.idx(8));
    return std::make_tuple(rowLocal, r, col);
  };
  auto slot = [&](Value local) { return e.add(e.mul(local, e.idx(8)), k); };
  Value step = e.idx(threads / 8);
  Value lanes0 = e.divs(tid, e.idx(8));
  // The compressed results and gates while the late splits run.
  e.forEach(lanes0, e.idx(items), step, [&](Value local) {
    auto [rowLocal, r0, col] = itemOf(local);
    Value r = e.min(r0, e.idx(15));
    SmallVector<SmallVector<Value>> loaded =
        loadSplits(tileIndex, r, col, e.idx(0), p.cmpSplits, k, perLane);
    Value g = e.min(r, e.idx(c.group - 1));
    Value hq = e.add(e.mul(tile.head, e.idx(c.group)), g);
    auto [mine, l] = mergeLoaded(loaded, k);
    Value s = slot(local);
    e.store(branchResult(mine[0], l), stash, {s, e.idx(0)});
    for (int64_t i = 0; i < 3; ++i) {
      Value logit = e.load(ops.gates, {batch, tile.token, hq, e.idx(i)});
      e.store(sigmoid(e, arith::ExtFOp::create(b, loc, f32, logit)), stash,
              {s, e.idx(1 + i)});
    }
  });
  stamp(OwnCompressed);
  // Phase 0 of mbarrier `at` (the window's or the selected splits'
  // pushes). The lanes leave the wait's loop apart; without the barrier
  // after it, the first lanes out run the merge alone until its shuffles
  // and the step takes longer (docs/Decode.md, the phase trace).
  auto waitPushes = [&](int64_t at) {
    ptx("{\n\t.reg .pred done;\n\twait:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], 0;\n\t"
        "@!done bra wait;\n\t}",
        {sharedAddress(lay.recvBar + at)}, "r");
    e.barrier();
  };
  // Late splits begin + lane + lanes u of local row rowLocal as loadSplits
  // gives them: (max, sum, O[col, col + 8)), -inf max past `end`.
  auto loadPushed = [&](Value rowLocal, Value col, Value begin, Value end,
                        Value lane, int64_t lanes, int64_t lanesEach) {
    SmallVector<SmallVector<Value>> out;
    for (int64_t u = 0; u < lanesEach; ++u) {
      Value at = e.add(e.add(begin, lane), e.idx(lanes * u));
      Value split = e.min(at, e.sub(end, e.idx(1)));
      Value entry = e.add(e.mul(rowLocal, e.idx(lateAll)), split);
      out.push_back(loadEntry(pushedStats, e.mul(entry, e.idx(2)), pushedO,
                              e.add(e.mul(entry, e.idx(c.vDim)), col),
                              e.lt(at, end)));
    }
    return out;
  };
  Value winEnd = p.winSplits;
  Value slcEnd = e.add(p.winSplits, p.slcSplits);
  // The window's result once its pushes are in (they end long before the
  // selected splits'), into the stash.
  waitPushes(0);
  e.forEach(lanes0, e.idx(items), step, [&](Value local) {
    auto [rowLocal, r0, col] = itemOf(local);
    (void)r0;
    auto [mine, l] = mergeLoaded(
        loadPushed(rowLocal, col, e.idx(0), winEnd, k, 8, (winMax + 7) / 8), k);
    e.store(branchResult(mine[0], l), stash, {slot(local), e.idx(4)});
  });
  waitPushes(8);
  stamp(Received);
  // The selected splits by 4 lanes an item, 2 columns a lane: at the
  // paper's dims every item in one round (the step waits for this part
  // alone). A warp's 8 items are all in or all out (the last ones again
  // where the items are not a multiple of 8, their stores dropped).
  Value k4 = e.rems(tid, e.idx(4));
  e.forEach(
      e.divs(tid, e.idx(4)), e.idx(alignUp(items, 8)), e.idx(threads / 4),
      [&](Value item) {
        Value local = e.min(item, e.idx(items - 1));
        auto [rowLocal, r0, col] = itemOf(local);
        Value r = e.min(r0, e.idx(15));
        auto [mine, l] = mergeLoaded(
            loadPushed(rowLocal, col, winEnd, slcEnd, k4, 4, (slcMax + 3) / 4),
            k4, 4);
        Value g = e.min(r, e.idx(c.group - 1));
        Value hq = e.add(e.mul(tile.head, e.idx(c.group)), g);
        for (int64_t j = 0; j < 2; ++j) {
          Value colHere = e.add(e.mul(k4, e.idx(2)), e.idx(j));
          Value s = e.add(e.mul(local, e.idx(8)), colHere);
          Value out = e.fadd(e.fadd(e.fmul(e.load(stash, {s, e.idx(1)}),
                                           e.load(stash, {s, e.idx(0)})),
                                    e.fmul(e.load(stash, {s, e.idx(2)}),
                                           branchResult(mine[j], l))),
                             e.fmul(e.load(stash, {s, e.idx(3)}),
                                    e.load(stash, {s, e.idx(4)})));
          Value kept =
              e.andi(e.lt(item, e.idx(items)),
                     e.andi(e.lt(r0, e.idx(16)), e.lt(r, e.idx(c.group))));
          e.ifThen(kept, [&] {
            e.store(arith::TruncFOp::create(b, loc, bf16, out), ops.out,
                    {batch, tile.token, hq, e.add(col, colHere)});
          });
        }
      });
}
