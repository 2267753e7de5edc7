//===- FlashDecode.cpp - split-K kernels of a decoding step --------------===//
//
// nsa-flash-attention's kernels for a decoding step (FlashDecode.h): the
// branch ops with `kv_lens` of one nsa.sparse_attention_decode and their
// combine become two launches whose blocks each walk a split of a branch's
// keys, so that a step at B = 1 still fills the GPU.
//
// A split is `cps` chunks of `chunkKeys` keys (cps chosen on the host from
// B, Lmax and the row tiles so that the launches come near targetBlocks
// blocks). A block holds the 16 (token, head) rows of one row tile (one
// token's G heads) as mma.sync fragments and, per chunk:
//   1. takes the chunk's keys (their rows in the caches and whether the
//      token sees them: Spec sections 4, 6, 7 with `t = kv_lens[b] - Tq +
//      j`, section 12),
//   2. stages K and V by cp.async (rows it does not see zero-filled),
//   3. S = Q K^T by mma.sync (a warp per 16 keys), masked, in log2 units,
//      into shared memory,
//   4. the online softmax per row (threads / 16 a row), P in bf16 into shared
//      memory; compressed chunks then write their Eq. 9 partials
//      sum_i w(i, j) exp2(s_i - m) per row and selection block j, with the
//      m they are relative to,
//   5. O += P V by mma.sync (warps split Dv), rescaled by the new max.
// The split's (max, sum) and unnormalized O go to a workspace. The
// selected kernel's blocks first choose their token's blocks from the
// compressed splits and partials (each block all of them: no launch
// between), merge a share of the compressed and window splits while their
// first chunk loads, and the last block of a row tile to finish merges the
// selected splits and gates the rows. On sm_90 a step with few row tiles
// is instead one launch in clusters (`_cluster`, FlashDecode.h), whose
// cluster barriers stand where the launch boundary and the count were.
//
//===----------------------------------------------------------------------===//

#include "FlashDecodeBuilder.h"

#include "NSA/Transforms/TensorCore.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <cmath>
#include <optional>

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

using namespace mlir::nsa::detail::decode;

std::string mlir::nsa::detail::checkDecodeConfig(const DecodeConfig &c) {
  if (c.kvHeads < 1 || c.group < 1 || c.queries < 1)
    return "decode: heads and queries must be positive";
  if (c.qkDim % 16 || c.vDim % 16)
    return "decode: Dqk and Dv must be multiples of 16";
  if (c.chunkKeys != 64 && c.chunkKeys != 128)
    return "decode: chunks of 64 or 128 keys";
  if (c.slcBlock < 16 || c.slcBlock % 16 || c.chunkKeys % c.slcBlock)
    return "decode: selection blocks must be a multiple of 16 keys that "
           "divides the chunk (" +
           std::to_string(c.chunkKeys) + " keys)";
  if (c.cmpStride < 1 || c.cmpBlock % c.cmpStride || c.slcBlock % c.cmpStride ||
      c.chunkKeys % (c.slcBlock / c.cmpStride))
    return "decode: d must divide l and l'";
  if (c.window < 1 || c.numSelected < 1 || c.targetBlocks < 1)
    return "decode: the window, n and the target must be positive";
  // The tournament sorts each lane's share of the warps' n best in
  // registers: its code grows as n squared.
  if (c.numSelected > kDecodeMaxSelected)
    return "decode: the block selection keeps at most " +
           std::to_string(kDecodeMaxSelected) + " blocks on chip, found " +
           std::to_string(c.numSelected);
  if (c.clusterBlocks < 0 || c.clusterBlocks == 1 || c.clusterBlocks > 16)
    return "decode: clusters of 2 to 16 blocks (or 0)";
  if (!PartialLayout(c).perThread)
    return "decode: the block selection's staging of " +
           std::to_string(16 * c.rowTiles()) +
           " rows a chunk does not fit a block's shared memory";
  return "";
}

namespace mlir::nsa::detail::decode {

void DecodeBuilder::plan() {
  int64_t ks = c.chunkKeys;
  p.batch = dim(ops.q, 0);
  p.cacheTokens = dim(ops.k, 1);
  p.cmpRows = dim(ops.kc, 1);
  p.cmpChunks = maxIdx(e.ceilDiv(p.cmpRows, ks), 1);
  Value chunks = e.add(p.cmpChunks, e.idx(winChunks() + slcChunks()));
  Value work = e.mul(e.mul(chunks, p.batch), e.idx(c.tiles()));
  Value perSplit = maxIdx(e.ceilDiv(work, c.targetBlocks), 1);
  p.cmpPer = p.winPer = p.slcPer = perSplit;
  // (With an append that may be folded in, its keys' length: the guard
  // that skips the append launch decides by it too. The step's tokens are
  // within both.)
  p.clustered = decodeTakesCluster(
      b, loc, c, p.batch,
      ops.append.appended > 0 ? dim(ops.kcAppend.input, 1) : p.cacheTokens);
  p.foldedAppends = e.idx(0);
  if (clusters()) {
    // `_cluster`: a cluster's blocks share the compressed chunks, then the
    // selected and window chunks.
    int64_t blocks = c.clusterBlocks;
    if (ops.append.appended > 0)
      p.foldedAppends = e.sel(
          e.andi(p.clustered,
                 foldAppendsCondition(b, loc, c, {ops.kcAppend, ops.vcAppend},
                                      ops.kvLens)),
          e.idx(1), e.idx(0));
    Value late = e.idx(clusterLatePer());
    p.cmpPer =
        e.sel(p.clustered, maxIdx(e.ceilDiv(p.cmpChunks, blocks), 1), perSplit);
    p.winPer = p.slcPer = e.sel(p.clustered, late, perSplit);
  }
  p.cmpSplits = ceilDivV(p.cmpChunks, p.cmpPer);
  p.winSplits = ceilDivV(e.idx(winChunks()), p.winPer);
  p.slcSplits = ceilDivV(e.idx(slcChunks()), p.slcPer);
  p.splits = e.add(e.add(p.cmpSplits, p.winSplits), p.slcSplits);
  // Per (batch row, row tile): the splits' (max, sum) and O of 16 rows, the
  // compressed chunks' reference max and Eq. 9 partials, and the
  // compressed and window results of 16 rows (rounded, before the gates).
  Value tiles = e.mul(p.batch, e.idx(c.tiles()));
  Value perTileSplits = e.mul(tiles, p.splits);
  Value perTileChunks = e.mul(tiles, p.cmpChunks);
  p.statsAt = e.idx(0);
  p.outAt = e.add(p.statsAt, e.mul(perTileSplits, e.idx(16 * 2)));
  p.refAt = e.add(p.outAt, e.mul(perTileSplits, e.idx(16 * c.vDim)));
  p.partAt = e.add(p.refAt, e.mul(perTileChunks, e.idx(16)));
  p.preAt =
      e.add(p.partAt, e.mul(perTileChunks, e.idx(16 * c.slotsPerChunk())));
  Value total = e.add(p.preAt, e.mul(tiles, e.idx(2 * 16 * c.vDim)));
  p.work = memref::AllocOp::create(
      b, loc, MemRefType::get({ShapedType::kDynamic}, b.getF32Type()),
      ValueRange{total});
  p.done = memref::AllocOp::create(
      b, loc, MemRefType::get({ShapedType::kDynamic}, b.getI32Type()),
      ValueRange{tiles});
}

void DecodeBuilder::buildPartialLaunch(const std::string &name, bool selected) {
  OpBuilder::InsertionGuard guard(b);
  Value gridX = selected ? p.slcSplits : e.add(p.cmpSplits, p.winSplits);
  gpu::LaunchOp launch =
      createNamedLaunch(b, loc, {gridX, e.idx(c.tiles()), p.batch},
                        partialThreads(), lay.total, name);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value split = ids.x, y = ids.y, batch = ids.z;
  // The selected launch always follows this one (it waits at its chosen
  // blocks instead).
  waitedAtEntry = false;
  if (!selected) {
    // The selected launch may start at once: it waits for this one's end
    // before it reads anything this one writes, and it can only start
    // once every block of this one has (so it never keeps this one's
    // blocks from the SMs).
    waitAtEntry();
    // The selected kernel's count of finished splits a row tile (it starts
    // after this launch ends).
    Value tid = launch.getThreadIds().x;
    e.ifThen(e.andi(e.eq(split, e.idx(0)), e.eq(tid, e.idx(0))), [&] {
      e.store(e.i32(0), p.done, {e.add(e.mul(batch, e.idx(c.tiles())), y)});
    });
  }
  if (selected) {
    auto [begin, end] = chunkRange(split, p.slcPer, e.idx(slcChunks()));
    attendSplit(DecodeKeys::Selected, batch, y, begin, end,
                e.add(e.add(p.cmpSplits, p.winSplits), split));
    return;
  }
  scf::IfOp::create(
      b, loc, e.lt(split, p.cmpSplits),
      [&](OpBuilder &, Location) {
        auto [begin, end] = chunkRange(split, p.cmpPer, p.cmpChunks);
        attendSplit(DecodeKeys::Compressed, batch, y, begin, end, split);
        scf::YieldOp::create(b, loc);
      },
      [&](OpBuilder &, Location) {
        auto [begin, end] =
            chunkRange(e.sub(split, p.cmpSplits), p.winPer, e.idx(winChunks()));
        attendSplit(DecodeKeys::Window, batch, y, begin, end, split);
        scf::YieldOp::create(b, loc);
      });
}

void DecodeBuilder::clusterBarrier() {
  // Release and acquire at cluster scope (the defaults): what a block of
  // the cluster wrote before it, global memory included, is visible to the
  // others after it. Blocks that exited do not count.
  e.asmStatement("barrier.cluster.arrive;", /*memory=*/true);
  e.asmStatement("barrier.cluster.wait;", /*memory=*/true);
}

void DecodeBuilder::stamp(Stamp which) {
  if (!c.trace || !inCluster)
    return;
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  e.ifThen(e.eq(tid, e.idx(0)), [&] {
    Value now = LLVM::InlineAsmOp::create(
                    b, loc, TypeRange{b.getI64Type()}, ValueRange{},
                    b.getStringAttr("mov.u64 $0, %globaltimer;"),
                    b.getStringAttr("=l"), b.getUnitAttr(), UnitAttr(),
                    LLVM::TailCallKindAttr::get(
                        b.getContext(), LLVM::tailcallkind::TailCallKind::None),
                    LLVM::AsmDialectAttr(), ArrayAttr())
                    .getResult(0);
    e.store(now,
            view(sharedBytes(), lay.stamps, {PartialLayout::kStampCount},
                 b.getI64Type()),
            {e.idx(which)});
  });
}

void DecodeBuilder::printStamps(Value rank) {
  if (!c.trace)
    return;
  // (No block prints before every block of the cluster is done: a print
  // takes microseconds and slows the blocks still running.)
  clusterBarrier();
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value y = gpu::BlockIdOp::create(b, loc, gpu::Dimension::y);
  Value z = gpu::BlockIdOp::create(b, loc, gpu::Dimension::z);
  e.ifThen(
      e.andi(e.eq(tid, e.idx(0)), e.andi(e.eq(y, e.idx(0)), e.eq(z, e.idx(0)))),
      [&] {
        Value stamps = view(sharedBytes(), lay.stamps,
                            {PartialLayout::kStampCount}, b.getI64Type());
        SmallVector<Value> args{e.toI32(rank)};
        std::string format = "NSA_TRACE %d";
        for (int64_t i = 0; i < PartialLayout::kStampCount; ++i) {
          args.push_back(e.load(stamps, {e.idx(i)}));
          format += " %lld";
        }
        gpu::PrintfOp::create(b, loc, b.getStringAttr(format + "\n"), args);
      });
}

void DecodeBuilder::buildClusterLaunch(const std::string &name) {
  // A cluster a row tile; block `rank` of it walks compressed split rank,
  // then selected split rank or window split rank - slcSplits.
  OpBuilder::InsertionGuard guard(b);
  int64_t blocks = c.clusterBlocks;
  gpu::LaunchOp launch =
      createNamedLaunch(b, loc, {e.idx(blocks), e.idx(c.tiles()), p.batch},
                        partialThreads(), lay.total, name, blocks);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value rank = ids.x, y = ids.y, batch = ids.z;
  Value tid = launch.getThreadIds().x;
  inCluster = true;
  waitAtEntry();
  if (c.trace) {
    e.ifThen(e.eq(tid, e.idx(0)), [&] {
      Value stamps = view(sharedBytes(), lay.stamps,
                          {PartialLayout::kStampCount}, b.getI64Type());
      for (int64_t i = 0; i < PartialLayout::kStampCount; ++i)
        e.store(arith::ConstantIntOp::create(b, loc, 0, 64), stamps,
                {e.idx(i)});
    });
    stamp(Start);
  }
  bool push = pushMerge();
  if (push)
    initPushed(rank, tid);
  e.ifThen(e.lt(rank, p.cmpSplits), [&] {
    auto [begin, end] = chunkRange(rank, p.cmpPer, p.cmpChunks);
    attendSplit(DecodeKeys::Compressed, batch, y, begin, end, rank);
  });
  stamp(Compressed);
  clusterBarrier();
  stamp(Barrier);
  // clusterSelect: every block scores its share of the token's blocks;
  // past a second barrier (arrived at here) the selected blocks take the
  // n best of the cluster's, while the window blocks attend before they
  // wait. Otherwise each selected block chooses alone (attendSplit).
  Tile tile = tileOf(y);
  Value tileIndex = e.add(e.mul(batch, e.idx(c.tiles())), y);
  bool shared = c.clusterSelect;
  if (shared) {
    scoreInCluster(batch, tile, positionOf(batch, tile.token), tid, rank);
    e.asmStatement("barrier.cluster.arrive;", /*memory=*/true);
  }
  auto clusterWait = [&] {
    if (shared)
      e.asmStatement("barrier.cluster.wait;", /*memory=*/true);
  };
  Value late = e.sub(rank, p.slcSplits);
  scf::IfOp::create(
      b, loc, e.lt(rank, p.slcSplits),
      [&](OpBuilder &, Location) {
        if (shared) {
          clusterWait();
          Value chosen = view(sharedBytes(), lay.chosen, {c.numSelected},
                              b.getI32Type());
          gatherChosen(tid, chosen);
        }
        chosenReady = shared;
        auto [begin, end] = chunkRange(rank, p.slcPer, e.idx(slcChunks()));
        attendSplit(DecodeKeys::Selected, batch, y, begin, end,
                    e.add(e.add(p.cmpSplits, p.winSplits), rank));
        chosenReady = false;
        scf::YieldOp::create(b, loc);
      },
      [&](OpBuilder &, Location) {
        e.ifThen(e.lt(late, p.winSplits), [&] {
          auto [begin, end] = chunkRange(late, p.winPer, e.idx(winChunks()));
          attendSplit(DecodeKeys::Window, batch, y, begin, end,
                      e.add(p.cmpSplits, late));
        });
        // clusterPush: the late splits pushed their rows to the blocks
        // past them, which merge (FlashDecodePush.cpp); no second barrier.
        if (push)
          e.ifThen(e.le(e.idx(lateSplits()), rank), [&] {
            clusterMergePushed(batch, tile, tileIndex, rank, tid);
          });
        clusterWait();
        scf::YieldOp::create(b, loc);
      });
  if (!push) {
    clusterBarrier();
    clusterMerge(batch, tile, tileIndex, rank, tid);
  }
  stamp(Stored);
  printStamps(rank);
  inCluster = waitedAtEntry = false;
}

void DecodeBuilder::clusterMerge(Value batch, Tile tile, Value tileIndex,
                                 Value rank, Value tid) {
  // The row tile's (row, group of 8 columns) items shared by the cluster's
  // blocks, `per` each (a multiple of 4: a warp's lanes are all in or all
  // out); 8 lanes an item merge each branch's splits, round the results to
  // bf16 as the branch ops' are, gate them (Spec section 8) and store a
  // column each.
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  int64_t threads = partialThreads(), groups = c.vDim / 8;
  int64_t items = 16 * groups;
  int64_t per = alignUp((items + c.clusterBlocks - 1) / c.clusterBlocks, 4);
  int64_t perLane = (c.clusterBlocks + 7) / 8;
  Value k = e.rems(tid, e.idx(8));
  Value winEnd = e.add(p.cmpSplits, p.winSplits);
  e.forEach(
      e.divs(tid, e.idx(8)), e.idx(per), e.idx(threads / 8), [&](Value local) {
        Value item = e.add(e.mul(rank, e.idx(per)), local);
        Value at = e.min(item, e.idx(items - 1));
        Value r = e.divs(at, e.idx(groups));
        Value col = e.mul(e.rems(at, e.idx(groups)), e.idx(8));
        // Every load first (one round of latency): each branch has
        // at most clusterBlocks splits, perLane a lane.
        Value bounds[3][2] = {
            {e.idx(0), p.cmpSplits}, {winEnd, p.splits}, {p.cmpSplits, winEnd}};
        SmallVector<SmallVector<Value>> loaded[3];
        for (int64_t branch = 0; branch < 3; ++branch)
          loaded[branch] = loadSplits(tileIndex, r, col, bounds[branch][0],
                                      bounds[branch][1], k, perLane);
        Value g = e.min(r, e.idx(c.group - 1));
        Value hq = e.add(e.mul(tile.head, e.idx(c.group)), g);
        Value logits[3];
        for (int64_t i = 0; i < 3; ++i)
          logits[i] = e.load(ops.gates, {batch, tile.token, hq, e.idx(i)});
        Value result[3]; // compressed, selected, window
        for (int64_t branch = 0; branch < 3; ++branch) {
          auto [mine, l] = mergeLoaded(loaded[branch], k);
          result[branch] = branchResult(mine[0], l);
        }
        Value gate[3];
        for (int64_t i = 0; i < 3; ++i)
          gate[i] = sigmoid(e, arith::ExtFOp::create(b, loc, f32, logits[i]));
        Value out = e.fadd(
            e.fadd(e.fmul(gate[0], result[0]), e.fmul(gate[1], result[1])),
            e.fmul(gate[2], result[2]));
        e.ifThen(e.andi(e.lt(item, e.idx(items)), e.lt(r, e.idx(c.group))),
                 [&] {
                   e.store(arith::TruncFOp::create(b, loc, bf16, out), ops.out,
                           {batch, tile.token, hq, e.add(col, k)});
                 });
      });
}

std::pair<SmallVector<Value>, Value>
DecodeBuilder::mergeRange(Value tileIndex, Value r, Value col, Value begin,
                          Value end, Value k, int64_t lanes) {
  // Row r's (max, sum, O[col, col + 8)) over splits [begin, end): lane k of
  // `lanes` consecutive lanes (a power of two up to 8) takes every lanes-th
  // split, four a step with their loads independent, and the lanes merge
  // by xor shuffles; every lane gets the (unnormalized) O and the sum.
  constexpr int64_t unroll = 4;
  Type f32 = b.getF32Type();
  auto v2 = VectorType::get({2}, f32), v4 = VectorType::get({4}, f32);
  auto part = [&](Value v, int64_t i) {
    return vector::ExtractOp::create(b, loc, v, ArrayRef<int64_t>{i})
        .getResult();
  };
  Value rowOf = e.mul(tileIndex, p.splits);
  SmallVector<Value> init(10, e.f32(0));
  init[0] = e.f32(-INFINITY);
  auto loop = scf::ForOp::create(
      b, loc, e.add(begin, k), end, e.idx(lanes * unroll), init,
      [&](OpBuilder &, Location, Value s0, ValueRange acc) {
        SmallVector<Value> m, l, o;
        for (int64_t u = 0; u < unroll; ++u) {
          Value at = e.add(s0, e.idx(lanes * u));
          Value valid = e.lt(at, end);
          Value split = e.min(at, e.sub(end, e.idx(1)));
          Value row = e.add(e.mul(e.add(rowOf, split), e.idx(16)), r);
          Value ml = vector::LoadOp::create(
              b, loc, v2, p.work,
              ValueRange{e.add(p.statsAt, e.mul(row, e.idx(2)))}, false,
              b.getI64IntegerAttr(8));
          m.push_back(e.sel(valid, part(ml, 0), e.f32(-INFINITY)));
          l.push_back(part(ml, 1));
          Value at8 = e.add(p.outAt, e.add(e.mul(row, e.idx(c.vDim)), col));
          for (int64_t h = 0; h < 2; ++h) {
            Value q = vector::LoadOp::create(
                b, loc, v4, p.work, ValueRange{e.add(at8, e.idx(4 * h))}, false,
                b.getI64IntegerAttr(16));
            for (int64_t i = 0; i < 4; ++i)
              o.push_back(part(q, i));
          }
        }
        Value mNew = acc[0];
        for (Value x : m)
          mNew = e.fmax(mNew, x);
        Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
        Value rescale = e.ex2(e.fsub(acc[0], mUse));
        SmallVector<Value> next{mNew};
        for (int64_t i = 1; i < 10; ++i)
          next.push_back(e.fmul(acc[i], rescale));
        for (int64_t u = 0; u < unroll; ++u) {
          Value w = e.ex2(e.fsub(m[u], mUse)); // 0 past the end
          next[1] = e.fadd(next[1], e.fmul(w, l[u]));
          for (int64_t i = 0; i < 8; ++i)
            next[2 + i] = e.fadd(next[2 + i], e.fmul(w, o[8 * u + i]));
        }
        scf::YieldOp::create(b, loc, next);
      });
  return mergeLanes(SmallVector<Value>(loop.getResults()), lanes);
}

std::pair<SmallVector<Value>, Value>
DecodeBuilder::mergeLanes(SmallVector<Value> st, int64_t lanes) {
  for (int32_t x = 1; x < lanes; x *= 2) {
    SmallVector<Value> other;
    for (Value v : st)
      other.push_back(e.shuffleXor(v, x));
    Value mNew = e.fmax(st[0], other[0]);
    Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
    Value a = e.ex2(e.fsub(st[0], mUse)), a2 = e.ex2(e.fsub(other[0], mUse));
    st[0] = mNew;
    for (int64_t i = 1; i < 10; ++i)
      st[i] = e.fadd(e.fmul(st[i], a), e.fmul(other[i], a2));
  }
  return {SmallVector<Value>(st.begin() + 2, st.end()), st[1]};
}

SmallVector<Value> DecodeBuilder::loadEntry(Value stats, Value statsAt, Value o,
                                            Value oAt, Value valid) {
  Type f32 = b.getF32Type();
  auto v2 = VectorType::get({2}, f32), v4 = VectorType::get({4}, f32);
  auto part = [&](Value v, int64_t i) {
    return vector::ExtractOp::create(b, loc, v, ArrayRef<int64_t>{i})
        .getResult();
  };
  Value ml = vector::LoadOp::create(b, loc, v2, stats, ValueRange{statsAt},
                                    false, b.getI64IntegerAttr(8));
  SmallVector<Value> st{e.sel(valid, part(ml, 0), e.f32(-INFINITY)),
                        part(ml, 1)};
  for (int64_t h = 0; h < 2; ++h) {
    Value q = vector::LoadOp::create(b, loc, v4, o,
                                     ValueRange{e.add(oAt, e.idx(4 * h))},
                                     false, b.getI64IntegerAttr(16));
    for (int64_t i = 0; i < 4; ++i)
      st.push_back(part(q, i));
  }
  return st;
}

SmallVector<SmallVector<Value>>
DecodeBuilder::loadSplits(Value tileIndex, Value r, Value col, Value begin,
                          Value end, Value k, int64_t perLane) {
  SmallVector<SmallVector<Value>> out;
  for (int64_t u = 0; u < perLane; ++u) {
    Value at = e.add(e.add(begin, k), e.idx(8 * u));
    Value split = e.min(at, e.sub(end, e.idx(1)));
    Value row =
        e.add(e.mul(e.add(e.mul(tileIndex, p.splits), split), e.idx(16)), r);
    out.push_back(loadEntry(
        p.work, e.add(p.statsAt, e.mul(row, e.idx(2))), p.work,
        e.add(p.outAt, e.add(e.mul(row, e.idx(c.vDim)), col)), e.lt(at, end)));
  }
  return out;
}

std::pair<SmallVector<Value>, Value>
DecodeBuilder::mergeLoaded(ArrayRef<SmallVector<Value>> loaded, Value k,
                           int64_t lanes) {
  // The max over the `lanes` lanes' splits first, so that every split is
  // scaled once; then the sum by an xor butterfly and O by a reduce-scatter
  // over the lanes (offsets lanes / 2, ..., 1: a lane keeps the half of its
  // columns whose bit matches its own and adds its partner's), which
  // leaves columns [k 8 / lanes, (k + 1) 8 / lanes) on lane k: for 8 lanes
  // 7 shuffles for O instead of a butterfly's 24 (the merge is short and
  // runs once: its instructions' fetch is most of its time).
  Value mNew = e.f32(-INFINITY);
  for (const SmallVector<Value> &st : loaded)
    mNew = e.fmax(mNew, st[0]);
  for (int32_t x = 1; x < lanes; x *= 2)
    mNew = e.fmax(mNew, e.shuffleXor(mNew, x));
  Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
  SmallVector<Value> acc(9, e.f32(0)); // sum, O[8]
  for (const SmallVector<Value> &st : loaded) {
    Value w = e.ex2(e.fsub(st[0], mUse)); // 0 past the end
    for (int64_t i = 0; i < 9; ++i)
      acc[i] = e.fadd(acc[i], e.fmul(w, st[1 + i]));
  }
  Value l = acc[0];
  for (int32_t x = 1; x < lanes; x *= 2)
    l = e.fadd(l, e.shuffleXor(l, x));
  SmallVector<Value> o(acc.begin() + 1, acc.end());
  int32_t half = 4, bit = static_cast<int32_t>(lanes / 2);
  for (; bit > 0; half /= 2, bit /= 2) {
    Value upper =
        e.cmp(arith::CmpIPredicate::ne, e.andi(k, e.idx(bit)), e.idx(0));
    SmallVector<Value> kept;
    for (int32_t i = 0; i < half; ++i) {
      Value low = o[i], high = o[i + half];
      Value keep = e.sel(upper, high, low), send = e.sel(upper, low, high);
      kept.push_back(e.fadd(keep, e.shuffleXor(send, bit)));
    }
    o = kept;
  }
  return {o, l};
}

void DecodeBuilder::ptx(StringRef text, ValueRange in,
                        StringRef constraints) {
  std::string all = constraints.str();
  all += all.empty() ? "~{memory}" : ",~{memory}";
  LLVM::InlineAsmOp::create(
      b, loc, TypeRange{}, in, b.getStringAttr(text), b.getStringAttr(all),
      b.getUnitAttr(), UnitAttr(),
      LLVM::TailCallKindAttr::get(b.getContext(),
                                  LLVM::tailcallkind::TailCallKind::None),
      LLVM::AsmDialectAttr(), ArrayAttr());
}

Value DecodeBuilder::sharedAddress(int64_t offset) {
  Value base =
      memref::ExtractAlignedPointerAsIndexOp::create(b, loc, sharedBytes());
  return e.toI32(e.add(base, e.idx(offset)));
}

Value DecodeBuilder::branchResult(Value o, Value l) {
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  Value empty = e.fcmp(arith::CmpFPredicate::OLE, l, e.f32(0));
  Value q = e.sel(empty, e.f32(0), arith::DivFOp::create(b, loc, o, l));
  Value rounded = arith::TruncFOp::create(b, loc, bf16, q);
  return arith::ExtFOp::create(b, loc, f32, rounded).getResult();
}

void DecodeBuilder::preMerge(Value tileIndex, Value split, Value tid) {
  // Selected block `split` of the row tile merges the compressed and the
  // window splits of its share of Dv's groups of 8 columns and stores each
  // branch's result, rounded to bf16 as the branch ops' results are: by 8
  // lanes a row where a branch has more than 8 splits (small batches),
  // else a thread a row and group.
  int64_t threads = partialThreads(), groups = c.vDim / 8;
  Value perBlock = ceilDivV(e.idx(groups), p.slcSplits);
  Value gBegin = e.min(e.mul(split, perBlock), e.idx(groups));
  Value gEnd = e.min(e.add(gBegin, perBlock), e.idx(groups));
  Value winEnd = e.add(p.cmpSplits, p.winSplits);
  auto store = [&](Value r, Value col, int64_t branch, Value value) {
    storeWork(
        value,
        e.add(p.preAt, e.add(e.mul(e.add(e.mul(e.add(e.mul(tileIndex, e.idx(2)),
                                                     e.idx(branch)),
                                               e.idx(16)),
                                         r),
                                   e.idx(c.vDim)),
                             col)));
  };
  Value few = e.le(e.max(p.cmpSplits, p.winSplits), e.idx(8));
  scf::IfOp::create(
      b, loc, few,
      [&](OpBuilder &, Location) {
        Value items = e.mul(e.sub(gEnd, gBegin), e.idx(16));
        e.forEach(tid, items, e.idx(threads), [&](Value item) {
          Value r = e.rems(item, e.idx(16));
          Value col = e.mul(e.add(gBegin, e.divs(item, e.idx(16))), e.idx(8));
          for (int64_t branch = 0; branch < 2; ++branch) {
            auto [o, l] =
                mergeRange(tileIndex, r, col, branch ? p.cmpSplits : e.idx(0),
                           branch ? winEnd : p.cmpSplits, e.idx(0),
                           /*lanes=*/1);
            for (int64_t i = 0; i < 8; ++i)
              store(r, e.add(col, e.idx(i)), branch, branchResult(o[i], l));
          }
        });
        scf::YieldOp::create(b, loc);
      },
      [&](OpBuilder &, Location) {
        // 128 threads a group: 16 rows of 8 lanes.
        int64_t halves = threads / 128;
        Value half = e.divs(tid, e.idx(128));
        Value r = e.rems(e.divs(tid, e.idx(8)), e.idx(16));
        Value k = e.rems(tid, e.idx(8));
        e.forEach(e.add(gBegin, half), gEnd, e.idx(halves), [&](Value g) {
          Value col = e.mul(g, e.idx(8));
          for (int64_t branch = 0; branch < 2; ++branch) {
            auto [o, l] =
                mergeRange(tileIndex, r, col, branch ? p.cmpSplits : e.idx(0),
                           branch ? winEnd : p.cmpSplits, k,
                           /*lanes=*/8);
            Value mine = o[0];
            for (int64_t i = 1; i < 8; ++i)
              mine = e.sel(e.eq(k, e.idx(i)), o[i], mine);
            store(r, e.add(col, k), branch, branchResult(mine, l));
          }
        });
        scf::YieldOp::create(b, loc);
      });
}

void DecodeBuilder::finalMerge(Value batch, Tile tile, Value tileIndex,
                               Value tid) {
  // The last selected block of a row tile: per row and group of 8 columns,
  // the selected splits merged and rounded, the compressed and window
  // results of preMerge, gated (Spec section 8) into the output.
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  int64_t threads = partialThreads(), groups = c.vDim / 8;
  Value winEnd = e.add(p.cmpSplits, p.winSplits);
  e.forEach(tid, e.idx(16 * groups), e.idx(threads), [&](Value item) {
    Value r = e.divs(item, e.idx(groups));
    Value col = e.mul(e.rems(item, e.idx(groups)), e.idx(8));
    Value g = e.add(e.mul(tile.sub, e.idx(16)), r);
    e.ifThen(e.lt(g, e.idx(c.group)), [&] {
      auto [o, l] = mergeRange(tileIndex, r, col, winEnd, p.splits, e.idx(0),
                               /*lanes=*/1);
      Value hq = e.add(e.mul(tile.head, e.idx(c.group)), g);
      Value gate[3];
      for (int64_t i = 0; i < 3; ++i)
        gate[i] = sigmoid(
            e, arith::ExtFOp::create(
                   b, loc, f32,
                   e.load(ops.gates, {batch, tile.token, hq, e.idx(i)})));
      // The compressed (0) and window (1) results' 8 columns.
      SmallVector<Value> pre[2];
      auto v4 = VectorType::get({4}, f32);
      for (int64_t branch = 0; branch < 2; ++branch)
        for (int64_t h = 0; h < 2; ++h) {
          Value at = e.add(
              p.preAt, e.add(e.mul(e.add(e.mul(e.add(e.mul(tileIndex, e.idx(2)),
                                                     e.idx(branch)),
                                               e.idx(16)),
                                         r),
                                   e.idx(c.vDim)),
                             e.add(col, e.idx(4 * h))));
          Value q = vector::LoadOp::create(b, loc, v4, p.work, ValueRange{at},
                                           false, b.getI64IntegerAttr(16));
          for (int64_t i = 0; i < 4; ++i)
            pre[branch].push_back(
                vector::ExtractOp::create(b, loc, q, ArrayRef<int64_t>{i}));
        }
      SmallVector<Value> outs;
      for (int64_t i = 0; i < 8; ++i) {
        Value slc = branchResult(o[i], l);
        Value out =
            e.fadd(e.fadd(e.fmul(gate[0], pre[0][i]), e.fmul(gate[1], slc)),
                   e.fmul(gate[2], pre[1][i]));
        outs.push_back(arith::TruncFOp::create(b, loc, bf16, out));
      }
      auto v8 = VectorType::get({8}, bf16);
      Value packed = vector::FromElementsOp::create(b, loc, v8, outs);
      vector::StoreOp::create(b, loc, packed, ops.out,
                              ValueRange{batch, tile.token, hq, col},
                              /*nontemporal=*/false, llvm::MaybeAlign(16));
    });
  });
}

} // namespace mlir::nsa::detail::decode

void mlir::nsa::detail::buildDecodeKernels(OpBuilder &b, Location loc,
                                           const DecodeConfig &config,
                                           const DecodeOperands &operands,
                                           StringRef kernelName) {
  decode::DecodeBuilder(b, loc, config, operands).build(kernelName);
}
