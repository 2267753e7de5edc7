//===- FlashDecodeSelect.cpp - a decoding step's choice of blocks ---------===//
//
// DecodeBuilder::chooseBlocks (FlashDecodeBuilder.h): each selected block
// of a decoding step chooses its token's n blocks (Spec 5.2-5.4) from the
// compressed splits and their chunks' Eq. 9 partials.
//
//===----------------------------------------------------------------------===//

#include "FlashDecodeBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

namespace mlir::nsa::detail::decode {

/// A block's score (Spec 5.4 and 14): its importance, forced blocks above
/// every importance (local ones first), a NaN one below them.
static Value rankScore(Emit &e, const spec::Backbone &bb, Value score,
                       Value j, Value last) {
  Value local = e.lt(e.sub(last, j), e.i32(bb.local));
  Value forcedScore =
      e.sel(local, e.f32(spec::kLocalScore), e.f32(spec::kForcedScore));
  Value nan = e.fcmp(arith::CmpFPredicate::UNO, score, score);
  score = e.sel(nan, e.f32(spec::kNaNScore), e.fadd(score, e.f32(0)));
  return e.sel(backboneForced(e, bb, j, last), forcedScore, score);
}

/// The candidate key of a block's score: the score's bits made
/// unsigned-ordered (higher first), as chooseBlocks ranks them.
static Value scoreKey(Emit &e, Value score) {
  OpBuilder &b = e.b;
  Type i32 = b.getI32Type();
  Value sb = arith::BitcastOp::create(b, e.loc, i32, score);
  return e.sel(e.cmp(arith::CmpIPredicate::slt, sb, e.i32(0)),
               arith::XOrIOp::create(b, e.loc, sb, e.i32(-1)),
               arith::OrIOp::create(b, e.loc, sb, e.i32(INT32_MIN)));
}

/// Whether candidate (k1, j1) ranks before (k2, j2): the higher key, then
/// the lower block (a blank's -1 after every block).
static Value ranksBefore(Emit &e, Value k1, Value j1, Value k2, Value j2) {
  auto ult = [&](Value x, Value y) {
    return e.cmp(arith::CmpIPredicate::ult, x, y);
  };
  return e.ori(ult(k2, k1), e.andi(e.eq(k1, k2), ult(j1, j2)));
}

void DecodeBuilder::storeGroupLse(ArrayRef<Value> loaded, Value tid,
                                  Value lseS) {
  int64_t rows = 16 * c.rowTiles(), warps = partialThreads() / 32;
  int64_t perWarp = (rows + warps - 1) / warps;
  Value warp = e.divs(tid, e.idx(32)), lane = e.rems(tid, e.idx(32));
  for (int64_t i = 0; i < perWarp; ++i) {
    Value rho = e.min(e.add(warp, e.idx(warps * i)), e.idx(rows - 1));
    Value m = loaded[2 * i], l = loaded[2 * i + 1];
    Value mAll = m;
    for (int32_t o : {1, 2, 4, 8, 16})
      mAll = e.fmax(mAll, e.shuffleXor(mAll, o));
    Value mUse = e.sel(isNegInf(e, mAll), e.f32(0), mAll);
    Value sum = e.fmul(l, e.ex2(e.fsub(m, mUse)));
    for (int32_t o : {1, 2, 4, 8, 16})
      sum = e.fadd(sum, e.shuffleXor(sum, o));
    Value lse = e.fadd(mAll, lg2(e, sum));
    Value none = e.ori(isNegInf(e, mAll), e.le(e.idx(c.group), rho));
    e.ifThen(e.andi(e.eq(lane, e.idx(0)),
                    e.lt(e.add(warp, e.idx(warps * i)), e.idx(rows))),
             [&] { e.store(e.sel(none, e.f32(-INFINITY), lse), lseS, {rho}); });
  }
}

void DecodeBuilder::chooseBlocks(Value batch, Tile tile, Value t, Value tid,
                                 Value chosen) {
  // The token's n blocks (Spec 5.2-5.4) into `chosen` in rank order, -1
  // where fewer: every selected block of the token's group ranks all
  // candidates itself, a pass of passChunks compressed chunks at a time:
  // the chunks' partials and reference maxima staged by cp.async (the
  // first pass's while the lse loads), the partials summed over the group's
  // rows per slot (Eq. 10), each thread's candidates scored, and the n
  // best of them and of the best n so far found by a tournament (rounds
  // of redux.sync in each warp, then in warp 0 over the warps' n best).
  // A candidate is two u32 keys in rank order: the score's bits made
  // unsigned-ordered (higher first), then ~block (the lower block first);
  // a blank is (0, 0), after every candidate.
  Choice ch = beginChoice(batch, tile, t, tid);
  groupLse(ch);
  stamp(Lse);
  // The best n so far: blanks.
  ch.blankKey = e.i32(0);
  ch.blankBlock = e.i32(-1);
  e.forEach(tid, e.idx(c.numSelected), e.idx(partialThreads()), [&](Value i) {
    e.store(ch.blankKey, ch.best, {i, e.idx(0)});
    e.store(ch.blankBlock, ch.best, {i, e.idx(1)});
  });
  scf::ForOp::create(
      b, loc, e.idx(0), ch.passes, e.idx(1), ValueRange{},
      [&](OpBuilder &, Location, Value pass, ValueRange) {
        choosePass(ch, pass);
        scf::YieldOp::create(b, loc);
      });
  // (No staged copy may land in the K and V buffers after this.)
  waitStaged();
  e.forEach(tid, e.idx(c.numSelected), e.idx(partialThreads()), [&](Value i) {
    Value key = e.load(ch.best, {i, e.idx(0)});
    Value block = e.load(ch.best, {i, e.idx(1)});
    e.store(e.sel(e.eq(key, ch.blankKey), e.i32(-1), block), chosen, {i});
  });
  e.barrier();
  stamp(Chosen);
}

DecodeBuilder::Choice DecodeBuilder::beginChoice(Value batch, Tile tile,
                                                 Value t, Value tid) {
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  int64_t n = c.numSelected, rows = 16 * c.rowTiles();
  int64_t warps = partialThreads() / 32;
  int64_t slots = c.slotsPerChunk(), perChunk = c.chunkKeys / subPerSlc();
  int64_t staged = lay.passChunks + 1;
  Choice ch;
  ch.batch = batch;
  ch.tile = tile;
  ch.tid = tid;
  ch.warp = e.divs(tid, e.idx(32));
  ch.lane = e.rems(tid, e.idx(32));
  Value shared = sharedBytes();
  ch.lseS = view(shared, lay.lse, {rows}, f32);
  ch.best = view(shared, lay.best, {n, 2}, i32);
  ch.lists = view(shared, lay.lists, {warps, n, 2}, i32);
  ch.factorS = view(shared, lay.factors, {staged * rows}, f32);
  ch.partS = view(shared, lay.parts, {staged * rows * slots}, f32);
  ch.sumS = view(shared, lay.sums, {staged, slots}, f32);
  Value visible = visibleBlocks(t);
  ch.last = e.sel(e.lt(t, e.idx(0)), e.idx(-1), e.divs(t, e.idx(c.slcBlock)));
  ch.chunkEnd = e.min(p.cmpChunks, e.ceilDiv(visible, c.chunkKeys));
  Value perPass = e.idx(lay.passChunks * perChunk);
  ch.passes = ceilDivV(e.max(e.add(ch.last, e.idx(1)), e.idx(0)), perPass);
  return ch;
}

Value DecodeBuilder::choiceTile(const Choice &ch, Value rho) {
  return groupTileIndex(ch.batch, ch.tile.token, ch.tile.head, rho);
}

std::pair<Value, Value> DecodeBuilder::stagedChunk(const Choice &ch, Value c0,
                                                   Value local) {
  Value chunk = e.add(e.sub(c0, e.idx(1)), local);
  return std::make_pair(
      chunk, e.andi(e.le(e.idx(0), chunk), e.lt(chunk, ch.chunkEnd)));
}

void DecodeBuilder::stageChunks(const Choice &ch, Value c0) {
  // The partials ([chunk][row][slot]) and reference maxima ([chunk][row],
  // into factorS) of the pass starting at chunk c0, as one group: the
  // chunks the token sees, contiguous in the workspace for each row tile.
  int64_t slots = c.slotsPerChunk(), passChunks = lay.passChunks;
  int64_t vecs = 16 * slots / 4, threads = partialThreads();
  Type token = nvgpu::DeviceAsyncTokenType::get(b.getContext());
  auto copy16 = [&](Value dst, Value dstAt, Value srcAt) {
    nvgpu::DeviceAsyncCopyOp::create(
        b, loc, token, dst, ValueRange{dstAt}, p.work, ValueRange{srcAt},
        b.getIndexAttr(4), Value(), b.getUnitAttr());
  };
  Value lo = e.max(e.sub(c0, e.idx(1)), e.idx(0));
  Value hi = e.max(e.min(e.add(c0, e.idx(passChunks)), ch.chunkEnd), lo);
  Value first = e.sub(lo, e.sub(c0, e.idx(1)));
  int64_t tiles = c.rowTiles();
  for (int64_t sub = 0; sub < tiles; ++sub) {
    Value row = e.add(e.mul(choiceTile(ch, e.idx(16 * sub)), p.cmpChunks), lo);
    // `chunkVecs` 16-byte copies a chunk and row tile; in shared memory
    // the row tiles of a chunk are consecutive.
    auto copyChunks = [&](Value dst, Value from, int64_t chunkVecs) {
      e.forEach(
          ch.tid, e.mul(e.sub(hi, lo), e.idx(chunkVecs)), e.idx(threads),
          [&](Value v) {
            Value at = e.mul(v, e.idx(4));
            Value to =
                tiles == 1
                    ? e.add(e.mul(first, e.idx(chunkVecs * 4)), at)
                    : e.add(e.mul(e.add(e.mul(e.add(first,
                                                    e.divs(v,
                                                           e.idx(chunkVecs))),
                                              e.idx(tiles)),
                                        e.idx(sub)),
                                  e.idx(chunkVecs * 4)),
                            e.mul(e.rems(v, e.idx(chunkVecs)), e.idx(4)));
            copy16(dst, to, e.add(from, at));
          });
    };
    copyChunks(ch.partS, e.add(p.partAt, e.mul(row, e.idx(16 * slots))), vecs);
    copyChunks(ch.factorS, e.add(p.refAt, e.mul(row, e.idx(16))), 4);
  }
  nvgpu::DeviceAsyncCreateGroupOp::create(b, loc, token, ValueRange{});
}

void DecodeBuilder::waitStaged() {
  Type token = nvgpu::DeviceAsyncTokenType::get(b.getContext());
  Value any =
      nvgpu::DeviceAsyncCreateGroupOp::create(b, loc, token, ValueRange{});
  nvgpu::DeviceAsyncWaitOp::create(b, loc, any, b.getI32IntegerAttr(0));
  e.barrier();
}

void DecodeBuilder::groupLse(const Choice &ch) {
  // 1. The compressed lse (log2 units) of each row of the group from the
  // splits: a warp takes every warps-th row, all of them in one loop over
  // the splits; -inf for padding rows and rows that saw no block. The
  // first pass's chunks are staged on the way.
  int64_t rows = 16 * c.rowTiles(), warps = partialThreads() / 32;
  int64_t perWarp = (rows + warps - 1) / warps;
  SmallVector<Value> init;
  for (int64_t i = 0; i < perWarp; ++i) {
    init.push_back(e.f32(-INFINITY));
    init.push_back(e.f32(0));
  }
  auto rowOf = [&](int64_t i) {
    return e.min(e.add(ch.warp, e.idx(warps * i)), e.idx(rows - 1));
  };
  // Split s's (max, sum) of row rho, merged into (m, l) online.
  auto statsAt = [&](Value rho, Value s) {
    return e.add(
        p.statsAt,
        e.mul(e.add(e.mul(e.add(e.mul(choiceTile(ch, rho), p.splits), s),
                          e.idx(16)),
                    e.rems(rho, e.idx(16))),
              e.idx(2)));
  };
  auto merge = [&](Value m0, Value l0, Value m, Value l) {
    Value mNew = e.fmax(m0, m);
    Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
    return std::make_pair(mNew, e.fadd(e.fmul(l0, e.ex2(e.fsub(m0, mUse))),
                                       e.fmul(l, e.ex2(e.fsub(m, mUse)))));
  };
  SmallVector<Value> rowStats;
  if (inCluster) {
    // (`_cluster`: at most 16 compressed splits, one a lane. Their loads
    // go out before the staging's copies, not behind them.)
    Value valid = e.lt(ch.lane, p.cmpSplits);
    Value s = e.min(ch.lane, e.sub(p.cmpSplits, e.idx(1)));
    SmallVector<Value> loaded;
    for (int64_t i = 0; i < perWarp; ++i) {
      Value at = statsAt(rowOf(i), s);
      loaded.push_back(loadWork(at));
      loaded.push_back(loadWork(e.add(at, e.idx(1))));
    }
    stageChunks(ch, e.idx(0));
    for (int64_t i = 0; i < perWarp; ++i) {
      Value m = e.sel(valid, loaded[2 * i], e.f32(-INFINITY));
      Value l = e.sel(valid, loaded[2 * i + 1], e.f32(0));
      auto [mNew, lNew] = merge(init[2 * i], init[2 * i + 1], m, l);
      rowStats.push_back(mNew);
      rowStats.push_back(lNew);
    }
  } else {
    stageChunks(ch, e.idx(0));
    auto lanes =
        scf::ForOp::create(b, loc, ch.lane, p.cmpSplits, e.idx(32), init,
                           [&](OpBuilder &, Location, Value s, ValueRange ml) {
                             SmallVector<Value> next;
                             for (int64_t i = 0; i < perWarp; ++i) {
                               Value at = statsAt(rowOf(i), s);
                               auto [mNew, lNew] =
                                   merge(ml[2 * i], ml[2 * i + 1], loadWork(at),
                                         loadWork(e.add(at, e.idx(1))));
                               next.push_back(mNew);
                               next.push_back(lNew);
                             }
                             scf::YieldOp::create(b, loc, next);
                           });
    rowStats.assign(lanes.getResults().begin(), lanes.getResults().end());
  }
  storeGroupLse(rowStats, ch.tid, ch.lseS);
}

void DecodeBuilder::choosePass(const Choice &ch, Value pass) {
  Value c0 = e.mul(pass, e.idx(lay.passChunks));
  passSums(ch, c0);
  stamp(Sums);
  // The next pass's chunks load under this one's ranking.
  e.ifThen(e.lt(e.add(pass, e.idx(1)), ch.passes),
           [&] { stageChunks(ch, e.add(c0, e.idx(lay.passChunks))); });
  SmallVector<Value> keys, keys2;
  passCandidates(ch, c0, keys, keys2);
  // 5. The n best by a tournament: each warp's n best of its lanes'
  // candidates into its list, then warp 0's n best of the lists into
  // `best`, in rank order (blanks last).
  int64_t n = c.numSelected, warps = partialThreads() / 32;
  int64_t perLane = (warps * n + 31) / 32;
  sortPairs(keys, keys2);
  tournament(ch, keys, keys2, [&](Value r, Value key, Value key2) {
    e.store(key, ch.lists, {ch.warp, r, e.idx(0)});
    e.store(key2, ch.lists, {ch.warp, r, e.idx(1)});
  });
  e.barrier();
  e.ifThen(e.lt(ch.tid, e.idx(32)), [&] {
    SmallVector<Value> k1, k2;
    for (int64_t i = 0; i < perLane; ++i) {
      Value at = e.add(e.mul(ch.lane, e.idx(perLane)), e.idx(i));
      Value inside = e.lt(at, e.idx(warps * n));
      Value from = e.min(at, e.idx(warps * n - 1));
      Value w = e.divs(from, e.idx(n)), r = e.rems(from, e.idx(n));
      k1.push_back(
          e.sel(inside, e.load(ch.lists, {w, r, e.idx(0)}), ch.blankKey));
      k2.push_back(e.sel(inside, e.load(ch.lists, {w, r, e.idx(1)}), e.i32(0)));
    }
    sortPairs(k1, k2);
    tournament(ch, k1, k2, [&](Value r, Value key, Value key2) {
      e.store(key, ch.best, {r, e.idx(0)});
      e.store(arith::XOrIOp::create(b, loc, key2, e.i32(-1)), ch.best,
              {r, e.idx(1)});
    });
  });
}

void DecodeBuilder::passSums(const Choice &ch, Value c0) {
  int64_t G = c.group, rows = 16 * c.rowTiles(), threads = partialThreads();
  int64_t slots = c.slotsPerChunk(), staged = lay.passChunks + 1;
  // 2. The staged chunks' factors exp2(m - lse) per row (0 where the token
  // does not see the chunk or the row saw no block).
  waitStaged();
  e.forEach(ch.tid, e.idx(staged * rows), e.idx(threads), [&](Value item) {
    Value rho = e.rems(item, e.idx(rows));
    Value seen = stagedChunk(ch, c0, e.divs(item, e.idx(rows))).second;
    Value lse = e.load(ch.lseS, {rho});
    Value use = e.andi(
        seen, e.fcmp(arith::CmpFPredicate::UNE, lse, e.f32(-INFINITY)));
    Value ref = e.load(ch.factorS, {item});
    e.store(e.sel(use, e.ex2(e.fsub(ref, lse)), e.f32(0)), ch.factorS, {item});
  });
  e.barrier();
  // 3. Per chunk and slot, the sum over the group's rows (rows in order, as
  // Eq. 10 adds them).
  e.forEach(ch.tid, e.idx(staged * slots), e.idx(threads), [&](Value item) {
    Value local = e.divs(item, e.idx(slots));
    Value q = e.rems(item, e.idx(slots));
    // (Chunks the token does not see, most of a pass for short caches, are
    // 0 without the sum.)
    Value sum =
        e.ifUnmasked(stagedChunk(ch, c0, local).second, [&](bool unseen) {
          Value sum = e.f32(0);
          for (int64_t rho = 0; rho < G && !unseen; ++rho) {
            Value row = e.add(e.mul(local, e.idx(rows)), e.idx(rho));
            Value part =
                e.load(ch.partS, {e.add(e.mul(row, e.idx(slots)), q)});
            sum = e.fadd(sum, e.fmul(e.load(ch.factorS, {row}), part));
          }
          return SmallVector<Value>{sum};
        })[0];
    e.store(sum, ch.sumS, {local, q});
  });
  e.barrier();
}

void DecodeBuilder::passCandidates(const Choice &ch, Value c0,
                                   SmallVector<Value> &keys,
                                   SmallVector<Value> &keys2) {
  // 4. This thread's candidates c0 perChunk + tid + threads i: the slots of
  // their chunk (and of the one before, where a block's first keys are
  // there); forced blocks first (rankScore).
  int64_t n = c.numSelected, threads = partialThreads();
  int64_t a = subPerCmp(), bsz = subPerSlc();
  int64_t slots = c.slotsPerChunk(), perChunk = c.chunkKeys / bsz;
  SmallVector<Value> blocks;
  for (int64_t i = 0; i < lay.perThread; ++i) {
    Value local = e.add(ch.tid, e.idx(threads * i));
    Value j = e.add(e.mul(c0, e.idx(perChunk)), local);
    Value at = e.add(e.divs(local, e.idx(perChunk)), e.idx(1));
    Value q = e.rems(local, e.idx(perChunk));
    Value score = e.load(ch.sumS, {at, q});
    Value early = e.lt(e.mul(q, e.idx(bsz)), e.idx(a - 1));
    Value prev = e.load(
        ch.sumS, {e.sub(at, e.idx(1)),
                  e.min(e.add(q, e.idx(perChunk)), e.idx(slots - 1))});
    score = e.sel(early, e.fadd(prev, score), score);
    Value key = scoreKey(
        e, rankScore(e, c.backbone, score, e.toI32(j), e.toI32(ch.last)));
    Value real = e.le(j, ch.last);
    keys.push_back(e.sel(real, key, ch.blankKey));
    blocks.push_back(e.sel(real, e.toI32(j), ch.blankBlock));
  }
  // The best n so far join the pass's candidates (thread i < n holds entry
  // i). A candidate's second key is its block's order: lower blocks first,
  // blanks last.
  {
    Value mine = e.lt(ch.tid, e.idx(n));
    Value at = e.min(ch.tid, e.idx(n - 1));
    keys.push_back(e.sel(mine, e.load(ch.best, {at, e.idx(0)}), ch.blankKey));
    blocks.push_back(
        e.sel(mine, e.load(ch.best, {at, e.idx(1)}), ch.blankBlock));
  }
  for (Value j : blocks)
    keys2.push_back(arith::XOrIOp::create(b, loc, j, e.i32(-1)));
}

void DecodeBuilder::sortPairs(SmallVector<Value> &k1, SmallVector<Value> &k2) {
  // Odd-even transposition; a candidate is two u32 keys: the score's, then
  // ~block (the lower block first; a blank's (0, 0) after every one).
  auto before = [&](Value x1, Value x2, Value y1, Value y2) {
    auto ult = [&](Value x, Value y) {
      return e.cmp(arith::CmpIPredicate::ult, x, y);
    };
    return e.ori(ult(y1, x1), e.andi(e.eq(x1, y1), ult(y2, x2)));
  };
  size_t m = k1.size();
  for (size_t round = 0; round < m; ++round)
    for (size_t i = round % 2; i + 1 < m; i += 2) {
      Value swap = before(k1[i + 1], k2[i + 1], k1[i], k2[i]);
      Value a = k1[i], a2 = k2[i];
      k1[i] = e.sel(swap, k1[i + 1], a);
      k2[i] = e.sel(swap, k2[i + 1], a2);
      k1[i + 1] = e.sel(swap, a, k1[i + 1]);
      k2[i + 1] = e.sel(swap, a2, k2[i + 1]);
    }
}

void DecodeBuilder::tournament(const Choice &ch, ArrayRef<Value> k1,
                               ArrayRef<Value> k2,
                               function_ref<void(Value, Value, Value)> put) {
  // n rounds: the largest head key (redux.sync), among the heads equal to
  // it the largest second key; the lane whose head that is shifts its list
  // (blanks in behind).
  Type i32 = b.getI32Type();
  auto warpMax = [&](Value v) {
    return NVVM::ReduxOp::create(b, loc, i32, v, NVVM::ReduxKind::UMAX,
                                 e.i32(-1))
        .getResult();
  };
  size_t m = k1.size();
  SmallVector<Value> init(k1);
  init.append(k2.begin(), k2.end());
  scf::ForOp::create(
      b, loc, e.idx(0), e.idx(c.numSelected), e.idx(1), init,
      [&](OpBuilder &, Location, Value r, ValueRange list) {
        Value top = warpMax(list[0]);
        Value mine = e.eq(list[0], top);
        Value top2 = warpMax(e.sel(mine, list[m], e.i32(0)));
        Value won = e.andi(mine, e.eq(list[m], top2));
        SmallVector<Value> next;
        for (size_t half : {size_t(0), m})
          for (size_t j = 0; j < m; ++j)
            next.push_back(e.sel(won, j + 1 < m ? list[half + j + 1] : e.i32(0),
                                 list[half + j]));
        e.ifThen(e.eq(ch.lane, e.idx(0)), [&] { put(r, top, top2); });
        scf::YieldOp::create(b, loc, next);
      });
}

void DecodeBuilder::scoreInCluster(Value batch, Tile tile, Value t, Value tid,
                                   Value rank) {
  // Blocks [rank per, (rank + 1) per) of the token's last + 1 (per = their
  // count over the cluster's blocks): each thread a block at a time, its
  // score summed over the group's rows as chooseBlocks sums it (the same
  // order, the same key), from the compressed splits' chunk partials and
  // reference maxima in the workspace; then each candidate's rank among
  // the block's by counting, the n first into `lay.cands`.
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  int64_t n = c.numSelected, G = c.group, threads = partialThreads();
  int64_t warps = threads / 32, perWarp = (16 + warps - 1) / warps;
  int64_t a = subPerCmp(), bsz = subPerSlc(), ks = c.chunkKeys;
  int64_t slots = c.slotsPerChunk(), perChunk = ks / bsz;
  Value shared = sharedBytes();
  Value lseS = view(shared, lay.lse, {16}, f32);
  Value cand = view(shared, 0, {clusterCandidates(), 2}, i32);
  Value list = view(shared, lay.cands, {n, 2}, i32);
  Value warp = e.divs(tid, e.idx(32)), lane = e.rems(tid, e.idx(32));
  Value tileIndex = groupTileIndex(batch, tile.token, tile.head, e.idx(0));
  // 1. The group's lse: split `lane` of rows warp + warps i (at most 16
  // compressed splits).
  Value valid = e.lt(lane, p.cmpSplits);
  Value split = e.min(lane, e.sub(p.cmpSplits, e.idx(1)));
  SmallVector<Value> loaded;
  for (int64_t i = 0; i < perWarp; ++i) {
    Value rho = e.min(e.add(warp, e.idx(warps * i)), e.idx(15));
    Value at = e.add(
        p.statsAt,
        e.mul(e.add(e.mul(e.add(e.mul(tileIndex, p.splits), split), e.idx(16)),
                    rho),
              e.idx(2)));
    loaded.push_back(e.sel(valid, loadWork(at), e.f32(-INFINITY)));
    loaded.push_back(e.sel(valid, loadWork(e.add(at, e.idx(1))), e.f32(0)));
  }
  storeGroupLse(loaded, tid, lseS);
  e.barrier();
  // 2. The candidates' keys.
  Value last =
      e.sel(e.lt(t, e.idx(0)), e.idx(-1), e.divs(t, e.idx(c.slcBlock)));
  Value count = e.max(e.add(last, e.idx(1)), e.idx(0));
  Value per = ceilDivV(count, e.idx(c.clusterBlocks));
  Value first = e.mul(rank, per);
  Value here = e.max(e.min(e.sub(count, first), per), e.idx(0));
  Value chunkEnd = e.min(p.cmpChunks, e.ceilDiv(visibleBlocks(t), ks));
  // Slot q of chunk ch summed over the rows (0 where the token does not
  // see the chunk or `use` is false).
  auto slotSum = [&](Value ch, Value q, Value use) {
    Value seen = e.andi(use, e.andi(e.le(e.idx(0), ch), e.lt(ch, chunkEnd)));
    return e.ifUnmasked(seen, [&](bool unseen) {
      Value sum = e.f32(0);
      Value base = e.mul(e.add(e.mul(tileIndex, p.cmpChunks),
                               e.max(ch, e.idx(0))),
                         e.idx(16));
      for (int64_t rho = 0; rho < G && !unseen; ++rho) {
        Value lse = e.load(lseS, {e.idx(rho)});
        Value live =
            e.fcmp(arith::CmpFPredicate::UNE, lse, e.f32(-INFINITY));
        Value row = e.add(base, e.idx(rho));
        Value ref = loadWork(e.add(p.refAt, row));
        Value part =
            loadWork(e.add(p.partAt, e.add(e.mul(row, e.idx(slots)), q)));
        Value factor = e.sel(live, e.ex2(e.fsub(ref, lse)), e.f32(0));
        sum = e.fadd(sum, e.fmul(factor, part));
      }
      return SmallVector<Value>{sum};
    })[0];
  };
  e.forEach(tid, here, e.idx(threads), [&](Value local) {
    Value j = e.add(first, local);
    Value ch = e.divs(j, e.idx(perChunk)), q = e.rems(j, e.idx(perChunk));
    Value score = slotSum(ch, q, arith::ConstantIntOp::create(b, loc, 1, 1));
    // A block's first keys in the chunk before (Eq. 9's overlap).
    Value early = e.lt(e.mul(q, e.idx(bsz)), e.idx(a - 1));
    Value prev = slotSum(e.sub(ch, e.idx(1)),
                         e.min(e.add(q, e.idx(perChunk)), e.idx(slots - 1)),
                         early);
    score = e.sel(early, e.fadd(prev, score), score);
    score = rankScore(e, c.backbone, score, e.toI32(j), e.toI32(last));
    e.store(scoreKey(e, score), cand, {local, e.idx(0)});
    e.store(e.toI32(j), cand, {local, e.idx(1)});
  });
  e.barrier();
  // 3. The n first in rank order (blocks differ: no ties), blanks past
  // the block's candidates.
  e.forEach(tid, here, e.idx(threads), [&](Value local) {
    Value key = e.load(cand, {local, e.idx(0)});
    Value block = e.load(cand, {local, e.idx(1)});
    auto ahead = scf::ForOp::create(
        b, loc, e.idx(0), here, e.idx(1), ValueRange{e.i32(0)},
        [&](OpBuilder &, Location, Value u, ValueRange acc) {
          Value k2 = e.load(cand, {u, e.idx(0)});
          Value j2 = e.load(cand, {u, e.idx(1)});
          Value one = e.sel(ranksBefore(e, k2, j2, key, block), e.i32(1),
                            e.i32(0));
          scf::YieldOp::create(b, loc, ValueRange{e.add(acc[0], one)});
        });
    Value r = e.toIndex(ahead.getResult(0));
    e.ifThen(e.lt(r, e.idx(n)), [&] {
      e.store(key, list, {r, e.idx(0)});
      e.store(block, list, {r, e.idx(1)});
    });
  });
  e.forEach(e.add(here, tid), e.idx(n), e.idx(threads), [&](Value i) {
    e.store(e.i32(0), list, {i, e.idx(0)});
    e.store(e.i32(-1), list, {i, e.idx(1)});
  });
  // (The buffers are the branches' again after this.)
  e.barrier();
}

/// A (key, block) pair of i32 at `address` (i32) of the shared::cluster
/// window.
static std::pair<Value, Value> peerLoadPair(Emit &e, Value address) {
  OpBuilder &b = e.b;
  MLIRContext *ctx = b.getContext();
  Type i32 = b.getI32Type();
  Type pair = LLVM::LLVMStructType::getLiteral(ctx, {i32, i32});
  auto op = LLVM::InlineAsmOp::create(
      b, e.loc, TypeRange{pair}, ValueRange{address},
      b.getStringAttr("ld.shared::cluster.v2.b32 {$0, $1}, [$2];"),
      b.getStringAttr("=r,=r,r,~{memory}"), b.getUnitAttr(), UnitAttr(),
      LLVM::TailCallKindAttr::get(ctx, LLVM::tailcallkind::TailCallKind::None),
      LLVM::AsmDialectAttr(), ArrayAttr());
  return {LLVM::ExtractValueOp::create(b, e.loc, op.getResult(0),
                                       ArrayRef<int64_t>{0}),
          LLVM::ExtractValueOp::create(b, e.loc, op.getResult(0),
                                       ArrayRef<int64_t>{1})};
}

Value DecodeBuilder::peerAddress(int64_t offset, Value byteIndex, Value rank) {
  Value local = e.add(sharedAddress(offset), e.toI32(byteIndex));
  return LLVM::InlineAsmOp::create(
             b, loc, TypeRange{b.getI32Type()},
             ValueRange{local, e.toI32(rank)},
             b.getStringAttr("mapa.shared::cluster.u32 $0, $1, $2;"),
             b.getStringAttr("=r,r,r"), UnitAttr(), UnitAttr(),
             LLVM::TailCallKindAttr::get(
                 b.getContext(), LLVM::tailcallkind::TailCallKind::None),
             LLVM::AsmDialectAttr(), ArrayAttr())
      .getResult(0);
}

void DecodeBuilder::gatherChosen(Value tid, Value chosen) {
  // The peers' lists (each in rank order, n entries) into the Q buffer
  // onwards; entry x of list p then ranks after its place in list p and,
  // in each other list q, after the entries before it (equal entries,
  // blanks only: the lower list first), found by a binary search: the
  // union's n first go to `chosen` at their ranks.
  Type i32 = b.getI32Type();
  int64_t n = c.numSelected, lists = c.clusterBlocks;
  int64_t threads = partialThreads(), total = lists * n;
  Value all = view(sharedBytes(), 0, {total, 2}, i32);
  e.forEach(tid, e.idx(total), e.idx(threads), [&](Value i) {
    Value peer = e.divs(i, e.idx(n)), pos = e.rems(i, e.idx(n));
    auto [key, block] = peerLoadPair(
        e, peerAddress(lay.cands, e.mul(pos, e.idx(8)), peer));
    e.store(key, all, {i, e.idx(0)});
    e.store(block, all, {i, e.idx(1)});
  });
  e.barrier();
  int64_t top = 1;
  while (top * 2 <= n)
    top *= 2;
  e.forEach(tid, e.idx(total), e.idx(threads), [&](Value i) {
    Value peer = e.divs(i, e.idx(n)), pos = e.rems(i, e.idx(n));
    Value key = e.load(all, {i, e.idx(0)});
    Value block = e.load(all, {i, e.idx(1)});
    Value rank = pos;
    for (int64_t q = 0; q < lists; ++q) {
      // The entries of list q before (key, block): a prefix of it.
      Value lo = e.idx(0);
      for (int64_t step = top; step > 0; step /= 2) {
        Value at = e.add(lo, e.idx(step - 1));
        Value in = e.lt(at, e.idx(n));
        Value y = e.add(e.idx(q * n), e.min(at, e.idx(n - 1)));
        Value k2 = e.load(all, {y, e.idx(0)});
        Value j2 = e.load(all, {y, e.idx(1)});
        Value tied = e.andi(e.andi(e.eq(k2, key), e.eq(j2, block)),
                            e.lt(e.idx(q), peer));
        Value ahead = e.ori(ranksBefore(e, k2, j2, key, block), tied);
        lo = e.sel(e.andi(in, ahead), e.add(lo, e.idx(step)), lo);
      }
      rank = e.add(rank, e.sel(e.eq(peer, e.idx(q)), e.idx(0), lo));
    }
    e.ifThen(e.lt(rank, e.idx(n)), [&] {
      e.store(e.sel(e.eq(key, e.i32(0)), e.i32(-1), block), chosen, {rank});
    });
  });
  e.barrier();
}

} // namespace mlir::nsa::detail::decode
