//===- FlashGradBuilder.h - the gradient kernels' builder ------*- C++ -*-===//
//
// Private to NSAToGPU: the shared-memory layout and the builder of the
// flash gradient kernels (FlashGrad.cpp, the window and compressed dq
// kernels and every dk, dv kernel's steps; FlashGradSelected.cpp,
// selected attention's dq and the dk, dv kernel's token queue).
//
//===----------------------------------------------------------------------===//

#ifndef NSA_LIB_CONVERSION_NSATOGPU_FLASHGRADBUILDER_H
#define NSA_LIB_CONVERSION_NSATOGPU_FLASHGRADBUILDER_H

#include "FlashBuilder.h"

namespace mlir::nsa::detail::flash::grad {

/// Tokens the dk, dv kernel of selected attention queues before walking
/// them.
constexpr int64_t kSelectedQueue = 1024;

/// Whether the selected dk, dv kernel with c.tma takes its steps' Q and dO
/// by TMA: a box a token (its G heads), whole 1024-byte swizzle atoms.
inline bool selectedRowsByTma(const FlashGradConfig &c) {
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
  /// (the block's rows of its keys, K-major); dk, dv, the queue of tokens and
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
  /// Selected attention's dq: 16 rows a block (wgmma: queryRows, 16 or
  /// 32), its warps splitting the keys of each block the rows' tokens
  /// chose.
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
  /// the block's rows (16 or 32: their tokens and lse2, D), into dq.
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
  /// Stores each of `values` (f32, or vectors of f32) at its `at` of
  /// `out`; into dq with dqTerms, the sum of the terms there
  /// (FlashGradOperands).
  void storeAll(ArrayRef<Value> values, Value out,
                ArrayRef<SmallVector<Value, 4>> at);
};

} // namespace mlir::nsa::detail::flash::grad

#endif // NSA_LIB_CONVERSION_NSATOGPU_FLASHGRADBUILDER_H
