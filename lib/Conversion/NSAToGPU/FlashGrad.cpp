//===- FlashGrad.cpp - flash kernels of the attention gradients -----------===//
//
// nsa.window_attention_grad, nsa.compressed_attention_grad and
// nsa.selected_attention_grad as three launches each (FlashKernel.h,
// FlashGradConfig), FlashAttention-2's backward with dq in a pass of its
// own instead of atomics:
//
//   _delta  a thread per (token, head) row: D = rowsum(grad * output) and
//           lse2 = lse log2(e) (+inf where lse is -inf, so that P = 0)
//   _dq     a block per (query tile, KV head [, head chunk], sequence), its
//           rows the G heads of its tokens as in the forward kernel, Q and
//           dO in shared memory; per key tile of a 2-stage ring (cp.async;
//           sm_90a, TMA: tmaRing):
//             S = Q K^T, dP = dO V^T     mma.sync m16n8k16, fragments by
//                                        ldmatrix
//             P = 2^(S scale log2e - lse2), masked to the row's keys
//             dS = P (dP - D)            rounded to bf16 in registers as A
//             dQ += dS K                 K read by ldmatrix.trans
//           Selected: 16 rows a block (wgmma: 16 or 32), the key tiles the
//           distinct blocks their tokens chose (buildBlockUnion), each tile's
//           keys split over the warps, whose dq are added in warp order at the
//           end (wgmma: the transposes, S^T = K Q^T, dP^T = V dO^T and dq^T
//           += K^T dS^T, dS^T through shared memory; no sums to add).
//   _dkv    a block per (key tile [, chunk of its tokens], KV head,
//           sequence), each warp 16 keys, K and V in shared memory; per
//           step of query rows (the G heads of R / G tokens, with their
//           lse2 and D) of a 2-stage ring:
//             S^T = K Q^T, dP^T = V dO^T
//             P^T and dS^T as above, per column
//             dV += P^T dO, dK += dS^T Q Q and dO read transposed
//           Selected: a key tile is a selection block; its tokens (those
//           after it that chose it) are found by a scan into a queue in
//           shared memory, in token order.
//
// dq and dk take the scale at the end. Every output element is
// accumulated by one thread in a fixed order; chunks of a key tile's
// tokens add their sums in a fixed order too (addInTurn): the same bits on
// every run.
//
// The builder and layout are in FlashGradBuilder.h; selected attention's
// dq kernel and the dk, dv kernel's token queue in FlashGradSelected.cpp.
//
// Fragment layouts are those of FlashKernel.cpp (TensorCore.h): a thread
// holds rows g and g + 8 (g = lane / 4) and columns p, p + 1 (p =
// 2 (lane % 4)) of each 8-column accumulator tile, which packed to bf16 is
// the A operand of the next product.
//
//===----------------------------------------------------------------------===//

#include "FlashGradBuilder.h"

#include "NSA/Transforms/TensorCore.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <cmath>

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;
using namespace mlir::nsa::detail::flash::grad;

void GradBuilder::setUp(gpu::LaunchOp launch, int64_t warps) {
  threads = warps * 32;
  tid = launch.getThreadIds().x;
  warp = e.divs(tid, e.idx(32));
  LaneFragments frag = laneFragments(e, e.rems(tid, e.idx(32)));
  group4 = frag.group4;
  pair = frag.pair;
  row16 = frag.row16;
  half8 = frag.half8;
  row8 = frag.row8;
  k8 = frag.k8;
  auto workgroup = gpu::AddressSpaceAttr::get(
      b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  sharedBase = gpu::DynamicSharedMemoryOp::create(
      b, loc,
      MemRefType::get({ShapedType::kDynamic}, b.getI8Type(), AffineMap(),
                      workgroup));
  if (swizzled) {
    SwizzledShared aligned = alignForSwizzle(e, sharedBase, lay.total);
    sharedBase = aligned.base;
    sharedAddr = aligned.address;
  }
  ringFills = e.idx(0);
  if (tmaRing) {
    ringBars = nvgpu::MBarrierCreateOp::create(
        b, loc, nvgpu::MBarrierGroupType::get(b.getContext(), workgroup, 2));
    e.ifThen(e.eq(tid, e.idx(0)), [&] {
      for (int64_t s = 0; s < 2; ++s)
        nvgpu::MBarrierInitOp::create(b, loc, ringBars, e.idx(1), e.idx(s),
                                      Value());
      fenceBarrierInit(b, loc);
    });
    e.barrier();
  }
  launchZ = launch.getBlockIds().z;
  seq = viewSequence(e, ops.q, ops.cuSeqlens, launchZ,
                     c.keys == FlashKeys::Compressed, c.cmpBlock, c.cmpStride);
  if (c.keys == FlashKeys::Compressed) {
    keyBase = seq.cmpStart;
    keyLimit = e.compressedBlocks(seq.length, c.cmpBlock, c.cmpStride);
  } else {
    keyBase = seq.tokenStart;
    keyLimit = seq.length;
  }
}

Value GradBuilder::view(int64_t offset, Value stage, ArrayRef<int64_t> shape,
                        Type elt) {
  Value at = e.idx(offset);
  if (stage)
    at = e.add(e.add(at, e.idx(lay.ring)), e.mul(stage, e.idx(lay.stageBytes)));
  auto space = gpu::AddressSpaceAttr::get(
      b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  return memref::ViewOp::create(b, loc,
                                MemRefType::get(shape, elt, AffineMap(), space),
                                sharedBase, at, ValueRange{});
}

Value GradBuilder::tile(int64_t offset, Value stage, int64_t rows,
                        int64_t cols) {
  return view(offset, stage, {rows, paddedCols(cols)}, b.getBF16Type());
}

void GradBuilder::copyScalars(
    Value dst, int64_t rows, Value src,
    function_ref<std::pair<Value, Value>(Value r)> rowHead,
    function_ref<Value(Value r)> valid) {
  Type tokenType = nvgpu::DeviceAsyncTokenType::get(b.getContext());
  e.forEach(tid, e.idx(rows), e.idx(threads), [&](Value r) {
    auto [row, head] = rowHead(r);
    nvgpu::DeviceAsyncCopyOp::create(
        b, loc, tokenType, dst, ValueRange{r}, src,
        ValueRange{seq.batch, row, head}, b.getIndexAttr(1),
        e.sel(valid(r), e.idx(1), e.idx(0)), UnitAttr());
  });
}

void GradBuilder::product(Frags &acc, Value aTile, Value aRow0, Value bTile,
                          int64_t kDim, Value bRow0) {
  Type bf16 = b.getBF16Type();
  int64_t tiles = acc.size();
  for (int64_t kk = 0; kk < kDim / 16; ++kk) {
    Value aLoaded = nvgpu::LdMatrixOp::create(
        b, loc, VectorType::get({4, 2}, bf16), aTile,
        ValueRange{e.add(aRow0, row16), e.add(e.idx(16 * kk), half8)}, false,
        4);
    SmallVector<Value, 4> a = unpackLdMatrix(b, loc, aLoaded, 0, 4);
    for (int64_t j = 0; j < tiles; j += 2) {
      bool two = j + 1 < tiles;
      Value nRow = e.add(e.idx(8 * j), row8);
      if (bRow0)
        nRow = e.add(nRow, bRow0);
      if (two)
        nRow = e.add(nRow, half8);
      Value loaded = nvgpu::LdMatrixOp::create(
          b, loc, VectorType::get({two ? 4 : 2, 2}, bf16), bTile,
          ValueRange{nRow, e.add(e.idx(16 * kk), k8)}, false, two ? 4 : 2);
      for (int64_t t = 0; t < (two ? 2 : 1); ++t)
        acc[j + t] = mmaBF16(
            b, loc, a, unpackLdMatrix(b, loc, loaded, 2 * t, 2), acc[j + t]);
    }
  }
}

void GradBuilder::productT(Frags &acc, ArrayRef<SmallVector<Value, 4>> a,
                           Value bTile, Value kRow0) {
  Type bf16 = b.getBF16Type();
  int64_t tiles = acc.size();
  for (auto [m, frag] : llvm::enumerate(a)) {
    Value kRow = e.add(e.idx(16 * static_cast<int64_t>(m)), row16);
    if (kRow0)
      kRow = e.add(kRow, kRow0);
    for (int64_t n = 0; n < tiles; n += 2) {
      bool two = n + 1 < tiles;
      Value loaded = nvgpu::LdMatrixOp::create(
          b, loc, VectorType::get({two ? 4 : 2, 2}, bf16), bTile,
          ValueRange{kRow, e.add(e.idx(8 * n), two ? half8 : e.idx(0))}, true,
          two ? 4 : 2);
      for (int64_t t = 0; t < (two ? 2 : 1); ++t)
        acc[n + t] = mmaBF16(
            b, loc, frag, unpackLdMatrix(b, loc, loaded, 2 * t, 2), acc[n + t]);
    }
  }
}

Frags GradBuilder::pack(const Frags &x) {
  auto pk = [&](Value lo, Value hi) { return truncPackBF16(b, loc, lo, hi); };
  Frags frags;
  for (size_t j = 0; j + 1 < x.size(); j += 2)
    frags.push_back({pk(x[j][0], x[j][1]), pk(x[j][2], x[j][3]),
                     pk(x[j + 1][0], x[j + 1][1]),
                     pk(x[j + 1][2], x[j + 1][3])});
  return frags;
}

std::pair<Value, Value> GradBuilder::gradsOf(Value s, Value dp, Value lse2,
                                             Value delta, Value visible) {
  Value x = e.fsub(e.fmul(s, e.f32(c.scale * M_LOG2E)), lse2);
  if (visible)
    x = e.sel(visible, x, e.f32(-INFINITY));
  Value p = e.ex2(x);
  return {p, e.fmul(p, e.fsub(dp, delta))};
}

void GradBuilder::storeRow(const Frags &acc, int64_t half, Value out, Value row,
                           Value head, double scale) {
  auto pairType = VectorType::get({2}, b.getF32Type());
  SmallVector<Value> values;
  SmallVector<SmallVector<Value, 4>> at;
  for (auto [n, f] : llvm::enumerate(acc)) {
    values.push_back(vector::FromElementsOp::create(
        b, loc, pairType,
        ValueRange{e.fmul(f[2 * half], e.f32(scale)),
                   e.fmul(f[2 * half + 1], e.f32(scale))}));
    at.push_back({seq.batch, row, head,
                  e.add(e.idx(8 * static_cast<int64_t>(n)), pair)});
  }
  storeAll(values, out, at);
}

void GradBuilder::storeAll(ArrayRef<Value> values, Value out,
                           ArrayRef<SmallVector<Value, 4>> at) {
  auto store = [&](Value value, ValueRange where) {
    if (isa<VectorType>(value.getType()))
      vector::StoreOp::create(b, loc, value, out, where);
    else
      e.store(value, out, where);
  };
  if (out != ops.dq || ops.dqTerms.empty()) {
    for (auto [value, where] : llvm::zip_equal(values, at))
      store(value, where);
    return;
  }
  // The branches' sum, in its order, rounded once. The other terms' loads
  // of a batch of stores are issued before its stores: they might alias
  // the output, so a load after a store would wait for the one before it
  // (a round trip to memory a store).
  Type elt = cast<MemRefType>(out.getType()).getElementType();
  constexpr size_t kBatch = 12;
  for (size_t first = 0; first < values.size(); first += kBatch) {
    size_t last = std::min(values.size(), first + kBatch);
    SmallVector<SmallVector<Value>> loaded(last - first);
    for (Value term : ops.dqTerms)
      for (size_t i = first; i < last; ++i) {
        auto vector = dyn_cast<VectorType>(values[i].getType());
        loaded[i - first].push_back(
            !term    ? values[i]
            : vector ? vector::LoadOp::create(b, loc, vector, term, at[i])
                           .getResult()
                     : e.load(term, at[i]));
      }
    for (size_t i = first; i < last; ++i) {
      Value sum;
      for (Value x : loaded[i - first])
        sum = sum ? arith::AddFOp::create(b, loc, sum, x).getResult() : x;
      Type type = values[i].getType();
      if (elt != getElementTypeOrSelf(type))
        sum = arith::TruncFOp::create(
            b, loc,
            isa<VectorType>(type) ? Type(cast<VectorType>(type).clone(elt))
                                  : elt,
            sum);
      store(sum, at[i]);
    }
  }
}

GradBuilder::QueryRows GradBuilder::loadQueryRows(
    int64_t rows, bool warpRows,
    function_ref<std::pair<Value, Value>(Value r)> rowHead,
    function_ref<Value(Value r)> valid) {
  QueryRows out;
  if (swizzled) {
    copyPairSwizzled(e.idx(0), e.idx(lay.second), rows, ops.q, ops.grad,
                     rowHead, valid);
  } else {
    out.q = tile(0, {}, rows, c.qkDim);
    out.dO = tile(lay.second, {}, rows, c.vDim);
    copyRows(out.q, rows, c.qkDim, ops.q, rowHead, valid);
    copyRows(out.dO, rows, c.vDim, ops.grad, rowHead, valid);
  }
  out.row[0] = warpRows ? e.add(e.mul(warp, e.idx(16)), group4) : group4;
  out.row[1] = e.add(out.row[0], e.idx(8));
  for (int64_t half = 0; half < 2; ++half) {
    auto [row, head] = rowHead(out.row[half]);
    Value live = valid(out.row[half]);
    out.lse2[half] =
        e.sel(live, e.load(ops.lse2, {seq.batch, row, head}), e.f32(INFINITY));
    out.delta[half] =
        e.sel(live, e.load(ops.delta, {seq.batch, row, head}), e.f32(0));
  }
  return out;
}

SmallVector<Value> GradBuilder::walkRing(
    Value count, ValueRange init, function_ref<void(Value, Value)> load,
    function_ref<SmallVector<Value>(Value, Value, ValueRange)> body) {
  Value base = ringFills;
  auto stageOf = [&](Value i) { return e.rems(e.add(base, i), e.idx(2)); };
  e.ifThen(e.lt(e.idx(0), count), [&] { load(stageOf(e.idx(0)), e.idx(0)); });
  commit();
  // dq with TMA: the cp.async groups are the resident rows' alone.
  if (tmaRing && !keyMajor)
    waitCopies(0);
  auto loop = scf::ForOp::create(
      b, loc, e.idx(0), count, e.idx(1), init,
      [&](OpBuilder &, Location, Value i, ValueRange state) {
        Value next = e.add(i, e.idx(1));
        e.ifThen(e.lt(next, count), [&] { load(stageOf(next), next); });
        if (!tmaRing || keyMajor)
          waitCopies(1);
        if (tmaRing) {
          // Fill f of the ring is stage f % 2's (f / 2)-th: it completes
          // that stage's phase of parity f / 2 % 2.
          Value fill = e.add(base, i);
          Value parity = arith::TruncIOp::create(
              b, loc, b.getI1Type(),
              e.toI32(e.rems(e.divs(fill, e.idx(2)), e.idx(2))));
          nvgpu::MBarrierTryWaitParityOp::create(
              b, loc, ringBars, parity, e.idx(10000000), stageOf(i));
        }
        SmallVector<Value> out = body(i, stageOf(i), state);
        e.barrier();
        scf::YieldOp::create(b, loc, out);
      });
  ringFills = e.add(base, count);
  return SmallVector<Value>(loop.getResults());
}

void GradBuilder::tmaTiles(Value stage, ArrayRef<Value> starts, Value head,
                           int64_t rows, int64_t heads) {
  auto space = gpu::AddressSpaceAttr::get(
      b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  auto boxType = MemRefType::get({1, rows, heads, 64}, b.getBF16Type(),
                                 AffineMap(), space);
  int64_t boxBytes = rows * heads * kSwizzleRowBytes;
  int64_t blockBytes = boxBytes * static_cast<int64_t>(starts.size());
  assert(boxBytes % kSwizzleAtomBytes == 0 && "boxes of whole swizzle atoms");
  Value first = keyMajor ? ops.qMap : ops.kMap;
  Value second = keyMajor ? ops.gradMap : ops.vMap;
  int64_t boxes = (c.qkDim + c.vDim) / 64;
  Value at = stageAt(stage);
  e.ifThen(e.eq(tid, e.idx(0)), [&] {
    nvgpu::MBarrierArriveExpectTxOp::create(
        b, loc, ringBars, e.idx(boxes * blockBytes), stage, Value());
    // Coordinates innermost first: column, head, row, batch. The second
    // tensor's boxes (V, dO) follow the first's at lay.stageSecond.
    for (int64_t blk = 0; blk < boxes; ++blk) {
      bool value = blk >= c.qkDim / 64;
      int64_t col = value ? blk - c.qkDim / 64 : blk;
      for (auto [k, row] : llvm::enumerate(starts)) {
        int64_t offset = (value ? lay.stageSecond : 0) + col * blockBytes +
                         static_cast<int64_t>(k) * boxBytes;
        Value dst = memref::ViewOp::create(b, loc, boxType, sharedBase,
                                           e.add(at, e.idx(offset)),
                                           ValueRange{});
        nvgpu::TmaAsyncLoadOp::create(
            b, loc, dst, ringBars, value ? second : first,
            ValueRange{e.idx(64 * col), head, row, seq.batch}, stage, Value(),
            Value());
      }
    }
  });
}

void GradBuilder::loadKeys(Value stage, Value k0, int64_t keys, Value h) {
  auto keyRow = [&](Value r) {
    Value key = e.min(e.add(k0, r), e.sub(keyLimit, e.idx(1)));
    return std::make_pair(e.add(keyBase, key), h);
  };
  auto keyValid = [&](Value r) { return e.lt(e.add(k0, r), keyLimit); };
  if (tmaRing) {
    tmaTiles(stage, {e.add(keyBase, k0)}, h, keys, 1);
    return;
  }
  if (swizzled) {
    Value at = stageAt(stage);
    copyPairSwizzled(at, e.add(at, e.idx(lay.stageSecond)), keys, ops.k,
                     ops.v, keyRow, keyValid);
    return;
  }
  copyRows(keyTile(stage, keys), keys, c.qkDim, ops.k, keyRow, keyValid);
  copyRows(valueTile(stage, keys), keys, c.vDim, ops.v, keyRow, keyValid);
}

std::pair<Frags, Frags> GradBuilder::scorePair(Value aFirst, Value aSecond,
                                               int64_t aRows, Value bFirst,
                                               Value bSecond, int64_t n) {
  // All four tiles are K-major; the first k16 step of each chain
  // overwrites its accumulators (scale-d 0).
  SmallVector<Value> acc(n, LLVM::UndefOp::create(b, loc, b.getF32Type()));
  acc = wgmmaFence(b, loc, acc);
  ArrayRef<Value> all(acc);
  SmallVector<Value> s = wgmmaChainSS(
      b, loc, n, descriptorAt(aFirst, 16), aRows, descriptorAt(bFirst, 16), n,
      c.qkDim, all.take_front(n / 2), /*accumulate=*/false,
      /*materializeA=*/false);
  SmallVector<Value> dp = wgmmaChainSS(
      b, loc, n, descriptorAt(aSecond, 16), aRows, descriptorAt(bSecond, 16),
      n, c.vDim, all.drop_front(n / 2), /*accumulate=*/false,
      /*materializeA=*/false);
  wgmmaCommit(b, loc);
  s.append(dp);
  s = wgmmaWait(b, loc, 0, s);
  return {unflatten(s, 0, n / 8), unflatten(s, n / 2, n / 8)};
}

SmallVector<Frags>
GradBuilder::productsWgmma(ArrayRef<RegisterProduct> products, int64_t kRows) {
  // MN-major B: LBO steps between its 64-column blocks (kRows x 128
  // bytes), a k16 step is 16 of its rows.
  SmallVector<Value> pinned;
  for (const RegisterProduct &p : products)
    pinned.append(flatten(p.acc));
  size_t accSize = pinned.size();
  for (const RegisterProduct &p : products)
    pinned.append(flatten(p.a));
  pinned = wgmmaFence(b, loc, pinned);
  ArrayRef<Value> all(pinned);
  SmallVector<Value> out;
  size_t accAt = 0, aAt = accSize;
  for (const RegisterProduct &p : products) {
    size_t accN = 4 * p.acc.size(), aN = 4 * p.a.size();
    SmallVector<Value> acc = wgmmaChainRS(
        b, loc, p.n, all.slice(aAt, aN),
        descriptorAt(p.offset, kRows * kSwizzleRowBytes),
        all.slice(accAt, accN));
    out.append(acc);
    accAt += accN;
    aAt += aN;
  }
  wgmmaCommit(b, loc);
  out = wgmmaWait(b, loc, 0, out);
  SmallVector<Frags> results;
  accAt = 0;
  for (const RegisterProduct &p : products) {
    results.push_back(unflatten(out, accAt, p.acc.size()));
    accAt += 4 * p.acc.size();
  }
  return results;
}

void GradBuilder::buildQueryGrad(gpu::LaunchOp launch) {
  int64_t rows = 16 * c.queryWarps, keys = c.queryKeyTile;
  int64_t heads = std::min(c.group, rows), chunks = c.group / heads;
  int64_t tokensPerBlock = rows / heads;
  setUp(launch, c.queryWarps);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value h = e.divs(ids.y, e.idx(chunks));
  Value headOff = e.add(e.mul(h, e.idx(c.group)),
                        e.mul(e.rems(ids.y, e.idx(chunks)), e.idx(heads)));
  Value len = seq.length, t0 = e.mul(ids.x, e.idx(tokensPerBlock));
  e.ifThen(e.lt(t0, len), [&] {
    Value tEnd = e.min(e.add(t0, e.idx(tokensPerBlock)), len);
    Value lo = e.idx(0), numTiles;
    if (c.keys == FlashKeys::Window) {
      Value first = e.max(e.idx(0), e.sub(t0, e.idx(c.window - 1)));
      lo = e.divs(first, e.idx(keys));
      numTiles = e.sub(e.ceilDiv(tEnd, keys), lo);
    } else {
      numTiles =
          e.ceilDiv(e.compressedBlocks(tEnd, c.cmpBlock, c.cmpStride), keys);
    }
    auto tokenOf = [&](Value r) { return e.add(t0, e.divs(r, e.idx(heads))); };
    auto headOf = [&](Value r) {
      return e.add(headOff, e.rems(r, e.idx(heads)));
    };
    auto rowHead = [&](Value r) {
      Value tok = e.min(tokenOf(r), e.sub(len, e.idx(1)));
      return std::make_pair(e.add(seq.tokenStart, tok), headOf(r));
    };
    auto valid = [&](Value r) { return e.lt(tokenOf(r), len); };
    QueryRows mine = loadQueryRows(rows, /*warpRows=*/true, rowHead, valid);
    Value qS = mine.q, dOS = mine.dO;
    Value *rowOf = mine.row, *lse2 = mine.lse2, *delta = mine.delta;
    auto tileStart = [&](Value kt) {
      return e.mul(e.add(lo, kt), e.idx(keys));
    };
    auto load = [&](Value stage, Value kt) {
      loadKeys(stage, tileStart(kt), keys, h);
    };

    int64_t sTiles = keys / 8, dTiles = c.qkDim / 8;
    SmallVector<Value> walked = walkRing(
        numTiles, flatten(zeros(dTiles)), load,
        [&](Value kt, Value stage, ValueRange state) -> SmallVector<Value> {
          Frags s, dp;
          Value kS;
          if (swizzled) {
            std::tie(s, dp) = scoresWgmma(stage, keys);
          } else {
            kS = keyTile(stage, keys);
            s = zeros(sTiles);
            dp = zeros(sTiles);
            product(s, qS, e.mul(warp, e.idx(16)), kS, c.qkDim);
            product(dp, dOS, e.mul(warp, e.idx(16)), valueTile(stage, keys),
                    c.vDim);
          }
          Value k0 = tileStart(kt);
          Value key0 = e.toI32(e.add(k0, pair));
          // dS as A fragments; masked only where some row of the block
          // does not see the whole tile (a branch uniform over the block).
          auto dsFrags = [&](bool mask) {
            std::pair<Value, Value> iv[2];
            Value tok[2] = {e.toI32(tokenOf(rowOf[0])),
                            e.toI32(tokenOf(rowOf[1]))};
            if (mask)
              for (int64_t half = 0; half < 2; ++half)
                iv[half] = keyInterval(e, c.keys, c.window, c.cmpBlock,
                                       c.cmpStride, tok[half]);
            Frags ds = zeros(sTiles);
            for (int64_t j = 0; j < sTiles; ++j)
              for (int64_t i = 0; i < 4; ++i) {
                int64_t half = i / 2;
                Value visible;
                if (mask) {
                  Value key = e.add(key0, e.i32(8 * j + (i & 1)));
                  visible = e.andi(e.le(iv[half].first, key),
                                   e.le(key, iv[half].second));
                }
                ds[j][i] =
                    gradsOf(s[j][i], dp[j][i], lse2[half], delta[half], visible)
                        .second;
              }
            return flatten(pack(ds));
          };
          SmallVector<Value> results =
              e.ifUnmasked(allVisible(t0, e.sub(tEnd, e.idx(1)), k0,
                                      e.add(k0, e.idx(keys - 1))),
                           dsFrags);
          Frags a = unflatten(results, 0, keys / 16);
          Frags acc = unflatten(state, 0, dTiles);
          if (swizzled)
            return flatten(
                productsWgmma({{acc, a, stageAt(stage), c.qkDim}}, keys)
                    .front());
          productT(acc, a, kS);
          return flatten(acc);
        });

    Frags acc = unflatten(walked, 0, dTiles);
    for (int64_t half = 0; half < 2; ++half)
      e.ifThen(valid(rowOf[half]), [&] {
        auto [row, head] = rowHead(rowOf[half]);
        storeRow(acc, half, ops.dq, row, head, c.scale);
      });
  });
}

SmallVector<Value>
GradBuilder::keySteps(Value numSteps, Value h, Value k0, Value kS, Value vS,
                      function_ref<Value(Value st, Value r)> tokenOf,
                      function_ref<Value(Value st, Value r)> validOf,
                      function_ref<Value(Value st)> wholeStep,
                      function_ref<Value(Value tok, Value key)> sees) {
  int64_t rows = c.keyQueryRows;
  Value len = seq.length;
  Type f32 = b.getF32Type();
  auto queryTile = [&](Value stage) { return tile(0, stage, rows, c.qkDim); };
  auto gradTile = [&](Value stage) {
    return tile(lay.stageSecond, stage, rows, c.vDim);
  };
  auto lseRows = [&](Value stage) {
    return view(lay.stageLse, stage, {rows}, f32);
  };
  auto deltaRows = [&](Value stage) {
    return view(lay.stageDelta, stage, {rows}, f32);
  };
  auto load = [&](Value stage, Value st) {
    auto rowHead = [&](Value r) {
      Value tok = e.min(tokenOf(st, r), e.sub(len, e.idx(1)));
      return std::make_pair(
          e.add(seq.tokenStart, tok),
          e.add(e.mul(h, e.idx(c.group)), e.rems(r, e.idx(c.group))));
    };
    auto valid = [&](Value r) { return validOf(st, r); };
    if (tmaRing) {
      // Rows past the step's tokens load whatever follows (selected: the
      // last token again); none is valid. Selected attention's tokens are
      // a box each.
      int64_t tokens = rows / c.group;
      Value head = e.mul(h, e.idx(c.group));
      auto start = [&](int64_t t) {
        return e.add(seq.tokenStart, tokenOf(st, e.idx(t * c.group)));
      };
      if (c.keys == FlashKeys::Selected) {
        SmallVector<Value> starts;
        for (int64_t t = 0; t < tokens; ++t)
          starts.push_back(start(t));
        tmaTiles(stage, starts, head, 1, c.group);
      } else {
        tmaTiles(stage, {start(0)}, head, tokens, c.group);
      }
    } else if (swizzled) {
      Value at = stageAt(stage);
      copyPairSwizzled(at, e.add(at, e.idx(lay.stageSecond)), rows, ops.q,
                       ops.grad, rowHead, valid);
    } else {
      copyRows(queryTile(stage), rows, c.qkDim, ops.q, rowHead, valid);
      copyRows(gradTile(stage), rows, c.vDim, ops.grad, rowHead, valid);
    }
    copyScalars(lseRows(stage), rows, ops.lse2, rowHead, valid);
    copyScalars(deltaRows(stage), rows, ops.delta, rowHead, valid);
  };

  int64_t sTiles = rows / 8, kTiles = c.qkDim / 8, vTiles = c.vDim / 8;
  Value keyRow0 = e.mul(warp, e.idx(16));
  Value keyA = e.toI32(e.add(e.add(k0, keyRow0), group4));
  Value keyOf[2] = {keyA, e.add(keyA, e.i32(8))};
  SmallVector<Value> walked = walkRing(
      numSteps, stepState, load,
      [&](Value st, Value stage, ValueRange state) -> SmallVector<Value> {
        Value qS, dOS;
        Frags s, dp;
        if (swizzled) {
          std::tie(s, dp) = scoresWgmma(stage, rows);
        } else {
          qS = queryTile(stage);
          dOS = gradTile(stage);
          s = zeros(sTiles);
          dp = zeros(sTiles);
          product(s, kS, keyRow0, qS, c.qkDim);
          product(dp, vS, keyRow0, dOS, c.vDim);
        }
        Value lseS = lseRows(stage), deltaS = deltaRows(stage);
        // P^T and dS^T as A fragments; masked only where some row of the
        // step does not see every key of the block.
        auto fragsOf = [&](bool mask) {
          Frags p = zeros(sTiles), ds = zeros(sTiles);
          for (int64_t j = 0; j < sTiles; ++j)
            for (int64_t odd = 0; odd < 2; ++odd) {
              Value col = e.add(e.idx(8 * j + odd), pair);
              Value lse2 = e.load(lseS, {col});
              Value delta = e.load(deltaS, {col});
              Value tok, live;
              if (mask) {
                tok = tokenOf(st, col);
                live = validOf(st, col);
              }
              for (int64_t half = 0; half < 2; ++half) {
                int64_t i = 2 * half + odd;
                Value visible;
                if (mask)
                  visible = e.andi(live, sees(tok, keyOf[half]));
                std::tie(p[j][i], ds[j][i]) =
                    gradsOf(s[j][i], dp[j][i], lse2, delta, visible);
              }
            }
          SmallVector<Value> out = flatten(pack(p));
          out.append(flatten(pack(ds)));
          return out;
        };
        SmallVector<Value> results = e.ifUnmasked(wholeStep(st), fragsOf);
        Frags pFrags = unflatten(results, 0, rows / 16);
        Frags dsFrags = unflatten(results, rows / 4, rows / 16);
        Frags dk = unflatten(state, 0, kTiles);
        Frags dv = unflatten(state, 4 * kTiles, vTiles);
        if (swizzled) {
          Value at = stageAt(stage);
          SmallVector<Frags> sums = productsWgmma(
              {{dk, dsFrags, at, c.qkDim},
               {dv, pFrags, e.add(at, e.idx(lay.stageSecond)), c.vDim}},
              rows);
          dk = sums[0];
          dv = sums[1];
        } else {
          productT(dv, pFrags, dOS);
          productT(dk, dsFrags, qS);
        }
        SmallVector<Value> out = flatten(dk);
        out.append(flatten(dv));
        return out;
      });
  return walked;
}

void GradBuilder::buildKeyGrad(gpu::LaunchOp launch) {
  bool selected = c.keys == FlashKeys::Selected;
  int64_t keys = 16 * c.keyWarps, rows = c.keyQueryRows;
  int64_t tokensPerStep = rows / c.group;
  setUp(launch, c.keyWarps);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value h = ids.y, len = seq.length;
  // Chunked: block x takes chunk C - 1 - x % C of key block x / C (C = the
  // most chunks a key block has): a key block's last chunks come first.
  Value block = ids.x, chunk = e.idx(0);
  if (c.chunkTokens) {
    Value most =
        e.ceilDiv(memref::DimOp::create(b, loc, ops.q, 1), c.chunkTokens);
    block = e.divs(ids.x, most);
    chunk = e.sub(e.sub(most, e.idx(1)), e.rems(ids.x, most));
  }
  Value k0 = e.mul(block, e.idx(keys));
  Value k1 = e.add(k0, e.idx(keys - 1));
  // The tokens that see some key of [k0, k1]: [tFirst, tLast].
  Value tFirst, tLast;
  if (c.keys == FlashKeys::Window) {
    tFirst = k0;
    tLast = e.min(e.sub(len, e.idx(1)), e.add(k1, e.idx(c.window - 1)));
  } else if (c.keys == FlashKeys::Compressed) {
    tFirst = e.add(e.mul(k0, e.idx(c.cmpStride)), e.idx(c.cmpBlock - 1));
    tLast = e.sub(len, e.idx(1));
  } else {
    tFirst = k0;
    tLast = e.sub(len, e.idx(1));
  }
  Value span = e.max(e.sub(e.add(tLast, e.idx(1)), tFirst), e.idx(0));
  // This block's tokens: a chunk of chunkTokens of them (the first chunk
  // also where there are none).
  Value live = e.lt(k0, keyLimit), turn;
  if (c.chunkTokens) {
    Value chunks = e.max(e.ceilDiv(span, c.chunkTokens), e.idx(1));
    live = e.andi(live, e.lt(chunk, chunks));
    // The chunks add from the last to the first (the block's nearest
    // tokens: for selected attention the most that chose it, the slowest
    // chunk), each after the one launched before it.
    turn = e.sub(e.sub(chunks, e.idx(1)), chunk);
    tFirst = e.add(tFirst, e.mul(chunk, e.idx(c.chunkTokens)));
    tLast = e.min(tLast, e.add(tFirst, e.idx(c.chunkTokens - 1)));
    span = e.max(e.sub(e.add(tLast, e.idx(1)), tFirst), e.idx(0));
  }
  e.ifThen(live, [&] {
    auto keyRow = [&](Value r) {
      Value key = e.min(e.add(k0, r), e.sub(keyLimit, e.idx(1)));
      return std::make_pair(e.add(keyBase, key), h);
    };
    auto keyValid = [&](Value r) { return e.lt(e.add(k0, r), keyLimit); };
    Value kS, vS;
    if (swizzled) {
      copyPairSwizzled(e.idx(0), e.idx(lay.second), keys, ops.k, ops.v,
                       keyRow, keyValid);
    } else {
      kS = tile(0, {}, keys, c.qkDim);
      vS = tile(lay.second, {}, keys, c.vDim);
      copyRows(kS, keys, c.qkDim, ops.k, keyRow, keyValid);
      copyRows(vS, keys, c.vDim, ops.v, keyRow, keyValid);
    }
    int64_t kTiles = c.qkDim / 8, vTiles = c.vDim / 8;
    stepState = flatten(zeros(kTiles));
    stepState.append(flatten(zeros(vTiles)));

    if (!selected) {
      auto stepStart = [&](Value st) {
        return e.add(tFirst, e.mul(st, e.idx(tokensPerStep)));
      };
      auto tokenOf = [&](Value st, Value r) {
        return e.add(stepStart(st), e.divs(r, e.idx(c.group)));
      };
      stepState = keySteps(
          e.ceilDiv(span, tokensPerStep), h, k0, kS, vS, tokenOf,
          [&](Value st, Value r) {
            return e.andi(e.lt(tokenOf(st, r), len),
                          e.le(tokenOf(st, r), tLast));
          },
          [&](Value st) {
            Value tS = stepStart(st);
            Value tE = e.add(tS, e.idx(tokensPerStep - 1));
            return e.andi(allVisible(tS, tE, k0, k1), e.le(tE, tLast));
          },
          [&](Value tok, Value key) {
            auto [lo, hi] = interval(tok);
            return e.andi(e.le(lo, key), e.le(key, hi));
          });
    } else {
      buildSelectedSteps(h, k0, k1, kS, vS, tFirst, tLast);
    }

    if (c.chunkTokens)
      return addInTurn(block, turn, h, k0);
    Frags dk = unflatten(stepState, 0, kTiles);
    Frags dv = unflatten(stepState, 4 * kTiles, vTiles);
    forEachKeyRow(k0, [&](int64_t half, Value row) {
      storeRow(dk, half, ops.dk, row, h, c.scale);
      storeRow(dv, half, ops.dv, row, h, 1.0);
    });
  });
}

void GradBuilder::forEachKeyRow(Value k0,
                                function_ref<void(int64_t, Value)> body) {
  Value keyRow0 = e.mul(warp, e.idx(16));
  for (int64_t half = 0; half < 2; ++half) {
    Value key = e.add(e.add(e.add(k0, keyRow0), group4), e.idx(8 * half));
    e.ifThen(e.lt(key, keyLimit), [&] { body(half, e.add(keyBase, key)); });
  }
}

void GradBuilder::addInTurn(Value block, Value turnIndex, Value h, Value k0) {
  // The turn counter of (sequence, KV head, key block), zero before the
  // launch: the chunk of turn i adds once it reads i, then makes it i + 1.
  // Chunks of a key block are consecutive blocks of the grid, launched in
  // order of their turns, so the one a chunk waits for has started before
  // it: no deadlock. The adds are atomic (at L2, where the earlier chunks'
  // are), their order fixed by the turns: the same sums on every call.
  Value blocks =
      e.ceilDiv(memref::DimOp::create(b, loc, ops.k, 1), 16 * c.keyWarps);
  Value flag =
      e.add(e.mul(e.add(e.mul(launchZ, e.idx(c.kvHeads)), h), blocks), block);
  Value turn = e.toI32(turnIndex);
  auto fence = [&] { e.asmStatement("fence.acq_rel.gpu;", /*memory=*/true); };
  // Without `deterministic` the chunks add as they finish: atomics in any
  // order, no turns.
  if (c.deterministic) {
    e.ifThen(e.eq(tid, e.idx(0)), [&] {
      scf::WhileOp::create(
          b, loc, TypeRange{}, ValueRange{},
          [&](OpBuilder &, Location, ValueRange) {
            Value now = memref::AtomicRMWOp::create(
                b, loc, arith::AtomicRMWKind::addi, e.i32(0), ops.turns,
                ValueRange{flag});
            scf::ConditionOp::create(b, loc,
                                     e.cmp(arith::CmpIPredicate::ne, now, turn),
                                     ValueRange{});
          },
          [&](OpBuilder &, Location, ValueRange) {
            // Back off instead of hammering L2 with atomics.
            e.asmStatement("nanosleep.u32 256;");
            scf::YieldOp::create(b, loc);
          });
      fence();
    });
    e.barrier();
  }
  int64_t kTiles = c.qkDim / 8, vTiles = c.vDim / 8;
  Frags dk = unflatten(stepState, 0, kTiles);
  Frags dv = unflatten(stepState, 4 * kTiles, vTiles);
  forEachKeyRow(k0, [&](int64_t half, Value row) {
    auto add = [&](const Frags &acc, Value out, double scale) {
      for (auto [n, f] : llvm::enumerate(acc))
        for (int64_t i = 0; i < 2; ++i)
          memref::AtomicRMWOp::create(
              b, loc, arith::AtomicRMWKind::addf,
              e.fmul(f[2 * half + i], e.f32(scale)), out,
              ValueRange{seq.batch, row, h,
                         e.add(e.idx(8 * static_cast<int64_t>(n) + i), pair)});
    };
    add(dk, ops.dk, c.scale);
    add(dv, ops.dv, 1.0);
  });
  if (!c.deterministic)
    return;
  fence();
  e.barrier();
  e.ifThen(e.eq(tid, e.idx(0)), [&] {
    memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, e.i32(1),
                                ops.turns, ValueRange{flag});
  });
}


bool mlir::nsa::detail::gradWgmmaFits(const FlashGradConfig &c) {
  return c.qkDim % 64 == 0 && c.vDim % 64 == 0 && c.queryWarps == 4 &&
         c.keyWarps == 4;
}

std::string mlir::nsa::detail::checkFlashGradConfig(const FlashGradConfig &c) {
  auto fail = [](const Twine &why) { return why.str(); };
  if (c.keys != FlashKeys::Window && c.keys != FlashKeys::Compressed &&
      c.keys != FlashKeys::Selected)
    return fail("the gradient kernels take window, compressed and selected "
                "attention");
  if (c.qkDim <= 0 || c.qkDim % 16 || c.vDim <= 0 || c.vDim % 16 ||
      c.qkDim > 256 || c.vDim > 256)
    return fail("Dqk and Dv must be multiples of 16 up to 256, found " +
                Twine(c.qkDim) + " and " + Twine(c.vDim));
  if (c.group <= 0 || 16 % c.group)
    return fail("the group size must divide 16, found " + Twine(c.group));
  if (c.queryWarps < 1 || c.queryWarps > 8 || c.keyWarps < 1 || c.keyWarps > 8)
    return fail("1 to 8 warps per block");
  if (!isFlashTileSize(c.queryKeyTile) || !isFlashTileSize(c.keyQueryRows) ||
      c.keyQueryRows % c.group)
    return fail("key tiles and query steps must be multiples of 16 in "
                "16..128, the steps whole tokens");
  if (c.keys == FlashKeys::Window && c.window < 1)
    return fail("the window must be positive");
  if (c.wgmma && !gradWgmmaFits(c))
    return fail("the wgmma gradient kernels take Dqk and Dv multiples of 64 "
                "and four warps");
  if (c.tma && !c.wgmma)
    return fail("the gradient kernels take their tiles by TMA only with wgmma");
  if (c.chunkTokens < 0 || (c.chunkTokens && c.chunkTokens % 256))
    return fail("chunks of tokens must be a multiple of 256");
  if (c.keys == FlashKeys::Selected &&
      (c.numSlots < 1 || c.slcBlock != 16 * c.keyWarps ||
       c.slcBlock != 16 * c.queryWarps || c.queryKeyTile != c.slcBlock))
    return fail("selected attention's gradient takes blocks of 16 to 128 "
                "keys, one key tile and a warp per 16 keys");
  if (c.keys == FlashKeys::Selected && c.selectedQueryRows != 16 &&
      !(c.selectedQueryRows == 32 && c.wgmma))
    return fail("selected attention's dq takes 16 rows a block, or 32 with "
                "wgmma, found " +
                Twine(c.selectedQueryRows));
  for (bool keyMajor : {false, true})
    if (int64_t bytes = GradLayout(c, keyMajor).total; bytes > kMaxSharedBytes)
      return fail("needs " + Twine(bytes) +
                  " bytes of shared memory, more "
                  "than the " +
                  Twine(kMaxSharedBytes) + " a block can have");
  return "";
}

void mlir::nsa::detail::buildFlashGradKernels(OpBuilder &b, Location loc,
                                              const FlashGradConfig &c,
                                              const FlashGradOperands &ops,
                                              StringRef kernelName) {
  Emit e{b, loc};
  std::string name = kernelName.str();
  buildFlashGradDeltaKernel(b, loc, c, ops, name + "_delta");
  Value tokens = memref::DimOp::create(b, loc, ops.q, 1);
  Value keyRows = memref::DimOp::create(b, loc, ops.k, 1);
  Value sequences =
      ops.cuSeqlens
          ? e.sub(memref::DimOp::create(b, loc, ops.cuSeqlens, 0).getResult(),
                  e.idx(1))
          : memref::DimOp::create(b, loc, ops.q, 0).getResult();
  {
    int64_t rows = c.queryRows();
    int64_t heads = std::min(c.group, rows);
    FlashGradOperands withMaps = ops;
    if (c.tma) {
      int64_t keys =
          c.keys == FlashKeys::Selected ? c.slcBlock : c.queryKeyTile;
      withMaps.kMap = createTileMap(b, loc, ops.k, keys);
      withMaps.vMap = createTileMap(b, loc, ops.v, keys);
    }
    OpBuilder::InsertionGuard guard(b);
    gpu::LaunchOp launch = createNamedLaunch(
        b, loc,
        {e.ceilDiv(tokens, rows / heads), e.idx(c.kvHeads * (c.group / heads)),
         sequences},
        c.queryWarps * 32, GradLayout(c, false).total, name + "_dq");
    GradBuilder builder(b, loc, c, withMaps, false);
    if (c.keys == FlashKeys::Selected)
      builder.buildSelectedQueryGrad(launch);
    else
      builder.buildQueryGrad(launch);
  }
  Value gridX = e.ceilDiv(keyRows, 16 * c.keyWarps);
  if (c.chunkTokens)
    gridX = e.mul(gridX, e.ceilDiv(tokens, c.chunkTokens));
  FlashGradOperands withMaps = ops;
  bool selected = c.keys == FlashKeys::Selected;
  if (c.tma && (!selected || selectedRowsByTma(c))) {
    // Boxes of a step's tokens; selected, of one token.
    int64_t tokens = selected ? 1 : c.keyQueryRows / c.group;
    withMaps.qMap = createTileMap(b, loc, ops.q, tokens, c.group);
    withMaps.gradMap = createTileMap(b, loc, ops.grad, tokens, c.group);
  }
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch = createNamedLaunch(
      b, loc, {gridX, e.idx(c.kvHeads), sequences}, c.keyWarps * 32,
      GradLayout(c, true).total, name + "_dkv");
  GradBuilder(b, loc, c, withMaps, true).buildKeyGrad(launch);
}
