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
//           Selected: 16 rows a block, the key tiles the distinct blocks
//           their tokens chose (buildBlockUnion), each tile's keys split
//           over the warps, whose dq are added in warp order at the end
//           (wgmma: the transposes, S^T = K Q^T, dP^T = V dO^T and dq^T
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
// Fragment layouts are those of FlashKernel.cpp (TensorCore.h): a thread
// holds rows g and g + 8 (g = lane / 4) and columns p, p + 1 (p =
// 2 (lane % 4)) of each 8-column accumulator tile, which packed to bf16 is
// the A operand of the next product.
//
//===----------------------------------------------------------------------===//

#include "FlashBuilder.h"

#include "../../Transforms/TensorCore.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <cmath>

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

namespace {

/// Tokens the dk, dv kernel of selected attention queues before walking
/// them.
constexpr int64_t kSelectedQueue = 1024;

/// Whether the selected dk, dv kernel with c.tma takes its steps' Q and dO
/// by TMA: a box a token (its G heads), whole 1024-byte swizzle atoms.
bool selectedRowsByTma(const FlashGradConfig &c) {
  return c.group * kSwizzleRowBytes % kSwizzleAtomBytes == 0;
}

/// Accumulator tiles (4 f32 each) or A fragments (4 i32 each).
using Frags = SmallVector<SmallVector<Value, 4>>;

/// Byte offsets of a gradient kernel's shared memory: two resident tiles
/// (dq: Q and dO; dkv: K and V), then a 2-stage ring of what the block
/// walks (dq: K and V tiles; dkv: Q and dO rows, their lse2 and D).
struct GradLayout {
  int64_t qStride, vStride;
  int64_t second = 0; ///< the second resident tile
  int64_t ring = 0, stageBytes = 0;
  /// Within a stage: the second tile, and (dkv) the rows' lse2 and D.
  int64_t stageSecond = 0, stageLse = 0, stageDelta = 0;
  /// Selected attention: dq, the union of the block's chosen blocks
  /// (buildBlockUnion) and (wgmma) dS^T, the B operand of dq^T += K^T dS^T
  /// (16 rows of a block's keys, K-major); dk, dv, the queue of tokens and
  /// the warps' counts.
  int64_t unionOffset = 0, dsOffset = 0, queueOffset = 0;
  int64_t total = 0;

  GradLayout(const FlashGradConfig &c, bool keyMajor) {
    // wgmma: unpadded tiles in the 128-byte-swizzled layout (Wgmma.h), each
    // 64-column block 1024-byte aligned, after alignForSwizzle's padding.
    bool swizzled = c.wgmma;
    int64_t align = swizzled ? kSwizzleAtomBytes : 16;
    qStride = swizzled ? c.qkDim : paddedCols(c.qkDim);
    vStride = swizzled ? c.vDim : paddedCols(c.vDim);
    int64_t resident = keyMajor ? 16 * c.keyWarps : c.queryRows();
    int64_t walked = keyMajor ? c.keyQueryRows : c.queryKeyTile;
    second = alignUp(resident * qStride * 2, align);
    ring = alignUp(second + resident * vStride * 2, align);
    stageSecond = alignUp(walked * qStride * 2, align);
    stageBytes = alignUp(stageSecond + walked * vStride * 2, 16);
    if (keyMajor) {
      stageLse = stageBytes;
      stageDelta = stageLse + walked * 4;
      stageBytes = stageDelta + walked * 4;
    }
    stageBytes = alignUp(stageBytes, align);
    total = ring + 2 * stageBytes;
    if (c.keys == FlashKeys::Selected && !keyMajor) {
      int64_t cands = c.queryRows() / c.group * c.numSlots;
      if (swizzled) {
        dsOffset = total;
        total += alignUp(c.queryRows() * c.slcBlock * 2, align);
      }
      unionOffset = total;
      total += alignUp((3 * cands + 1) * 4, 16);
    } else if (c.keys == FlashKeys::Selected) {
      queueOffset = total;
      total += alignUp((kSelectedQueue + c.keyWarps) * 4, 16);
    }
    if (swizzled)
      total += kStaticSharedBytes + kSwizzleAtomBytes;
    // As the forward kernels: enough shared memory that
    // nsa-kernel-occupancy plans registers for two blocks an SM, not more
    // (each thread holds dq, or dk and dv, in registers).
    total = std::max(total, kTwoBlocksPerSM);
  }
};

class GradBuilder {
public:
  GradBuilder(OpBuilder &b, Location loc, const FlashGradConfig &c,
              const FlashGradOperands &ops, bool keyMajor)
      : e{b, loc}, b(b), loc(loc), c(c), ops(ops), lay(c, keyMajor),
        keyMajor(keyMajor), swizzled(c.wgmma),
        tmaRing(c.tma && (!keyMajor || c.keys != FlashKeys::Selected ||
                          selectedRowsByTma(c))) {}

  void buildQueryGrad(gpu::LaunchOp launch);
  /// A dq block's query rows in shared memory (`rows` of Q and dO by
  /// cp.async, row r read at `rowHead(r)`, zero where `valid(r)` is false),
  /// and this thread's two rows (from 16 a warp with `warpRows`, else from
  /// 0: every warp holds all of them) with their lse2 (+inf past the
  /// sequence: P = 0) and D.
  struct QueryRows {
    Value q, dO, row[2], lse2[2], delta[2];
  };
  QueryRows
  loadQueryRows(int64_t rows, bool warpRows,
                function_ref<std::pair<Value, Value>(Value r)> rowHead,
                function_ref<Value(Value r)> valid);
  /// A dq kernel's ring stage: the K and V tiles of `keys` keys.
  Value keyTile(Value stage, int64_t keys) {
    return tile(0, stage, keys, c.qkDim);
  }
  Value valueTile(Value stage, int64_t keys) {
    return tile(lay.stageSecond, stage, keys, c.vDim);
  }
  /// The loop over `count` tiles of a 2-stage ring (cp.async, or TMA with
  /// tmaRing), fill ringFills + i of it tile i: `load(stage, 0)` (with
  /// the cp.async copies issued before it, one group), then iteration i
  /// starts `load(stage, i + 1)`, waits for tile i and returns `body(i,
  /// stage of i, state)`, the next state; a barrier closes it (the next
  /// iteration refills the stage this one read). Returns the last state;
  /// ringFills grows by `count`.
  SmallVector<Value> walkRing(
      Value count, ValueRange init,
      function_ref<void(Value stage, Value i)> load,
      function_ref<SmallVector<Value>(Value i, Value stage, ValueRange state)>
          body);
  /// Copies keys k0.. of KV head h (zero past the sequence's; by TMA,
  /// whatever rows follow, which no row sees) into the K and V tiles of
  /// `stage`.
  void loadKeys(Value stage, Value k0, int64_t keys, Value h);
  /// tmaRing: thread 0 issues boxes of `rows` rows of heads `head`..
  /// (`heads` of them), the k-th from row `starts[k]`, one after the other
  /// into `stage`, on its mbarrier: dq, of K and V (one head); dk, dv, of Q
  /// and dO.
  void tmaTiles(Value stage, ArrayRef<Value> starts, Value head, int64_t rows,
                int64_t heads);
  /// Selected attention's dq: 16 rows a block, its warps splitting the
  /// keys of each block the rows' tokens chose.
  void buildSelectedQueryGrad(gpu::LaunchOp launch);
  void buildKeyGrad(gpu::LaunchOp launch);

private:
  Emit e;
  OpBuilder &b;
  Location loc;
  const FlashGradConfig &c;
  const FlashGradOperands &ops;
  GradLayout lay;
  /// The dk, dv kernel (else dq).
  bool keyMajor;
  /// A wgmma kernel: tiles in the swizzled layout, from sharedAddr.
  bool swizzled;
  /// A kernel whose ring tiles come by TMA (c.tma; the dq kernels' K and V,
  /// the window and compressed dk, dv kernels' Q and dO): thread 0 issues
  /// a stage's boxes on its mbarrier (ringBars), every thread waits for
  /// its parity. The dk, dv kernels' lse2 and D still come by cp.async.
  bool tmaRing;
  Value ringBars;
  /// The ring's fills so far (walkRing); its parity with tmaRing.
  Value ringFills;
  int64_t threads = 0;
  Value tid, warp, group4, pair, row16, half8, row8, k8, sharedBase;
  /// swizzled: the shared address (i32) of sharedBase.
  Value sharedAddr;
  SequenceView seq;
  /// The rows of the key tensors: the sequence's first, and its count.
  Value keyBase, keyLimit;
  /// dk, dv: the accumulators (dk's tiles, then dv's) across step loops.
  SmallVector<Value> stepState;
  /// The block's sequence (or batch) index.
  Value launchZ;

  /// The step loop of the dk, dv kernel, from and into stepState: each of
  /// `numSteps` steps takes R query rows, row r of step st the head
  /// h G + r % G of token `tokenOf(st, r)` (zero where `validOf` is
  /// false), against the block's keys from k0 in `kS` and `vS`. A step
  /// where `wholeStep` holds is not masked; else a valid row sees key
  /// `key` (i32) where `sees(token, key)`.
  SmallVector<Value> keySteps(Value numSteps, Value h, Value k0, Value kS,
                              Value vS,
                              function_ref<Value(Value st, Value r)> tokenOf,
                              function_ref<Value(Value st, Value r)> validOf,
                              function_ref<Value(Value st)> wholeStep,
                              function_ref<Value(Value tok, Value key)> sees);
  /// For this thread's two key rows (half 0 and 1) of the block from k0
  /// that lie in the sequence: `body(half, row)`, row that of the key
  /// tensors.
  void forEachKeyRow(Value k0, function_ref<void(int64_t, Value)> body);
  /// Selected attention: the steps of block k0 / l' (keys k0..k1) over the
  /// tokens that chose it.
  void buildSelectedSteps(Value h, Value k0, Value k1, Value kS, Value vS,
                          Value from, Value to);
  /// Chunked dk, dv: waits for turn `turn` of key block `block` (the
  /// chunks before have added theirs), adds this thread's accumulators to
  /// dk and dv, and hands the turn on.
  void addInTurn(Value block, Value turn, Value h, Value k0);

  void setUp(gpu::LaunchOp launch, int64_t warps);
  Value view(int64_t offset, Value stage, ArrayRef<int64_t> shape, Type elt);
  /// A bf16 tile of `rows` x `cols` (padded rows) at `offset` (+ the
  /// stage's offset in the ring when `stage` is set).
  Value tile(int64_t offset, Value stage, int64_t rows, int64_t cols);
  void copyRows(Value dst, int64_t rows, int64_t cols, Value src,
                function_ref<std::pair<Value, Value>(Value r)> rowHead,
                function_ref<Value(Value r)> valid) {
    copyRowsAsync(e, tid, threads, seq.batch, dst, rows, cols, src, rowHead,
                  valid);
  }
  /// One f32 a row from `src` [B, T, HQ] into `dst` [rows], by cp.async.
  void copyScalars(Value dst, int64_t rows, Value src,
                   function_ref<std::pair<Value, Value>(Value r)> rowHead,
                   function_ref<Value(Value r)> valid);
  Value commit() {
    return nvgpu::DeviceAsyncCreateGroupOp::create(
        b, loc, nvgpu::DeviceAsyncTokenType::get(b.getContext()), ValueRange{});
  }
  /// Waits for this thread's cp.async groups but `pending`, then for the
  /// block.
  void waitCopies(int64_t pending) {
    nvgpu::DeviceAsyncWaitOp::create(b, loc, commit(),
                                     b.getI32IntegerAttr(pending));
    if (swizzled)
      fenceProxyAsync(b, loc);
    e.barrier();
  }
  /// swizzled: copyRows of `rows` rows of `first` (Dqk) into the tile at
  /// byte `offset` and of `second` (Dv) into the one at `secondAt` (Q and
  /// dO, or K and V).
  void copyPairSwizzled(Value offset, Value secondAt, int64_t rows,
                        Value first, Value second,
                        function_ref<std::pair<Value, Value>(Value r)> rowHead,
                        function_ref<Value(Value r)> valid) {
    copyRowsSwizzledAsync(e, tid, threads, seq.batch, sharedBase, offset, rows,
                          c.qkDim, first, rowHead, valid);
    copyRowsSwizzledAsync(e, tid, threads, seq.batch, sharedBase,
                          secondAt, rows, c.vDim,
                          second, rowHead, valid);
  }
  /// swizzled: the byte offset of ring stage `stage` (its K tile, then at
  /// lay.stageSecond its V tile).
  Value stageAt(Value stage) {
    return e.add(e.idx(lay.ring), e.mul(stage, e.idx(lay.stageBytes)));
  }
  /// swizzled: the wgmma descriptor of the tile at byte `offset`.
  WgmmaDesc descriptorAt(Value offset, int64_t leadingBytes) {
    return wgmmaDescriptor(b, loc, e.add(sharedAddr, e.toI32(offset)),
                           leadingBytes, kSwizzleAtomBytes);
  }
  /// swizzled: the two score products of the block's 64 resident rows
  /// against the `n` rows of ring stage `stage`, committed together: dq,
  /// S = Q K^T and dP = dO V^T; dk, dv, S^T = K Q^T and dP^T = V dO^T.
  std::pair<Frags, Frags> scoresWgmma(Value stage, int64_t n) {
    Value at = stageAt(stage);
    return scorePair(e.idx(0), e.idx(lay.second), 64, at,
                     e.add(at, e.idx(lay.stageSecond)), n);
  }
  /// swizzled: A B^T of the Dqk-column tiles at byte `aFirst` (64 rows)
  /// and `bFirst` (n rows), and of the Dv-column ones at `aSecond` and
  /// `bSecond`, committed together and waited for.
  std::pair<Frags, Frags> scorePair(Value aFirst, Value aSecond, int64_t aRows,
                                    Value bFirst, Value bSecond, int64_t n);
  /// Selected attention's dq by wgmma: the walk over the union's blocks of
  /// the 16 rows `rows` (their tokens and lse2, D), into dq.
  void selectedQueryWgmma(const BlockUnion &chosen,
                          function_ref<Value(Value r)> tokenOf,
                          function_ref<std::pair<Value, Value>(Value r)> rowHead,
                          function_ref<Value(Value r)> valid,
                          function_ref<void(Value stage, Value kt)> load,
                          function_ref<Value(Value kt)> tileStart);
  /// One product acc += A B of productsWgmma: A fragments in registers, B
  /// the MN-major tile at byte `offset` (rows of K), `n` columns.
  struct RegisterProduct {
    Frags acc, a;
    Value offset;
    int64_t n;
  };
  /// swizzled: the products, B tiles of `kRows` rows, in one group waited
  /// for; returns their accumulators.
  SmallVector<Frags> productsWgmma(ArrayRef<RegisterProduct> products,
                                   int64_t kRows);
  std::pair<Value, Value> interval(Value token) {
    return keyInterval(e, c.keys, c.window, c.cmpBlock, c.cmpStride,
                       e.toI32(token));
  }
  /// Whether every token of [first, last] sees every key of [k0, k1].
  Value allVisible(Value first, Value last, Value k0, Value k1) {
    return e.andi(e.le(interval(last).first, e.toI32(k0)),
                  e.le(e.toI32(k1), interval(first).second));
  }
  Frags zeros(int64_t tiles) {
    return Frags(tiles, SmallVector<Value, 4>(4, e.f32(0)));
  }
  /// acc[j] += A B^T over `kDim`: A this warp's 16 rows of `aTile` (from
  /// row `aRow0`), B the rows bRow0 + 8j.. of `bTile` (stored [n][k]).
  void product(Frags &acc, Value aTile, Value aRow0, Value bTile, int64_t kDim,
               Value bRow0 = {});
  /// acc[n] += A B: A the fragments `a` (16 columns each), B `bTile`
  /// stored [k][n] (from row `kRow0`), read transposed.
  void productT(Frags &acc, ArrayRef<SmallVector<Value, 4>> a, Value bTile,
                Value kRow0 = {});
  /// Accumulator tiles rounded and packed into A fragments, 16 columns
  /// each.
  Frags pack(const Frags &x);
  /// P and dS of one accumulator element: `s` and `dp` of a row with
  /// `lse2` and `delta`, masked out where `visible` is false.
  std::pair<Value, Value> gradsOf(Value s, Value dp, Value lse2, Value delta,
                                  Value visible);
  static SmallVector<Value> flatten(const Frags &x) {
    SmallVector<Value> flat;
    for (const auto &f : x)
      flat.append(f.begin(), f.end());
    return flat;
  }
  static Frags unflatten(ValueRange flat, size_t first, size_t tiles) {
    Frags x;
    for (size_t j = 0; j < tiles; ++j)
      x.emplace_back(flat.begin() + first + 4 * j,
                     flat.begin() + first + 4 * j + 4);
    return x;
  }
  /// Stores `acc` times `scale` (f32 pairs) into the row (row, head) of
  /// `out` for this thread's row `half`.
  void storeRow(const Frags &acc, int64_t half, Value out, Value row,
                Value head, double scale);
};

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
  for (auto [n, f] : llvm::enumerate(acc)) {
    Value v = vector::FromElementsOp::create(
        b, loc, pairType,
        ValueRange{e.fmul(f[2 * half], e.f32(scale)),
                   e.fmul(f[2 * half + 1], e.f32(scale))});
    vector::StoreOp::create(
        b, loc, v, out,
        ValueRange{seq.batch, row, head,
                   e.add(e.idx(8 * static_cast<int64_t>(n)), pair)});
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

void GradBuilder::buildSelectedQueryGrad(gpu::LaunchOp launch) {
  // 16 rows (the G heads of 16 / G tokens) a block, whose warps split each
  // selection block's keys, 16 each, and add their dq in turn at the end.
  int64_t warps = c.queryWarps, keys = c.slcBlock, heads = c.group;
  int64_t tokensPerBlock = 16 / heads;
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
  // 16 rows: S^T = K Q^T and dP^T = V dO^T from shared memory; dS^T,
  // rounded to bf16, into shared memory as the K-major B of dq^T += K^T
  // dS^T, whose A is the key tile read M-major. A thread holds keys
  // 16 warp + g (+ 8) and rows p, p + 1 (+ 8) of each product, and of
  // dq^T the columns 16 warp + g (+ 8) of each 64 and the same rows.
  int64_t rows = 16, keys = c.slcBlock, heads = c.group;
  int64_t mTiles = c.qkDim / 64;
  assert(keys == 64 && "a wgmma block of selected keys is one swizzled block");
  Type bf16 = b.getBF16Type();
  copyPairSwizzled(e.idx(0), e.idx(lay.second), rows, ops.q, ops.grad,
                   rowHead, valid);
  Value numTiles = chosen.length;

  // This thread's four rows (j, odd: row 8 j + p + odd), their lse2 (+inf
  // past the sequence: P = 0), D, token and bit in the union's masks.
  Value rowOf[2][2], lse2[2][2], delta[2][2], tok[2][2], bit[2][2];
  for (int64_t j = 0; j < 2; ++j)
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
  Value allTokens = e.i32((int64_t{1} << (rows / heads)) - 1);
  Value dsTile = view(lay.dsOffset, {}, {rows * keys}, bf16);
  // Where dS^T of (key keyRow + 8 half, row 8 j + p + odd) goes: row-major
  // [row][key], chunk (key / 8) ^ (row % 8) of the 128-byte row.
  Value dsAt[2][2][2];
  for (int64_t j = 0; j < 2; ++j)
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
      numTiles, flatten(zeros(2 * mTiles)), load,
      [&](Value kt, Value stage, ValueRange state) -> SmallVector<Value> {
        Value at = stageAt(stage);
        auto [s, dp] = scorePair(at, e.add(at, e.idx(lay.stageSecond)), keys,
                                 e.idx(0), e.idx(lay.second), rows);
        Value k0 = tileStart(kt);
        Value who = e.load(chosen.keep, {kt});
        Value key = e.toI32(e.add(k0, keyRow));
        // Masked unless every token chose the block and sees all of it.
        auto dsOf = [&](bool mask) {
          Frags ds = zeros(2);
          for (int64_t j = 0; j < 2; ++j)
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
        Frags ds = unflatten(e.ifUnmasked(whole, dsOf), 0, 2);
        for (int64_t j = 0; j < 2; ++j)
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
          SmallVector<Value> part(acc.begin() + 8 * mt,
                                  acc.begin() + 8 * mt + 8);
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
  for (int64_t j = 0; j < 2; ++j)
    for (int64_t odd = 0; odd < 2; ++odd)
      e.ifThen(valid(rowOf[j][odd]), [&] {
        auto [row, head] = rowHead(rowOf[j][odd]);
        for (int64_t mt = 0; mt < mTiles; ++mt)
          for (int64_t half = 0; half < 2; ++half)
            e.store(e.fmul(walked[8 * mt + 4 * j + 2 * half + odd],
                           e.f32(c.scale)),
                    ops.dq,
                    {seq.batch, row, head,
                     e.add(keyRow, e.idx(64 * mt + 8 * half))});
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

} // namespace

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
