//===- FlashDecode.cpp - split-K kernels of a decoding step --------------===//
//
// nsa-flash-attention's kernels for a decoding step (FlashDecode.h): the
// branch ops with `kv_lens` of one nsa.sparse_attention_decode and their
// combine become four launches whose blocks each walk a split of a
// branch's keys, so that a step at B = 1 still fills the GPU.
//
// A split is `cps` chunks of `chunkKeys` keys (cps chosen on the host from
// B, Lmax and the row tiles so that the launches come near targetBlocks
// blocks). A block holds the 16 (token, head) rows of one row tile (one
// token's G heads) as mma.sync fragments and, per chunk:
//   1. lists the chunk's keys (their rows in the caches and whether the
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
// The split's (max, sum) and unnormalized O go to a workspace that the
// select and merge kernels read.
//
//===----------------------------------------------------------------------===//

#include "FlashDecode.h"

#include "FlashBuilder.h"

#include "../../Transforms/TensorCore.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <cmath>

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

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
  return "";
}

namespace {

/// Which keys a partial block walks.
enum class DecodeKeys { Compressed, Window, Selected };

/// Spans of candidate blocks per (batch row, token, KV head): their best n
/// each, at most kMaxSpans * n, are ranked again by the selected kernel.
constexpr int64_t kMaxSpans = 16;

/// lg2.approx.ftz.f32.
Value lg2(Emit &e, Value x) {
  return LLVM::InlineAsmOp::create(
             e.b, e.loc, e.b.getF32Type(), ValueRange{x},
             e.b.getStringAttr("lg2.approx.ftz.f32 $0, $1;"),
             e.b.getStringAttr("=f,f"), UnitAttr(), UnitAttr(),
             LLVM::TailCallKindAttr::get(
                 e.b.getContext(), LLVM::tailcallkind::TailCallKind::None),
             LLVM::AsmDialectAttr(), ArrayAttr())
      .getResult(0);
}

Value isNegInf(Emit &e, Value x) {
  return e.fcmp(arith::CmpFPredicate::OEQ, x, e.f32(-INFINITY));
}

/// Whether candidate (score s, block j) ranks before (s2, j2) in top-n
/// (Spec 5.4: higher scores first, ties to the lower block; f32 blocks).
Value ranksBefore(Emit &e, Value s, Value j, Value s2, Value j2) {
  return e.ori(e.fcmp(arith::CmpFPredicate::OGT, s, s2),
               e.andi(e.fcmp(arith::CmpFPredicate::OEQ, s, s2),
                      e.fcmp(arith::CmpFPredicate::OLT, j, j2)));
}

/// The host's choices and the workspace of one step; every value is an
/// index on the host, captured by the launches.
struct Plan {
  Value batch, cacheTokens, cmpRows;
  Value cmpChunks, perSplit, cmpSplits, winSplits, slcSplits, splits;
  /// Selection blocks of Lmax, the candidates a select block ranks (a
  /// span) and the spans (at most kMaxSpans).
  Value numBlocks, span, spans;
  /// f32 workspace and its regions' offsets (elements): per span its best
  /// n (score, block) pairs, the block an f32 (exact below 2^24), -1 none.
  Value work, statsAt, outAt, refAt, partAt, candAt;
};

/// Byte offsets of a partial block's shared memory.
struct PartialLayout {
  int64_t qStride, kStride, vStride, pStride, sStride;
  int64_t q, k, v, p, s, stats, keys, cand, chosen, total;
  explicit PartialLayout(const DecodeConfig &c) {
    int64_t n = c.chunkKeys;
    qStride = kStride = paddedCols(c.qkDim);
    vStride = paddedCols(c.vDim);
    pStride = paddedCols(n);
    sStride = n + 4;
    q = 0;
    k = alignUp(q + 16 * qStride * 2, 16);
    v = alignUp(k + n * kStride * 2, 16);
    p = alignUp(v + n * vStride * 2, 16);
    s = alignUp(p + 16 * pStride * 2, 16);
    stats = alignUp(s + 16 * sStride * 4, 16);
    keys = alignUp(stats + 16 * 3 * 4, 16);
    // Selected attention: the spans' candidates (score, block), then the
    // n chosen blocks in rank order.
    cand = alignUp(keys + 2 * n * 2 * 4, 16);
    chosen = alignUp(cand + kMaxSpans * c.numSelected * 2 * 4, 16);
    total = alignUp(chosen + c.numSelected * 4, 16);
  }
};

class DecodeBuilder {
public:
  DecodeBuilder(OpBuilder &b, Location loc, const DecodeConfig &c,
                const DecodeOperands &ops)
      : e{b, loc}, b(b), loc(loc), c(c), ops(ops), lay(c) {}

  void build(StringRef name) {
    plan();
    // (The first launch's predecessor is not one of these: it waits too,
    // for the compressed caches' appends.)
    std::string pdl = c.gridDeps ? "_pdl" : "";
    buildPartialLaunch(name.str() + "_partial" + pdl, /*selected=*/false);
    buildSelectLaunch(name.str() + "_select" + pdl);
    buildPartialLaunch(name.str() + "_selected" + pdl, /*selected=*/true);
    buildMergeLaunch(name.str() + "_merge" + pdl);
  }

private:
  Emit e;
  OpBuilder &b;
  Location loc;
  const DecodeConfig &c;
  const DecodeOperands &ops;
  PartialLayout lay;
  Plan p;

  int64_t qHeads() const { return c.kvHeads * c.group; }
  /// Threads of a partial block: a warp per 16 keys of a chunk (S), so
  /// 256 for 128-key chunks; each row's softmax takes threads / 16 lanes.
  int64_t partialThreads() const { return c.chunkKeys * 2; }
  int64_t subPerSlc() const { return c.slcBlock / c.cmpStride; }
  int64_t subPerCmp() const { return c.cmpBlock / c.cmpStride; }
  int64_t winChunks() const {
    return (c.window + c.chunkKeys - 1) / c.chunkKeys;
  }
  int64_t slcChunks() const {
    return (c.numSelected * c.slcBlock + c.chunkKeys - 1) / c.chunkKeys;
  }

  Value dim(Value memref, int64_t d) {
    return memref::DimOp::create(b, loc, memref, d);
  }
  Value view(Value base, int64_t byteOffset, ArrayRef<int64_t> shape,
             Type elt) {
    auto space = gpu::AddressSpaceAttr::get(
        b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
    return memref::ViewOp::create(
        b, loc, MemRefType::get(shape, elt, AffineMap(), space), base,
        e.idx(byteOffset), ValueRange{});
  }
  Value sharedBytes() {
    auto workgroup = gpu::AddressSpaceAttr::get(
        b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
    return gpu::DynamicSharedMemoryOp::create(
        b, loc,
        MemRefType::get({ShapedType::kDynamic}, b.getI8Type(), AffineMap(),
                        workgroup));
  }
  /// griddepcontrol.wait (with gridDeps): what the launches before this
  /// one wrote is visible after it. Every block must reach it.
  void waitForPredecessor() {
    if (c.gridDeps)
      NVVM::GriddepcontrolOp::create(b, loc, NVVM::GridDepActionKind::wait);
  }
  /// griddepcontrol.launch_dependents (with gridDeps): the next launch may
  /// start once every block got here (it waits for this one's end before
  /// it reads what this one writes).
  void releaseSuccessor() {
    if (c.gridDeps)
      NVVM::GriddepcontrolOp::create(
          b, loc, NVVM::GridDepActionKind::launch_dependents);
  }
  Value maxIdx(Value x, int64_t v) { return e.max(x, e.idx(v)); }
  Value ceilDivV(Value x, Value y) {
    return e.divs(e.sub(e.add(x, y), e.idx(1)), y);
  }
  Value loadWork(Value at) { return e.load(p.work, {at}); }
  void storeWork(Value v, Value at) { e.store(v, p.work, {at}); }

  /// The row tile's (token, KV head, tile) from its index y.
  struct Tile {
    Value token, head, sub;
  };
  Tile tileOf(Value y) {
    int64_t rt = c.rowTiles();
    return {e.divs(y, e.idx(c.kvHeads * rt)),
            e.rems(e.divs(y, e.idx(rt)), e.idx(c.kvHeads)),
            e.rems(y, e.idx(rt))};
  }
  /// The position of query row `token` of batch row `batch`.
  Value positionOf(Value batch, Value token) {
    Value len = e.toIndex(e.load(ops.kvLens, {batch}));
    return e.add(e.sub(len, e.idx(c.queries)), token);
  }
  /// Visible compressed blocks of the token at `t` (Spec section 4).
  Value visibleBlocks(Value t) {
    Value n = e.max(e.add(t, e.idx(1)), e.idx(0));
    return e.compressedBlocks(n, c.cmpBlock, c.cmpStride);
  }

  void plan();
  void buildPartialLaunch(const std::string &name, bool selected);
  void attendSplit(DecodeKeys keys, Value batch, Value y, Value chunkBegin,
                   Value chunkEnd, Value outSplit);
  void buildSelectLaunch(const std::string &name);
  void buildMergeLaunch(const std::string &name);
};

void DecodeBuilder::plan() {
  int64_t ks = c.chunkKeys;
  p.batch = dim(ops.q, 0);
  p.cacheTokens = dim(ops.k, 1);
  p.cmpRows = dim(ops.kc, 1);
  p.cmpChunks = maxIdx(e.ceilDiv(p.cmpRows, ks), 1);
  Value chunks = e.add(p.cmpChunks, e.idx(winChunks() + slcChunks()));
  Value work = e.mul(e.mul(chunks, p.batch), e.idx(c.tiles()));
  p.perSplit = maxIdx(e.ceilDiv(work, c.targetBlocks), 1);
  p.cmpSplits = ceilDivV(p.cmpChunks, p.perSplit);
  p.winSplits = ceilDivV(e.idx(winChunks()), p.perSplit);
  p.slcSplits = ceilDivV(e.idx(slcChunks()), p.perSplit);
  p.splits = e.add(e.add(p.cmpSplits, p.winSplits), p.slcSplits);
  p.numBlocks = maxIdx(e.ceilDiv(p.cacheTokens, c.slcBlock), 1);
  // (A multiple of 64: the ranking reads four candidates at a time.)
  p.span = e.mul(maxIdx(e.ceilDiv(e.ceilDiv(p.numBlocks, kMaxSpans), 64), 1),
                 e.idx(64));
  p.spans = ceilDivV(p.numBlocks, p.span);
  // Per (batch row, row tile): the splits' (max, sum) and O of 16 rows, the
  // compressed chunks' reference max and Eq. 9 partials; per (batch row,
  // token, KV head, span) the span's best n candidates.
  Value tiles = e.mul(p.batch, e.idx(c.tiles()));
  Value perTileSplits = e.mul(tiles, p.splits);
  Value perTileChunks = e.mul(tiles, p.cmpChunks);
  p.statsAt = e.idx(0);
  p.outAt = e.add(p.statsAt, e.mul(perTileSplits, e.idx(16 * 2)));
  p.refAt = e.add(p.outAt, e.mul(perTileSplits, e.idx(16 * c.vDim)));
  p.partAt = e.add(p.refAt, e.mul(perTileChunks, e.idx(16)));
  p.candAt =
      e.add(p.partAt, e.mul(perTileChunks, e.idx(16 * c.slotsPerChunk())));
  Value groups = e.mul(p.batch, e.idx(c.queries * c.kvHeads));
  Value total =
      e.add(p.candAt, e.mul(e.mul(groups, p.spans), e.idx(2 * c.numSelected)));
  p.work = memref::AllocOp::create(
      b, loc, MemRefType::get({ShapedType::kDynamic}, b.getF32Type()),
      ValueRange{total});
}

void DecodeBuilder::buildPartialLaunch(const std::string &name, bool selected) {
  OpBuilder::InsertionGuard guard(b);
  Value gridX = selected ? p.slcSplits : e.add(p.cmpSplits, p.winSplits);
  gpu::LaunchOp launch =
      createNamedLaunch(b, loc, {gridX, e.idx(c.tiles()), p.batch},
                        partialThreads(), lay.total, name);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value split = ids.x, y = ids.y, batch = ids.z;
  auto range = [&](Value s, Value chunks) {
    Value begin = e.mul(s, p.perSplit);
    return std::make_pair(begin, e.min(e.add(begin, p.perSplit), chunks));
  };
  if (selected) {
    auto [begin, end] = range(split, e.idx(slcChunks()));
    attendSplit(DecodeKeys::Selected, batch, y, begin, end,
                e.add(e.add(p.cmpSplits, p.winSplits), split));
    return;
  }
  scf::IfOp::create(
      b, loc, e.lt(split, p.cmpSplits),
      [&](OpBuilder &, Location) {
        auto [begin, end] = range(split, p.cmpChunks);
        attendSplit(DecodeKeys::Compressed, batch, y, begin, end, split);
        scf::YieldOp::create(b, loc);
      },
      [&](OpBuilder &, Location) {
        auto [begin, end] =
            range(e.sub(split, p.cmpSplits), e.idx(winChunks()));
        attendSplit(DecodeKeys::Window, batch, y, begin, end, split);
        scf::YieldOp::create(b, loc);
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
  // [parity][row, visible][key]: this chunk's and the next one's.
  Value keyRows = view(shared, lay.keys, {2, 2, ks}, i32);
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
  auto commit = [&] {
    return nvgpu::DeviceAsyncCreateGroupOp::create(
        b, loc, nvgpu::DeviceAsyncTokenType::get(b.getContext()), ValueRange{});
  };
  // Waits for all groups but the newest `pending` (a wait whose token is
  // not a new group: the token is not read).
  Value anyToken = commit(); // Q's group
  auto waitFor = [&](int64_t pending) {
    nvgpu::DeviceAsyncWaitOp::create(b, loc, anyToken,
                                     b.getI32IntegerAttr(pending));
    e.barrier();
  };
  e.ifThen(e.lt(tid, e.idx(16)), [&] {
    e.store(e.f32(-INFINITY), stats, {e.idx(0), tid});
    e.store(e.f32(0), stats, {e.idx(1), tid});
  });

  // The chosen blocks come from the select launch, the compressed caches'
  // new rows from the appends; the window's keys from neither (its blocks
  // wait at their end).
  if (keys != DecodeKeys::Window)
    waitForPredecessor();
  if (keys == DecodeKeys::Selected) {
    // The token's n blocks: the spans' best n candidates ranked again (the
    // n best of all, Spec 5.4), chosen[rank] = block; -1 where fewer.
    int64_t n = c.numSelected;
    Value cand = view(shared, lay.cand, {kMaxSpans * n, 2}, f32);
    Value count = e.mul(p.spans, e.idx(n));
    Value groupIndex =
        e.add(e.mul(e.add(e.mul(batch, e.idx(c.queries)), tile.token),
                    e.idx(c.kvHeads)),
              tile.head);
    Value from = e.add(p.candAt, e.mul(e.mul(groupIndex, count), e.idx(2)));
    e.forEach(tid, e.idx(n), e.idx(kThreads),
              [&](Value i) { e.store(e.i32(-1), chosen, {i}); });
    e.forEach(tid, count, e.idx(kThreads), [&](Value i) {
      for (int64_t f = 0; f < 2; ++f)
        e.store(loadWork(e.add(from, e.add(e.mul(i, e.idx(2)), e.idx(f)))),
                cand, {i, e.idx(f)});
    });
    e.barrier();
    // Each span's list is in rank order (blanks, block -1, last): warp 0
    // merges the lists, lane l holding the head of span l's; n times the
    // best head is taken and its lane moves on. A head is two u32 keys in
    // the order of ranksBefore (Spec 5.4): the score's bits made unsigned-
    // ordered, then the block (f32 >= 0, so its bits are ordered); the best
    // is a redux.sync max of the first and a min of the second among the
    // lanes that tie.
    e.ifThen(e.lt(tid, e.idx(32)), [&] {
      static_assert(kMaxSpans <= 32, "a lane a span");
      Value live = e.lt(tid, p.spans);
      auto bits = [&](Value x) {
        return arith::BitcastOp::create(b, loc, i32, x).getResult();
      };
      auto headOf = [&](Value at) {
        Value inList = e.andi(live, e.lt(at, e.idx(n)));
        Value i = e.add(e.mul(e.min(tid, e.idx(kMaxSpans - 1)), e.idx(n)),
                        e.min(at, e.idx(n - 1)));
        Value sc = e.load(cand, {i, e.idx(0)}), j = e.load(cand, {i, e.idx(1)});
        Value real =
            e.andi(inList, e.fcmp(arith::CmpFPredicate::OGE, j, e.f32(0)));
        // Past the list or a blank: after every real candidate. (-0 is
        // made +0 so that equal scores have equal keys.)
        Value sb = bits(e.fadd(e.sel(real, sc, e.f32(-INFINITY)), e.f32(0)));
        Value negative = e.cmp(arith::CmpIPredicate::slt, sb, e.i32(0));
        Value key =
            e.sel(negative, arith::XOrIOp::create(b, loc, sb, e.i32(-1)),
                  arith::OrIOp::create(b, loc, sb, e.i32(INT32_MIN)));
        return std::make_pair(key, bits(e.sel(real, j, e.f32(1e30f))));
      };
      auto redux = [&](Value x, NVVM::ReduxKind kind) {
        return NVVM::ReduxOp::create(b, loc, i32, x, kind, e.i32(-1))
            .getResult();
      };
      auto [k0, j0] = headOf(e.idx(0));
      auto steps = scf::ForOp::create(
          b, loc, e.idx(0), e.idx(n), e.idx(1), ValueRange{e.idx(0), k0, j0},
          [&](OpBuilder &, Location, Value k, ValueRange st) {
            Value best = redux(st[1], NVVM::ReduxKind::UMAX);
            Value tie = e.eq(st[1], best);
            Value bj =
                redux(e.sel(tie, st[2], e.i32(-1)), NVVM::ReduxKind::UMIN);
            // (Blocks are distinct: the winning lane holds bj.)
            Value mine = e.andi(tie, e.eq(st[2], bj));
            Value block = arith::BitcastOp::create(b, loc, b.getF32Type(), bj);
            e.ifThen(
                e.andi(e.eq(tid, e.idx(0)),
                       e.fcmp(arith::CmpFPredicate::OLT, block, e.f32(1e29f))),
                [&] {
                  e.store(arith::FPToSIOp::create(b, loc, i32, block), chosen,
                          {k});
                });
            Value at = e.add(st[0], e.sel(mine, e.idx(1), e.idx(0)));
            auto [kn, jn] = headOf(at);
            scf::YieldOp::create(
                b, loc,
                ValueRange{at, e.sel(mine, kn, st[1]), e.sel(mine, jn, st[2])});
          });
      (void)steps;
    });
    e.barrier();
  }

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
  // 1. A chunk's keys: their rows and whether the token sees them.
  auto fillKeys = [&](Value chunk, Value parity) {
    e.forEach(tid, e.idx(ks), e.idx(kThreads), [&](Value kk) {
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
        row =
            e.add(e.mul(blk, e.idx(c.slcBlock)), e.rems(kk, e.idx(c.slcBlock)));
        seen = e.andi(inRange, e.le(e.idx(0), blk));
        seen = e.andi(seen, e.le(row, t));
        break;
      }
      }
      seen = e.andi(seen, e.andi(e.le(e.idx(0), row), e.lt(row, cacheRows)));
      e.store(e.toI32(e.sel(seen, row, e.idx(0))), keyRows,
              {parity, e.idx(0), kk});
      e.store(e.sel(seen, e.i32(1), e.i32(0)), keyRows, {parity, e.idx(1), kk});
    });
  };
  // 2. K or V of the chunk whose keys are at `parity`, by cp.async (unseen
  // rows zero-filled), as one group.
  auto issue = [&](Value parity, bool values) {
    auto rowHead = [&](Value r) {
      return std::make_pair(e.toIndex(e.load(keyRows, {parity, e.idx(0), r})),
                            tile.head);
    };
    auto seenRow = [&](Value r) {
      return e.eq(e.load(keyRows, {parity, e.idx(1), r}), e.i32(1));
    };
    if (values)
      copyRowsAsync(e, tid, kThreads, batch, vS, ks, c.vDim, vSrc, rowHead,
                    seenRow);
    else
      copyRowsAsync(e, tid, kThreads, batch, kS, ks, c.qkDim, kSrc, rowHead,
                    seenRow);
  };
  // The first chunk's K and V; each iteration then loads the next chunk's
  // K while this one's softmax and P V run, and its V while the next S
  // runs (one buffer each; the key lists by parity).
  fillKeys(chunkBegin, e.idx(0));
  e.barrier();
  issue(e.idx(0), false);
  commit();
  issue(e.idx(0), true);
  commit();
  // Q (in flight with K and V): fragments.
  waitFor(2);
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
        Value parity = e.rems(e.sub(chunk, chunkBegin), e.idx(2));
        Value nextParity = e.sub(e.idx(1), parity);
        Value next = e.add(chunk, e.idx(1));
        Value hasNext = e.lt(next, chunkEnd);
        waitFor(1); // this chunk's K (its V may still come)
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
              Value seen =
                  e.eq(e.load(keyRows, {parity, e.idx(1), key}), e.i32(1));
              e.store(e.sel(seen, e.fmul(s[n][i], scaleLog2), e.f32(-INFINITY)),
                      sS, {row, key});
            }
        }
        e.barrier();
        // The next chunk's keys, and its K into the buffer S is done with.
        e.ifThen(hasNext, [&] { fillKeys(next, nextParity); });
        e.barrier();
        e.ifThen(hasNext, [&] { issue(nextParity, false); });
        commit();
        // 4. The online softmax: threads / 16 a row.
        Value row = e.divs(tid, e.idx(rowLanes));
        Value part = e.rems(tid, e.idx(rowLanes));
        Value mOld = e.load(stats, {e.idx(0), row});
        Value lOld = e.load(stats, {e.idx(1), row});
        Value cm = e.f32(-INFINITY);
        for (int64_t i = 0; i < ks / rowLanes; ++i)
          cm = e.fmax(cm, e.load(sS, {row, e.add(part, e.idx(rowLanes * i))}));
        for (int32_t o = 1; o < rowLanes; o *= 2)
          cm = e.fmax(cm, e.shuffleXor(cm, o));
        Value mNew = e.fmax(mOld, cm);
        Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
        Value sum = e.f32(0);
        for (int64_t i = 0; i < ks / rowLanes; ++i) {
          Value kk = e.add(part, e.idx(rowLanes * i));
          Value pv = e.ex2(e.fsub(e.load(sS, {row, kk}), mUse));
          sum = e.fadd(sum, pv);
          e.store(arith::TruncFOp::create(b, loc, bf16, pv), pS, {row, kk});
          if (keys == DecodeKeys::Compressed)
            e.store(pv, sS, {row, kk});
        }
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
        if (keys == DecodeKeys::Compressed) {
          // Eq. 9 partials: block j of slot q takes key i = q bsz - a + 1 + o
          // (a = l/d, bsz = l'/d) with weight min(o + 1, bsz) - max(o - a + 1,
          // 0), where that key is in the chunk.
          e.barrier();
          int64_t a = subPerCmp(), bsz = subPerSlc(), slots = c.slotsPerChunk();
          Value partBase =
              e.add(p.partAt, e.mul(e.add(e.mul(tileIndex, p.cmpChunks), chunk),
                                    e.idx(16 * slots)));
          e.forEach(tid, e.idx(16 * slots), e.idx(kThreads), [&](Value item) {
            Value r = e.divs(item, e.idx(slots)),
                  q = e.rems(item, e.idx(slots));
            Value acc = e.f32(0);
            for (int64_t o = 0; o < bsz + a - 1; ++o) {
              int64_t w =
                  std::min(o + 1, bsz) - std::max<int64_t>(o - a + 1, 0);
              Value local = e.add(e.mul(q, e.idx(bsz)), e.idx(o - a + 1));
              Value in = e.andi(e.le(e.idx(0), local), e.lt(local, e.idx(ks)));
              Value pv =
                  e.load(sS, {r, e.min(e.max(local, e.idx(0)), e.idx(ks - 1))});
              acc = e.fadd(acc, e.sel(in, e.fmul(pv, e.f32(w)), e.f32(0)));
            }
            storeWork(acc, e.add(partBase, item));
          });
        }
        waitFor(1); // this chunk's V (the next K may still come)
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
        e.ifThen(hasNext, [&] { issue(nextParity, true); });
        commit();
        scf::YieldOp::create(b, loc, acc);
      });

  // The split's (max, sum) and unnormalized O.
  if (keys == DecodeKeys::Window)
    waitForPredecessor();
  releaseSuccessor();
  Value splitIndex = e.add(e.mul(tileIndex, p.splits), outSplit);
  e.barrier();
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
}

void DecodeBuilder::buildSelectLaunch(const std::string &name) {
  // A block per (span of candidate blocks, token and KV head, batch row):
  // the group's compressed lse from the splits, the span's block scores
  // (Spec 5.2-5.4) in shared memory, and its best n by rank (each
  // candidate counts the ones ranked before it), written for the selected
  // kernel, which ranks the spans' best again.
  OpBuilder::InsertionGuard guard(b);
  constexpr int64_t threads = 128, warps = threads / 32;
  int64_t rows = 16 * c.rowTiles(), n = c.numSelected, G = c.group;
  int64_t lseBytes = alignUp(rows * 4, 16);
  Value sharedSize = e.toI32(e.add(e.idx(lseBytes), e.mul(p.span, e.idx(4))));
  gpu::LaunchOp launch = createNamedLaunch(
      b, loc, {p.spans, e.idx(c.queries * c.kvHeads), p.batch}, threads, 0,
      name);
  launch.getDynamicSharedMemorySizeMutable().assign(sharedSize);
  Type f32 = b.getF32Type();
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value spanIndex = ids.x, batch = ids.z;
  Value token = e.divs(ids.y, e.idx(c.kvHeads));
  Value head = e.rems(ids.y, e.idx(c.kvHeads));
  Value tid = launch.getThreadIds().x;
  Value warp = e.divs(tid, e.idx(32)), lane = e.rems(tid, e.idx(32));
  Value shared = sharedBytes();
  Value lseS = view(shared, 0, {rows}, f32);
  auto space = gpu::AddressSpaceAttr::get(
      b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
  Value scoresS = memref::ViewOp::create(
      b, loc, MemRefType::get({ShapedType::kDynamic}, f32, AffineMap(), space),
      shared, e.idx(lseBytes), ValueRange{p.span});

  Value t = positionOf(batch, token);
  Value visible = visibleBlocks(t);
  Value last =
      e.sel(e.lt(t, e.idx(0)), e.idx(-1), e.divs(t, e.idx(c.slcBlock)));
  Value firstTile =
      e.mul(e.add(e.mul(token, e.idx(c.kvHeads)), head), e.idx(c.rowTiles()));
  auto tileIndexOf = [&](int64_t rho) {
    return e.add(e.mul(batch, e.idx(c.tiles())),
                 e.add(firstTile, e.idx(rho / 16)));
  };

  // The partial launch's splits and chunk partials.
  waitForPredecessor();

  // The compressed lse (log2 units) of each row from the splits; -inf for
  // padding rows and rows that saw no block.
  e.forEach(warp, e.idx(rows), e.idx(warps), [&](Value rho) {
    Value tileIndex = e.add(e.mul(batch, e.idx(c.tiles())),
                            e.add(firstTile, e.divs(rho, e.idx(16))));
    Value r = e.rems(rho, e.idx(16));
    auto lanes = scf::ForOp::create(
        b, loc, lane, p.cmpSplits, e.idx(32),
        ValueRange{e.f32(-INFINITY), e.f32(0)},
        [&](OpBuilder &, Location, Value s, ValueRange ml) {
          Value at = e.add(
              p.statsAt, e.mul(e.add(e.mul(e.add(e.mul(tileIndex, p.splits), s),
                                           e.idx(16)),
                                     r),
                               e.idx(2)));
          Value m = loadWork(at), l = loadWork(e.add(at, e.idx(1)));
          Value mNew = e.fmax(ml[0], m);
          Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
          Value sum = e.fadd(e.fmul(ml[1], e.ex2(e.fsub(ml[0], mUse))),
                             e.fmul(l, e.ex2(e.fsub(m, mUse))));
          scf::YieldOp::create(b, loc, ValueRange{mNew, sum});
        });
    Value m = lanes.getResult(0), l = lanes.getResult(1);
    Value mAll = m;
    for (int32_t o : {1, 2, 4, 8, 16})
      mAll = e.fmax(mAll, e.shuffleXor(mAll, o));
    Value mUse = e.sel(isNegInf(e, mAll), e.f32(0), mAll);
    Value sum = e.fmul(l, e.ex2(e.fsub(m, mUse)));
    for (int32_t o : {1, 2, 4, 8, 16})
      sum = e.fadd(sum, e.shuffleXor(sum, o));
    Value lse = e.fadd(mAll, lg2(e, sum));
    Value none = e.ori(isNegInf(e, mAll), e.le(e.idx(G), rho));
    e.ifThen(e.eq(lane, e.idx(0)),
             [&] { e.store(e.sel(none, e.f32(-INFINITY), lse), lseS, {rho}); });
  });
  e.barrier();

  // The span's candidates first .. first + count - 1 (of 0 .. last):
  // forced blocks +inf; else the G rows' sums of w(i, j) p_i from the
  // chunks holding block j's keys.
  int64_t a = subPerCmp(), bsz = subPerSlc(), ks = c.chunkKeys,
          slots = c.slotsPerChunk();
  Value first = e.mul(spanIndex, p.span);
  Value count =
      e.max(e.min(e.sub(e.add(last, e.idx(1)), first), p.span), e.idx(0));
  e.forEach(tid, count, e.idx(threads), [&](Value jj) {
    Value j = e.add(first, jj);
    Value firstKey = e.max(e.sub(e.mul(j, e.idx(bsz)), e.idx(a - 1)), e.idx(0));
    Value lastKey = e.add(e.mul(j, e.idx(bsz)), e.idx(bsz - 1));
    Value chunkLo = e.divs(firstKey, e.idx(ks));
    Value chunkHi = e.min(e.add(e.divs(lastKey, e.idx(ks)), e.idx(1)),
                          e.min(p.cmpChunks, e.ceilDiv(visible, ks)));
    auto sumLoop = scf::ForOp::create(
        b, loc, chunkLo, chunkHi, e.idx(1), ValueRange{e.f32(0)},
        [&](OpBuilder &, Location, Value ch, ValueRange acc) {
          Value q = e.sub(j, e.mul(ch, e.idx(ks / bsz)));
          Value inSlots = e.andi(e.le(e.idx(0), q), e.lt(q, e.idx(slots)));
          Value qc = e.min(e.max(q, e.idx(0)), e.idx(slots - 1));
          Value sum = acc[0];
          for (int64_t rho = 0; rho < G; ++rho) {
            Value chunkRow =
                e.add(e.mul(e.add(e.mul(tileIndexOf(rho), p.cmpChunks), ch),
                            e.idx(16)),
                      e.idx(rho % 16));
            Value lse = e.load(lseS, {e.idx(rho)});
            Value ref = loadWork(e.add(p.refAt, chunkRow));
            Value part = loadWork(
                e.add(p.partAt, e.add(e.mul(chunkRow, e.idx(slots)), qc)));
            Value factor =
                e.sel(isNegInf(e, lse), e.f32(0), e.ex2(e.fsub(ref, lse)));
            sum = e.fadd(sum, e.sel(inSlots, e.fmul(factor, part), e.f32(0)));
          }
          scf::YieldOp::create(b, loc, ValueRange{sum});
        });
    Value forced = backboneForced(e, c.backbone, e.toI32(j), e.toI32(last));
    e.store(e.sel(forced, e.f32(INFINITY), sumLoop.getResult(0)), scoresS,
            {jj});
  });

  // (-inf past the candidates, up to a multiple of four.)
  e.ifThen(e.lt(tid, e.idx(4)), [&] {
    Value at = e.add(count, tid);
    e.ifThen(e.lt(at, p.span),
             [&] { e.store(e.f32(-INFINITY), scoresS, {at}); });
  });

  // The span's best n by rank, at their rank; (-inf, -1) where fewer.
  Value groupIndex = e.add(
      e.mul(e.add(e.mul(batch, e.idx(c.queries)), token), e.idx(c.kvHeads)),
      head);
  Value out =
      e.add(p.candAt,
            e.mul(e.add(e.mul(groupIndex, p.spans), spanIndex), e.idx(2 * n)));
  auto asF32 = [&](Value index) {
    return arith::SIToFPOp::create(b, loc, f32, e.toI32(index)).getResult();
  };
  releaseSuccessor();
  e.ifThen(e.lt(tid, e.idx(n)), [&] {
    Value at = e.add(out, e.mul(tid, e.idx(2)));
    storeWork(e.f32(-INFINITY), at);
    storeWork(e.f32(-1), e.add(at, e.idx(1)));
  });
  e.barrier(); // the scores, and the blanks before the candidates
  e.forEach(tid, count, e.idx(threads), [&](Value jj) {
    Value sj = e.load(scoresS, {jj});
    Value j = asF32(e.add(first, jj));
    // Four candidates an iteration (the span's scores padded with -inf to
    // a multiple of four rank after everything), blocks as f32.
    constexpr int64_t unroll = 4;
    auto rank = scf::ForOp::create(
        b, loc, e.idx(0), count, e.idx(unroll), ValueRange{e.i32(0)},
        [&](OpBuilder &, Location, Value o, ValueRange acc) {
          Value fo = asF32(e.add(first, o));
          Value sum = acc[0];
          for (int64_t u = 0; u < unroll; ++u) {
            Value before = ranksBefore(e, e.load(scoresS, {e.add(o, e.idx(u))}),
                                       e.fadd(fo, e.f32(u)), sj, j);
            sum = e.add(sum,
                        arith::ExtUIOp::create(b, loc, b.getI32Type(), before));
          }
          scf::YieldOp::create(b, loc, ValueRange{sum});
        });
    Value r = e.toIndex(rank.getResult(0));
    e.ifThen(e.lt(r, e.idx(n)), [&] {
      Value at = e.add(out, e.mul(r, e.idx(2)));
      storeWork(sj, at);
      storeWork(j, e.add(at, e.idx(1)));
    });
  });
}

void DecodeBuilder::buildMergeLaunch(const std::string &name) {
  // A block per (8 columns of Dv, row tile, batch row): each row's 8 lanes
  // take every 8th split of a branch (four a step, their loads
  // independent), merge them by xor shuffles, and lane k writes column k
  // of the gated row. Many blocks of short threads: at B = 1 the merge is
  // latency, not bandwidth.
  OpBuilder::InsertionGuard guard(b);
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  constexpr int64_t threads = 128, lanes = 8, unroll = 4;
  gpu::LaunchOp launch = createNamedLaunch(
      b, loc, {e.idx(c.vDim / 8), e.idx(c.tiles()), p.batch}, threads, 0, name);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value tid = launch.getThreadIds().x;
  Value col = e.mul(ids.x, e.idx(8)), y = ids.y, batch = ids.z;
  Value r = e.divs(tid, e.idx(lanes)), k = e.rems(tid, e.idx(lanes));
  // Every split of every branch.
  waitForPredecessor();
  Tile tile = tileOf(y);
  Value g = e.add(e.mul(tile.sub, e.idx(16)), r);
  Value hq =
      e.add(e.mul(tile.head, e.idx(c.group)), e.min(g, e.idx(c.group - 1)));
  Value tileIndex = e.add(e.mul(batch, e.idx(c.tiles())), y);
  Value rowOf = e.mul(tileIndex, p.splits);
  auto alignment = [&](int64_t bytes) { return b.getI64IntegerAttr(bytes); };
  auto v2 = VectorType::get({2}, f32), v4 = VectorType::get({4}, f32);
  auto lane = [&](Value v, int64_t i) {
    return vector::ExtractOp::create(b, loc, v, ArrayRef<int64_t>{i})
        .getResult();
  };
  // Few splits a branch (large batches): lane k walks them all for column
  // k alone, no shuffles.
  auto mergeColumn = [&](Value begin, Value end) {
    auto loop = scf::ForOp::create(
        b, loc, begin, end, e.idx(1),
        ValueRange{e.f32(-INFINITY), e.f32(0), e.f32(0)},
        [&](OpBuilder &, Location, Value split, ValueRange acc) {
          Value row = e.add(e.mul(e.add(rowOf, split), e.idx(16)), r);
          Value ml = vector::LoadOp::create(
              b, loc, v2, p.work,
              ValueRange{e.add(p.statsAt, e.mul(row, e.idx(2)))}, false,
              alignment(8));
          Value m = lane(ml, 0);
          Value o = loadWork(
              e.add(p.outAt, e.add(e.mul(row, e.idx(c.vDim)), e.add(col, k))));
          Value mNew = e.fmax(acc[0], m);
          Value mUse = e.sel(isNegInf(e, mNew), e.f32(0), mNew);
          Value a = e.ex2(e.fsub(acc[0], mUse)), w = e.ex2(e.fsub(m, mUse));
          scf::YieldOp::create(
              b, loc,
              ValueRange{mNew,
                         e.fadd(e.fmul(acc[1], a), e.fmul(w, lane(ml, 1))),
                         e.fadd(e.fmul(acc[2], a), e.fmul(w, o))});
        });
    return std::make_pair(loop.getResult(2), loop.getResult(1));
  };
  // (max, sum, o[8]) of splits [begin, end), merged over the row's lanes.
  auto mergeSplits = [&](Value begin, Value end) {
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
                alignment(8));
            m.push_back(e.sel(valid, lane(ml, 0), e.f32(-INFINITY)));
            l.push_back(lane(ml, 1));
            Value at8 = e.add(p.outAt, e.add(e.mul(row, e.idx(c.vDim)), col));
            for (int64_t h = 0; h < 2; ++h) {
              Value q = vector::LoadOp::create(
                  b, loc, v4, p.work, ValueRange{e.add(at8, e.idx(4 * h))},
                  false, alignment(16));
              for (int64_t i = 0; i < 4; ++i)
                o.push_back(lane(q, i));
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
    SmallVector<Value> st(loop.getResults());
    for (int32_t x : {1, 2, 4}) {
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
    // This lane's column.
    Value o = st[2];
    for (int64_t i = 1; i < 8; ++i)
      o = e.sel(e.eq(k, e.idx(i)), st[2 + i], o);
    return std::make_pair(o, st[1]);
  };
  // Column k of a branch, divided by the sum and rounded to bf16 (the
  // branch op's result type): by columns where every branch has at most
  // `lanes` splits, else by splits.
  Value fewSplits =
      e.le(e.max(e.max(p.cmpSplits, p.winSplits), p.slcSplits), e.idx(lanes));
  auto merge = [&](Value begin, Value end) {
    auto both = scf::IfOp::create(
        b, loc, fewSplits,
        [&](OpBuilder &, Location) {
          auto [o, l] = mergeColumn(begin, end);
          scf::YieldOp::create(b, loc, ValueRange{o, l});
        },
        [&](OpBuilder &, Location) {
          auto [o, l] = mergeSplits(begin, end);
          scf::YieldOp::create(b, loc, ValueRange{o, l});
        });
    Value o = both.getResult(0), l = both.getResult(1);
    Value empty = e.fcmp(arith::CmpFPredicate::OLE, l, e.f32(0));
    Value q = e.sel(empty, e.f32(0), arith::DivFOp::create(b, loc, o, l));
    Value rounded = arith::TruncFOp::create(b, loc, bf16, q);
    return arith::ExtFOp::create(b, loc, f32, rounded).getResult();
  };
  Value winEnd = e.add(p.cmpSplits, p.winSplits);
  Value cmp = merge(e.idx(0), p.cmpSplits);
  Value win = merge(p.cmpSplits, winEnd);
  Value slc = merge(winEnd, p.splits);
  e.ifThen(e.lt(g, e.idx(c.group)), [&] {
    Value gate[3];
    for (int64_t i = 0; i < 3; ++i)
      gate[i] =
          sigmoid(e, arith::ExtFOp::create(
                         b, loc, f32,
                         e.load(ops.gates, {batch, tile.token, hq, e.idx(i)})));
    Value o = e.fadd(e.fadd(e.fmul(gate[0], cmp), e.fmul(gate[1], slc)),
                     e.fmul(gate[2], win));
    e.store(arith::TruncFOp::create(b, loc, bf16, o), ops.out,
            {batch, tile.token, hq, e.add(col, k)});
  });
}

} // namespace

void mlir::nsa::detail::buildDecodeKernels(OpBuilder &b, Location loc,
                                           const DecodeConfig &config,
                                           const DecodeOperands &operands,
                                           StringRef kernelName) {
  DecodeBuilder(b, loc, config, operands).build(kernelName);
}

void mlir::nsa::detail::buildCompressAppendKernel(
    OpBuilder &b, Location loc, const AppendConfig &c,
    ArrayRef<AppendOperands> appends, Value kvLens, StringRef kernelName) {
  Emit e{b, loc};
  // Each thread pools two neighbouring columns of the row (as
  // buildCompressKernel does), reading its l tokens' rows coalesced.
  int64_t widest = 0;
  for (const AppendOperands &a : appends)
    widest = std::max(widest, a.dim);
  int64_t threads = std::min<int64_t>(alignUp(widest / 2, 32), 256);
  int64_t l = c.block, d = c.stride;
  int64_t slots = (c.appended + d - 1) / d;
  Value batches = memref::DimOp::create(b, loc, appends[0].input, 0);
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch = createNamedLaunch(
      b, loc,
      {e.idx(slots), e.idx(c.heads),
       e.mul(batches, e.idx(static_cast<int64_t>(appends.size())))},
      threads, 0, kernelName);
  if (c.gridDeps)
    NVVM::GriddepcontrolOp::create(b, loc,
                                   NVVM::GridDepActionKind::launch_dependents);
  gpu::KernelDim3 ids = launch.getBlockIds();
  Value tid = launch.getThreadIds().x;
  Value h = ids.y, batch = e.rems(ids.z, batches);
  Value which = e.divs(ids.z, batches);
  Value len = e.toIndex(e.load(kvLens, {batch}));
  Value before = e.max(e.sub(len, e.idx(c.appended)), e.idx(0));
  Value first = e.compressedBlocks(before, l, d);
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  auto pairType = VectorType::get({2}, bf16);
  auto pairF32 = VectorType::get({2}, f32);
  for (auto [index, a] : llvm::enumerate(appends)) {
    e.ifThen(e.eq(which, e.idx(index)), [&] {
      Value rows = memref::DimOp::create(b, loc, a.dst, 1);
      Value end = e.min(e.compressedBlocks(e.max(len, e.idx(0)), l, d), rows);
      Value i = e.add(first, ids.x);
      int64_t pairs = a.dim / 2;
      e.ifThen(e.lt(i, end), [&] {
        e.forEach(tid, e.idx(pairs), e.idx(threads), [&](Value pr) {
          Value col = e.mul(pr, e.idx(2));
          Value zero = arith::ConstantOp::create(
              b, loc, pairF32,
              DenseElementsAttr::get(pairF32, b.getF32FloatAttr(0)));
          auto sum = scf::ForOp::create(
              b, loc, e.idx(0), e.idx(l), e.idx(1), ValueRange{zero},
              [&](OpBuilder &, Location, Value j, ValueRange acc) {
                Value v = vector::LoadOp::create(
                    b, loc, pairType, a.input,
                    ValueRange{batch, e.add(e.mul(i, e.idx(d)), j), h, col});
                Value w =
                    a.weights ? e.load(a.weights, {h, j}) : e.f32(1.0 / l);
                Value wv = vector::BroadcastOp::create(b, loc, pairF32, w);
                Value next = vector::FMAOp::create(
                    b, loc, arith::ExtFOp::create(b, loc, pairF32, v), wv,
                    acc[0]);
                scf::YieldOp::create(b, loc, ValueRange{next});
              });
          vector::StoreOp::create(
              b, loc,
              arith::TruncFOp::create(b, loc, pairType, sum.getResult(0)),
              a.dst, ValueRange{batch, i, h, col}, /*nontemporal=*/false,
              llvm::MaybeAlign(4));
        });
      });
      // Out of place: the blocks of each (slot, head) copy the batch row's
      // other rows of their head (grid-stride over the rows), never a new
      // one.
      Value srcAt =
          memref::ExtractAlignedPointerAsIndexOp::create(b, loc, a.src);
      Value dstAt =
          memref::ExtractAlignedPointerAsIndexOp::create(b, loc, a.dst);
      e.ifThen(e.cmp(arith::CmpIPredicate::ne, srcAt, dstAt), [&] {
        e.forEach(ids.x, rows, e.idx(slots), [&](Value row) {
          Value fresh = e.andi(e.le(first, row), e.lt(row, end));
          scf::IfOp::create(
              b, loc, fresh,
              [&](OpBuilder &, Location) { scf::YieldOp::create(b, loc); },
              [&](OpBuilder &, Location) {
                e.forEach(tid, e.idx(a.dim), e.idx(threads), [&](Value col) {
                  e.store(e.load(a.src, {batch, row, h, col}), a.dst,
                          {batch, row, h, col});
                });
                scf::YieldOp::create(b, loc);
              });
        });
      });
    });
  }
}
