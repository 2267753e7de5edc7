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

void DecodeBuilder::attendSplit(DecodeKeys keys, Value batch, Value y,
                                Value chunkBegin, Value chunkEnd,
                                Value outSplit) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i32 = b.getI32Type();
  int64_t ks = c.chunkKeys, G = c.group, kThreads = partialThreads();
  int64_t rowLanes = kThreads / 16;
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value warp = e.divs(tid, e.idx(32)), lane = e.rems(tid, e.idx(32));
  LaneFragments f = laneFragments(e, lane);
  Value shared = sharedBytes();
  Value qS = view(shared, lay.q, {16, lay.qStride}, bf16);
  Value kS = view(shared, lay.k, {ks, lay.kStride}, bf16);
  Value vS = view(shared, lay.v, {ks, lay.vStride}, bf16);
  Value pS = view(shared, lay.p, {16, lay.pStride}, bf16);
  Value sS = view(shared, lay.s, {16, lay.sStride}, f32);
  Value stats = view(shared, lay.stats, {3, 16}, f32); // max, sum, alpha
  Value chosen = view(shared, lay.chosen, {c.numSelected}, i32);

  Tile tile = tileOf(y);
  Value t = positionOf(batch, tile.token);
  Value headBase =
      e.add(e.mul(tile.head, e.idx(G)), e.mul(tile.sub, e.idx(16)));
  Value headsHere = e.sub(e.idx(G), e.mul(tile.sub, e.idx(16)));
  // (Row r of the tile is query head headBase + r where r < headsHere.)
  Value tileIndex = e.add(e.mul(batch, e.idx(c.tiles())), y);

  // Q: shared memory, then fragments (the tile's rows are one token's).
  copyRowsAsync(
      e, tid, kThreads, batch, qS, 16, c.qkDim, ops.q,
      [&](Value r) {
        return std::make_pair(tile.token,
                              e.min(e.add(headBase, r), e.idx(qHeads() - 1)));
      },
      [&](Value r) { return e.lt(r, headsHere); });
  Value qToken = nvgpu::DeviceAsyncCreateGroupOp::create(
      b, loc, nvgpu::DeviceAsyncTokenType::get(b.getContext()), ValueRange{});
  // K and V come by bulk copies (the split-K launches), a row a thread, on
  // an mbarrier each (a phase a chunk; its arrivals: the warps that issue
  // them), or by cp.async (`_cluster`: at one block an SM the bulk copies'
  // issue is slower).
  bool noBulk = inCluster;
  Value kBar = sharedAddress(lay.bars), vBar = sharedAddress(lay.bars + 8);
  int64_t issuers = ks / 32;
  if (!noBulk) {
    e.ifThen(e.eq(tid, e.idx(0)), [&] {
      for (Value bar : {kBar, vBar})
        ptx("mbarrier.init.shared::cta.b64 [$0], " + std::to_string(issuers) +
                ";",
            bar, "r");
      ptx("fence.mbarrier_init.release.cluster;", {}, "");
    });
    e.barrier();
  }
  e.ifThen(e.lt(tid, e.idx(16)), [&] {
    e.store(e.f32(-INFINITY), stats, {e.idx(0), tid});
    e.store(e.f32(0), stats, {e.idx(1), tid});
  });

  // `_selected`'s chosen blocks come from the partial launch's splits and
  // chunk partials. (`_partial` and `_cluster` waited at their entry.)
  if (keys == DecodeKeys::Selected)
    waitForPredecessor();
  if (keys == DecodeKeys::Selected && !chosenReady)
    chooseBlocks(batch, tile, t, tid, chosen);

  double scale = keys == DecodeKeys::Compressed ? c.cmpScale
                 : keys == DecodeKeys::Window   ? c.winScale
                                                : c.slcScale;
  Value scaleLog2 = e.f32(scale * M_LOG2E);
  Value cacheRows = keys == DecodeKeys::Compressed ? p.cmpRows : p.cacheTokens;
  Value kSrc = keys == DecodeKeys::Compressed ? ops.kc : ops.k;
  Value vSrc = keys == DecodeKeys::Compressed ? ops.vc : ops.v;
  Value visible = visibleBlocks(t);
  // Warps split the keys of a chunk in groups of 16 (S) and Dv in groups of
  // 16 columns (O), `kGroups` and `vGroups` a warp.
  int64_t warps = kThreads / 32;
  int64_t kGroups = ks / 16 / warps;
  int64_t vGroupsAll = c.vDim / 16;
  int64_t vGroups = (vGroupsAll + warps - 1) / warps;
  auto vGroupOf = [&](int64_t i) {
    return e.min(e.add(warp, e.idx(warps * i)), e.idx(vGroupsAll - 1));
  };
  // 1. Key kk of a chunk: its row and whether the token sees it (computed
  // where used: a list in shared memory costs a barrier and a dependent
  // load a row).
  auto keyOf = [&](Value chunk, Value kk) {
    Value row, seen;
    switch (keys) {
    case DecodeKeys::Compressed:
      row = e.add(e.mul(chunk, e.idx(ks)), kk);
      seen = e.lt(row, visible);
      break;
    case DecodeKeys::Window:
      row = e.add(e.sub(t, e.idx(c.window - 1)),
                  e.add(e.mul(chunk, e.idx(ks)), kk));
      seen = e.andi(e.le(e.idx(0), row), e.le(row, t));
      seen = e.andi(seen, e.lt(e.sub(t, row), e.idx(c.window)));
      break;
    case DecodeKeys::Selected: {
      Value slot = e.add(e.mul(chunk, e.idx(ks / c.slcBlock)),
                         e.divs(kk, e.idx(c.slcBlock)));
      Value inRange = e.lt(slot, e.idx(c.numSelected));
      Value blk =
          e.toIndex(e.load(chosen, {e.min(slot, e.idx(c.numSelected - 1))}));
      row = e.add(e.mul(blk, e.idx(c.slcBlock)), e.rems(kk, e.idx(c.slcBlock)));
      seen = e.andi(inRange, e.le(e.idx(0), blk));
      seen = e.andi(seen, e.le(row, t));
      break;
    }
    }
    seen = e.andi(seen, e.andi(e.le(e.idx(0), row), e.lt(row, cacheRows)));
    return std::make_pair(e.sel(seen, row, e.idx(0)), seen);
  };
  // 2. K or V of a chunk. By cp.async (unseen rows zero-filled): a
  // thread copies one 16-byte piece of a row a step, rowsPerStep rows a
  // step, unrolled (each row's key found once, the steps independent). By
  // bulk copies: thread r < ks copies row r (its warp's lane 0 first tells
  // the mbarrier the warp's bytes); unseen rows are not copied, and V's are
  // zeroed (P is 0 there, and 0 times stale shared memory may be NaN).
  auto rowsOf = [&](Value src) {
    auto meta = memref::ExtractStridedMetadataOp::create(b, loc, src);
    Value base = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, src);
    auto strides = meta.getStrides();
    base = e.add(base, e.mul(e.add(meta.getOffset(),
                                   e.mul(batch, strides[0])),
                             e.idx(2)));
    Value headAt = e.mul(tile.head, strides[2]);
    return [=, this](Value row) {
      Value at = e.add(base, e.mul(e.add(e.mul(row, strides[1]), headAt),
                                   e.idx(2)));
      return arith::IndexCastOp::create(b, loc, b.getI64Type(), at)
          .getResult();
    };
  };
  auto kRow = rowsOf(kSrc), vRow = rowsOf(vSrc);
  Value laneI32 = e.toI32(lane);
  auto issue = [&](Value chunk, bool values) {
    if (noBulk) {
      int64_t pieces = (values ? c.vDim : c.qkDim) / 8;
      Value dst = values ? vS : kS, src = values ? vSrc : kSrc;
      Type tokenType = nvgpu::DeviceAsyncTokenType::get(b.getContext());
      // 8 threads a row where the row's pieces split evenly among them: a
      // row's key found once for its pieces, which a thread issues at
      // consecutive addresses (and 8 lanes cover 128 contiguous bytes).
      // Else a row's pieces over as many threads.
      int64_t group = 8;
      if (pieces % group == 0 && kThreads % group == 0 && pieces > group) {
        int64_t each = pieces / group, rowsPerStep = kThreads / group;
        Value row0 = e.divs(tid, e.idx(group));
        Value piece0 = e.rems(tid, e.idx(group));
        for (int64_t k = 0; k * rowsPerStep < ks; ++k) {
          Value r = e.add(row0, e.idx(k * rowsPerStep));
          auto copies = [&] {
            auto [row, seen] = keyOf(chunk, r);
            Value size = e.sel(seen, e.idx(8), e.idx(0));
            for (int64_t j = 0; j < each; ++j) {
              Value col = e.mul(e.add(piece0, e.idx(group * j)), e.idx(8));
              nvgpu::DeviceAsyncCopyOp::create(
                  b, loc, tokenType, dst, ValueRange{r, col}, src,
                  ValueRange{batch, row, tile.head, col}, b.getIndexAttr(8),
                  size, b.getUnitAttr());
            }
          };
          if ((k + 1) * rowsPerStep <= ks)
            copies();
          else
            e.ifThen(e.lt(r, e.idx(ks)), copies);
        }
        return;
      }
      int64_t perRow = std::min(pieces, kThreads);
      int64_t rowsPerStep = kThreads / perRow;
      Value row0 = e.divs(tid, e.idx(perRow));
      Value piece0 = e.rems(tid, e.idx(perRow));
      for (int64_t p0 = 0; p0 < pieces; p0 += perRow) {
        Value col = e.mul(e.add(piece0, e.idx(p0)), e.idx(8));
        Value active = e.lt(tid, e.idx(rowsPerStep * perRow));
        if (p0 + perRow > pieces)
          active = e.andi(active, e.lt(col, e.idx(pieces * 8)));
        e.ifThen(active, [&] {
          for (int64_t k = 0; k * rowsPerStep < ks; ++k) {
            Value r = e.add(row0, e.idx(k * rowsPerStep));
            auto copy = [&] {
              auto [row, seen] = keyOf(chunk, r);
              nvgpu::DeviceAsyncCopyOp::create(
                  b, loc, tokenType, dst, ValueRange{r, col}, src,
                  ValueRange{batch, row, tile.head, col}, b.getIndexAttr(8),
                  e.sel(seen, e.idx(8), e.idx(0)), b.getUnitAttr());
            };
            if ((k + 1) * rowsPerStep <= ks)
              copy();
            else
              e.ifThen(e.lt(r, e.idx(ks)), copy);
          }
        });
      }
      return;
    }
    int64_t rowBytes = (values ? c.vDim : c.qkDim) * 2;
    int64_t dstAt = values ? lay.v : lay.k;
    int64_t stride = (values ? lay.vStride : lay.kStride) * 2;
    Value bar = values ? vBar : kBar;
    e.ifThen(e.lt(tid, e.idx(ks)), [&] {
      auto [row, seen] = keyOf(chunk, tid);
      Value dst =
          e.add(sharedAddress(dstAt), e.toI32(e.mul(tid, e.idx(stride))));
      Value src = values ? vRow(row) : kRow(row);
      std::string bytes = std::to_string(rowBytes);
      ptx("{\n\t.reg .pred seen, first;\n\t.reg .b32 mask, tx;\n\t"
          "setp.ne.u32 seen, $0, 0;\n\t"
          "vote.sync.ballot.b32 mask, seen, -1;\n\t"
          "popc.b32 tx, mask;\n\t"
          "mul.lo.u32 tx, tx, " +
              bytes +
              ";\n\t"
              "setp.eq.u32 first, $1, 0;\n\t"
              "@first mbarrier.arrive.expect_tx.shared::cta.b64 _, [$2], "
              "tx;\n\t"
              "bar.warp.sync -1;\n\t"
              "@seen fence.proxy.async.shared::cta;\n\t"
              "@seen cp.async.bulk.shared::cluster.global.mbarrier::"
              "complete_tx::bytes [$3], [$4], " +
              bytes + ", [$2];\n\t}",
          {arith::ExtUIOp::create(b, loc, b.getI32Type(), seen), laneI32, bar,
           dst, src},
          "r,r,r,r,l");
      if (values)
        e.ifThen(e.eq(seen, arith::ConstantIntOp::create(b, loc, 0, 1)), [&] {
          Value zero = arith::ConstantOp::create(
              b, loc,
              DenseElementsAttr::get(VectorType::get({8}, bf16),
                                     b.getZeroAttr(bf16)));
          for (int64_t col = 0; col < c.vDim; col += 8)
            vector::StoreOp::create(b, loc, zero, vS,
                                    ValueRange{tid, e.idx(col)}, false,
                                    llvm::MaybeAlign(16));
        });
    });
  };
  // cp.async: the copies issued since the last commit as one group, also
  // where there were none (chunk with no next, empty split), so that a
  // wait for all groups but the newest always leaves just the one after.
  auto commit = [&] {
    if (noBulk)
      nvgpu::DeviceAsyncCreateGroupOp::create(
          b, loc, nvgpu::DeviceAsyncTokenType::get(b.getContext()),
          ValueRange{});
  };
  // Waits for chunk `chunk`'s K or V (every thread), then the block (V's
  // zeroed rows); cp.async: all groups but the newest.
  auto waitRows = [&](Value chunk, bool values) {
    if (noBulk) {
      nvgpu::DeviceAsyncWaitOp::create(b, loc, qToken,
                                       b.getI32IntegerAttr(1));
      e.barrier();
      return;
    }
    Value parity = e.toI32(e.rems(e.sub(chunk, chunkBegin), e.idx(2)));
    ptx("{\n\t.reg .pred done;\n\twait:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\n\t"
        "@!done bra wait;\n\t}",
        {values ? vBar : kBar, parity}, "r,r");
    e.barrier();
  };
  // The first chunk's K and V; each iteration then loads the next chunk's
  // K while this one's softmax and P V run, and its V while the next S
  // runs (one buffer each).
  e.ifThen(e.lt(chunkBegin, chunkEnd), [&] { issue(chunkBegin, false); });
  commit();
  e.ifThen(e.lt(chunkBegin, chunkEnd), [&] { issue(chunkBegin, true); });
  commit();
  if (keys != DecodeKeys::Compressed)
    stamp(Issued);
  // The appends folded in: the new compressed row pooled while they come.
  std::optional<PooledRow> pooled;
  if (keys == DecodeKeys::Compressed && inCluster && ops.append.appended > 0)
    pooled = poolAppended(batch, tile, tid, chunkBegin, chunkEnd);
  // While the first chunk comes: this block's columns of the compressed and
  // window results (the partial launch's splits merged).
  if (keys == DecodeKeys::Selected && !inCluster)
    preMerge(tileIndex, e.sub(outSplit, e.add(p.cmpSplits, p.winSplits)), tid);
  // Q (in flight with K and V): fragments.
  nvgpu::DeviceAsyncWaitOp::create(b, loc, qToken,
                                   b.getI32IntegerAttr(noBulk ? 2 : 0));
  e.barrier();
  SmallVector<SmallVector<Value, 4>> qFrags;
  for (int64_t kk = 0; kk < c.qkDim / 16; ++kk) {
    Value loaded = nvgpu::LdMatrixOp::create(
        b, loc, VectorType::get({4, 2}, bf16), qS,
        ValueRange{f.row16, e.add(e.idx(16 * kk), f.half8)}, false, 4);
    qFrags.push_back(unpackLdMatrix(b, loc, loaded, 0, 4));
  }
  SmallVector<Value> init(vGroups * 8, e.f32(0));
  auto loop = scf::ForOp::create(
      b, loc, chunkBegin, chunkEnd, e.idx(1), init,
      [&](OpBuilder &, Location, Value chunk, ValueRange accIn) {
        SmallVector<Value> acc(accIn);
        Value next = e.add(chunk, e.idx(1));
        Value hasNext = e.lt(next, chunkEnd);
        waitRows(chunk, false); // this chunk's K (its V may still come)
        if (pooled)
          placeAppended(*pooled, chunk, /*values=*/false, kS, tid);
        // 3. S = Q K^T, a warp per 16 keys, masked, in log2 units.
        for (int64_t g = 0; g < kGroups; ++g) {
          Value key0 = e.mul(e.add(warp, e.idx(warps * g)), e.idx(16));
          SmallVector<SmallVector<Value, 4>> s(
              2, SmallVector<Value, 4>(4, e.f32(0)));
          for (int64_t kk = 0; kk < c.qkDim / 16; ++kk) {
            Value loaded = nvgpu::LdMatrixOp::create(
                b, loc, VectorType::get({4, 2}, bf16), kS,
                ValueRange{e.add(e.add(key0, f.row8), f.half8),
                           e.add(e.idx(16 * kk), f.k8)},
                false, 4);
            for (int64_t n = 0; n < 2; ++n)
              s[n] = mmaBF16(b, loc, qFrags[kk],
                             unpackLdMatrix(b, loc, loaded, 2 * n, 2), s[n]);
          }
          for (int64_t n = 0; n < 2; ++n)
            for (int64_t i = 0; i < 4; ++i) {
              Value key = e.add(e.add(key0, e.idx(8 * n + i % 2)), f.pair);
              Value row = i < 2 ? f.group4 : e.add(f.group4, e.idx(8));
              Value seen = keyOf(chunk, key).second;
              e.store(e.sel(seen, e.fmul(s[n][i], scaleLog2), e.f32(-INFINITY)),
                      sS, {row, key});
            }
        }
        // The next chunk's K into the buffer S is done with.
        e.barrier();
        e.ifThen(hasNext, [&] { issue(next, false); });
        commit();
        // 4. The online softmax: threads / 16 a row, 8 consecutive keys a
        // thread (16-byte shared loads and stores).
        constexpr int64_t per = 8;
        static_assert(per % 4 == 0, "two 16-byte loads a thread");
        Value row = e.divs(tid, e.idx(rowLanes));
        Value part = e.rems(tid, e.idx(rowLanes));
        Value first = e.mul(part, e.idx(per));
        Value mOld = e.load(stats, {e.idx(0), row});
        Value lOld = e.load(stats, {e.idx(1), row});
        auto v4 = VectorType::get({4}, f32);
        SmallVector<Value> sv;
        for (int64_t i = 0; i < per; i += 4) {
          Value q = vector::LoadOp::create(
              b, loc, v4, sS, ValueRange{row, e.add(first, e.idx(i))}, false,
              b.getI64IntegerAttr(16));
          for (int64_t j = 0; j < 4; ++j)
            sv.push_back(
                vector::ExtractOp::create(b, loc, q, ArrayRef<int64_t>{j}));
        }
        Value cm = e.f32(-INFINITY);
        for (Value x : sv)
          cm = e.fmax(cm, x);
        for (int32_t o = 1; o < rowLanes; o *= 2)
          cm = e.fmax(cm, e.shuffleXor(cm, o));
        Value mNew = e.fmax(mOld, cm);
        Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
        Value sum = e.f32(0);
        SmallVector<Value> pvs, pbf;
        for (Value x : sv) {
          Value pv = e.ex2(e.fsub(x, mUse));
          sum = e.fadd(sum, pv);
          pvs.push_back(pv);
          pbf.push_back(arith::TruncFOp::create(b, loc, bf16, pv));
        }
        vector::StoreOp::create(b, loc,
                                vector::FromElementsOp::create(
                                    b, loc, VectorType::get({per}, bf16), pbf),
                                pS, ValueRange{row, first}, false,
                                llvm::MaybeAlign(16));
        // Eq. 9 partials (compressed chunks): block j of slot q takes key
        // i = q bsz - a + 1 + o (a = l/d, bsz = l'/d) with weight
        // min(o + 1, bsz) - max(o - a + 1, 0), where that key is in the
        // chunk. From the registers where a thread's keys hold its slots'
        // keys but for the a - 1 before (the lanes before it: shuffles),
        // else from S in shared memory.
        int64_t a = subPerCmp(), bsz = subPerSlc(), slots = c.slotsPerChunk();
        auto partBaseOf = [&](Value ch) {
          return e.add(p.partAt,
                       e.mul(e.add(e.mul(tileIndex, p.cmpChunks), ch),
                             e.idx(16 * slots)));
        };
        bool inRegisters = per % bsz == 0 && a - 1 <= per;
        if (keys == DecodeKeys::Compressed && !inRegisters)
          for (int64_t i = 0; i < per; ++i)
            e.store(pvs[i], sS, {row, e.add(first, e.idx(i))});
        for (int32_t o = 1; o < rowLanes; o *= 2)
          sum = e.fadd(sum, e.shuffleXor(sum, o));
        Value alpha = e.ex2(e.fsub(mOld, mUse));
        e.ifThen(e.eq(part, e.idx(0)), [&] {
          e.store(mNew, stats, {e.idx(0), row});
          e.store(e.fadd(e.fmul(lOld, alpha), sum), stats, {e.idx(1), row});
          e.store(alpha, stats, {e.idx(2), row});
          if (keys == DecodeKeys::Compressed)
            storeWork(
                mUse,
                e.add(p.refAt,
                      e.add(e.mul(e.add(e.mul(tileIndex, p.cmpChunks), chunk),
                                  e.idx(16)),
                            row)));
        });
        // Slot q's partial of the row `r`.
        auto storePart = [&](Value v, Value r, Value q) {
          storeWork(v, e.add(partBaseOf(chunk),
                             e.add(e.mul(r, e.idx(slots)), q)));
        };
        auto weight = [&](int64_t o) {
          return std::min(o + 1, bsz) - std::max<int64_t>(o - a + 1, 0);
        };
        if (keys == DecodeKeys::Compressed && inRegisters) {
          // before[j]: key first - 1 - j (the previous lane's), 0 at the
          // row's first lane (no such key in the chunk).
          SmallVector<Value> before;
          for (int64_t j = 0; j < a - 1; ++j) {
            Value up = gpu::ShuffleOp::create(b, loc, pvs[per - 1 - j], 1, 32,
                                              gpu::ShuffleMode::UP)
                           .getShuffleResult();
            before.push_back(e.sel(e.eq(part, e.idx(0)), e.f32(0), up));
          }
          // Key first + idx, -(a - 1) <= idx; 0 past the chunk's end.
          auto keyAt = [&](int64_t idx) -> Value {
            if (idx < 0)
              return before[-idx - 1];
            return idx < per ? pvs[idx] : Value();
          };
          auto slotSum = [&](int64_t start) {
            Value acc = e.f32(0);
            for (int64_t o = 0; o < bsz + a - 1; ++o)
              if (Value pv = keyAt(start - a + 1 + o))
                acc = e.fadd(acc, e.fmul(pv, e.f32(weight(o))));
            return acc;
          };
          Value q0 = e.divs(first, e.idx(bsz));
          for (int64_t t = 0; t < per / bsz; ++t)
            storePart(slotSum(t * bsz), row, e.add(q0, e.idx(t)));
          // The slots past ks / bsz (their keys start in this chunk's last
          // a - 1 keys): the row's last lane.
          e.ifThen(e.eq(part, e.idx(rowLanes - 1)), [&] {
            for (int64_t q = ks / bsz; q < slots; ++q)
              storePart(slotSum(q * bsz - (ks - per)), row, e.idx(q));
          });
        }
        if (keys == DecodeKeys::Compressed && !inRegisters) {
          e.barrier();
          e.forEach(tid, e.idx(16 * slots), e.idx(kThreads), [&](Value item) {
            Value r = e.divs(item, e.idx(slots)),
                  q = e.rems(item, e.idx(slots));
            Value acc = e.f32(0);
            for (int64_t o = 0; o < bsz + a - 1; ++o) {
              Value local = e.add(e.mul(q, e.idx(bsz)), e.idx(o - a + 1));
              Value in = e.andi(e.le(e.idx(0), local), e.lt(local, e.idx(ks)));
              Value pv =
                  e.load(sS, {r, e.min(e.max(local, e.idx(0)), e.idx(ks - 1))});
              acc = e.fadd(acc,
                           e.sel(in, e.fmul(pv, e.f32(weight(o))), e.f32(0)));
            }
            storePart(acc, r, q);
          });
        }
        waitRows(chunk, true); // this chunk's V (the next K may still come)
        if (pooled)
          placeAppended(*pooled, chunk, /*values=*/true, vS, tid);
        // 5. O = alpha O + P V; warps split Dv.
        Value alphaA = e.load(stats, {e.idx(2), f.group4});
        Value alphaB = e.load(stats, {e.idx(2), e.add(f.group4, e.idx(8))});
        for (int64_t i = 0; i < vGroups * 8; ++i)
          acc[i] = e.fmul(acc[i], (i % 4) < 2 ? alphaA : alphaB);
        for (int64_t kk = 0; kk < ks / 16; ++kk) {
          Value pLoaded = nvgpu::LdMatrixOp::create(
              b, loc, VectorType::get({4, 2}, bf16), pS,
              ValueRange{f.row16, e.add(e.idx(16 * kk), f.half8)}, false, 4);
          SmallVector<Value, 4> pFrag = unpackLdMatrix(b, loc, pLoaded, 0, 4);
          for (int64_t i = 0; i < vGroups; ++i) {
            Value vLoaded = nvgpu::LdMatrixOp::create(
                b, loc, VectorType::get({4, 2}, bf16), vS,
                ValueRange{e.add(e.idx(16 * kk), f.row16),
                           e.add(e.mul(vGroupOf(i), e.idx(16)), f.half8)},
                true, 4);
            for (int64_t n = 0; n < 2; ++n) {
              SmallVector<Value> cIn(acc.begin() + 8 * i + 4 * n,
                                     acc.begin() + 8 * i + 4 * n + 4);
              SmallVector<Value, 4> d =
                  mmaBF16(b, loc, pFrag,
                          unpackLdMatrix(b, loc, vLoaded, 2 * n, 2), cIn);
              std::copy(d.begin(), d.end(), acc.begin() + 8 * i + 4 * n);
            }
          }
        }
        // The next chunk's V into the buffer P V is done with.
        e.barrier();
        e.ifThen(hasNext, [&] { issue(next, true); });
        commit();
        scf::YieldOp::create(b, loc, acc);
      });

  // The split's (max, sum) and unnormalized O.
  if (keys == DecodeKeys::Selected && !inCluster)
    releaseSuccessor();
  Value splitIndex = e.add(e.mul(tileIndex, p.splits), outSplit);
  e.barrier();
  // (Every phase waited for: the mbarriers may be initialized again.)
  if (!noBulk)
    e.ifThen(e.eq(tid, e.idx(0)), [&] {
      for (Value bar : {kBar, vBar})
        ptx("mbarrier.inval.shared::cta.b64 [$0];", bar, "r");
    });
  bool late = keys != DecodeKeys::Compressed;
  if (late)
    stamp(Attended);
  if (inCluster && late && pushMerge()) {
    pushSplit(e.sub(outSplit, p.cmpSplits), stats,
              SmallVector<Value>(loop.getResults()), warp, tid, vGroups);
    stamp(Pushed);
    return;
  }
  e.ifThen(e.lt(tid, e.idx(16)), [&] {
    Value at = e.add(p.statsAt,
                     e.mul(e.add(e.mul(splitIndex, e.idx(16)), tid), e.idx(2)));
    storeWork(e.load(stats, {e.idx(0), tid}), at);
    storeWork(e.load(stats, {e.idx(1), tid}), e.add(at, e.idx(1)));
  });
  Value outBase = e.add(p.outAt, e.mul(splitIndex, e.idx(16 * c.vDim)));
  for (int64_t i = 0; i < vGroups; ++i) {
    Value owned = e.lt(e.add(warp, e.idx(warps * i)), e.idx(vGroupsAll));
    e.ifThen(owned, [&] {
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t k = 0; k < 4; ++k) {
          Value row = k < 2 ? f.group4 : e.add(f.group4, e.idx(8));
          Value col =
              e.add(e.add(e.mul(vGroupOf(i), e.idx(16)), e.idx(8 * n + k % 2)),
                    f.pair);
          storeWork(loop.getResult(8 * i + 4 * n + k),
                    e.add(outBase, e.add(e.mul(row, e.idx(c.vDim)), col)));
        }
    });
  }
  if (keys != DecodeKeys::Selected || inCluster)
    return;
  // The row tile's last selected block to finish (its count of finished
  // splits, made visible to it by the fences) merges the splits and gates
  // the rows.
  auto fence = [&] { e.asmStatement("fence.acq_rel.gpu;", /*memory=*/true); };
  Value flag = view(shared, lay.flag, {1}, i32);
  fence();
  e.barrier();
  e.ifThen(e.eq(tid, e.idx(0)), [&] {
    Value before =
        memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi,
                                    e.i32(1), p.done, ValueRange{tileIndex});
    Value last = e.eq(before, e.toI32(e.sub(p.slcSplits, e.idx(1))));
    e.store(e.sel(last, e.i32(1), e.i32(0)), flag, {e.idx(0)});
  });
  e.barrier();
  e.ifThen(e.eq(e.load(flag, {e.idx(0)}), e.i32(1)), [&] {
    fence();
    finalMerge(batch, tile, tileIndex, tid);
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
