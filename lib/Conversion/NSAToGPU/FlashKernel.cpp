//===- FlashKernel.cpp - hand-scheduled FlashAttention-2 kernels ----------===//
//
// One thread block per (query tile, KV head [, head chunk], sequence):
//
//   prologue   sequence view (cu_seqlens), the block's key tiles;
//              Selected: the distinct blocks its tokens chose, in shared
//              memory (candidates, duplicates dropped, compacted)
//   Q          cp.async into shared memory, then ldmatrix into registers:
//              each warp's 16 rows x Dqk stay in registers to the end
//   key tiles  a ring of `stages` shared-memory buffers filled by cp.async
//              (zero-filled past the end); per tile and warp:
//                S = Q K^T        mma.sync m16n8k16, K fragments by ldmatrix
//                mask, max        one key interval per row; quad shuffles
//                P = 2^(S - m)    ex2.approx, scale folded into log2 units
//                O = O alpha + P V P rounded to bf16 in registers as A,
//                                 V fragments by ldmatrix.trans
//   epilogue   warps that split the keys merge (max, sum, O) through shared
//              memory; O / sum and lse = (m + log2 sum) ln 2 are written
//
// With `wgmma` (sm_90a) the block is one warpgroup: Q stays in shared
// memory, Q and the key tiles are copied into the 128-byte-swizzled layout
// of Wgmma.h, S = Q K^T is a chain of wgmma reading both from shared memory
// and O += P V one with P from registers (V read transposed); the softmax
// between them is unchanged, as the wgmma accumulators of a warp have the
// mma.sync layout of its 16 rows.
//
// Block selection (`select`) runs the same prologue and score loop and
// replaces the softmax by the Spec 5 scores and a running top-n per warp.
// Compression and gating are separate, shared-memory-free kernels at the
// end of the file.
//
// Fragment layouts are those of TensorCore.h: with g = lane / 4 and
// p = 2 (lane % 4), a thread holds rows g and g + 8 and columns p, p + 1 of
// every 8-column accumulator tile, which is also the A layout of the next
// product once two neighbouring tiles are packed to bf16.
//
//===----------------------------------------------------------------------===//

#include "FlashBuilder.h"

#include "NSA/Transforms/TensorCore.h"
#include "NSA/Transforms/TileBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

void FlashBuilder::sequenceView(Value s) {
  SequenceView v =
      viewSequence(e, ops.q, ops.cuSeqlens, s, c.keys == FlashKeys::Compressed,
                   c.cmpBlock, c.cmpStride);
  batch = v.batch;
  start = v.tokenStart;
  len = v.length;
  cmpStart = v.cmpStart;
}

void FlashBuilder::copyRows(
    Value dst, int64_t rows, int64_t cols, Value src,
    function_ref<std::pair<Value, Value>(Value r)> rowHead,
    function_ref<Value(Value r)> valid) {
  copyRowsAsync(e, tid, c.warps() * 32, batch, dst, rows, cols, src, rowHead,
                valid);
}

void FlashBuilder::waitCopies(int64_t pending) {
  nvgpu::DeviceAsyncWaitOp::create(b, loc, commit(),
                                   b.getI32IntegerAttr(pending));
  if (c.wgmma)
    fenceProxyAsync(b, loc);
  e.barrier();
}

void FlashBuilder::buildUnion() {
  int64_t cands = lay.candidates;
  Type i32 = b.getI32Type();
  cand = view(e.idx(lay.unionOffset), {cands}, i32);
  keep = view(e.idx(lay.unionOffset + 4 * cands), {cands}, i32);
  list = view(e.idx(lay.unionOffset + 8 * cands), {cands + 1}, i32);
  BlockUnion u = buildBlockUnion(e, tid, c.warps() * 32, ops.indices, batch,
                                 start, len, t0, h, c.tokensPerBlock(),
                                 c.numSlots, c.warpSkips(), cand, keep, list);
  listLen = u.length;
}

Value FlashBuilder::tileStart(Value kt) {
  if (c.keys == FlashKeys::Gathered)
    return e.mul(gBlock, e.idx(c.slcBlock));
  if (c.keys == FlashKeys::Selected)
    return e.mul(e.toIndex(e.load(list, {kt})), e.idx(c.slcBlock));
  return e.mul(e.add(lo, kt), e.idx(c.keyTile));
}

Value FlashBuilder::stageOffset(Value stage, bool value) {
  Value off = e.add(e.idx(lay.ringOffset), e.mul(stage, e.idx(lay.stageBytes)));
  return value ? e.add(off, e.idx(lay.kBytes)) : off;
}

Value FlashBuilder::stageView(Value stage, bool value) {
  if (c.tma)
    return view(stageOffset(stage, value),
                {c.keyTile * (value ? c.vDim : c.qkDim)}, b.getBF16Type());
  return view(stageOffset(stage, value),
              {c.keyTile, value ? lay.vStride : lay.kStride}, b.getBF16Type());
}

SmallVector<Value, 2> FlashBuilder::tileIndex(Value row, int64_t col,
                                              Value laneCol) {
  if (!c.tma)
    return {row, e.add(e.idx(col), laneCol)};
  // Swizzled: the 16-byte chunk of the row's 64-column block, XOR row % 8
  // (here lane % 8: rows advance by multiples of 8 across lanes' groups).
  Value chunk = e.add(e.idx((col % 64) / 8), e.divs(laneCol, e.idx(8)));
  Value swz = arith::XOrIOp::create(b, loc, chunk, row8);
  return {e.add(e.add(e.idx(col / 64 * c.keyTile * 64),
                      e.mul(row, e.idx(64))),
                e.mul(swz, e.idx(8)))};
}

void FlashBuilder::loadTile(Value stage, Value kt) {
  Value k0 = tileStart(kt);
  auto copy = [&](bool whole) {
    // A tile inside the key range needs no clamp and no zero fill: its
    // rows are a constant stride apart.
    auto rowHead = [&](Value r) {
      Value key = e.add(k0, r);
      if (!whole)
        key = e.min(key, e.sub(keyLimit, e.idx(1)));
      return std::make_pair(e.add(keyBase, key), h);
    };
    auto valid = [&](Value r) { return e.lt(e.add(k0, r), keyLimit); };
    function_ref<Value(Value)> validFn;
    if (!whole)
      validFn = valid;
    copyRows(stageView(stage, false), c.keyTile, c.qkDim, ops.k, rowHead,
             validFn);
    if (!c.select)
      copyRows(stageView(stage, true), c.keyTile, c.vDim, ops.v, rowHead,
               validFn);
  };
  // Selected attention, whose copies dominate its issue slots (one block of
  // keys per 16 rows), takes the fast path where it can; for the others the
  // second copy of the copy code costs more registers than it saves.
  if (c.keys != FlashKeys::Selected) {
    copy(false);
    return;
  }
  scf::IfOp::create(
      b, loc, e.le(e.add(k0, e.idx(c.keyTile)), keyLimit),
      [&](OpBuilder &, Location) {
        copy(true);
        scf::YieldOp::create(b, loc);
      },
      [&](OpBuilder &, Location) {
        copy(false);
        scf::YieldOp::create(b, loc);
      });
}

void FlashBuilder::build(gpu::LaunchOp launch) {
  beginKernel(launch);
  if (c.keys == FlashKeys::Gathered)
    return buildGathered(launch.getBlockIds().x);
  e.ifThen(e.lt(t0, len), [&] {
    Value numTiles = keyTiles();
    // This thread's two rows.
    rowA = e.add(e.mul(wm, e.idx(16)), group4);
    rowB = e.add(rowA, e.idx(8));
    tokA = tokenOf(rowA);
    tokB = tokenOf(rowB);
    loadQuery();
    if (c.overlap)
      return overlappedLoop(numTiles);
    if (c.wgmma && !c.select && c.stages >= 3)
      return pipelinedLoop(numTiles);
    // Pipelining the selection loop pays with Dqk = 192 and is slower with
    // Dqk = 128, whose shorter S hides less.
    if (c.wgmma && c.select && c.qkDim > 128)
      return pipelinedSelectLoop(numTiles);
    mainLoop(numTiles);
  });
}

void FlashBuilder::beginKernel(gpu::LaunchOp launch) {
  auto workgroup = gpu::AddressSpaceAttr::get(
      b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  tid = launch.getThreadIds().x;
  Value warp = e.divs(tid, e.idx(32));
  lane = e.rems(tid, e.idx(32));
  wm = e.rems(warp, e.idx(c.warpsM));
  wn = e.divs(warp, e.idx(c.warpsM));
  LaneFragments frag = laneFragments(e, lane);
  group4 = frag.group4;
  pair = frag.pair;
  row16 = frag.row16;
  half8 = frag.half8;
  row8 = frag.row8;
  k8 = frag.k8;
  gpu::KernelDim3 ids = launch.getBlockIds();
  int64_t heads = c.headsPerBlock(), tokensPerBlock = c.tokensPerBlock();
  int64_t headChunks = c.group / heads;
  h = e.divs(ids.y, e.idx(headChunks));
  headOff = e.add(e.mul(h, e.idx(c.group)),
                  e.mul(e.rems(ids.y, e.idx(headChunks)), e.idx(heads)));
  sequenceView(ids.z);
  t0 = e.mul(ids.x, e.idx(tokensPerBlock));
  sharedBase = gpu::DynamicSharedMemoryOp::create(
      b, loc,
      MemRefType::get({ShapedType::kDynamic}, b.getI8Type(), AffineMap(),
                      workgroup));
  if (c.tma) {
    SwizzledShared aligned = alignForSwizzle(e, sharedBase, lay.total);
    sharedAddr = aligned.address;
    sharedBase = aligned.base;
    auto bars = [&] {
      return nvgpu::MBarrierCreateOp::create(
          b, loc,
          nvgpu::MBarrierGroupType::get(b.getContext(), workgroup, c.stages));
    };
    ringBars = bars();
    if (c.overlap)
      vBars = bars();
    e.ifThen(e.eq(tid, e.idx(0)), [&] {
      int64_t counts = c.releaseCounts();
      for (int64_t s = 0; s < c.stages; ++s) {
        nvgpu::MBarrierInitOp::create(b, loc, ringBars, e.idx(1), e.idx(s),
                                      Value());
        if (c.overlap)
          nvgpu::MBarrierInitOp::create(b, loc, vBars, e.idx(1), e.idx(s),
                                        Value());
      }
      for (int64_t i = 0; i < counts; ++i)
        e.store(e.i32(0),
                view(e.idx(lay.releaseOffset), {counts}, b.getI32Type()),
                {e.idx(i)});
      fenceBarrierInit(b, loc);
    });
    e.barrier();
  }
}

Value FlashBuilder::keyTiles() {
  Value numTiles;
  lo = e.idx(0);
  keyBase = start;
  keyLimit = len;
  Value tEnd = e.min(e.add(t0, e.idx(c.tokensPerBlock())), len);
  tLast = e.sub(tEnd, e.idx(1));
  auto blocksOf = [&](Value n) {
    return e.compressedBlocks(n, c.cmpBlock, c.cmpStride);
  };
  switch (c.keys) {
  case FlashKeys::Window: {
    Value first = e.max(e.idx(0), e.sub(t0, e.idx(c.window - 1)));
    lo = e.divs(first, e.idx(c.keyTile));
    numTiles = e.sub(e.ceilDiv(tEnd, c.keyTile), lo);
    break;
  }
  case FlashKeys::Compressed: {
    keyBase = cmpStart;
    keyLimit = blocksOf(len);
    if (!c.select) {
      numTiles = e.ceilDiv(blocksOf(tEnd), c.keyTile);
      break;
    }
    // Up to the compressed block that anchors (Spec 5.2) the selection
    // block of the last token.
    Value lastBlock = e.divs(e.sub(tEnd, e.idx(1)), e.idx(c.slcBlock));
    Value anchors = e.mul(e.add(lastBlock, e.idx(1)),
                          e.idx(c.slcBlock / c.cmpStride));
    numTiles = e.ceilDiv(anchors, c.keyTile);
    break;
  }
  case FlashKeys::Selected:
    buildUnion();
    numTiles = listLen;
    break;
  case FlashKeys::Gathered:
    llvm_unreachable("buildGathered");
  }
  return numTiles;
}

void FlashBuilder::loadQuery() {
  // Q: shared memory, then (mma.sync) fragments in registers.
  Type bf16 = b.getBF16Type();
  auto qRow = [&](Value r) {
    Value tok = e.min(tokenOf(r), e.sub(len, e.idx(1)));
    return std::make_pair(e.add(start, tok), headOf(r));
  };
  auto qValid = [&](Value r) {
    Value valid = e.lt(tokenOf(r), len);
    return c.rowsPerToken() > c.headsPerBlock()
               ? e.andi(valid, isHeadRow(r))
               : valid;
  };
  if (c.wgmma) {
    copyRowsSwizzled(e.idx(0), c.rows(), c.qkDim, ops.q, qRow, qValid);
    waitCopies(0);
    // Each warpgroup multiplies its 64 rows.
    Value wgRows = e.mul(e.divs(tid, e.idx(128)), e.idx(64 * kSwizzleRowBytes));
    qDesc = wgmmaDescriptor(b, loc, e.add(sharedAddr, e.toI32(wgRows)), 16,
                            kSwizzleAtomBytes);
  } else {
    Value qShared = view(e.idx(0), {c.rows(), lay.qStride}, bf16);
    copyRows(qShared, c.rows(), c.qkDim, ops.q, qRow, qValid);
    waitCopies(0);
    for (int64_t kk = 0; kk < c.qkDim / 16; ++kk) {
      Value loaded = nvgpu::LdMatrixOp::create(
          b, loc, VectorType::get({4, 2}, bf16), qShared,
          ValueRange{e.add(e.mul(wm, e.idx(16)), row16),
                     e.add(e.idx(16 * kk), half8)},
          false, 4);
      qFrags.push_back(unpackLdMatrix(b, loc, loaded, 0, 4));
    }
    // The ring reuses Q's shared memory (by TMA: order the reads first).
    if (c.tma)
      fenceProxyAsync(b, loc);
    e.barrier();
  }
}

void FlashBuilder::mainLoop(Value numTiles) {
  SmallVector<Value> init = c.select ? selectInit() : attendInit();
  // The ring: by TMA `stages - 1` tiles ahead (a stage is refilled once
  // the barrier closing the iteration that used it has passed) or, where
  // the warps release their stages, `stages` ahead (the last warp done
  // with a stage refills it); by cp.async one tile ahead.
  bool releases = c.releasesStages();
  int64_t ahead = releases ? c.stages : c.tma ? c.stages - 1 : 1;
  auto load = [&](Value stage, Value kt) {
    if (c.tma)
      issueTile(stage, kt);
    else
      loadTile(stage, kt);
  };
  for (int64_t t = 0; t < ahead; ++t)
    e.ifThen(e.lt(e.idx(t), numTiles), [&] { load(e.idx(t), e.idx(t)); });
  if (!c.tma)
    commit();
  auto loop = scf::ForOp::create(
      b, loc, e.idx(0), numTiles, e.idx(1), init,
      [&](OpBuilder &, Location, Value kt, ValueRange state) {
        Value next = e.add(kt, e.idx(ahead));
        if (!releases)
          e.ifThen(e.lt(next, numTiles),
                   [&] { load(e.rems(next, e.idx(c.stages)), next); });
        Value stage = e.rems(kt, e.idx(c.stages));
        curStage = stage;
        if (c.tma)
          waitTile(stage, e.divs(kt, e.idx(c.stages)));
        else
          waitCopies(1);
        Value keyW0 = e.mul(wn, e.idx(c.keyTile / c.warpsN));
        auto step = [&]() -> SmallVector<Value> {
          Scores s = c.wgmma ? scoresWgmma(stage)
                             : scores(stageView(stage, false), keyW0);
          return c.select ? selectTile(kt, s, state)
                          : attendTile(kt, s, stageView(stage, true), keyW0,
                                       state);
        };
        SmallVector<Value> next2;
        if (c.warpSkips()) {
          // Only the warps whose token chose the block (buildUnion's
          // mask) attend to it.
          Value token = e.divs(e.mul(wm, e.idx(16)), e.idx(c.rowsPerToken()));
          Value who = arith::ShRUIOp::create(b, loc, e.load(keep, {kt}),
                                             e.toI32(token));
          Value chosen = e.eq(e.andi(who, e.i32(1)), e.i32(1));
          auto ifOp = scf::IfOp::create(
              b, loc, chosen,
              [&](OpBuilder &, Location) {
                scf::YieldOp::create(b, loc, step());
              },
              [&](OpBuilder &, Location) {
                scf::YieldOp::create(b, loc, state);
              });
          next2.assign(ifOp.getResults().begin(), ifOp.getResults().end());
        } else {
          next2 = step();
        }
        if (releases)
          releaseStage(stage, next, numTiles);
        else
          e.barrier();
        scf::YieldOp::create(b, loc, next2);
      });
  // The epilogues may reuse the ring's shared memory (the merge of warps
  // over keys), which slower warps may still read.
  if (releases)
    e.barrier();
  if (c.select)
    selectFinish(loop.getResults());
  else
    attendFinish(loop.getResults());
}

FlashBuilder::Scores FlashBuilder::scores(Value kS, Value keyW0) {
  Type bf16 = b.getBF16Type();
  int64_t sTiles = c.keyTile / c.warpsN / 8;
  Value zero = e.f32(0);
  // With few key tiles per warp (selected attention: 2) the products over
  // Dqk are a long dependent chain: split it over two accumulators.
  int64_t chains = sTiles <= 2 && c.qkDim >= 64 ? 2 : 1;
  SmallVector<Scores> part(chains,
                           Scores(sTiles, SmallVector<Value, 4>(4, zero)));
  for (int64_t kk = 0; kk < c.qkDim / 16; ++kk) {
    Scores &s = part[kk % chains];
    for (int64_t j = 0; j < sTiles; j += 2) {
      bool two = j + 1 < sTiles;
      Value keyRow = e.add(e.add(keyW0, e.idx(8 * j)), row8);
      if (two)
        keyRow = e.add(keyRow, half8);
      Value loaded = nvgpu::LdMatrixOp::create(
          b, loc, VectorType::get({two ? 4 : 2, 2}, bf16), kS,
          tileIndex(keyRow, 16 * kk, k8), false, two ? 4 : 2);
      for (int64_t t = 0; t < (two ? 2 : 1); ++t)
        s[j + t] = mmaBF16(b, loc, qFrags[kk],
                           unpackLdMatrix(b, loc, loaded, 2 * t, 2), s[j + t]);
    }
  }
  Scores s = part[0];
  for (int64_t p = 1; p < chains; ++p)
    for (int64_t j = 0; j < sTiles; ++j)
      for (int64_t i = 0; i < 4; ++i)
        s[j][i] = e.fadd(s[j][i], part[p][j][i]);
  return s;
}

std::pair<Value, Value> FlashBuilder::interval(Value r, Value tok, Value kt) {
  Value t = e.toI32(tok);
  switch (c.keys) {
  case FlashKeys::Window:
  case FlashKeys::Compressed:
    return keyInterval(e, c.keys, c.window, c.cmpBlock, c.cmpStride, t);
  case FlashKeys::Gathered:
    // The block is one the row's token chose; rows past the entries have
    // token -1 and see nothing.
    return {e.i32(0), t};
  case FlashKeys::Selected: {
    // (Without masksByToken a warp attends only to its token's blocks.)
    if (!c.masksByToken())
      return {e.i32(0), t};
    // Only the blocks this row's token chose.
    Value base =
        e.mul(e.divs(r, e.idx(c.headsPerBlock())), e.idx(c.numSlots));
    Value j = e.load(list, {kt});
    Value chosen = e.eq(e.i32(0), e.i32(1));
    for (int64_t slot = 0; slot < c.numSlots; ++slot)
      chosen = e.ori(chosen,
                     e.eq(e.load(cand, {e.add(base, e.idx(slot))}), j));
    return {e.i32(0), e.sel(chosen, t, e.i32(-1))};
  }
  }
  llvm_unreachable("key source");
}

Value FlashBuilder::wholeTileVisible(Value k0) {
  if (c.masksByToken())
    return e.eq(e.i32(0), e.i32(1));
  // The intervals grow with the token: the last live token has the largest
  // lower end, the first the smallest upper end.
  Value first = e.toI32(k0);
  Value last = e.add(first, e.i32(c.keyTile - 1));
  Value lo = interval(Value(), tLast, Value()).first;
  Value hi = interval(Value(), t0, Value()).second;
  return e.andi(e.le(lo, first), e.le(last, hi));
}

SmallVector<Value> FlashBuilder::attendInit() {
  Value zero = e.f32(0), negInf = e.f32(-INFINITY);
  SmallVector<Value> init(c.vDim / 8 * 4, zero);
  init.append({negInf, negInf, zero, zero});
  return init;
}

SmallVector<Value> FlashBuilder::attendTile(Value kt, Scores &s, Value vS,
                                            Value keyW0, ValueRange state,
                                            bool deferPV) {
  // Masks only where some row of the block does not see the whole tile: a
  // branch uniform over the block, each side the whole update (one side's
  // registers do not constrain the other's).
  auto ifOp = scf::IfOp::create(
      b, loc, wholeTileVisible(tileStart(kt)),
      [&](OpBuilder &, Location) {
        Scores copy = s;
        scf::YieldOp::create(b, loc,
                             attendTile(kt, copy, vS, keyW0, state, false,
                                                deferPV));
      },
      [&](OpBuilder &, Location) {
        Scores copy = s;
        scf::YieldOp::create(b, loc,
                             attendTile(kt, copy, vS, keyW0, state, true,
                                                deferPV));
      });
  return SmallVector<Value>(ifOp.getResults());
}

SmallVector<Value> FlashBuilder::attendTile(Value kt, Scores &s, Value vS,
                                            Value keyW0, ValueRange state,
                                            bool mask, bool deferPV) {
  Type bf16 = b.getBF16Type();
  int64_t vTiles = c.vDim / 8, keysPerWarp = c.keyTile / c.warpsN;
  int64_t sTiles = keysPerWarp / 8;
  Value zero = e.f32(0), negInf = e.f32(-INFINITY);
  Value k0 = tileStart(kt);
  Value key0 = e.toI32(e.add(e.add(k0, keyW0), pair));

  // Scores in log2 units, masked by the rows' key intervals.
  Value scaleV = e.f32(c.scale * M_LOG2E);
  std::pair<Value, Value> ivA, ivB;
  if (mask) {
    ivA = interval(rowA, tokA, kt);
    ivB = interval(rowB, tokB, kt);
  }
  Value mxA = negInf, mxB = negInf;
  for (int64_t j = 0; j < sTiles; ++j)
    for (int64_t i = 0; i < 4; ++i) {
      Value x = e.fmul(s[j][i], scaleV);
      if (mask) {
        Value key = e.add(key0, e.i32(8 * j + (i & 1)));
        auto [lo, hi] = i < 2 ? ivA : ivB;
        x = e.sel(e.andi(e.le(lo, key), e.le(key, hi)), x, negInf);
      }
      s[j][i] = x;
      if (i < 2)
        mxA = e.fmax(mxA, x);
      else
        mxB = e.fmax(mxB, x);
    }
  for (int32_t off : {1, 2}) {
    mxA = e.fmax(mxA, e.shuffleXor(mxA, off));
    mxB = e.fmax(mxB, e.shuffleXor(mxB, off));
  }
  // overlap: no O in the state (it is in flight); the caller rescales it.
  int64_t oSize = state.size() == 4 ? 0 : vTiles * 4;
  assert((oSize || deferPV) && "O is rescaled here unless P V is deferred");
  Value mA = state[oSize], mB = state[oSize + 1];
  Value lA = state[oSize + 2], lB = state[oSize + 3];
  Value newA = e.fmax(mA, mxA), newB = e.fmax(mB, mxB);
  Value baseA = finiteOrZero(newA), baseB = finiteOrZero(newB);
  Value alphaA = e.ex2(e.fsub(mA, baseA));
  Value alphaB = e.ex2(e.fsub(mB, baseB));
  Value sumA = zero, sumB = zero;
  for (int64_t j = 0; j < sTiles; ++j)
    for (int64_t i = 0; i < 4; ++i) {
      bool a = i < 2;
      s[j][i] = e.ex2(e.fsub(s[j][i], a ? baseA : baseB));
      if (a)
        sumA = e.fadd(sumA, s[j][i]);
      else
        sumB = e.fadd(sumB, s[j][i]);
    }
  SmallVector<Value> o(state.begin(), state.begin() + oSize);
  for (int64_t j = 0; j < oSize / 4; ++j)
    for (int64_t i = 0; i < 4; ++i)
      o[4 * j + i] = e.fmul(o[4 * j + i], i < 2 ? alphaA : alphaB);

  // The state after O: the rows' max and sum, then (overlap) their
  // rescale factors.
  SmallVector<Value> stats = {newA, newB, e.fadd(e.fmul(lA, alphaA), sumA),
                              e.fadd(e.fmul(lB, alphaB), sumB)};
  if (!oSize)
    stats.append({alphaA, alphaB});
  SmallVector<Value> p;
  for (const auto &frag : s)
    p.append(frag.begin(), frag.end());
  if (deferPV) {
    SmallVector<Value> next(o);
    next.append(stats);
    next.append(p);
    return next;
  }
  // O += P V: P from registers; V fragments by ldmatrix.trans, or V read
  // by wgmma from shared memory.
  SmallVector<SmallVector<Value, 4>> pFrags = packP(p);
  if (c.wgmma)
    o = accumulateWgmma(pFrags, o);
  for (int64_t kk = 0; kk < keysPerWarp / 16 && !c.wgmma; ++kk) {
    const SmallVector<Value, 4> &pFrag = pFrags[kk];
    Value keyRow = e.add(e.add(keyW0, e.idx(16 * kk)), row16);
    for (int64_t j = 0; j < vTiles; j += 2) {
      bool two = j + 1 < vTiles;
      Value loaded = nvgpu::LdMatrixOp::create(
          b, loc, VectorType::get({two ? 4 : 2, 2}, bf16), vS,
          tileIndex(keyRow, 8 * j, two ? half8 : e.idx(0)), true,
          two ? 4 : 2);
      for (int64_t t = 0; t < (two ? 2 : 1); ++t) {
        SmallVector<Value, 4> acc(o.begin() + 4 * (j + t),
                                  o.begin() + 4 * (j + t) + 4);
        SmallVector<Value, 4> d = mmaBF16(
            b, loc, pFrag, unpackLdMatrix(b, loc, loaded, 2 * t, 2), acc);
        std::copy(d.begin(), d.end(), o.begin() + 4 * (j + t));
      }
    }
  }
  SmallVector<Value> next(o);
  next.append(stats);
  return next;
}

SmallVector<SmallVector<Value, 4>> FlashBuilder::packP(ArrayRef<Value> p) {
  // 16 keys a fragment, as mma.sync's A operand: row A's pair of keys
  // 0-7, row B's, then the same of keys 8-15.
  auto pk = [&](Value x, Value y) { return truncPackBF16(b, loc, x, y); };
  SmallVector<SmallVector<Value, 4>> frags;
  for (size_t i = 0; i + 8 <= p.size(); i += 8)
    frags.push_back({pk(p[i], p[i + 1]), pk(p[i + 2], p[i + 3]),
                     pk(p[i + 4], p[i + 5]), pk(p[i + 6], p[i + 7])});
  return frags;
}

void FlashBuilder::writeRows(ArrayRef<Value> acc, Value mA, Value mB, Value lA,
                             Value lB) {
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  Value zero = e.f32(0), negInf = e.f32(-INFINITY);
  auto pairType = VectorType::get({2}, f32);
  // The combine epilogue: both rows' gated compressed and selected terms,
  // all loaded before the first store (which the loads could not pass:
  // nothing says the buffers do not alias), from rows clamped into the
  // sequence; the window term joins them below.
  SmallVector<Value> gated[2];
  Value winGate[2];
  if (ops.combineGates) {
    for (int64_t half = 0; half < 2; ++half) {
      Value tok = e.min(half ? tokB : tokA, e.sub(len, e.idx(1)));
      Value row = e.add(start, tok), head = headOf(half ? rowB : rowA);
      Value sig[3];
      for (int64_t i = 0; i < 3; ++i)
        sig[i] = sigmoid(
            e, arith::ExtFOp::create(
                   b, loc, f32,
                   e.load(ops.combineGates, {batch, row, head, e.idx(i)})));
      winGate[half] = vector::BroadcastOp::create(b, loc, pairType, sig[2]);
      for (int64_t j = 0; j < c.vDim / 8; ++j) {
        SmallVector<Value, 4> at = {batch, row, head,
                                    e.add(e.idx(8 * j), pair)};
        auto term = [&](Value branch, Value g) {
          Value in = vector::LoadOp::create(
              b, loc, VectorType::get({2}, bf16), branch, at,
              /*nontemporal=*/false, llvm::MaybeAlign(4));
          return arith::MulFOp::create(
              b, loc, vector::BroadcastOp::create(b, loc, pairType, g),
              arith::ExtFOp::create(b, loc, pairType, in));
        };
        gated[half].push_back(
            e.fadd(term(ops.combineCmp, sig[0]), term(ops.combineSlc, sig[1])));
      }
    }
  }
  for (int64_t half = 0; half < 2; ++half) {
    Value r = half ? rowB : rowA, tok = half ? tokB : tokA;
    Value m = half ? mB : mA, l = half ? lB : lA;
    bool gathered = c.keys == FlashKeys::Gathered;
    // Gathered: the entry's partial row; rows past the entries have token
    // -1.
    Value row = gathered ? (half ? outRowB : outRowA) : e.add(start, tok);
    Value live = gathered ? e.le(e.idx(0), tok) : e.lt(tok, len);
    Value head = headOf(r);
    // l is 0 only for a row with no keys; a NaN l (Spec section 14) stays.
    Value nonEmpty = e.fcmp(arith::CmpFPredicate::UNE, l, zero);
    Value inv =
        e.sel(nonEmpty, arith::DivFOp::create(b, loc, e.f32(1), l), zero);
    e.ifThen(live, [&] {
      for (int64_t j = 0; j < c.vDim / 8; ++j) {
        Value x = e.fmul(acc[4 * j + 2 * half], inv);
        Value y = e.fmul(acc[4 * j + 2 * half + 1], inv);
        Value pairV =
            vector::FromElementsOp::create(b, loc, pairType, ValueRange{x, y});
        if (ops.combineGates)
          pairV = e.fadd(gated[half][j],
                         arith::MulFOp::create(b, loc, winGate[half], pairV));
        Value packed = arith::TruncFOp::create(
            b, loc, VectorType::get({2}, bf16), pairV);
        vector::StoreOp::create(
            b, loc, packed, ops.out,
            ValueRange{batch, row, head, e.add(e.idx(8 * j), pair)},
            /*nontemporal=*/false, llvm::MaybeAlign(4));
      }
      e.ifThen(e.eq(pair, e.idx(0)), [&] {
        Value lse = e.fmul(e.fadd(m, math::Log2Op::create(b, loc, l)),
                           e.f32(M_LN2));
        e.store(e.sel(nonEmpty, lse, negInf), ops.lse, {batch, row, head});
      });
    });
  }
}

void FlashBuilder::attendFinish(ValueRange state) {
  Type f32 = b.getF32Type();
  int64_t vTiles = c.vDim / 8;
  SmallVector<Value> o(state.begin(), state.begin() + vTiles * 4);
  Value mA = state[vTiles * 4], mB = state[vTiles * 4 + 1];
  Value lA = state[vTiles * 4 + 2], lB = state[vTiles * 4 + 3];
  // The quad's partial sums.
  for (int32_t off : {1, 2}) {
    lA = e.fadd(lA, e.shuffleXor(lA, off));
    lB = e.fadd(lB, e.shuffleXor(lB, off));
  }
  if (c.warpsN == 1) {
    writeRows(o, mA, mB, lA, lB);
    return;
  }
  // Each warp's (O, max, sum) of its rows to shared memory; the warps with
  // wn = 0 merge them.
  Value merge = view(e.idx(0), {c.warps() * 16, lay.mergeStride}, f32);
  auto mergeRow = [&](Value warpN, int64_t half) {
    return e.add(e.mul(e.add(e.mul(warpN, e.idx(c.warpsM)), wm), e.idx(16)),
                 e.add(group4, e.idx(8 * half)));
  };
  for (int64_t half = 0; half < 2; ++half) {
    Value r = mergeRow(wn, half);
    for (int64_t j = 0; j < vTiles; ++j)
      for (int64_t i = 0; i < 2; ++i)
        e.store(o[4 * j + 2 * half + i], merge,
                {r, e.add(e.idx(8 * j + i), pair)});
    e.store(half ? mB : mA, merge, {r, e.idx(c.vDim)});
    e.store(half ? lB : lA, merge, {r, e.idx(c.vDim + 1)});
  }
  e.barrier();
  e.ifThen(e.eq(wn, e.idx(0)), [&] {
    Value m[2] = {mA, mB}, l[2] = {lA, lB};
    Value mTot[2] = {mA, mB};
    for (int64_t w = 1; w < c.warpsN; ++w)
      for (int64_t half = 0; half < 2; ++half)
        mTot[half] = e.fmax(mTot[half], e.load(merge, {mergeRow(e.idx(w), half),
                                                       e.idx(c.vDim)}));
    SmallVector<Value> acc(o);
    for (int64_t half = 0; half < 2; ++half) {
      Value base = finiteOrZero(mTot[half]);
      Value own = e.ex2(e.fsub(m[half], base));
      for (int64_t j = 0; j < vTiles; ++j)
        for (int64_t i = 2 * half; i < 2 * half + 2; ++i)
          acc[4 * j + i] = e.fmul(acc[4 * j + i], own);
      l[half] = e.fmul(l[half], own);
      for (int64_t w = 1; w < c.warpsN; ++w) {
        Value r = mergeRow(e.idx(w), half);
        Value f = e.ex2(e.fsub(e.load(merge, {r, e.idx(c.vDim)}), base));
        l[half] = e.fadd(l[half],
                         e.fmul(f, e.load(merge, {r, e.idx(c.vDim + 1)})));
        for (int64_t j = 0; j < vTiles; ++j)
          for (int64_t i = 0; i < 2; ++i) {
            Value x =
                e.load(merge, {r, e.add(e.idx(8 * j + i), pair)});
            acc[4 * j + 2 * half + i] =
                e.fadd(acc[4 * j + 2 * half + i], e.fmul(f, x));
          }
      }
    }
    writeRows(acc, mTot[0], mTot[1], l[0], l[1]);
  });
}

//===----------------------------------------------------------------------===//
// Block selection (Spec 5): scores from the compression probabilities, a
// running top-n per token in the lanes of its warp
//===----------------------------------------------------------------------===//

Value FlashBuilder::isForced(Value j, Value cBlock) {
  return backboneForced(e, c.backbone, j, cBlock);
}

Value FlashBuilder::selectionShared(int64_t offset, ArrayRef<int64_t> shape,
                                    Type elt) {
  return view(e.idx(lay.selectOffset + offset), shape, elt);
}

Value FlashBuilder::rankedEntries() {
  return selectionShared(c.warps() * lay.columns * 4, {c.warps(), 16, 3},
                         b.getI32Type());
}

Value FlashBuilder::queuedEntries() {
  return selectionShared((c.warps() * lay.columns + c.warps() * 16 * 3) * 4,
                         {c.warps(), 16, 3}, b.getI32Type());
}

SmallVector<Value> FlashBuilder::selectInit() {
  // Per warp: the column sums of a tile after `carry` columns of the
  // previous one, and the kept entries; zero before the first tile (Spec
  // 5.2: indices below 0 contribute nothing).
  Value warp = e.divs(tid, e.idx(32));
  int64_t carry = c.cmpBlock / c.cmpStride - 1;
  e.forEach(lane, e.idx(carry), e.idx(32), [&](Value i) {
    e.store(e.f32(0), selectionShared(0, {c.warps(), lay.columns},
                                      b.getF32Type()),
            {warp, i});
  });
  auto lseOf = [&](Value r, Value tok) {
    Value row = e.add(start, e.min(tok, e.sub(len, e.idx(1))));
    return e.fmul(e.load(ops.lse, {batch, row, headOf(r)}), e.f32(M_LOG2E));
  };
  lseA = lseOf(rowA, tokA);
  lseB = lseOf(rowB, tokB);
  // Kept entries (score, block, valid), ranked: none valid yet; no
  // pending entries.
  Value noBlock = e.add(e.toI32(lane), e.i32(1 << 30));
  return {e.f32(-INFINITY), noBlock, e.i32(0), e.i32(0)};
}

void FlashBuilder::sumColumns(Value kt, Scores &s, Value k0, Value warp,
                              Value columns, Value zero) {
  int64_t sTiles = c.keyTile / 8, carry = c.cmpBlock / c.cmpStride - 1;
  Value key0 = e.toI32(e.add(k0, pair));
  // Probabilities exp(s q.k - lse) of the visible blocks, summed over the
  // warp's 16 rows: the G heads of its token, then padding (G < 16), which
  // adds nothing.
  auto [loA, hiA] = interval(rowA, tokA, kt);
  bool padded = c.rowsPerToken() > c.headsPerBlock();
  Value headA = padded ? isHeadRow(rowA) : Value();
  Value scaleV = e.f32(c.scale * M_LOG2E);
  auto probabilities = [&](bool mask) {
    SmallVector<Value> sums;
    for (int64_t j = 0; j < sTiles; ++j)
      for (int64_t i = 0; i < 2; ++i) {
        Value p = e.ex2(e.fsub(e.fmul(s[j][i], scaleV), lseA));
        // Padded (G <= 8): rows 8-15 of the warp (B) are all padding.
        if (padded)
          p = e.sel(headA, p, zero);
        else
          p = e.fadd(p, e.ex2(e.fsub(e.fmul(s[j][2 + i], scaleV), lseB)));
        if (mask) {
          Value key = e.add(key0, e.i32(8 * j + i));
          p = e.sel(e.andi(e.le(loA, key), e.le(key, hiA)), p, zero);
        }
        sums.push_back(p);
      }
    return sums;
  };
  // The key interval only where the tile is not wholly visible to the
  // warp's token (uniform over the warp): most tiles skip the masks.
  Value first = e.toI32(k0);
  Value whole = e.andi(e.le(loA, first),
                       e.le(e.add(first, e.i32(c.keyTile - 1)), hiA));
  SmallVector<Value> colSum = e.ifUnmasked(whole, probabilities);
  if (sTiles == 8) {
    // Sum over the 8 lanes of a quad position (lane bits 4, 3, 2) while
    // splitting the values: at each step a lane keeps the half its bit
    // selects and adds its partner's copy of that half. Lane g * 4 + p ends
    // with the sums of columns 8 g + 2 p + {0, 1}: 14 shuffles, not 48.
    for (int32_t bit : {4, 3, 2}) {
      Value upper = e.eq(e.rems(e.divs(lane, e.idx(1 << bit)), e.idx(2)),
                         e.idx(1));
      size_t half = colSum.size() / 2;
      SmallVector<Value> kept;
      for (size_t k = 0; k < half; ++k) {
        Value mine = e.sel(upper, colSum[half + k], colSum[k]);
        Value theirs = e.sel(upper, colSum[k], colSum[half + k]);
        kept.push_back(e.fadd(mine, e.shuffleXor(theirs, 1 << bit)));
      }
      colSum = kept;
    }
    for (int64_t i = 0; i < 2; ++i)
      e.store(colSum[i], columns,
              {warp, e.add(e.add(e.idx(carry + i), e.mul(group4, e.idx(8))),
                           pair)});
  } else {
    for (int32_t off : {4, 8, 16})
      for (Value &v : colSum)
        v = e.fadd(v, e.shuffleXor(v, off));
    e.ifThen(e.lt(lane, e.idx(4)), [&] {
      for (int64_t j = 0; j < sTiles; ++j)
        for (int64_t i = 0; i < 2; ++i)
          e.store(colSum[2 * j + i], columns,
                  {warp, e.add(e.idx(carry + 8 * j + i), pair)});
    });
  }
  syncWarp();
}

SmallVector<Value> FlashBuilder::selectTile(Value kt, Scores &s,
                                            ValueRange state) {
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  int64_t carry = c.cmpBlock / c.cmpStride - 1;
  int64_t perBlock = c.slcBlock / c.cmpStride; // compressed anchors per block
  int64_t newBlocks = c.keyTile / perBlock;
  Value zero = e.f32(0);
  Value warp = e.divs(tid, e.idx(32));
  Value columns =
      selectionShared(0, {c.warps(), lay.columns}, f32);
  Value k0 = tileStart(kt);
  sumColumns(kt, s, k0, warp, columns, zero);
  // Eq. 9: lanes 16 .. 16 + newBlocks - 1 score the selection blocks whose
  // anchors lie in this tile: their compressed blocks start `carry` columns
  // earlier.
  Value k = e.sub(lane, e.idx(16));
  Value kSafe = e.max(e.min(k, e.idx(newBlocks - 1)), e.idx(0));
  Value score = zero;
  for (int64_t o = 0; o < perBlock + carry; ++o) {
    // Overlap of compressed block (first + o) with the selection block.
    int64_t weight = std::min(o - carry + c.cmpBlock / c.cmpStride, perBlock) -
                     std::max<int64_t>(o - carry, 0);
    if (weight <= 0)
      continue;
    Value col = e.load(columns,
                       {warp, e.add(e.mul(kSafe, e.idx(perBlock)), e.idx(o))});
    score = e.fadd(score, e.fmul(e.f32(weight), col));
  }
  // A NaN score ranks above every number (Spec section 14): the
  // ranking's order stays total.
  score = e.sel(e.fcmp(arith::CmpFPredicate::UNO, score, score),
                e.f32(spec::kNaNScore), score);
  syncWarp();
  // The last columns become the next tile's carry.
  e.ifThen(e.lt(lane, e.idx(carry)), [&] {
    e.store(e.load(columns, {warp, e.add(e.idx(c.keyTile), lane)}), columns,
            {warp, lane});
  });
  Value j = e.toI32(e.add(e.divs(k0, e.idx(perBlock)), kSafe));
  Value cBlock = e.toI32(e.divs(tokA, e.idx(c.slcBlock)));
  Value isNew = e.andi(e.le(e.idx(16), lane), e.lt(k, e.idx(newBlocks)));
  Value candidate = e.andi(isNew, e.le(j, cBlock));
  Value forced = e.andi(candidate, isForced(j, cBlock));
  // Forced blocks first, the local ones before the others (Spec 5.4).
  Value local = e.lt(e.sub(cBlock, j), e.i32(c.backbone.local));
  Value forcedScore =
      e.sel(local, e.f32(spec::kLocalScore), e.f32(spec::kForcedScore));
  Value newScore = e.sel(candidate, e.sel(forced, forcedScore, score),
                         e.f32(-INFINITY));
  Value newBlock =
      e.sel(isNew, j, e.add(e.toI32(lane), e.i32(1 << 30)));
  // Only entries that can still make the top n go on: valid ones scoring
  // at least the ranked 16th (all while fewer than 16 are valid: the
  // threshold only rises, so nothing dropped could rank later). They queue
  // in shared memory; the ranking runs when the queue would overflow, and
  // at the end.
  Value thr = e.shuffleIdx(state[0], 15);
  Value thrValid = e.eq(e.shuffleIdx(state[2], 15), e.i32(1));
  Value beats = e.ori(arith::XOrIOp::create(
                          b, loc, thrValid,
                          arith::ConstantIntOp::create(b, loc, b.getI1Type(), 1)),
                      e.fcmp(arith::CmpFPredicate::OGE, newScore, thr));
  Value pass = e.andi(candidate, beats);
  Value ballot = NVVM::VoteSyncOp::create(b, loc, i32, e.i32(-1), pass,
                                          NVVM::VoteSyncKind::ballot);
  Value n = math::CtPopOp::create(b, loc, ballot);
  Value pending = state[3];
  auto ranked = scf::IfOp::create(
      b, loc, e.lt(e.i32(16), e.add(pending, n)),
      [&](OpBuilder &, Location) {
        SmallVector<Value> merged = selectMerge(state, pending);
        merged.push_back(e.i32(0));
        scf::YieldOp::create(b, loc, merged);
      },
      [&](OpBuilder &, Location) {
        scf::YieldOp::create(b, loc, state);
      });
  SmallVector<Value> next(ranked.getResults());
  Value queue = queuedEntries();
  Value below = arith::AndIOp::create(
      b, loc, ballot,
      e.sub(arith::ShLIOp::create(b, loc, e.i32(1), e.toI32(lane)), e.i32(1)));
  Value slot = e.toIndex(e.add(next[3], math::CtPopOp::create(b, loc, below)));
  e.ifThen(pass, [&] {
    e.store(arith::BitcastOp::create(b, loc, i32, newScore), queue,
            {warp, slot, e.idx(0)});
    e.store(newBlock, queue, {warp, slot, e.idx(1)});
    e.store(e.i32(1), queue, {warp, slot, e.idx(2)});
  });
  syncWarp();
  next[3] = e.add(next[3], n);
  return next;
}

SmallVector<Value> FlashBuilder::selectMerge(ValueRange state, Value count) {
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  Value warp = e.divs(tid, e.idx(32));
  Value kept = rankedEntries(), queue = queuedEntries();
  // Lanes 16 + i hold the queued entry i (i < count), else nothing valid.
  Value low = e.lt(lane, e.idx(16));
  Value q = e.rems(lane, e.idx(16));
  Value queued = e.andi(e.le(e.idx(16), lane), e.lt(e.toI32(q), count));
  Value qScore = arith::BitcastOp::create(b, loc, f32,
                                          e.load(queue, {warp, q, e.idx(0)}));
  Value qBlock = e.load(queue, {warp, q, e.idx(1)});
  Value none = e.add(e.toI32(lane), e.i32(1 << 30));
  Value mine[3] = {
      e.sel(low, state[0], e.sel(queued, qScore, e.f32(-INFINITY))),
      e.sel(low, state[1], e.sel(queued, qBlock, none)),
      e.sel(low, state[2], e.sel(queued, e.i32(1), e.i32(0)))};
  syncWarp();
  // Rank among the 32 entries: valid first, higher score, lower block. A
  // loop, not unrolled: rankings are rare (the queue fills up seldom), and
  // unrolled they would set the kernel's register count.
  auto rankLoop = scf::ForOp::create(
      b, loc, e.i32(0), e.i32(32), e.i32(1), ValueRange{e.i32(0)},
      [&](OpBuilder &, Location, Value other, ValueRange count) {
        auto from = [&](Value v) {
          return gpu::ShuffleOp::create(b, loc, v, other, e.i32(32),
                                        gpu::ShuffleMode::IDX)
              .getShuffleResult();
        };
        Value os = from(mine[0]), ob = from(mine[1]), ov = from(mine[2]);
        Value sameValid = e.eq(ov, mine[2]);
        Value higher = e.fcmp(arith::CmpFPredicate::OGT, os, mine[0]);
        Value tie = e.andi(e.fcmp(arith::CmpFPredicate::OEQ, os, mine[0]),
                           e.lt(ob, mine[1]));
        Value better = e.ori(e.cmp(arith::CmpIPredicate::sgt, ov, mine[2]),
                             e.andi(sameValid, e.ori(higher, tie)));
        scf::YieldOp::create(
            b, loc,
            ValueRange{e.add(count[0], e.sel(better, e.i32(1), e.i32(0)))});
      });
  Value rank = rankLoop.getResult(0);
  Value rankIdx = e.toIndex(rank);
  e.ifThen(e.lt(rankIdx, e.idx(16)), [&] {
    e.store(arith::BitcastOp::create(b, loc, i32, mine[0]), kept,
            {warp, rankIdx, e.idx(0)});
    e.store(mine[1], kept, {warp, rankIdx, e.idx(1)});
    e.store(mine[2], kept, {warp, rankIdx, e.idx(2)});
  });
  syncWarp();
  Value slot = e.rems(lane, e.idx(16));
  SmallVector<Value> next = {
      arith::BitcastOp::create(b, loc, f32,
                               e.load(kept, {warp, slot, e.idx(0)})),
      e.load(kept, {warp, slot, e.idx(1)}),
      e.load(kept, {warp, slot, e.idx(2)})};
  syncWarp();
  return next;
}

void FlashBuilder::selectFinish(ValueRange queuedState) {
  // The queue joins the ranking; then lanes 0 .. n-1 hold the top n,
  // ranked: write the valid ones in increasing block order and -1 after
  // them (Spec 5.4).
  auto ranked = scf::IfOp::create(
      b, loc, e.lt(e.i32(0), queuedState[3]),
      [&](OpBuilder &, Location) {
        scf::YieldOp::create(b, loc,
                             selectMerge(queuedState, queuedState[3]));
      },
      [&](OpBuilder &, Location) {
        scf::YieldOp::create(b, loc, queuedState.take_front(3));
      });
  ValueRange state = ranked.getResults();
  int64_t n = c.numSelected;
  Value block = state[1], valid = state[2];
  auto order = scf::ForOp::create(
      b, loc, e.i32(0), e.i32(n), e.i32(1), ValueRange{e.i32(0), e.i32(0)},
      [&](OpBuilder &, Location, Value other, ValueRange acc) {
        auto from = [&](Value v) {
          return gpu::ShuffleOp::create(b, loc, v, other, e.i32(32),
                                        gpu::ShuffleMode::IDX)
              .getShuffleResult();
        };
        Value ob = from(block), isValid = e.eq(from(valid), e.i32(1));
        Value before = e.andi(isValid, e.lt(ob, block));
        scf::YieldOp::create(
            b, loc,
            ValueRange{e.add(acc[0], e.sel(before, e.i32(1), e.i32(0))),
                       e.add(acc[1], e.sel(isValid, e.i32(1), e.i32(0)))});
      });
  Value pos = order.getResult(0), count = order.getResult(1);
  Value row = e.add(start, tokA);
  e.ifThen(e.andi(e.lt(tokA, len), e.lt(lane, e.idx(n))), [&] {
    Value mineValid = e.eq(valid, e.i32(1));
    e.ifThen(mineValid, [&] {
      e.store(block, ops.indices, {batch, row, h, e.toIndex(pos)});
    });
    e.ifThen(e.le(count, e.toI32(lane)), [&] {
      e.store(e.i32(-1), ops.indices, {batch, row, h, lane});
    });
  });
}

std::string mlir::nsa::detail::checkFlashConfig(const FlashConfig &c) {
  auto fail = [](const Twine &why) { return why.str(); };
  if (c.qkDim <= 0 || c.qkDim % 16 || c.vDim <= 0 || c.vDim % 16)
    return fail("Dqk and Dv must be multiples of 16, found " +
                Twine(c.qkDim) + " and " + Twine(c.vDim));
  if (c.vDim > 256 || c.qkDim > 256)
    return fail("Dqk and Dv above 256 do not fit in registers");
  // Groups larger than 16 split a token's heads over blocks; the kernels
  // have that path, but no GPU test covers it yet, so such layers stay on
  // the generic mapping.
  if (c.group <= 0 || 16 % c.group)
    return fail("the group size must divide 16, found " + Twine(c.group));
  if (c.warpsM < 1 || c.warpsN < 1 || c.warps() > 8)
    return fail("1 to 8 warps per block");
  if (c.group > c.rows() && c.group % c.rows())
    return fail("a block's rows must divide the group");
  if (c.keyTile < 16 || c.keyTile > 128 || c.keyTile % (16 * c.warpsN))
    return fail("keys per tile must be 16 to 128 and a multiple of 16 per "
                "warp, found " +
                Twine(c.keyTile));
  if (c.stages < 2 || c.stages > 4)
    return fail("2 to 4 stages");
  if (c.tma && !tmaFits(c))
    return fail("TMA key tiles take Dqk and Dv multiples of 64");
  if (c.wgmma && !c.tma)
    return fail("the wgmma kernel loads its key tiles by TMA");
  if (c.wgmma && !wgmmaFits(c))
    return fail("the wgmma kernel takes window and compressed attention and "
                "block selection with 64- or 128-row blocks, 64-key tiles "
                "(64, 96 or 128 for attention) and dims that are multiples of "
                "64");
  if ((c.keys == FlashKeys::Selected || c.keys == FlashKeys::Gathered) &&
      (c.slcBlock != c.keyTile || c.numSlots < 1))
    return fail("selection blocks must be one key tile");
  if (c.overlap &&
      (!c.wgmma || c.select || c.stages != 2 ||
       (c.keys != FlashKeys::Window && c.keys != FlashKeys::Compressed)))
    return fail("the overlapped loop takes wgmma window or compressed "
                "attention with a 2-stage ring");
  if (c.pingpong && (!c.overlap || c.warps() != 8))
    return fail("the warpgroups take turns in the overlapped loop of two");
  if (c.keys == FlashKeys::Gathered && (!c.wgmma || c.warpsM != 4))
    return fail("block-major selected attention takes the wgmma kernel of "
                "64 rows");
  if (c.keys == FlashKeys::Window && c.window < 1)
    return fail("the window must be positive");
  if (c.select) {
    int64_t perBlock = c.cmpStride > 0 ? c.slcBlock / c.cmpStride : 0;
    if (c.keys != FlashKeys::Compressed || c.group > 16 || c.warpsN != 1)
      return fail("block selection takes G up to 16 (one token's heads per "
                  "warp), found G = " +
                  Twine(c.group));
    if (c.numSelected < 1 || c.numSelected > 16)
      return fail("block selection keeps at most 16 blocks, found " +
                  Twine(c.numSelected));
    if (c.cmpStride < 1 || c.slcBlock % c.cmpStride ||
        c.cmpBlock % c.cmpStride || c.cmpBlock / c.cmpStride > 32 ||
        perBlock < 1 || c.keyTile % perBlock || c.keyTile / perBlock > 16)
      return fail("a key tile must anchor 1 to 16 whole selection blocks");
  }
  int64_t bytes = flashSharedMemoryBytes(c);
  if (bytes > kMaxSharedBytes)
    return fail("needs " + Twine(bytes) + " bytes of shared memory, more "
                "than the " + Twine(kMaxSharedBytes) + " a block can have");
  return "";
}

bool mlir::nsa::detail::tmaFits(const FlashConfig &c) {
  return c.qkDim % 64 == 0 && (c.select || c.vDim % 64 == 0) &&
         c.keyTile % 8 == 0;
}

bool mlir::nsa::detail::wgmmaFits(const FlashConfig &c) {
  return c.keys != FlashKeys::Selected &&
         (c.warpsM == 4 || c.warpsM == 8) && c.warpsN == 1 &&
         (c.keyTile == 64 ||
          (!c.select && c.keyTile % 32 == 0 && c.keyTile > 64)) &&
         c.qkDim % 64 == 0 &&
         (c.select || c.vDim % 64 == 0);
}

int64_t mlir::nsa::detail::flashSharedMemoryBytes(const FlashConfig &c) {
  return Layout(c).total;
}

gpu::LaunchOp mlir::nsa::detail::buildFlashKernel(
    OpBuilder &b, Location loc, const FlashConfig &c,
    const FlashOperands &ops, StringRef kernelName) {
  Emit e{b, loc};
  int64_t heads = c.headsPerBlock();
  Value tokens = memref::DimOp::create(b, loc, ops.q, 1);
  Value gridX = e.ceilDiv(tokens, c.tokensPerBlock());
  Value gridY = e.idx(c.kvHeads * (c.group / heads));
  Value gridZ =
      ops.cuSeqlens
          ? e.sub(memref::DimOp::create(b, loc, ops.cuSeqlens, 0).getResult(),
                  e.idx(1))
          : memref::DimOp::create(b, loc, ops.q, 0).getResult();
  if (c.keys == FlashKeys::Gathered) {
    // Work items: at most one partly filled per (batch, KV head, block),
    // the rest full (kGatheredChunks chunks of 64 / G entries).
    Value batches = memref::DimOp::create(b, loc, ops.q, 0);
    Value lists = memref::DimOp::create(b, loc, ops.counts, 0);
    Value entries =
        e.mul(e.mul(batches, tokens), e.idx(c.kvHeads * c.numSlots));
    gridX =
        e.add(e.ceilDiv(entries, c.tokensPerBlock() * kGatheredChunks), lists);
    gridY = gridZ = e.idx(1);
  }
  FlashOperands withMaps = ops;
  if (c.tma) {
    withMaps.kMap = createTileMap(b, loc, ops.k, c.keyTile);
    if (!c.select)
      withMaps.vMap = createTileMap(b, loc, ops.v, c.keyTile);
  }
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch =
      createNamedLaunch(b, loc, {gridX, gridY, gridZ}, c.warps() * 32,
                        flashSharedMemoryBytes(c), kernelName);
  FlashBuilder(b, loc, c, withMaps).build(launch);
  return launch;
}

gpu::LaunchOp mlir::nsa::detail::buildCompressKernel(
    OpBuilder &b, Location loc, const CompressConfig &c, Value x,
    Value weights, Value cuSeqlens, Value out, StringRef kernelName) {
  Emit e{b, loc};
  // Each thread pools two neighbouring elements of one compressed row: the
  // row's D / 2 threads read its tokens' rows coalesced, 4 bytes each.
  int64_t pairs = c.dim / 2;
  int64_t rowsPerBlock = std::max<int64_t>(1, 256 / pairs);
  int64_t threads = rowsPerBlock * pairs;
  int64_t l = c.block, d = c.stride;
  auto blocksOf = [&](Value n) { return e.compressedBlocks(n, l, d); };
  Value tokens = memref::DimOp::create(b, loc, x, 1);
  Value gridX = e.ceilDiv(blocksOf(tokens), rowsPerBlock);
  Value gridZ = cuSeqlens
                    ? e.sub(memref::DimOp::create(b, loc, cuSeqlens, 0)
                                .getResult(),
                            e.idx(1))
                    : memref::DimOp::create(b, loc, x, 0).getResult();
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch = createNamedLaunch(
      b, loc, {gridX, e.idx(c.heads), gridZ}, threads, 0, kernelName);

  gpu::KernelDim3 ids = launch.getBlockIds();
  Value tid = launch.getThreadIds().x;
  Value h = ids.y, s = ids.z;
  Value batch = s, start = e.idx(0), len = tokens, cmpStart = e.idx(0);
  if (cuSeqlens) {
    // Spec sections 2 and 3: the sequence's tokens, and its compressed rows
    // after those of the earlier sequences.
    auto at = [&](Value i) { return e.toIndex(e.load(cuSeqlens, {i})); };
    batch = e.idx(0);
    start = at(s);
    len = e.sub(at(e.add(s, e.idx(1))), start);
    auto prefix = scf::ForOp::create(
        b, loc, e.idx(0), s, e.idx(1), ValueRange{e.idx(0)},
        [&](OpBuilder &, Location, Value i, ValueRange sum) {
          Value n = e.sub(at(e.add(i, e.idx(1))), at(i));
          scf::YieldOp::create(b, loc, ValueRange{e.add(sum[0], blocksOf(n))});
        });
    cmpStart = prefix.getResult(0);
  }
  Value row = e.add(e.mul(ids.x, e.idx(rowsPerBlock)),
                    e.divs(tid, e.idx(pairs)));
  Value col = e.mul(e.rems(tid, e.idx(pairs)), e.idx(2));
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  auto pairType = VectorType::get({2}, bf16);
  auto pairF32 = VectorType::get({2}, f32);
  e.ifThen(e.lt(row, blocksOf(len)), [&] {
    Value first = e.add(start, e.mul(row, e.idx(d)));
    Value zero = arith::ConstantOp::create(b, loc, pairF32,
                                           DenseElementsAttr::get(
                                               pairF32, b.getF32FloatAttr(0)));
    auto sum = scf::ForOp::create(
        b, loc, e.idx(0), e.idx(l), e.idx(1), ValueRange{zero},
        [&](OpBuilder &, Location, Value j, ValueRange acc) {
          Value v = vector::LoadOp::create(
              b, loc, pairType, x,
              ValueRange{batch, e.add(first, j), h, col});
          Value w = weights ? e.load(weights, {h, j}) : e.f32(1.0 / l);
          Value wv = vector::BroadcastOp::create(b, loc, pairF32, w);
          Value next = vector::FMAOp::create(
              b, loc, arith::ExtFOp::create(b, loc, pairF32, v), wv, acc[0]);
          scf::YieldOp::create(b, loc, ValueRange{next});
        });
    vector::StoreOp::create(
        b, loc, arith::TruncFOp::create(b, loc, pairType, sum.getResult(0)),
        out, ValueRange{batch, e.add(cmpStart, row), h, col},
        /*nontemporal=*/false, llvm::MaybeAlign(4));
  });
  return launch;
}
