//===- FlashKernelSM90.cpp - the flash kernels' sm_90a parts -------------===//
//
// The parts of FlashBuilder that use Hopper's asynchronous units (sm90):
// key tiles by TMA into an mbarrier ring (tensor maps made on the host),
// Q copied into the 128-byte-swizzled layout, S and P V by wgmma, and the
// pipelined key-tile loop. docs/Pipeline.md section 6.
//
//===----------------------------------------------------------------------===//

#include "FlashBuilder.h"

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

void FlashBuilder::copyRowsSwizzled(
    Value offset, int64_t rows, int64_t cols, Value src,
    function_ref<std::pair<Value, Value>(Value r)> rowHead,
    function_ref<Value(Value r)> valid) {
  copyRowsSwizzledAsync(e, tid, c.warps() * 32, batch, sharedBase, offset,
                        rows, cols, src, rowHead, valid);
}

void FlashBuilder::tmaLoads(Value bars, Value stage, Value key, bool value) {
  auto space = gpu::AddressSpaceAttr::get(
      b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  auto boxType = MemRefType::get({1, c.keyTile, 1, 64}, b.getBF16Type(),
                                 AffineMap(), space);
  int64_t boxBytes = c.keyTile * kSwizzleRowBytes;
  for (int64_t blk = 0; blk < (value ? c.vDim : c.qkDim) / 64; ++blk) {
    Value dst = memref::ViewOp::create(
        b, loc, boxType, sharedBase,
        e.add(stageOffset(stage, value), e.idx(blk * boxBytes)), ValueRange{});
    // Coordinates innermost first: column, head, key, batch.
    nvgpu::TmaAsyncLoadOp::create(
        b, loc, dst, bars, value ? ops.vMap : ops.kMap,
        ValueRange{e.idx(64 * blk), h, key, batch}, stage, Value(), Value());
  }
}

void FlashBuilder::issueTile(Value stage, Value kt, TileParts parts,
                             Value issuer) {
  bool keys = parts != TileParts::Values;
  bool values = parts != TileParts::Keys && !c.select;
  int64_t boxes = (keys ? c.qkDim / 64 : 0) + (values ? c.vDim / 64 : 0);
  Value bars = parts == TileParts::Values ? vBars : ringBars;
  Value key = e.add(keyBase, tileStart(kt));
  e.ifThen(issuer ? issuer : e.eq(tid, e.idx(0)), [&] {
    nvgpu::MBarrierArriveExpectTxOp::create(
        b, loc, bars, e.idx(boxes * c.keyTile * kSwizzleRowBytes), stage,
        Value());
    if (keys)
      tmaLoads(bars, stage, key, false);
    if (values)
      tmaLoads(bars, stage, key, true);
  });
}

Value FlashBuilder::countOut(Value counter) {
  // Lane 0 counts the warp out once all its lanes are done; the counts only
  // grow, so the warp that completes a multiple of the block's warps is the
  // last of this use of the stage. (The next use cannot begin before this
  // one's refill is waited for.)
  syncWarp();
  Type i32 = b.getI32Type();
  Value counts = view(e.idx(lay.releaseOffset), {c.releaseCounts()}, i32);
  auto counted = scf::IfOp::create(
      b, loc, e.eq(lane, e.idx(0)),
      [&](OpBuilder &, Location) {
        Value before =
            memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi,
                                        e.i32(1), counts, ValueRange{counter});
        Value done = e.add(before, e.i32(1));
        scf::YieldOp::create(
            b, loc,
            e.eq(arith::RemUIOp::create(b, loc, done, e.i32(c.warps())),
                 e.i32(0)));
      },
      [&](OpBuilder &, Location) {
        scf::YieldOp::create(
            b, loc,
            arith::ConstantIntOp::create(b, loc, b.getI1Type(), 0).getResult());
      });
  return counted.getResult(0);
}

void FlashBuilder::releaseStage(Value stage, Value refill, Value numTiles,
                                TileParts parts) {
  // The values' counts follow the keys' (overlap).
  Value last = countOut(
      parts == TileParts::Values ? e.add(stage, e.idx(c.stages)) : stage);
  e.ifThen(e.lt(refill, numTiles),
           [&] { issueTile(stage, refill, parts, last); });
}

void FlashBuilder::turn(bool take) {
  // Named barrier 1 + g is warpgroup g's turn: it waits there (bar.sync)
  // for the other warpgroup's hand-over (bar.arrive), 256 threads in all.
  // Constant ids, a branch per warpgroup (or ptxas reserves all 16), as
  // inline PTX (LLVM would merge the branches' intrinsic calls).
  auto emit = [&](int64_t id) {
    std::string text = std::string(take ? "bar.sync " : "bar.arrive ") +
                       std::to_string(id) + ", 256;";
    LLVM::InlineAsmOp::create(
        b, loc, TypeRange{}, ValueRange{}, b.getStringAttr(text),
        b.getStringAttr(""), b.getUnitAttr(), UnitAttr(),
        LLVM::TailCallKindAttr::get(b.getContext(),
                                    LLVM::tailcallkind::TailCallKind::None),
        LLVM::AsmDialectAttr(), ArrayAttr());
  };
  scf::IfOp::create(
      b, loc, e.lt(tid, e.idx(128)),
      [&](OpBuilder &, Location) {
        emit(take ? 1 : 2);
        scf::YieldOp::create(b, loc);
      },
      [&](OpBuilder &, Location) {
        emit(take ? 2 : 1);
        scf::YieldOp::create(b, loc);
      });
}

void FlashBuilder::overlappedLoop(Value numTiles) {
  // Tile t's keys and values in stage t % 2, each on its own mbarrier;
  // tiles 0 and 1 before the loop.
  auto ifTile = [&](Value t, function_ref<void()> then) {
    e.ifThen(e.lt(t, numTiles), then);
  };
  for (int64_t t = 0; t < 2; ++t)
    ifTile(e.idx(t), [&] {
      issueTile(e.idx(t), e.idx(t), TileParts::Keys);
      issueTile(e.idx(t), e.idx(t), TileParts::Values);
    });
  // Tile 0: S, its keys freed (tile 2's come in), the softmax; O is zero.
  // (Without tiles S reads stale shared memory and every key is masked.)
  ifTile(e.idx(0), [&] { waitTile(e.idx(0), e.idx(0), TileParts::Keys); });
  Scores s0 = fragments(wgmmaWait(b, loc, 0, issueScores(e.idx(0))));
  releaseStage(e.idx(0), e.idx(2), numTiles, TileParts::Keys);
  SmallVector<Value> init = attendInit();
  size_t oSize = c.vDim / 2;
  SmallVector<Value> first =
      attendTile(e.idx(0), s0, Value(), e.idx(0),
                 ArrayRef<Value>(init).drop_front(oSize), /*deferPV=*/true);
  // Warpgroup 0 has the first turn: warpgroup 1 hands it over.
  if (c.pingpong)
    e.ifThen(e.eq(e.divs(tid, e.idx(128)), e.idx(1)),
             [&] { turn(/*take=*/false); });
  // The carried state: O, (max, sum) of rows A and B, the last tile's P
  // in bf16.
  auto packed = [&](ArrayRef<Value> p) {
    SmallVector<Value> flat;
    for (const auto &frag : packP(p))
      flat.append(frag.begin(), frag.end());
    return flat;
  };
  auto pFragsOf = [](ArrayRef<Value> p) {
    SmallVector<SmallVector<Value, 4>> frags;
    for (size_t i = 0; i < p.size(); i += 4)
      frags.push_back({p[i], p[i + 1], p[i + 2], p[i + 3]});
    return frags;
  };
  SmallVector<Value> carried(init.begin(), init.begin() + oSize);
  carried.append(first.begin(), first.begin() + 4);
  carried.append(packed(ArrayRef<Value>(first).drop_front(6)));
  auto loop = scf::ForOp::create(
      b, loc, e.idx(1), numTiles, e.idx(1), carried,
      [&](OpBuilder &, Location, Value kt, ValueRange args) {
        SmallVector<Value> argv(args.begin(), args.end());
        ArrayRef<Value> all(argv);
        Value prev = e.sub(kt, e.idx(1));
        Value stage = e.rems(kt, e.idx(2)), prevStage = e.rems(prev, e.idx(2));
        // This tile's S, then the last tile's P V, on the tensor cores
        // together.
        waitTile(stage, e.divs(kt, e.idx(2)), TileParts::Keys);
        waitTile(prevStage, e.divs(prev, e.idx(2)), TileParts::Values);
        if (c.pingpong)
          turn(/*take=*/true);
        SmallVector<Value> sAcc = issueScores(stage);
        curStage = prevStage;
        SmallVector<Value> oAcc = accumulateWgmma(
            pFragsOf(all.drop_front(oSize + 4)), all.take_front(oSize),
            /*wait=*/false);
        if (c.pingpong)
          turn(/*take=*/false);
        Scores s = fragments(wgmmaWait(b, loc, 1, sAcc));
        releaseStage(stage, e.add(kt, e.idx(2)), numTiles, TileParts::Keys);
        // The softmax while P V runs; then O, complete, is rescaled.
        SmallVector<Value> res =
            attendTile(kt, s, Value(), e.idx(0), all.slice(oSize, 4),
                       /*deferPV=*/true);
        SmallVector<Value> o = wgmmaWait(b, loc, 0, oAcc);
        releaseStage(prevStage, e.add(kt, e.idx(1)), numTiles,
                     TileParts::Values);
        for (size_t i = 0; i < o.size(); ++i)
          o[i] = e.fmul(o[i], res[4 + (i % 4 < 2 ? 0 : 1)]);
        o.append(res.begin(), res.begin() + 4);
        // P packed only now that the last P's registers are free.
        o.append(packed(ArrayRef<Value>(res).drop_front(6)));
        scf::YieldOp::create(b, loc, o);
      });
  // The last tile's P V (none without tiles: its values were never
  // loaded); every warp then leaves the ring.
  SmallVector<Value> results(loop.getResults());
  ArrayRef<Value> out(results);
  // Warpgroup 1 handed over one turn more than warpgroup 0 took.
  if (c.pingpong)
    e.ifThen(e.eq(e.divs(tid, e.idx(128)), e.idx(0)),
             [&] { turn(/*take=*/true); });
  auto last = scf::IfOp::create(
      b, loc, e.lt(e.idx(0), numTiles),
      [&](OpBuilder &, Location) {
        Value lastTile = e.sub(numTiles, e.idx(1));
        curStage = e.rems(lastTile, e.idx(2));
        waitTile(curStage, e.divs(lastTile, e.idx(2)), TileParts::Values);
        scf::YieldOp::create(
            b, loc,
            accumulateWgmma(pFragsOf(out.drop_front(oSize + 4)),
                            out.take_front(oSize)));
      },
      [&](OpBuilder &, Location) {
        scf::YieldOp::create(b, loc, out.take_front(oSize));
      });
  SmallVector<Value> done(last.getResults());
  done.append(out.begin() + oSize, out.begin() + oSize + 4);
  attendFinish(done);
}

void FlashBuilder::waitTile(Value stage, Value use, TileParts parts) {
  // Blocks until the phase of parity `use % 2` has completed.
  Value parity = arith::TruncIOp::create(
      b, loc, b.getI1Type(), e.toI32(e.rems(use, e.idx(2))));
  nvgpu::MBarrierTryWaitParityOp::create(
      b, loc, parts == TileParts::Values ? vBars : ringBars, parity,
      e.idx(10000000), stage);
}

void FlashBuilder::pipelinedLoop(Value numTiles) {
  // Tiles stages - 1 ahead by TMA; S of tile 0 before the loop.
  for (int64_t t = 0; t + 1 < c.stages; ++t)
    e.ifThen(e.lt(e.idx(t), numTiles), [&] { issueTile(e.idx(t), e.idx(t)); });
  e.ifThen(e.lt(e.idx(0), numTiles), [&] { waitTile(e.idx(0), e.idx(0)); });
  // (Without tiles the product reads stale shared memory and is dropped.)
  SmallVector<Value> init = attendInit();
  size_t oSize = c.vDim / 2, stateSize = oSize + 4;
  SmallVector<Value> s0 = issueScores(e.idx(0));
  init.append(s0.begin(), s0.end());
  auto loop = scf::ForOp::create(
      b, loc, e.idx(0), numTiles, e.idx(1), init,
      [&](OpBuilder &, Location, Value kt, ValueRange carried) {
        // This tile's S and the last tile's P V complete.
        SmallVector<Value> inFlight(carried.begin(), carried.begin() + oSize);
        inFlight.append(carried.begin() + stateSize, carried.end());
        inFlight = wgmmaWait(b, loc, 0, inFlight);
        SmallVector<Value> state(inFlight.begin(), inFlight.begin() + oSize);
        state.append(carried.begin() + oSize, carried.begin() + stateSize);
        Scores s = fragments(ArrayRef<Value>(inFlight).drop_front(oSize));
        // Every warp is past the last tile's P V: its stage is refilled.
        // The next tile's S runs on the tensor cores during this softmax.
        e.barrier();
        SmallVector<Value> sNext =
            refillAndIssueNext(kt, e.add(kt, e.idx(c.stages - 1)), numTiles);
        curStage = e.rems(kt, e.idx(c.stages));
        SmallVector<Value> res = attendTile(kt, s, Value(), e.idx(0), state,
                                            /*deferPV=*/true);
        SmallVector<SmallVector<Value, 4>> pFrags =
            packP(ArrayRef<Value>(res).drop_front(stateSize));
        SmallVector<Value> o = accumulateWgmma(
            pFrags, ArrayRef<Value>(res).take_front(oSize), /*wait=*/false);
        o.append(res.begin() + oSize, res.begin() + stateSize);
        o.append(sNext.begin(), sNext.end());
        scf::YieldOp::create(b, loc, o);
      });
  SmallVector<Value> last(loop.getResults());
  SmallVector<Value> done = wgmmaWait(b, loc, 0, last);
  done.resize(stateSize);
  for (size_t i = oSize; i < stateSize; ++i)
    done[i] = last[i];
  attendFinish(done);
}

SmallVector<Value> FlashBuilder::refillAndIssueNext(Value kt, Value ahead,
                                                   Value numTiles) {
  e.ifThen(e.lt(ahead, numTiles), [&] {
    issueTile(e.rems(ahead, e.idx(c.stages)), ahead);
  });
  return issueNext(kt, numTiles);
}

SmallVector<Value> FlashBuilder::issueNext(Value kt, Value numTiles) {
  // Past the last tile the S reads stale shared memory and is dropped.
  Value next = e.add(kt, e.idx(1));
  Value nextStage = e.rems(next, e.idx(c.stages));
  e.ifThen(e.lt(next, numTiles), [&] {
    waitTile(nextStage, e.divs(next, e.idx(c.stages)));
  });
  return issueScores(nextStage);
}

void FlashBuilder::pipelinedSelectLoop(Value numTiles) {
  // Tiles 0 .. stages - 1 by TMA; S of tile 0 before the loop (without
  // tiles it reads stale shared memory and is dropped).
  for (int64_t t = 0; t < c.stages; ++t)
    e.ifThen(e.lt(e.idx(t), numTiles), [&] { issueTile(e.idx(t), e.idx(t)); });
  e.ifThen(e.lt(e.idx(0), numTiles), [&] { waitTile(e.idx(0), e.idx(0)); });
  SmallVector<Value> init = selectInit();
  size_t stateSize = init.size();
  SmallVector<Value> s0 = issueScores(e.idx(0));
  init.append(s0.begin(), s0.end());
  auto loop = scf::ForOp::create(
      b, loc, e.idx(0), numTiles, e.idx(1), init,
      [&](OpBuilder &, Location, Value kt, ValueRange carried) {
        SmallVector<Value> acc =
            wgmmaWaitMoved(b, loc, 0, carried.drop_front(stateSize));
        Scores s = fragments(acc);
        // This warp's S of tile kt is done: once every warp's is, the
        // stage is refilled. The next tile's S runs during this tile's
        // scoring.
        SmallVector<Value> sNext;
        if (c.releasesStages()) {
          releaseStage(e.rems(kt, e.idx(c.stages)), e.add(kt, e.idx(c.stages)),
                       numTiles);
          sNext = issueNext(kt, numTiles);
        } else {
          e.barrier();
          sNext = refillAndIssueNext(kt, e.add(kt, e.idx(c.stages)), numTiles);
        }
        SmallVector<Value> state =
            selectTile(kt, s, carried.take_front(stateSize));
        state.append(sNext.begin(), sNext.end());
        scf::YieldOp::create(b, loc, state);
      });
  SmallVector<Value> results(loop.getResults());
  // The last S in flight completes before the kernel goes on.
  wgmmaWait(b, loc, 0, ArrayRef<Value>(results).drop_front(stateSize));
  selectFinish(ArrayRef<Value>(results).take_front(stateSize));
}

FlashBuilder::Scores FlashBuilder::scoresWgmma(Value stage) {
  return fragments(wgmmaWait(b, loc, 0, issueScores(stage)));
}

FlashBuilder::Scores FlashBuilder::fragments(ArrayRef<Value> acc) {
  Scores s;
  for (size_t j = 0; j < acc.size() / 4; ++j)
    s.emplace_back(acc.begin() + 4 * j, acc.begin() + 4 * j + 4);
  return s;
}

SmallVector<Value> FlashBuilder::issueScores(Value stage) {
  // Q [rows x Dqk] and K [keys x Dqk] are both K-major: a k16 step moves
  // 32 bytes within a 64-column block, a block is rows x 128 bytes.
  WgmmaDesc kDesc = wgmmaDescriptor(
      b, loc, e.add(sharedAddr, e.toI32(stageOffset(stage, false))), 16,
      kSwizzleAtomBytes);
  // The first k16 step overwrites the accumulators (scale-d 0), so they
  // start undefined rather than zeroed by c.keyTile / 2 moves a tile.
  SmallVector<Value> acc(c.keyTile / 2,
                         LLVM::UndefOp::create(b, loc, b.getF32Type()));
  acc = wgmmaFence(b, loc, acc);
  acc = wgmmaChainSS(b, loc, c.keyTile, qDesc, c.rows(), kDesc, c.keyTile,
                     c.qkDim, acc, /*accumulate=*/false,
                     c.hoistsQDescriptors());
  wgmmaCommit(b, loc);
  return acc;
}

SmallVector<Value>
FlashBuilder::accumulateWgmma(ArrayRef<SmallVector<Value, 4>> pFrags,
                              ArrayRef<Value> o, bool wait) {
  // V [keys x Dv] is MN-major (transposed B): a k16 step is 16 rows of
  // 128 bytes; LBO steps between 64-column blocks, SBO between 8-row groups.
  WgmmaDesc vDesc = wgmmaDescriptor(
      b, loc, e.add(sharedAddr, e.toI32(stageOffset(curStage, true))),
      c.keyTile * kSwizzleRowBytes, kSwizzleAtomBytes);
  SmallVector<Value> pinned(o);
  for (const auto &p : pFrags)
    pinned.append(p.begin(), p.end());
  pinned = wgmmaFence(b, loc, pinned);
  SmallVector<Value> acc =
      wgmmaChainRS(b, loc, c.vDim, ArrayRef<Value>(pinned).drop_front(o.size()),
                   vDesc, ArrayRef<Value>(pinned).take_front(o.size()));
  wgmmaCommit(b, loc);
  return wait ? wgmmaWait(b, loc, 0, acc) : acc;
}

Value mlir::nsa::detail::flash::createTileMap(OpBuilder &b, Location loc,
                                              Value tensor, int64_t keys,
                                              int64_t heads) {
  MLIRContext *ctx = b.getContext();
  auto space = gpu::AddressSpaceAttr::get(
      ctx, gpu::GPUDialect::getWorkgroupAddressSpace());
  auto type = nvgpu::TensorMapDescriptorType::get(
      ctx,
      MemRefType::get({1, keys, heads, 64}, b.getBF16Type(), AffineMap(),
                      space),
      nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
      nvgpu::TensorMapL2PromoKind::L2PROMO_256B,
      nvgpu::TensorMapOOBKind::OOB_ZERO,
      nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
  Value unranked = memref::CastOp::create(
      b, loc, UnrankedMemRefType::get(b.getBF16Type(), Attribute()), tensor);
  SmallVector<Value> box;
  for (int64_t side : {int64_t(1), keys, heads, int64_t(64)})
    box.push_back(arith::ConstantIndexOp::create(b, loc, side));
  return nvgpu::TmaCreateDescriptorOp::create(b, loc, type, unranked, box);
}
