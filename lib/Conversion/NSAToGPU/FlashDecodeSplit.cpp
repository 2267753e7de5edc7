//===- FlashDecodeSplit.cpp - one split of a decoding step's branch ------===//
//
// DecodeBuilder::attendSplit (FlashDecodeBuilder.h): a block walks the
// chunks of one split of a branch's keys for its row tile, steps 1-5 of
// FlashDecode.cpp's list a chunk (keys, staging, S, online softmax with
// the Eq. 9 partials, P V), then writes the split's (max, sum, O) or, in
// `_cluster`, pushes it to its owner; the selected kernel's last block of
// a row tile merges the splits.
//
//===----------------------------------------------------------------------===//

#include "FlashDecodeBuilder.h"

#include "NSA/Transforms/TensorCore.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
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

void DecodeBuilder::attendSplit(DecodeKeys keys, Value batch, Value y,
                                Value chunkBegin, Value chunkEnd,
                                Value outSplit) {
  Split s = beginSplit(keys, batch, y, chunkBegin, chunkEnd, outSplit);
  // The first chunk's K and V; each iteration then loads the next chunk's
  // K while this one's softmax and P V run, and its V while the next S
  // runs (one buffer each).
  e.ifThen(e.lt(chunkBegin, chunkEnd),
           [&] { issueChunk(s, chunkBegin, false); });
  commitChunk(s);
  e.ifThen(e.lt(chunkBegin, chunkEnd),
           [&] { issueChunk(s, chunkBegin, true); });
  commitChunk(s);
  if (keys != DecodeKeys::Compressed)
    stamp(Issued);
  // The appends folded in: the new compressed row pooled while they come.
  std::optional<PooledRow> pooled;
  if (keys == DecodeKeys::Compressed && inCluster && ops.append.appended > 0)
    pooled = poolAppended(batch, s.tile, s.tid, chunkBegin, chunkEnd);
  // While the first chunk comes: this block's columns of the compressed and
  // window results (the partial launch's splits merged).
  if (keys == DecodeKeys::Selected && !inCluster)
    preMerge(s.tileIndex, e.sub(outSplit, e.add(p.cmpSplits, p.winSplits)),
             s.tid);
  // Q (in flight with K and V): fragments.
  nvgpu::DeviceAsyncWaitOp::create(b, loc, s.qToken,
                                   b.getI32IntegerAttr(s.noBulk ? 2 : 0));
  e.barrier();
  Type bf16 = b.getBF16Type();
  for (int64_t kk = 0; kk < c.qkDim / 16; ++kk) {
    Value loaded = nvgpu::LdMatrixOp::create(
        b, loc, VectorType::get({4, 2}, bf16), s.qS,
        ValueRange{s.f.row16, e.add(e.idx(16 * kk), s.f.half8)}, false, 4);
    s.qFrags.push_back(unpackLdMatrix(b, loc, loaded, 0, 4));
  }
  SmallVector<Value> init(s.vGroups * 8, e.f32(0));
  auto loop = scf::ForOp::create(
      b, loc, chunkBegin, chunkEnd, e.idx(1), init,
      [&](OpBuilder &, Location, Value chunk, ValueRange accIn) {
        scf::YieldOp::create(b, loc, attendChunk(s, pooled, chunk, accIn));
      });
  endSplit(s, loop.getResults());
}

DecodeBuilder::Split DecodeBuilder::beginSplit(DecodeKeys keys, Value batch,
                                               Value y, Value chunkBegin,
                                               Value chunkEnd,
                                               Value outSplit) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i32 = b.getI32Type();
  Split s;
  s.keys = keys;
  s.batch = batch;
  s.chunkBegin = chunkBegin;
  s.chunkEnd = chunkEnd;
  s.outSplit = outSplit;
  int64_t ks = c.chunkKeys, G = c.group, kThreads = partialThreads();
  s.tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  s.warp = e.divs(s.tid, e.idx(32));
  s.lane = e.rems(s.tid, e.idx(32));
  s.f = laneFragments(e, s.lane);
  Value shared = sharedBytes();
  s.qS = view(shared, lay.q, {16, lay.qStride}, bf16);
  s.kS = view(shared, lay.k, {ks, lay.kStride}, bf16);
  s.vS = view(shared, lay.v, {ks, lay.vStride}, bf16);
  s.pS = view(shared, lay.p, {16, lay.pStride}, bf16);
  s.sS = view(shared, lay.s, {16, lay.sStride}, f32);
  s.stats = view(shared, lay.stats, {3, 16}, f32); // max, sum, alpha
  s.chosen = view(shared, lay.chosen, {c.numSelected}, i32);
  s.shared = shared;

  s.tile = tileOf(y);
  s.t = positionOf(batch, s.tile.token);
  Value headBase =
      e.add(e.mul(s.tile.head, e.idx(G)), e.mul(s.tile.sub, e.idx(16)));
  Value headsHere = e.sub(e.idx(G), e.mul(s.tile.sub, e.idx(16)));
  // (Row r of the tile is query head headBase + r where r < headsHere.)
  s.tileIndex = e.add(e.mul(batch, e.idx(c.tiles())), y);

  // Q: shared memory, then fragments (the tile's rows are one token's).
  copyRowsAsync(
      e, s.tid, kThreads, batch, s.qS, 16, c.qkDim, ops.q,
      [&](Value r) {
        return std::make_pair(s.tile.token,
                              e.min(e.add(headBase, r), e.idx(qHeads() - 1)));
      },
      [&](Value r) { return e.lt(r, headsHere); });
  s.qToken = nvgpu::DeviceAsyncCreateGroupOp::create(
      b, loc, nvgpu::DeviceAsyncTokenType::get(b.getContext()), ValueRange{});
  // K and V come by bulk copies (the split-K launches), a row a thread, on
  // an mbarrier each (a phase a chunk; its arrivals: the warps that issue
  // them), or by cp.async (`_cluster`: at one block an SM the bulk copies'
  // issue is slower).
  s.noBulk = inCluster;
  s.kBar = sharedAddress(lay.bars);
  s.vBar = sharedAddress(lay.bars + 8);
  int64_t issuers = ks / 32;
  if (!s.noBulk) {
    e.ifThen(e.eq(s.tid, e.idx(0)), [&] {
      for (Value bar : {s.kBar, s.vBar})
        ptx("mbarrier.init.shared::cta.b64 [$0], " + std::to_string(issuers) +
                ";",
            bar, "r");
      ptx("fence.mbarrier_init.release.cluster;", {}, "");
    });
    e.barrier();
  }
  e.ifThen(e.lt(s.tid, e.idx(16)), [&] {
    e.store(e.f32(-INFINITY), s.stats, {e.idx(0), s.tid});
    e.store(e.f32(0), s.stats, {e.idx(1), s.tid});
  });

  // `_selected`'s chosen blocks come from the partial launch's splits and
  // chunk partials. (`_partial` and `_cluster` waited at their entry.)
  if (keys == DecodeKeys::Selected)
    waitForPredecessor();
  if (keys == DecodeKeys::Selected && !chosenReady)
    chooseBlocks(batch, s.tile, s.t, s.tid, s.chosen);

  double scale = keys == DecodeKeys::Compressed ? c.cmpScale
                 : keys == DecodeKeys::Window   ? c.winScale
                                                : c.slcScale;
  s.scaleLog2 = e.f32(scale * M_LOG2E);
  s.cacheRows = keys == DecodeKeys::Compressed ? p.cmpRows : p.cacheTokens;
  s.kSrc = keys == DecodeKeys::Compressed ? ops.kc : ops.k;
  s.vSrc = keys == DecodeKeys::Compressed ? ops.vc : ops.v;
  s.visible = visibleBlocks(s.t);
  // Warps split the keys of a chunk in groups of 16 (S) and Dv in groups of
  // 16 columns (O), `kGroups` and `vGroups` a warp.
  s.warps = kThreads / 32;
  s.kGroups = ks / 16 / s.warps;
  s.vGroupsAll = c.vDim / 16;
  s.vGroups = (s.vGroupsAll + s.warps - 1) / s.warps;
  s.kRow = rowAddresses(s, s.kSrc);
  s.vRow = rowAddresses(s, s.vSrc);
  s.laneI32 = e.toI32(s.lane);
  return s;
}

Value DecodeBuilder::vGroupOf(const Split &s, int64_t i) {
  return e.min(e.add(s.warp, e.idx(s.warps * i)), e.idx(s.vGroupsAll - 1));
}

std::pair<Value, Value> DecodeBuilder::splitKey(const Split &s, Value chunk,
                                                Value kk) {
  int64_t ks = c.chunkKeys;
  Value row, seen;
  switch (s.keys) {
  case DecodeKeys::Compressed:
    row = e.add(e.mul(chunk, e.idx(ks)), kk);
    seen = e.lt(row, s.visible);
    break;
  case DecodeKeys::Window:
    row = e.add(e.sub(s.t, e.idx(c.window - 1)),
                e.add(e.mul(chunk, e.idx(ks)), kk));
    seen = e.andi(e.le(e.idx(0), row), e.le(row, s.t));
    seen = e.andi(seen, e.lt(e.sub(s.t, row), e.idx(c.window)));
    break;
  case DecodeKeys::Selected: {
    Value slot = e.add(e.mul(chunk, e.idx(ks / c.slcBlock)),
                       e.divs(kk, e.idx(c.slcBlock)));
    Value inRange = e.lt(slot, e.idx(c.numSelected));
    Value blk = e.toIndex(
        e.load(s.chosen, {e.min(slot, e.idx(c.numSelected - 1))}));
    row = e.add(e.mul(blk, e.idx(c.slcBlock)), e.rems(kk, e.idx(c.slcBlock)));
    seen = e.andi(inRange, e.le(e.idx(0), blk));
    seen = e.andi(seen, e.le(row, s.t));
    break;
  }
  }
  seen = e.andi(seen, e.andi(e.le(e.idx(0), row), e.lt(row, s.cacheRows)));
  return std::make_pair(e.sel(seen, row, e.idx(0)), seen);
}

std::function<Value(Value)> DecodeBuilder::rowAddresses(const Split &s,
                                                        Value src) {
  auto meta = memref::ExtractStridedMetadataOp::create(b, loc, src);
  Value base = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, src);
  auto strides = meta.getStrides();
  base = e.add(base, e.mul(e.add(meta.getOffset(),
                                 e.mul(s.batch, strides[0])),
                           e.idx(2)));
  Value headAt = e.mul(s.tile.head, strides[2]);
  Value rowStride = strides[1];
  return [=, this](Value row) {
    Value at =
        e.add(base, e.mul(e.add(e.mul(row, rowStride), headAt), e.idx(2)));
    return arith::IndexCastOp::create(b, loc, b.getI64Type(), at).getResult();
  };
}

void DecodeBuilder::issueChunk(const Split &s, Value chunk, bool values) {
  if (s.noBulk)
    issueChunkAsync(s, chunk, values);
  else
    issueChunkBulk(s, chunk, values);
}

void DecodeBuilder::issueChunkAsync(const Split &s, Value chunk,
                                    bool values) {
  int64_t ks = c.chunkKeys, kThreads = partialThreads();
  int64_t pieces = (values ? c.vDim : c.qkDim) / 8;
  Value dst = values ? s.vS : s.kS, src = values ? s.vSrc : s.kSrc;
  Value tid = s.tid;
  Type tokenType = nvgpu::DeviceAsyncTokenType::get(b.getContext());
  // A thread copies one 16-byte piece of a row a step, rowsPerStep rows a
  // step, unrolled (each row's key found once, the steps independent);
  // unseen rows are zero-filled. 8 threads a row where the row's pieces
  // split evenly among them: a row's key found once for its pieces, which
  // a thread issues at consecutive addresses (and 8 lanes cover 128
  // contiguous bytes). Else a row's pieces over as many threads.
  int64_t group = 8;
  if (pieces % group == 0 && kThreads % group == 0 && pieces > group) {
    int64_t each = pieces / group, rowsPerStep = kThreads / group;
    Value row0 = e.divs(tid, e.idx(group));
    Value piece0 = e.rems(tid, e.idx(group));
    for (int64_t k = 0; k * rowsPerStep < ks; ++k) {
      Value r = e.add(row0, e.idx(k * rowsPerStep));
      auto copies = [&] {
        auto [row, seen] = splitKey(s, chunk, r);
        Value size = e.sel(seen, e.idx(8), e.idx(0));
        for (int64_t j = 0; j < each; ++j) {
          Value col = e.mul(e.add(piece0, e.idx(group * j)), e.idx(8));
          nvgpu::DeviceAsyncCopyOp::create(
              b, loc, tokenType, dst, ValueRange{r, col}, src,
              ValueRange{s.batch, row, s.tile.head, col}, b.getIndexAttr(8),
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
          auto [row, seen] = splitKey(s, chunk, r);
          nvgpu::DeviceAsyncCopyOp::create(
              b, loc, tokenType, dst, ValueRange{r, col}, src,
              ValueRange{s.batch, row, s.tile.head, col}, b.getIndexAttr(8),
              e.sel(seen, e.idx(8), e.idx(0)), b.getUnitAttr());
        };
        if ((k + 1) * rowsPerStep <= ks)
          copy();
        else
          e.ifThen(e.lt(r, e.idx(ks)), copy);
      }
    });
  }
}

void DecodeBuilder::issueChunkBulk(const Split &s, Value chunk, bool values) {
  // Thread r < ks copies row r (its warp's lane 0 first tells the mbarrier
  // the warp's bytes); unseen rows are not copied, and V's are zeroed (P is
  // 0 there, and 0 times stale shared memory may be NaN).
  Type bf16 = b.getBF16Type();
  int64_t ks = c.chunkKeys;
  int64_t rowBytes = (values ? c.vDim : c.qkDim) * 2;
  int64_t dstAt = values ? lay.v : lay.k;
  int64_t stride = (values ? lay.vStride : lay.kStride) * 2;
  Value bar = values ? s.vBar : s.kBar, tid = s.tid;
  e.ifThen(e.lt(tid, e.idx(ks)), [&] {
    auto [row, seen] = splitKey(s, chunk, tid);
    Value dst =
        e.add(sharedAddress(dstAt), e.toI32(e.mul(tid, e.idx(stride))));
    Value src = values ? s.vRow(row) : s.kRow(row);
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
        {arith::ExtUIOp::create(b, loc, b.getI32Type(), seen), s.laneI32, bar,
         dst, src},
        "r,r,r,r,l");
    if (values)
      e.ifThen(e.eq(seen, arith::ConstantIntOp::create(b, loc, 0, 1)), [&] {
        Value zero = arith::ConstantOp::create(
            b, loc,
            DenseElementsAttr::get(VectorType::get({8}, bf16),
                                   b.getZeroAttr(bf16)));
        for (int64_t col = 0; col < c.vDim; col += 8)
          vector::StoreOp::create(b, loc, zero, s.vS,
                                  ValueRange{tid, e.idx(col)}, false,
                                  llvm::MaybeAlign(16));
      });
  });
}

void DecodeBuilder::commitChunk(const Split &s) {
  // cp.async: the copies issued since the last commit as one group, also
  // where there were none (chunk with no next, empty split), so that a
  // wait for all groups but the newest always leaves just the one after.
  if (s.noBulk)
    nvgpu::DeviceAsyncCreateGroupOp::create(
        b, loc, nvgpu::DeviceAsyncTokenType::get(b.getContext()),
        ValueRange{});
}

void DecodeBuilder::waitChunk(const Split &s, Value chunk, bool values) {
  // Every thread waits for chunk `chunk`'s K or V, then the block (V's
  // zeroed rows); cp.async: all groups but the newest.
  if (s.noBulk) {
    nvgpu::DeviceAsyncWaitOp::create(b, loc, s.qToken, b.getI32IntegerAttr(1));
    e.barrier();
    return;
  }
  Value parity = e.toI32(e.rems(e.sub(chunk, s.chunkBegin), e.idx(2)));
  ptx("{\n\t.reg .pred done;\n\twait:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\n\t"
      "@!done bra wait;\n\t}",
      {values ? s.vBar : s.kBar, parity}, "r,r");
  e.barrier();
}

SmallVector<Value>
DecodeBuilder::attendChunk(const Split &s,
                           const std::optional<PooledRow> &pooled,
                           Value chunk, ValueRange accIn) {
  SmallVector<Value> acc(accIn);
  Value next = e.add(chunk, e.idx(1));
  Value hasNext = e.lt(next, s.chunkEnd);
  waitChunk(s, chunk, false); // this chunk's K (its V may still come)
  if (pooled)
    placeAppended(*pooled, chunk, /*values=*/false, s.kS, s.tid);
  scoreChunk(s, chunk);
  // The next chunk's K into the buffer S is done with.
  e.barrier();
  e.ifThen(hasNext, [&] { issueChunk(s, next, false); });
  commitChunk(s);
  ChunkRows rows = softmaxChunk(s, chunk);
  if (s.keys == DecodeKeys::Compressed)
    storeChunkPartials(s, chunk, rows);
  waitChunk(s, chunk, true); // this chunk's V (the next K may still come)
  if (pooled)
    placeAppended(*pooled, chunk, /*values=*/true, s.vS, s.tid);
  accumulateChunk(s, acc);
  // The next chunk's V into the buffer P V is done with.
  e.barrier();
  e.ifThen(hasNext, [&] { issueChunk(s, next, true); });
  commitChunk(s);
  return acc;
}

void DecodeBuilder::scoreChunk(const Split &s, Value chunk) {
  // 3. S = Q K^T, a warp per 16 keys, masked, in log2 units.
  Type bf16 = b.getBF16Type();
  const LaneFragments &f = s.f;
  for (int64_t g = 0; g < s.kGroups; ++g) {
    Value key0 = e.mul(e.add(s.warp, e.idx(s.warps * g)), e.idx(16));
    SmallVector<SmallVector<Value, 4>> acc(2,
                                           SmallVector<Value, 4>(4, e.f32(0)));
    for (int64_t kk = 0; kk < c.qkDim / 16; ++kk) {
      Value loaded = nvgpu::LdMatrixOp::create(
          b, loc, VectorType::get({4, 2}, bf16), s.kS,
          ValueRange{e.add(e.add(key0, f.row8), f.half8),
                     e.add(e.idx(16 * kk), f.k8)},
          false, 4);
      for (int64_t n = 0; n < 2; ++n)
        acc[n] = mmaBF16(b, loc, s.qFrags[kk],
                         unpackLdMatrix(b, loc, loaded, 2 * n, 2), acc[n]);
    }
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 4; ++i) {
        Value key = e.add(e.add(key0, e.idx(8 * n + i % 2)), f.pair);
        Value row = i < 2 ? f.group4 : e.add(f.group4, e.idx(8));
        Value seen = splitKey(s, chunk, key).second;
        e.store(e.sel(seen, e.fmul(acc[n][i], s.scaleLog2), e.f32(-INFINITY)),
                s.sS, {row, key});
      }
  }
}

DecodeBuilder::ChunkRows DecodeBuilder::softmaxChunk(const Split &s,
                                                     Value chunk) {
  // 4. The online softmax: threads / 16 a row, 8 consecutive keys a thread
  // (16-byte shared loads and stores).
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type();
  int64_t rowLanes = partialThreads() / 16;
  ChunkRows rows;
  Value row = rows.row = e.divs(s.tid, e.idx(rowLanes));
  Value part = rows.part = e.rems(s.tid, e.idx(rowLanes));
  Value first = rows.first = e.mul(part, e.idx(ChunkRows::per));
  Value mOld = e.load(s.stats, {e.idx(0), row});
  Value lOld = e.load(s.stats, {e.idx(1), row});
  auto v4 = VectorType::get({4}, f32);
  SmallVector<Value> sv;
  for (int64_t i = 0; i < ChunkRows::per; i += 4) {
    Value q = vector::LoadOp::create(b, loc, v4, s.sS,
                                     ValueRange{row, e.add(first, e.idx(i))},
                                     false, b.getI64IntegerAttr(16));
    for (int64_t j = 0; j < 4; ++j)
      sv.push_back(vector::ExtractOp::create(b, loc, q, ArrayRef<int64_t>{j}));
  }
  Value cm = e.f32(-INFINITY);
  for (Value x : sv)
    cm = e.fmax(cm, x);
  for (int32_t o = 1; o < rowLanes; o *= 2)
    cm = e.fmax(cm, e.shuffleXor(cm, o));
  Value mNew = e.fmax(mOld, cm);
  Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
  Value sum = e.f32(0);
  SmallVector<Value> pbf;
  for (Value x : sv) {
    Value pv = e.ex2(e.fsub(x, mUse));
    sum = e.fadd(sum, pv);
    rows.pvs.push_back(pv);
    pbf.push_back(arith::TruncFOp::create(b, loc, bf16, pv));
  }
  vector::StoreOp::create(
      b, loc,
      vector::FromElementsOp::create(
          b, loc, VectorType::get({ChunkRows::per}, bf16), pbf),
      s.pS, ValueRange{row, first}, false, llvm::MaybeAlign(16));
  // Compressed chunks whose Eq. 9 partials need the keys of other lanes
  // read them from S in shared memory (storeChunkPartials).
  if (s.keys == DecodeKeys::Compressed && !partialsInRegisters())
    for (int64_t i = 0; i < ChunkRows::per; ++i)
      e.store(rows.pvs[i], s.sS, {row, e.add(first, e.idx(i))});
  for (int32_t o = 1; o < rowLanes; o *= 2)
    sum = e.fadd(sum, e.shuffleXor(sum, o));
  Value alpha = e.ex2(e.fsub(mOld, mUse));
  e.ifThen(e.eq(part, e.idx(0)), [&] {
    e.store(mNew, s.stats, {e.idx(0), row});
    e.store(e.fadd(e.fmul(lOld, alpha), sum), s.stats, {e.idx(1), row});
    e.store(alpha, s.stats, {e.idx(2), row});
    if (s.keys == DecodeKeys::Compressed)
      storeWork(mUse,
                e.add(p.refAt,
                      e.add(e.mul(e.add(e.mul(s.tileIndex, p.cmpChunks), chunk),
                                  e.idx(16)),
                            row)));
  });
  return rows;
}

bool DecodeBuilder::partialsInRegisters() const {
  int64_t a = subPerCmp(), bsz = subPerSlc();
  return ChunkRows::per % bsz == 0 && a - 1 <= ChunkRows::per;
}

void DecodeBuilder::storeChunkPartials(const Split &s, Value chunk,
                                       const ChunkRows &rows) {
  // Eq. 9 partials (compressed chunks): block j of slot q takes key
  // i = q bsz - a + 1 + o (a = l/d, bsz = l'/d) with weight
  // min(o + 1, bsz) - max(o - a + 1, 0), where that key is in the chunk.
  // From the registers where a thread's keys hold its slots' keys but for
  // the a - 1 before (the lanes before it: shuffles), else from S in
  // shared memory.
  constexpr int64_t per = ChunkRows::per;
  int64_t ks = c.chunkKeys, rowLanes = partialThreads() / 16;
  int64_t a = subPerCmp(), bsz = subPerSlc(), slots = c.slotsPerChunk();
  Value row = rows.row, part = rows.part, first = rows.first;
  ArrayRef<Value> pvs = rows.pvs;
  auto partBase = [&] {
    return e.add(p.partAt,
                 e.mul(e.add(e.mul(s.tileIndex, p.cmpChunks), chunk),
                       e.idx(16 * slots)));
  };
  // Slot q's partial of the row `r`.
  auto storePart = [&](Value v, Value r, Value q) {
    storeWork(v, e.add(partBase(), e.add(e.mul(r, e.idx(slots)), q)));
  };
  auto weight = [&](int64_t o) {
    return std::min(o + 1, bsz) - std::max<int64_t>(o - a + 1, 0);
  };
  if (!partialsInRegisters()) {
    e.barrier();
    e.forEach(s.tid, e.idx(16 * slots), e.idx(partialThreads()),
              [&](Value item) {
      Value r = e.divs(item, e.idx(slots)), q = e.rems(item, e.idx(slots));
      Value acc = e.f32(0);
      for (int64_t o = 0; o < bsz + a - 1; ++o) {
        Value local = e.add(e.mul(q, e.idx(bsz)), e.idx(o - a + 1));
        Value in = e.andi(e.le(e.idx(0), local), e.lt(local, e.idx(ks)));
        Value pv =
            e.load(s.sS, {r, e.min(e.max(local, e.idx(0)), e.idx(ks - 1))});
        acc = e.fadd(acc, e.sel(in, e.fmul(pv, e.f32(weight(o))), e.f32(0)));
      }
      storePart(acc, r, q);
    });
    return;
  }
  // before[j]: key first - 1 - j (the previous lane's), 0 at the row's
  // first lane (no such key in the chunk).
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
  // The slots past ks / bsz (their keys start in this chunk's last a - 1
  // keys): the row's last lane.
  e.ifThen(e.eq(part, e.idx(rowLanes - 1)), [&] {
    for (int64_t q = ks / bsz; q < slots; ++q)
      storePart(slotSum(q * bsz - (ks - per)), row, e.idx(q));
  });
}

void DecodeBuilder::accumulateChunk(const Split &s, SmallVector<Value> &acc) {
  // 5. O = alpha O + P V; warps split Dv.
  Type bf16 = b.getBF16Type();
  const LaneFragments &f = s.f;
  Value alphaA = e.load(s.stats, {e.idx(2), f.group4});
  Value alphaB = e.load(s.stats, {e.idx(2), e.add(f.group4, e.idx(8))});
  for (int64_t i = 0; i < s.vGroups * 8; ++i)
    acc[i] = e.fmul(acc[i], (i % 4) < 2 ? alphaA : alphaB);
  for (int64_t kk = 0; kk < c.chunkKeys / 16; ++kk) {
    Value pLoaded = nvgpu::LdMatrixOp::create(
        b, loc, VectorType::get({4, 2}, bf16), s.pS,
        ValueRange{f.row16, e.add(e.idx(16 * kk), f.half8)}, false, 4);
    SmallVector<Value, 4> pFrag = unpackLdMatrix(b, loc, pLoaded, 0, 4);
    for (int64_t i = 0; i < s.vGroups; ++i) {
      Value vLoaded = nvgpu::LdMatrixOp::create(
          b, loc, VectorType::get({4, 2}, bf16), s.vS,
          ValueRange{e.add(e.idx(16 * kk), f.row16),
                     e.add(e.mul(vGroupOf(s, i), e.idx(16)), f.half8)},
          true, 4);
      for (int64_t n = 0; n < 2; ++n) {
        SmallVector<Value> cIn(acc.begin() + 8 * i + 4 * n,
                               acc.begin() + 8 * i + 4 * n + 4);
        SmallVector<Value, 4> d = mmaBF16(
            b, loc, pFrag, unpackLdMatrix(b, loc, vLoaded, 2 * n, 2), cIn);
        std::copy(d.begin(), d.end(), acc.begin() + 8 * i + 4 * n);
      }
    }
  }
}

void DecodeBuilder::endSplit(const Split &s, ValueRange acc) {
  // The split's (max, sum) and unnormalized O.
  if (s.keys == DecodeKeys::Selected && !inCluster)
    releaseSuccessor();
  Value splitIndex = e.add(e.mul(s.tileIndex, p.splits), s.outSplit);
  e.barrier();
  // (Every phase waited for: the mbarriers may be initialized again.)
  if (!s.noBulk)
    e.ifThen(e.eq(s.tid, e.idx(0)), [&] {
      for (Value bar : {s.kBar, s.vBar})
        ptx("mbarrier.inval.shared::cta.b64 [$0];", bar, "r");
    });
  bool late = s.keys != DecodeKeys::Compressed;
  if (late)
    stamp(Attended);
  if (inCluster && late && pushMerge()) {
    pushSplit(e.sub(s.outSplit, p.cmpSplits), s.stats,
              SmallVector<Value>(acc), s.warp, s.tid, s.vGroups);
    stamp(Pushed);
    return;
  }
  e.ifThen(e.lt(s.tid, e.idx(16)), [&] {
    Value at = e.add(p.statsAt, e.mul(e.add(e.mul(splitIndex, e.idx(16)),
                                            s.tid),
                                      e.idx(2)));
    storeWork(e.load(s.stats, {e.idx(0), s.tid}), at);
    storeWork(e.load(s.stats, {e.idx(1), s.tid}), e.add(at, e.idx(1)));
  });
  const LaneFragments &f = s.f;
  Value outBase = e.add(p.outAt, e.mul(splitIndex, e.idx(16 * c.vDim)));
  for (int64_t i = 0; i < s.vGroups; ++i) {
    Value owned = e.lt(e.add(s.warp, e.idx(s.warps * i)), e.idx(s.vGroupsAll));
    e.ifThen(owned, [&] {
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t k = 0; k < 4; ++k) {
          Value row = k < 2 ? f.group4 : e.add(f.group4, e.idx(8));
          Value col = e.add(
              e.add(e.mul(vGroupOf(s, i), e.idx(16)), e.idx(8 * n + k % 2)),
              f.pair);
          storeWork(acc[8 * i + 4 * n + k],
                    e.add(outBase, e.add(e.mul(row, e.idx(c.vDim)), col)));
        }
    });
  }
  if (s.keys != DecodeKeys::Selected || inCluster)
    return;
  // The row tile's last selected block to finish (its count of finished
  // splits, made visible to it by the fences) merges the splits and gates
  // the rows.
  auto fence = [&] { e.asmStatement("fence.acq_rel.gpu;", /*memory=*/true); };
  Value flag = view(s.shared, lay.flag, {1}, b.getI32Type());
  fence();
  e.barrier();
  e.ifThen(e.eq(s.tid, e.idx(0)), [&] {
    Value before =
        memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi,
                                    e.i32(1), p.done, ValueRange{s.tileIndex});
    Value last = e.eq(before, e.toI32(e.sub(p.slcSplits, e.idx(1))));
    e.store(e.sel(last, e.i32(1), e.i32(0)), flag, {e.idx(0)});
  });
  e.barrier();
  e.ifThen(e.eq(e.load(flag, {e.idx(0)}), e.i32(1)), [&] {
    fence();
    finalMerge(s.batch, s.tile, s.tileIndex, s.tid);
  });
}
