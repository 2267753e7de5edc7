//===- FlashGradSelected.cpp - selected attention's gradient kernels -----===//
//
// The parts of the gradient kernels (FlashGrad.cpp) that only selected
// attention has: its dq kernel, 16 or 32 rows a block walking the distinct
// blocks their tokens chose (mma.sync, or by wgmma through the transposed
// products), and the dk, dv kernel's token queue (the tokens after a
// block that chose it, in token order).
//
//===----------------------------------------------------------------------===//

#include "FlashGradBuilder.h"

#include "NSA/Transforms/TensorCore.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <array>
#include <cmath>

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;
using namespace mlir::nsa::detail::flash::grad;

void GradBuilder::buildSelectedQueryGrad(gpu::LaunchOp launch) {
  // 16 rows (the G heads of 16 / G tokens; wgmma: queryRows) a block,
  // whose warps split each selection block's keys, 16 each (mma.sync: and
  // add their dq in turn at the end).
  int64_t warps = c.queryWarps, keys = c.slcBlock, heads = c.group;
  int64_t tokensPerBlock = c.queryRows() / heads;
  setUp(launch, warps);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value h = ids.y, headOff = e.mul(h, e.idx(c.group));
  Value len = seq.length, t0 = e.mul(ids.x, e.idx(tokensPerBlock));
  e.ifThen(e.lt(t0, len), [&] {
    // The distinct blocks the block's tokens chose, with the mask of the
    // tokens that chose each.
    int64_t cands = tokensPerBlock * c.numSlots;
    Type i32 = b.getI32Type(), f32 = b.getF32Type();
    BlockUnion chosen = buildBlockUnion(
        e, tid, threads, ops.indices, seq.batch, seq.tokenStart, len, t0, h,
        tokensPerBlock, c.numSlots, /*masks=*/true,
        view(lay.unionOffset, {}, {cands}, i32),
        view(lay.unionOffset + 4 * cands, {}, {cands}, i32),
        view(lay.unionOffset + 8 * cands, {}, {cands + 1}, i32));
    Value numTiles = chosen.length;
    assert((swizzled || c.queryRows() == 16) &&
           "the mma.sync selected dq kernel takes 16 rows");
    auto tokenOf = [&](Value r) { return e.add(t0, e.divs(r, e.idx(heads))); };
    auto rowHead = [&](Value r) {
      Value tok = e.min(tokenOf(r), e.sub(len, e.idx(1)));
      return std::make_pair(e.add(seq.tokenStart, tok),
                            e.add(headOff, e.rems(r, e.idx(heads))));
    };
    auto valid = [&](Value r) { return e.lt(tokenOf(r), len); };
    auto tileStart = [&](Value kt) {
      return e.mul(e.toIndex(e.load(chosen.list, {kt})), e.idx(keys));
    };
    auto load = [&](Value stage, Value kt) {
      loadKeys(stage, tileStart(kt), keys, h);
    };
    if (swizzled) {
      selectedQueryWgmma(chosen, tokenOf, rowHead, valid, load, tileStart);
      return;
    }
    // Every warp holds the block's 16 rows.
    QueryRows mine = loadQueryRows(16, /*warpRows=*/false, rowHead, valid);
    Value qS = mine.q, dOS = mine.dO;
    Value *rowOf = mine.row, *lse2 = mine.lse2, *delta = mine.delta;

    Value keyW0 = e.mul(warp, e.idx(16));
    Value allTokens = e.i32((int64_t{1} << tokensPerBlock) - 1);
    int64_t dTiles = c.qkDim / 8;
    Value tok[2] = {e.toI32(tokenOf(rowOf[0])), e.toI32(tokenOf(rowOf[1]))};
    SmallVector<Value> walked = walkRing(
        numTiles, flatten(zeros(dTiles)), load,
        [&](Value kt, Value stage, ValueRange state) -> SmallVector<Value> {
          Value kS = keyTile(stage, keys);
          Value k0 = tileStart(kt);
          Value who = e.load(chosen.keep, {kt});
          Frags s = zeros(2), dp = zeros(2);
          product(s, qS, e.idx(0), kS, c.qkDim, keyW0);
          product(dp, dOS, e.idx(0), valueTile(stage, keys), c.vDim, keyW0);
          Value key0 = e.toI32(e.add(e.add(k0, keyW0), pair));
          // dS of this warp's 16 keys; masked unless every token chose the
          // block and sees all of it.
          auto dsFrags = [&](bool mask) {
            Value mine[2];
            for (int64_t half = 0; half < 2 && mask; ++half) {
              Value bit = arith::ShRUIOp::create(
                  b, loc, who, e.toI32(e.divs(rowOf[half], e.idx(heads))));
              mine[half] = e.eq(e.andi(bit, e.i32(1)), e.i32(1));
            }
            Frags ds = zeros(2);
            for (int64_t j = 0; j < 2; ++j)
              for (int64_t i = 0; i < 4; ++i) {
                int64_t half = i / 2;
                Value visible;
                if (mask) {
                  Value key = e.add(key0, e.i32(8 * j + (i & 1)));
                  visible = e.andi(mine[half], e.le(key, tok[half]));
                }
                ds[j][i] =
                    gradsOf(s[j][i], dp[j][i], lse2[half], delta[half], visible)
                        .second;
              }
            return flatten(pack(ds));
          };
          Value whole = e.andi(e.eq(who, allTokens),
                               e.le(e.add(k0, e.idx(keys - 1)), t0));
          SmallVector<Value> results = e.ifUnmasked(whole, dsFrags);
          Frags a = unflatten(results, 0, 1);
          Frags acc = unflatten(state, 0, dTiles);
          productT(acc, a, kS, keyW0);
          return flatten(acc);
        });

    // The warps' sums, added in warp order by warp 0 (the ring is free).
    Frags acc = unflatten(walked, 0, dTiles);
    Value partial =
        view(lay.ring, {}, {std::max<int64_t>(warps - 1, 1), 16, c.qkDim}, f32);
    auto at = [&](int64_t half, int64_t n, int64_t i) {
      return e.add(e.idx(8 * n + i), pair);
    };
    e.ifThen(e.lt(e.idx(0), warp), [&] {
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t n = 0; n < dTiles; ++n)
          for (int64_t i = 0; i < 2; ++i)
            e.store(acc[n][2 * half + i], partial,
                    {e.sub(warp, e.idx(1)), rowOf[half], at(half, n, i)});
    });
    e.barrier();
    e.ifThen(e.eq(warp, e.idx(0)), [&] {
      Frags sum = acc;
      for (int64_t w = 1; w < warps; ++w)
        for (int64_t half = 0; half < 2; ++half)
          for (int64_t n = 0; n < dTiles; ++n)
            for (int64_t i = 0; i < 2; ++i)
              sum[n][2 * half + i] = e.fadd(
                  sum[n][2 * half + i],
                  e.load(partial, {e.idx(w - 1), rowOf[half], at(half, n, i)}));
      for (int64_t half = 0; half < 2; ++half)
        e.ifThen(valid(rowOf[half]), [&] {
          auto [row, head] = rowHead(rowOf[half]);
          storeRow(sum, half, ops.dq, row, head, c.scale);
        });
    });
  });
}

void GradBuilder::selectedQueryWgmma(
    const BlockUnion &chosen, function_ref<Value(Value r)> tokenOf,
    function_ref<std::pair<Value, Value>(Value r)> rowHead,
    function_ref<Value(Value r)> valid,
    function_ref<void(Value stage, Value kt)> load,
    function_ref<Value(Value kt)> tileStart) {
  // The transposed products, M the block's 64 keys (16 a warp) and N the
  // block's rows (16 or 32): S^T = K Q^T and dP^T = V dO^T from shared
  // memory; dS^T, rounded to bf16, into shared memory as the K-major B of
  // dq^T += K^T dS^T, whose A is the key tile read M-major. A thread holds
  // keys 16 warp + g (+ 8) and rows 8 j + p, 8 j + p + 1 (j < rows / 8)
  // of each product, and of dq^T the columns 16 warp + g (+ 8) of each 64
  // and the same rows.
  int64_t rows = c.queryRows(), keys = c.slcBlock, heads = c.group;
  int64_t mTiles = c.qkDim / 64, chunks = rows / 8, perTile = rows / 2;
  assert(keys == 64 && "a wgmma block of selected keys is one swizzled block");
  Type bf16 = b.getBF16Type();
  copyPairSwizzled(e.idx(0), e.idx(lay.second), rows, ops.q, ops.grad,
                   rowHead, valid);
  Value numTiles = chosen.length;

  // This thread's rows (j, odd: row 8 j + p + odd), their lse2 (+inf past
  // the sequence: P = 0), D, token and bit in the union's masks.
  using Pair = std::array<Value, 2>;
  SmallVector<Pair> rowOf(chunks), lse2(chunks), delta(chunks), tok(chunks),
      bit(chunks);
  for (int64_t j = 0; j < chunks; ++j)
    for (int64_t odd = 0; odd < 2; ++odd) {
      Value r = e.add(e.idx(8 * j + odd), pair);
      auto [row, head] = rowHead(r);
      Value live = valid(r);
      rowOf[j][odd] = r;
      lse2[j][odd] = e.sel(live, e.load(ops.lse2, {seq.batch, row, head}),
                           e.f32(INFINITY));
      delta[j][odd] =
          e.sel(live, e.load(ops.delta, {seq.batch, row, head}), e.f32(0));
      tok[j][odd] = e.toI32(tokenOf(r));
      bit[j][odd] = e.toI32(e.divs(r, e.idx(heads)));
    }
  Value keyRow = e.add(e.mul(warp, e.idx(16)), group4);
  Value t0 = tokenOf(e.idx(0));
  Value allTokens = e.i32(static_cast<int32_t>(
      static_cast<uint32_t>((uint64_t{1} << (rows / heads)) - 1)));
  Value dsTile = view(lay.dsOffset, {}, {rows * keys}, bf16);
  // Where dS^T of (key keyRow + 8 half, row 8 j + p + odd) goes: row-major
  // [row][key], chunk (key / 8) ^ (row % 8) of the 128-byte row.
  SmallVector<std::array<Pair, 2>> dsAt(chunks);
  for (int64_t j = 0; j < chunks; ++j)
    for (int64_t odd = 0; odd < 2; ++odd)
      for (int64_t half = 0; half < 2; ++half) {
        Value chunk = arith::XOrIOp::create(
            b, loc, e.add(e.mul(warp, e.idx(2)), e.idx(half)),
            e.add(pair, e.idx(odd)));
        dsAt[j][odd][half] =
            e.add(e.add(e.mul(rowOf[j][odd], e.idx(keys)),
                        e.mul(chunk, e.idx(8))),
                  group4);
      }

  SmallVector<Value> walked = walkRing(
      numTiles, flatten(zeros(chunks * mTiles)), load,
      [&](Value kt, Value stage, ValueRange state) -> SmallVector<Value> {
        Value at = stageAt(stage);
        auto [s, dp] = scorePair(at, e.add(at, e.idx(lay.stageSecond)), keys,
                                 e.idx(0), e.idx(lay.second), rows);
        Value k0 = tileStart(kt);
        Value who = e.load(chosen.keep, {kt});
        Value key = e.toI32(e.add(k0, keyRow));
        // Masked unless every token chose the block and sees all of it.
        auto dsOf = [&](bool mask) {
          Frags ds = zeros(chunks);
          for (int64_t j = 0; j < chunks; ++j)
            for (int64_t i = 0; i < 4; ++i) {
              int64_t half = i / 2, odd = i & 1;
              Value visible;
              if (mask) {
                Value chose = e.andi(
                    arith::ShRUIOp::create(b, loc, who, bit[j][odd]),
                    e.i32(1));
                visible =
                    e.andi(e.eq(chose, e.i32(1)),
                           e.le(e.add(key, e.i32(8 * half)), tok[j][odd]));
              }
              ds[j][i] = gradsOf(s[j][i], dp[j][i], lse2[j][odd],
                                 delta[j][odd], visible)
                             .second;
            }
          return flatten(ds);
        };
        Value whole = e.andi(e.eq(who, allTokens),
                             e.le(e.add(k0, e.idx(keys - 1)), t0));
        Frags ds = unflatten(e.ifUnmasked(whole, dsOf), 0, chunks);
        for (int64_t j = 0; j < chunks; ++j)
          for (int64_t i = 0; i < 4; ++i)
            memref::StoreOp::create(
                b, loc, arith::TruncFOp::create(b, loc, bf16, ds[j][i]),
                dsTile, ValueRange{dsAt[j][i & 1][i / 2]});
        fenceProxyAsync(b, loc);
        e.barrier();

        // dq^T += K^T dS^T: per 64 columns of dq, keys / 16 k16 steps (16
        // rows of the key tile, 32 bytes of the dS^T rows).
        SmallVector<Value> acc = wgmmaFence(b, loc, state);
        WgmmaDesc keyT = descriptorAt(at, keys * kSwizzleRowBytes);
        WgmmaDesc dsB = descriptorAt(e.idx(lay.dsOffset), 16);
        SmallVector<Value> out;
        for (int64_t mt = 0; mt < mTiles; ++mt) {
          SmallVector<Value> part(acc.begin() + perTile * mt,
                                  acc.begin() + perTile * (mt + 1));
          for (int64_t kk = 0; kk < keys / 16; ++kk)
            part = wgmmaSS(
                b, loc, rows,
                wgmmaMaterialize(
                    b, loc,
                    wgmmaAdvance(keyT, (mt * keys + 16 * kk) *
                                           kSwizzleRowBytes)),
                wgmmaAdvance(dsB, 32 * kk), part, /*accumulate=*/true,
                /*transA=*/true);
          out.append(part);
        }
        wgmmaCommit(b, loc);
        return wgmmaWait(b, loc, 0, out);
      });

  // dq of row 8 j + p + odd, column 64 mt + keyRow + 8 half: element
  // 4 j + 2 half + odd of m-tile mt.
  for (int64_t j = 0; j < chunks; ++j)
    for (int64_t odd = 0; odd < 2; ++odd)
      e.ifThen(valid(rowOf[j][odd]), [&] {
        auto [row, head] = rowHead(rowOf[j][odd]);
        SmallVector<Value> values;
        SmallVector<SmallVector<Value, 4>> at;
        for (int64_t mt = 0; mt < mTiles; ++mt)
          for (int64_t half = 0; half < 2; ++half) {
            values.push_back(e.fmul(
                walked[perTile * mt + 4 * j + 2 * half + odd], e.f32(c.scale)));
            at.push_back({seq.batch, row, head,
                          e.add(keyRow, e.idx(64 * mt + 8 * half))});
          }
        storeAll(values, ops.dq, at);
      });
}

void GradBuilder::buildSelectedSteps(Value h, Value k0, Value k1, Value kS,
                                     Value vS, Value from, Value to) {
  // Block j = k0 / l' of KV head h: its query tokens are those t >= k0 that
  // chose it (Spec section 6), walked in increasing t, so that every key's
  // sum runs in the same order on every call. The tokens are found by
  // scanning chunks of `threads` tokens into a queue in shared memory
  // (per warp a prefix sum by shuffles, then the warps in order); a full
  // queue, or the last chunk, is walked in steps of R / G tokens, and a
  // partial step's tokens stay at the queue's front.
  int64_t tokensPerStep = c.keyQueryRows / c.group, n = c.numSlots;
  int64_t capacity = kSelectedQueue, warps = threads / 32;
  Type i32 = b.getI32Type();
  Value queue = view(lay.queueOffset, {}, {capacity}, i32);
  Value warpCounts = view(lay.queueOffset + 4 * capacity, {}, {warps}, i32);
  Value j = e.toI32(e.divs(k0, e.idx(c.slcBlock)));
  Value chunks = e.ceilDiv(e.sub(e.add(to, e.idx(1)), from), threads);
  Value rows = memref::DimOp::create(b, loc, ops.indices, 1);
  Value lane = e.rems(tid, e.idx(32));
  // The carried state: the queue's length, the ring's fills and the sums.
  SmallVector<Value> init = {e.idx(0), ringFills};
  init.append(stepState);
  auto loop = scf::ForOp::create(
      b, loc, e.idx(0), chunks, e.idx(1), init,
      [&](OpBuilder &, Location, Value chunk, ValueRange state) {
        Value count = state[0];
        ringFills = state[1];
        Value t = e.add(e.add(from, e.mul(chunk, e.idx(threads))), tid);
        Value row = e.min(e.add(seq.tokenStart, t), e.sub(rows, e.idx(1)));
        // The token's slots, 16 bytes a load where they come in fours.
        Value chose = e.eq(e.i32(0), e.i32(1));
        int64_t width = n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1;
        auto vecType = VectorType::get({width}, i32);
        Value want = vector::BroadcastOp::create(b, loc, vecType, j);
        for (int64_t slot = 0; slot < n; slot += width) {
          Value got = vector::LoadOp::create(
              b, loc, vecType, ops.indices,
              ValueRange{seq.batch, row, h, e.idx(slot)},
              /*nontemporal=*/false, llvm::MaybeAlign(4 * width));
          Value same = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                             got, want);
          chose = e.ori(chose, vector::ReductionOp::create(
                                   b, loc, vector::CombiningKind::OR, same));
        }
        chose = e.andi(chose, e.le(t, to));
        // The warp's inclusive prefix sum of its flags.
        Value flag = e.sel(chose, e.i32(1), e.i32(0));
        Value sum = flag;
        for (int32_t off = 1; off < 32; off *= 2) {
          Value up =
              gpu::ShuffleOp::create(b, loc, sum, off, 32, gpu::ShuffleMode::UP)
                  .getShuffleResult();
          sum = e.sel(e.le(e.idx(off), lane), e.add(sum, up), sum);
        }
        e.ifThen(e.eq(lane, e.idx(31)),
                 [&] { e.store(sum, warpCounts, {warp}); });
        e.barrier();
        Value before = e.i32(0), total = e.i32(0);
        for (int64_t w = 0; w < warps; ++w) {
          Value cw = e.load(warpCounts, {e.idx(w)});
          before = e.add(before, e.sel(e.lt(e.idx(w), warp), cw, e.i32(0)));
          total = e.add(total, cw);
        }
        e.ifThen(chose, [&] {
          Value at = e.add(count, e.toIndex(e.sub(e.add(before, sum), flag)));
          e.store(e.toI32(t), queue, {at});
        });
        e.barrier();
        Value filled = e.add(count, e.toIndex(total));
        Value last = e.eq(chunk, e.sub(chunks, e.idx(1)));
        Value walk = e.ori(last, e.lt(e.idx(capacity - threads), filled));
        SmallVector<Value> carried(state.begin() + 2, state.end());
        auto ifOp = scf::IfOp::create(
            b, loc, walk,
            [&](OpBuilder &, Location) {
              Value full = e.mul(e.divs(filled, e.idx(tokensPerStep)),
                                 e.idx(tokensPerStep));
              Value steps = e.sel(last, e.ceilDiv(filled, tokensPerStep),
                                  e.divs(filled, e.idx(tokensPerStep)));
              auto at = [&](Value st, Value r) {
                return e.add(e.mul(st, e.idx(tokensPerStep)),
                             e.divs(r, e.idx(c.group)));
              };
              auto tokenOf = [&](Value st, Value r) {
                Value i = e.min(at(st, r), e.sub(filled, e.idx(1)));
                return e.toIndex(e.load(queue, {i}));
              };
              stepState = carried;
              SmallVector<Value> acc = keySteps(
                  steps, h, k0, kS, vS, tokenOf,
                  [&](Value st, Value r) { return e.lt(at(st, r), filled); },
                  [&](Value st) {
                    // Whole steps whose first (smallest) token sees k1.
                    Value end =
                        e.mul(e.add(st, e.idx(1)), e.idx(tokensPerStep));
                    Value first = e.toIndex(
                        e.load(queue, {e.mul(st, e.idx(tokensPerStep))}));
                    return e.andi(e.le(end, filled), e.le(k1, first));
                  },
                  [&](Value tok, Value key) {
                    return e.le(key, e.toI32(tok));
                  });
              // The partial step's tokens (not after the last chunk) to
              // the front.
              Value rest = e.sel(last, e.idx(0), e.sub(filled, full));
              Value from = e.min(e.add(full, tid), e.idx(capacity - 1));
              Value moving = e.load(queue, {from});
              e.barrier();
              e.ifThen(e.lt(tid, rest), [&] { e.store(moving, queue, {tid}); });
              e.barrier();
              SmallVector<Value> out = {rest, ringFills};
              out.append(acc);
              scf::YieldOp::create(b, loc, out);
            },
            [&](OpBuilder &, Location) {
              SmallVector<Value> out = {filled, state[1]};
              out.append(carried);
              scf::YieldOp::create(b, loc, out);
            });
        scf::YieldOp::create(b, loc, ifOp.getResults());
      });
  ringFills = loop.getResult(1);
  stepState.assign(loop.getResults().begin() + 2, loop.getResults().end());
}
