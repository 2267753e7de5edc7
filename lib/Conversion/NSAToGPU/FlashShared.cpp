//===- FlashShared.cpp - pieces shared by the flash kernel builders ------===//
//
// What the forward kernels (FlashKernel.cpp, BlockMajor.cpp) and the
// gradient kernels (FlashGrad.cpp) build alike: a block's sequence view,
// cp.async row copies, the branches' key intervals, the union of a block's
// selected blocks, and the launches themselves (FlashBuilder.h).
//
//===----------------------------------------------------------------------===//

#include "FlashBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

SequenceView flash::viewSequence(Emit &e, Value q, Value cuSeqlens, Value s,
                                 bool compressed, int64_t l, int64_t d) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  SequenceView v;
  if (!cuSeqlens) {
    v.batch = s;
    v.tokenStart = e.idx(0);
    v.length = memref::DimOp::create(b, loc, q, 1);
    v.cmpStart = e.idx(0);
    return v;
  }
  auto at = [&](Value i) { return e.toIndex(e.load(cuSeqlens, {i})); };
  v.batch = e.idx(0);
  v.tokenStart = at(s);
  v.length = e.sub(at(e.add(s, e.idx(1))), v.tokenStart);
  if (!compressed) {
    v.cmpStart = e.idx(0);
    return v;
  }
  // Spec section 3, packed layout: the compressed rows of earlier sequences
  // come first.
  auto loop = scf::ForOp::create(
      b, loc, e.idx(0), s, e.idx(1), ValueRange{e.idx(0)},
      [&](OpBuilder &, Location, Value i, ValueRange sum) {
        Value n = e.sub(at(e.add(i, e.idx(1))), at(i));
        Value blocks = e.compressedBlocks(n, l, d);
        scf::YieldOp::create(b, loc, ValueRange{e.add(sum[0], blocks)});
      });
  v.cmpStart = loop.getResult(0);
  return v;
}

void flash::copyRowsSwizzledAsync(
    Emit &e, Value tid, int64_t threads, Value batch, Value shared,
    Value offset, int64_t rows, int64_t cols, Value src,
    function_ref<std::pair<Value, Value>(Value r)> rowHead,
    function_ref<Value(Value r)> valid) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // Eight threads a 128-byte row segment, threads / 8 rows a step (a
  // multiple of 8): the rows a thread copies agree modulo 8, so its
  // swizzled chunk is fixed.
  int64_t rowsPerStep = threads / 8;
  Type tokenType = nvgpu::DeviceAsyncTokenType::get(b.getContext());
  auto space = gpu::AddressSpaceAttr::get(
      b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  Value dst = memref::ViewOp::create(
      b, loc,
      MemRefType::get({rows * cols}, b.getBF16Type(), AffineMap(), space),
      shared, offset, ValueRange{});
  Value row0 = e.divs(tid, e.idx(8));
  Value chunk = e.rems(tid, e.idx(8));
  Value swizzled = arith::XOrIOp::create(b, loc, chunk, e.rems(row0, e.idx(8)));
  for (int64_t blk = 0; blk < cols / 64; ++blk) {
    Value col = e.add(e.mul(chunk, e.idx(8)), e.idx(64 * blk));
    Value inRow = e.add(e.idx(blk * rows * 64), e.mul(swizzled, e.idx(8)));
    e.forEach(row0, e.idx(rows), e.idx(rowsPerStep), [&](Value r) {
      auto [row, head] = rowHead(r);
      Value n = valid ? e.sel(valid(r), e.idx(8), e.idx(0)) : Value();
      nvgpu::DeviceAsyncCopyOp::create(
          b, loc, tokenType, dst, ValueRange{e.add(inRow, e.mul(r, e.idx(64)))},
          src, ValueRange{batch, row, head, col}, b.getIndexAttr(8), n,
          b.getUnitAttr());
    });
  }
}

SwizzledShared flash::alignForSwizzle(Emit &e, Value dynamicShared,
                                      int64_t totalBytes) {
  // The swizzle patterns are laid out from a 1024-byte aligned base past
  // the static variables (kStaticSharedBytes).
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value addr =
      memref::ExtractAlignedPointerAsIndexOp::create(b, loc, dynamicShared);
  Value atom = e.idx(kSwizzleAtomBytes);
  Value past = e.add(addr, e.idx(kStaticSharedBytes));
  Value pad = e.add(e.rems(e.sub(atom, e.rems(past, atom)), atom),
                    e.idx(kStaticSharedBytes));
  SwizzledShared out;
  out.address = e.toI32(e.add(addr, pad));
  out.base = memref::ViewOp::create(
      b, loc, dynamicShared.getType(), dynamicShared, pad,
      ValueRange{e.idx(totalBytes - kStaticSharedBytes - kSwizzleAtomBytes)});
  return out;
}

void flash::copyRowsAsync(
    Emit &e, Value tid, int64_t threads, Value batch, Value dst, int64_t rows,
    int64_t cols, Value src,
    function_ref<std::pair<Value, Value>(Value r)> rowHead,
    function_ref<Value(Value r)> valid) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // Each thread copies one 16-byte chunk of a row per step: `perRow`
  // threads a row, the column fixed per thread, the row advancing by a
  // constant (no division per chunk).
  int64_t chunks = cols / 8;
  int64_t perRow = std::min(chunks, threads), rowsPerStep = threads / perRow;
  Type tokenType = nvgpu::DeviceAsyncTokenType::get(b.getContext());
  Value row0 = e.divs(tid, e.idx(perRow));
  Value chunk0 = e.rems(tid, e.idx(perRow));
  for (int64_t c0 = 0; c0 < chunks; c0 += perRow) {
    Value chunk = e.add(chunk0, e.idx(c0));
    Value col = e.mul(chunk, e.idx(8));
    // Threads past the last whole row of a step and chunks past the row
    // stay idle.
    Value active = e.lt(tid, e.idx(rowsPerStep * perRow));
    if (c0 + perRow > chunks)
      active = e.andi(active, e.lt(chunk, e.idx(chunks)));
    e.ifThen(active, [&] {
      e.forEach(row0, e.idx(rows), e.idx(rowsPerStep), [&](Value r) {
        auto [row, head] = rowHead(r);
        Value n = valid ? e.sel(valid(r), e.idx(8), e.idx(0)) : Value();
        nvgpu::DeviceAsyncCopyOp::create(b, loc, tokenType, dst,
                                         ValueRange{r, col}, src,
                                         ValueRange{batch, row, head, col},
                                         b.getIndexAttr(8), n, b.getUnitAttr());
      });
    });
  }
}

BlockUnion flash::buildBlockUnion(Emit &e, Value tid, int64_t threads,
                                  Value indices, Value batch, Value start,
                                  Value len, Value t0, Value h, int64_t tokens,
                                  int64_t n, bool masks, Value cand, Value keep,
                                  Value list) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  int64_t cands = tokens * n;
  Value rows = memref::DimOp::create(b, loc, indices, 1);
  // Every (token, slot) of the block: its block, or -1.
  e.forEach(tid, e.idx(cands), e.idx(threads), [&](Value i) {
    Value tok = e.add(t0, e.divs(i, e.idx(n)));
    Value slot = e.rems(i, e.idx(n));
    Value row = e.min(e.add(start, tok), e.sub(rows, e.idx(1)));
    Value j = e.load(indices, {batch, row, h, slot});
    e.store(e.sel(e.lt(tok, len), j, e.i32(-1)), cand, {i});
  });
  e.barrier();
  // Spec 6: -1 is skipped and a repeated block counts once. keep[i] is 0
  // for a candidate that is skipped, else 1 or (masks) the mask of the
  // block's tokens that chose it (bit k: the block's token k).
  e.forEach(tid, e.idx(cands), e.idx(threads), [&](Value i) {
    Value j = e.load(cand, {i});
    auto scan = scf::ForOp::create(
        b, loc, e.idx(0), masks ? e.idx(cands) : i, e.idx(1),
        ValueRange{e.i32(0), e.i32(0)},
        [&](OpBuilder &, Location, Value p, ValueRange acc) {
          Value same = e.eq(e.load(cand, {p}), j);
          Value seen = same;
          Value who = acc[1];
          if (masks) {
            seen = e.andi(same, e.lt(p, i));
            Value bit = arith::ShLIOp::create(b, loc, e.i32(1),
                                              e.toI32(e.divs(p, e.idx(n))));
            who = e.ori(who, e.sel(same, bit, e.i32(0)));
          }
          scf::YieldOp::create(b, loc,
                               ValueRange{e.sel(seen, e.i32(1), acc[0]), who});
        });
    Value fresh = e.andi(e.eq(scan.getResult(0), e.i32(0)),
                         e.cmp(arith::CmpIPredicate::sge, j, e.i32(0)));
    e.store(e.sel(fresh, masks ? scan.getResult(1) : e.i32(1), e.i32(0)), keep,
            {i});
  });
  e.barrier();
  e.ifThen(e.eq(tid, e.idx(0)), [&] {
    auto compact = scf::ForOp::create(
        b, loc, e.idx(0), e.idx(cands), e.idx(1), ValueRange{e.i32(0)},
        [&](OpBuilder &, Location, Value i, ValueRange count) {
          Value kept =
              e.cmp(arith::CmpIPredicate::ne, e.load(keep, {i}), e.i32(0));
          auto next = scf::IfOp::create(
              b, loc, kept,
              [&](OpBuilder &, Location) {
                e.store(e.load(cand, {i}), list, {e.toIndex(count[0])});
                // In place: keep[count] (count <= i) has been read.
                if (masks)
                  e.store(e.load(keep, {i}), keep, {e.toIndex(count[0])});
                scf::YieldOp::create(b, loc,
                                     ValueRange{e.add(count[0], e.i32(1))});
              },
              [&](OpBuilder &, Location) {
                scf::YieldOp::create(b, loc, count);
              });
          scf::YieldOp::create(b, loc, next.getResults());
        });
    e.store(compact.getResult(0), list, {e.idx(cands)});
  });
  e.barrier();
  return {cand, keep, list, e.toIndex(e.load(list, {e.idx(cands)}))};
}

std::pair<Value, Value> flash::keyInterval(Emit &e, FlashKeys keys,
                                           int64_t window, int64_t l, int64_t d,
                                           Value t) {
  if (keys == FlashKeys::Window)
    return {e.sub(t, e.i32(window - 1)), t};
  assert(keys == FlashKeys::Compressed && "window or compressed keys");
  Value past = e.sub(t, e.i32(l - 1));
  Value hi = e.sel(e.lt(past, e.i32(0)), e.i32(-1), e.divs(past, e.i32(d)));
  return {e.i32(0), hi};
}

Value flash::backboneForced(Emit &e, const spec::Backbone &bb, Value j,
                            Value cBlock) {
  Value back = e.sub(cBlock, j);
  Value forced = e.ori(e.lt(j, e.i32(bb.initial)), e.lt(back, e.i32(bb.local)));
  if (bb.logLevels > 0) {
    // back = 2^i with i < logLevels: a positive power of two below 2^levels.
    Value pow2 = e.eq(e.andi(back, e.sub(back, e.i32(1))), e.i32(0));
    Value inRange = e.andi(e.lt(e.i32(0), back),
                           e.lt(back, e.i32(int64_t(1) << bb.logLevels)));
    forced = e.ori(forced, e.andi(pow2, inRange));
  }
  if (bb.hubStride > 0)
    forced = e.ori(forced, e.eq(e.rems(j, e.i32(bb.hubStride)), e.i32(0)));
  for (int64_t block : bb.blocks)
    forced = e.ori(forced, e.eq(j, e.i32(block)));
  return forced;
}

gpu::LaunchOp flash::launchPerRow(
    OpBuilder &b, Location loc, Value like, int64_t heads, int64_t threads,
    StringRef kernelName,
    function_ref<void(Emit &, Value, Value, Value, Value)> body) {
  Emit e{b, loc};
  Value batches = memref::DimOp::create(b, loc, like, 0);
  Value tokens = memref::DimOp::create(b, loc, like, 1);
  Value rows = e.mul(e.mul(batches, tokens), e.idx(heads));
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch =
      createNamedLaunch(b, loc, {e.ceilDiv(rows, threads), e.idx(1), e.idx(1)},
                        threads, 0, kernelName);
  Value row = e.add(e.mul(launch.getBlockIds().x, e.idx(threads)),
                    launch.getThreadIds().x);
  e.ifThen(e.lt(row, rows), [&] {
    Value head = e.rems(row, e.idx(heads));
    Value bt = e.divs(row, e.idx(heads));
    Value t = e.rems(bt, tokens), batch = e.divs(bt, tokens);
    body(e, batch, t, head, tokens);
  });
  return launch;
}

gpu::LaunchOp flash::createNamedLaunch(OpBuilder &b, Location loc,
                                       ArrayRef<Value> grid, int64_t threads,
                                       int64_t sharedBytes,
                                       StringRef kernelName, int64_t cluster) {
  Value one = arith::ConstantIndexOp::create(b, loc, 1);
  Value clusterX =
      cluster ? arith::ConstantIndexOp::create(b, loc, cluster).getResult()
              : Value();
  auto launch = gpu::LaunchOp::create(
      b, loc, grid[0], grid[1], grid[2],
      arith::ConstantIndexOp::create(b, loc, threads), one, one,
      sharedBytes
          ? arith::ConstantIntOp::create(b, loc, b.getI32Type(), sharedBytes)
                .getResult()
          : Value(),
      /*asyncTokenType=*/nullptr, /*asyncDependencies=*/{},
      /*workgroupAttributions=*/{}, /*privateAttributions=*/{}, clusterX,
      cluster ? one : Value(), cluster ? one : Value());
  // (MLIR 22's builder leaves out the body's cluster ids and sizes, which
  // the parser and getClusterIds put after the 12 others.)
  if (cluster && launch.getBody().front().getNumArguments() < 18)
    for (int i = 0; i < 6; ++i)
      launch.getBody().front().addArgument(b.getIndexType(), loc);
  auto symbol = FlatSymbolRefAttr::get(b.getContext(), kernelName);
  launch.setFunctionAttr(symbol);
  launch.setModuleAttr(symbol);
  b.setInsertionPointToStart(&launch.getBody().front());
  gpu::TerminatorOp::create(b, loc);
  b.setInsertionPointToStart(&launch.getBody().front());
  return launch;
}
