//===- FlashBuilder.h - the flash kernel builder, shared ------*- C++ -*-===//
//
// The builder of the flash kernels (FlashKernel.h), shared by its two
// files: FlashKernel.cpp (the kernel structure, mma.sync, the softmax, block
// selection, compression and gating) and FlashKernelSM90.cpp (TMA, wgmma,
// the pipelined loop). Private to lib/Conversion/NSAToGPU.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_LIB_CONVERSION_NSATOGPU_FLASHBUILDER_H
#define NSA_LIB_CONVERSION_NSATOGPU_FLASHBUILDER_H

#include "FlashKernel.h"
#include "Wgmma.h"

#include "NSA/Transforms/TileBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <cmath>

namespace mlir::nsa::detail::flash {

/// Shared memory a block may use on sm_80/sm_90 (opt-in).
constexpr int64_t kMaxSharedBytes = 227 * 1024;

/// Shared memory per block above which at most two blocks fit on an SM.
constexpr int64_t kTwoBlocksPerSM = kSharedBytesPerSM / 3;

/// Elements per row of a shared tile of `cols` bf16: an odd number of
/// 16-byte chunks, so that ldmatrix's eight row reads hit distinct banks.
inline int64_t paddedCols(int64_t cols) { return (cols / 8) % 2 ? cols : cols + 8; }

inline int64_t alignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/// Bytes at the start of `gpu.dynamic_shared_memory` that the TMA kernels
/// leave to the static variables. The NVPTX backend emits the dynamic
/// buffer as a static `.shared .b8` variable and ptxas may place the ring's
/// mbarriers (`nvgpu.mbarrier.create`, 8 bytes a stage) right after it,
/// inside what the kernel takes for its own memory: they have come out at
/// bytes 8 to 23 of Q's first row (block-major selected attention read
/// them as Q). 16 for the buffer's alignment and 8 per stage, rounded
/// up.
constexpr int64_t kStaticSharedBytes = 64;
static_assert(kStaticSharedBytes >= 16 + 8 * 4, "room for four stages");

/// Byte offsets of the regions of shared memory.
struct Layout {
  int64_t qStride, kStride, vStride;
  int64_t kBytes, stageBytes;
  int64_t mergeStride;    ///< f32 per merged row: Dv, max, sum
  int64_t candidates = 0; ///< Selected: tokens * n
  int64_t unionOffset = 0, total = 0;
  /// wgmma: where the key-tile ring starts (Q stays before it).
  int64_t ringOffset = 0;
  /// Selection: f32 column sums per warp (carry + key tile), after them the
  /// kept entries (16 x 3 i32 per warp).
  int64_t columns = 0, selectOffset = 0;
  /// FlashConfig::releaseCounts i32 counts of the warps done with a ring
  /// stage (FlashBuilder::releaseStage).
  int64_t releaseOffset = 0;

  explicit Layout(const FlashConfig &c) {
    qStride = paddedCols(c.qkDim);
    kStride = paddedCols(c.qkDim);
    vStride = paddedCols(c.vDim);
    kBytes = alignUp(c.keyTile * kStride * 2, 16);
    stageBytes = kBytes + (c.select ? 0 : alignUp(c.keyTile * vStride * 2, 16));
    mergeStride = c.vDim + 2;
    int64_t q = c.rows() * qStride * 2;
    int64_t ring = c.stages * stageBytes;
    int64_t merge = c.warpsN > 1 ? c.warps() * 16 * mergeStride * 4 : 0;
    unionOffset = alignUp(std::max({q, ring, merge}), 16);
    if (c.tma) {
      // Unpadded, swizzled tiles, each starting a swizzle pattern.
      kBytes = alignUp(c.keyTile * c.qkDim * 2, kSwizzleAtomBytes);
      stageBytes =
          kBytes +
          (c.select ? 0 : alignUp(c.keyTile * c.vDim * 2, kSwizzleAtomBytes));
      ring = c.stages * stageBytes;
      unionOffset = alignUp(std::max({q, ring, merge}), 16);
    }
    if (c.wgmma) {
      // Q stays in shared memory, before the ring. Gathered: one stage, the
      // block's keys.
      bool gathered = c.keys == FlashKeys::Gathered;
      ringOffset = alignUp(c.rows() * c.qkDim * 2, kSwizzleAtomBytes);
      unionOffset = ringOffset + (gathered ? stageBytes : ring);
    }
    total = unionOffset;
    if (c.keys == FlashKeys::Selected) {
      candidates = c.tokensPerBlock() * c.numSlots;
      // candidates, keep flags, the list and its length (i32 each)
      total += alignUp((3 * candidates + 1) * 4, 16);
    }
    if (c.select) {
      columns = c.cmpBlock / c.cmpStride - 1 + c.keyTile;
      selectOffset = total;
      // columns, then the ranked entries and the pending ones (16 x 3 i32
      // each) per warp
      total += alignUp(c.warps() * (columns + 2 * 16 * 3) * 4, 16);
    }
    if (c.releaseCounts()) {
      releaseOffset = total;
      total += alignUp(c.releaseCounts() * 4, 16);
    }
    if (c.tma) // to step past the static variables and align the base
      total += kStaticSharedBytes + kSwizzleAtomBytes;
    // Registers, not shared memory, bound the kernels to two blocks of four
    // warps per SM (up to 255 registers a thread): ask for enough shared
    // memory that nsa-kernel-occupancy plans registers for no more.
    // (Block-major selected attention, at 163 registers, runs three.)
    if (c.warps() <= 4 && c.keys != FlashKeys::Gathered)
      total = std::max(total, kTwoBlocksPerSM);
  }
};

/// Scalar arithmetic at the builder's insertion point.
struct Emit {
  OpBuilder &b;
  Location loc;

  Value idx(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value i32(int64_t v) {
    return arith::ConstantIntOp::create(b, loc, b.getI32Type(), v);
  }
  Value f32(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
  }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value divs(Value x, Value y) { return arith::DivSIOp::create(b, loc, x, y); }
  Value rems(Value x, Value y) { return arith::RemSIOp::create(b, loc, x, y); }
  Value min(Value x, Value y) { return arith::MinSIOp::create(b, loc, x, y); }
  Value max(Value x, Value y) { return arith::MaxSIOp::create(b, loc, x, y); }
  Value cmp(arith::CmpIPredicate p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }
  Value lt(Value x, Value y) { return cmp(arith::CmpIPredicate::slt, x, y); }
  Value le(Value x, Value y) { return cmp(arith::CmpIPredicate::sle, x, y); }
  Value eq(Value x, Value y) { return cmp(arith::CmpIPredicate::eq, x, y); }
  Value andi(Value x, Value y) { return arith::AndIOp::create(b, loc, x, y); }
  Value ori(Value x, Value y) { return arith::OrIOp::create(b, loc, x, y); }
  Value sel(Value c, Value x, Value y) {
    return arith::SelectOp::create(b, loc, c, x, y);
  }
  Value toI32(Value v) {
    return arith::IndexCastOp::create(b, loc, b.getI32Type(), v);
  }
  Value toIndex(Value v) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), v);
  }
  /// Spec section 3: the compressed blocks of a sequence of `n` tokens.
  Value compressedBlocks(Value n, int64_t l, int64_t d) {
    return TileBuilder(b, loc).numCompressedBlocks(n, l, d);
  }
  Value ceilDiv(Value x, int64_t y) {
    return divs(add(x, idx(y - 1)), idx(y));
  }
  // Contractible: a product feeding a sum becomes one fma (as nvcc does by
  // default), e.g. the softmax's s * scale - max.
  Value fadd(Value x, Value y) {
    return arith::AddFOp::create(b, loc, x, y, arith::FastMathFlags::contract);
  }
  Value fsub(Value x, Value y) {
    return arith::SubFOp::create(b, loc, x, y, arith::FastMathFlags::contract);
  }
  Value fmul(Value x, Value y) {
    return arith::MulFOp::create(b, loc, x, y, arith::FastMathFlags::contract);
  }
  Value fmax(Value x, Value y) {
    return arith::MaximumFOp::create(b, loc, x, y);
  }
  Value fcmp(arith::CmpFPredicate p, Value x, Value y) {
    return arith::CmpFOp::create(b, loc, p, x, y);
  }
  /// 2^x by the special-function unit (ex2.approx.ftz.f32).
  Value ex2(Value x) {
    return LLVM::InlineAsmOp::create(
               b, loc, b.getF32Type(), ValueRange{x},
               b.getStringAttr("ex2.approx.ftz.f32 $0, $1;"),
               b.getStringAttr("=f,f"), UnitAttr(), UnitAttr(),
               LLVM::TailCallKindAttr::get(b.getContext(),
                                           LLVM::tailcallkind::TailCallKind::None),
               LLVM::AsmDialectAttr(), ArrayAttr())
        .getResult(0);
  }
  /// `then(false)` where `cond` holds, else `then(true)`, as one scf.if
  /// yielding what they build (the masked and unmasked sides of a tile).
  SmallVector<Value> ifUnmasked(Value cond,
                                function_ref<SmallVector<Value>(bool)> then) {
    auto ifOp = scf::IfOp::create(
        b, loc, cond,
        [&](OpBuilder &, Location) {
          scf::YieldOp::create(b, loc, then(false));
        },
        [&](OpBuilder &, Location) {
          scf::YieldOp::create(b, loc, then(true));
        });
    return SmallVector<Value>(ifOp.getResults());
  }
  /// A PTX statement without operands; with `memory` the compiler keeps
  /// memory accesses on their side of it (fences).
  void asmStatement(StringRef text, bool memory = false) {
    LLVM::InlineAsmOp::create(
        b, loc, TypeRange{}, ValueRange{}, b.getStringAttr(text),
        b.getStringAttr(memory ? "~{memory}" : ""), b.getUnitAttr(), UnitAttr(),
        LLVM::TailCallKindAttr::get(b.getContext(),
                                    LLVM::tailcallkind::TailCallKind::None),
        LLVM::AsmDialectAttr(), ArrayAttr());
  }
  Value shuffleXor(Value v, int32_t offset) {
    return gpu::ShuffleOp::create(b, loc, v, offset, 32,
                                  gpu::ShuffleMode::XOR)
        .getShuffleResult();
  }
  Value shuffleIdx(Value v, int32_t from) {
    return gpu::ShuffleOp::create(b, loc, v, from, 32, gpu::ShuffleMode::IDX)
        .getShuffleResult();
  }
  Value load(Value memref, ValueRange indices) {
    return memref::LoadOp::create(b, loc, memref, indices);
  }
  void store(Value v, Value memref, ValueRange indices) {
    memref::StoreOp::create(b, loc, v, memref, indices);
  }
  void barrier() { gpu::BarrierOp::create(b, loc); }

  /// `if (cond) then()`.
  void ifThen(Value cond, function_ref<void()> then) {
    scf::IfOp::create(b, loc, cond, [&](OpBuilder &, Location) {
      then();
      scf::YieldOp::create(b, loc);
    });
  }
  /// `for (i = lb; i < ub; i += step) body(i)`.
  void forEach(Value lb, Value ub, Value step, function_ref<void(Value)> body) {
    scf::ForOp::create(b, loc, lb, ub, step, ValueRange{},
                       [&](OpBuilder &, Location, Value i, ValueRange) {
                         body(i);
                         scf::YieldOp::create(b, loc);
                       });
  }
};

/// sigmoid(g) = 1 / (1 + exp(-g)) in f32 (Spec section 8).
Value sigmoid(Emit &e, Value g);

/// A lane's place in the mma.sync fragments (TensorCore.h): its rows
/// group4 and group4 + 8 and columns pair, pair + 1 of an accumulator tile,
/// and the ldmatrix row and column offsets of its address.
struct LaneFragments {
  Value group4, pair, row16, half8, row8, k8;
};
inline LaneFragments laneFragments(Emit &e, Value lane) {
  LaneFragments f;
  f.group4 = e.divs(lane, e.idx(4));
  f.pair = e.mul(e.rems(lane, e.idx(4)), e.idx(2));
  f.row16 = e.rems(lane, e.idx(16));
  f.half8 = e.mul(e.divs(lane, e.idx(16)), e.idx(8));
  f.row8 = e.rems(lane, e.idx(8));
  f.k8 = e.mul(e.rems(e.divs(lane, e.idx(8)), e.idx(2)), e.idx(8));
  return f;
}

/// The sequence of a block (Spec section 2, TileBuilder.h): its batch,
/// first token and length, and (compressed keys, packed layout) its first
/// compressed row. `s` is the batch, or with `cuSeqlens` the sequence.
SequenceView viewSequence(Emit &e, Value q, Value cuSeqlens, Value s,
                          bool compressed, int64_t l, int64_t d);

/// Copies `rows` rows of `cols` bf16 from `src` [B, T, H, D] into `dst`
/// ([rows, stride] in shared memory) by cp.async, 16 bytes a copy, over
/// threads `tid` in [0, threads): row r reads (batch, row, head) with
/// (row, head) = `rowHead(r)`, or is zero-filled where `valid(r)` is false
/// (every row is read without it).
void copyRowsAsync(Emit &e, Value tid, int64_t threads, Value batch, Value dst,
                   int64_t rows, int64_t cols, Value src,
                   function_ref<std::pair<Value, Value>(Value r)> rowHead,
                   function_ref<Value(Value r)> valid);

/// copyRowsAsync into the 128-byte-swizzled tile (Wgmma.h) at byte `offset`
/// of `shared` (i8, its start 1024-byte aligned): `rows` rows of `cols`
/// bf16 (a multiple of 64); `threads` a multiple of 64.
void copyRowsSwizzledAsync(
    Emit &e, Value tid, int64_t threads, Value batch, Value shared,
    Value offset, int64_t rows, int64_t cols, Value src,
    function_ref<std::pair<Value, Value>(Value r)> rowHead,
    function_ref<Value(Value r)> valid);

/// The shared memory of a kernel with swizzled tiles: `base` (i8) starts
/// 1024-byte aligned past the static variables (kStaticSharedBytes), its
/// shared address `address` (i32); `totalBytes` is the dynamic size asked
/// for, kStaticSharedBytes + kSwizzleAtomBytes of it the padding.
struct SwizzledShared {
  Value base, address;
};
SwizzledShared alignForSwizzle(Emit &e, Value dynamicShared,
                               int64_t totalBytes);

/// The keys [lo, hi] (i32) that token `t` (i32) sees: window, t - w < s <=
/// t; compressed, the blocks i with i d + l - 1 <= t (Spec sections 4, 7).
std::pair<Value, Value> keyInterval(Emit &e, FlashKeys keys, int64_t window,
                                    int64_t l, int64_t d, Value t);

/// The distinct selection blocks that `tokens` tokens from `t0` chose
/// (indices [B, T, H, n] i32 of KV head `h`; Spec section 6: -1 skipped, a
/// repeated block once), built in shared memory over threads `tid` in
/// [0, threads): `cand` [tokens * n] their (token, slot) blocks, `list`
/// [tokens * n + 1] the distinct blocks in the order first chosen (its
/// count in the last entry) and `keep` [tokens * n] per listed block 1 or
/// (`masks`) the mask of the tokens that chose it (bit k: token t0 + k;
/// tokens <= 32).
struct BlockUnion {
  Value cand, keep, list, length;
};
BlockUnion buildBlockUnion(Emit &e, Value tid, int64_t threads, Value indices,
                           Value batch, Value start, Value len, Value t0,
                           Value h, int64_t tokens, int64_t n, bool masks,
                           Value cand, Value keep, Value list);

/// Whether selection block `j` is forced for a token whose block is
/// `cBlock` (Spec 5.4, `spec::Backbone::isForced`; both i32).
Value backboneForced(Emit &e, const spec::Backbone &bb, Value j, Value cBlock);

/// What of a key tile a TMA load, wait or release covers.
enum class TileParts { Both, Keys, Values };

/// Builds the kernel body; one instance per launch.
class FlashBuilder {
public:
  FlashBuilder(OpBuilder &b, Location loc, const FlashConfig &c,
               const FlashOperands &ops)
      : e{b, loc}, b(b), loc(loc), c(c), ops(ops), lay(c) {}

  void build(gpu::LaunchOp launch);

private:
  /// The thread's indices and fragments, the block's heads and sequence,
  /// the dynamic shared memory and (TMA) the ring's barriers.
  void beginKernel(gpu::LaunchOp launch);
  /// The block's key range (lo, keyBase, keyLimit, tLast): the number of
  /// key tiles it walks.
  Value keyTiles();
  /// Q into shared memory and (mma.sync) fragments, or (wgmma) its
  /// descriptor.
  void loadQuery();
  /// The key-tile loop of the kernels that are neither overlapped nor
  /// pipelined, and their epilogue.
  void mainLoop(Value numTiles);
  Emit e;
  OpBuilder &b;
  Location loc;
  const FlashConfig &c;
  const FlashOperands &ops;
  Layout lay;

  using Scores = SmallVector<SmallVector<Value, 4>>;

  // Thread and block coordinates, ldmatrix lane offsets.
  Value tid, lane, wm, wn, group4, pair, row16, half8, row8, k8;
  // The block's sequence and rows.
  Value batch, start, len, cmpStart, t0, tLast, h, headOff;
  // The key tiles: the first, the rows of the key tensors they index.
  Value lo, keyBase, keyLimit;
  // This thread's rows and their tokens; their Q fragments.
  Value rowA, rowB, tokA, tokB;
  SmallVector<SmallVector<Value, 4>> qFrags;
  Value sharedBase;
  // wgmma: the shared address (i32) of sharedBase, Q's descriptor, the
  // ring stage of the tile being processed, the ring's mbarriers.
  Value sharedAddr, curStage, ringBars;
  WgmmaDesc qDesc;
  // overlap: the mbarriers of the ring's values (ringBars: its keys).
  Value vBars;
  // Selected: shared candidates, keep flags, list, list length.
  Value cand, keep, list, listLen;
  // Selection: the compressed lse of rows A and B, in log2 units.
  Value lseA, lseB;
  // Gathered: the block, and the partial rows (t * n + slot) of rows A, B.
  Value gBlock, outRowA, outRowB;

  Value tokenOf(Value r) {
    return e.add(t0, e.divs(r, e.idx(c.rowsPerToken())));
  }
  /// Padding rows (selection with G < 16) read the token's last head.
  Value headOf(Value r) {
    Value in = e.rems(r, e.idx(c.rowsPerToken()));
    if (c.rowsPerToken() > c.headsPerBlock())
      in = e.min(in, e.idx(c.headsPerBlock() - 1));
    return e.add(headOff, in);
  }
  /// Whether row `r` is a head (not padding).
  Value isHeadRow(Value r) {
    return e.lt(e.rems(r, e.idx(c.rowsPerToken())), e.idx(c.headsPerBlock()));
  }
  Value finiteOrZero(Value m) {
    return e.sel(e.fcmp(arith::CmpFPredicate::OEQ, m, e.f32(-INFINITY)),
                 e.f32(0), m);
  }
  Value commit() {
    return nvgpu::DeviceAsyncCreateGroupOp::create(
        b, loc, nvgpu::DeviceAsyncTokenType::get(b.getContext()),
        ValueRange{});
  }
  void syncWarp() { NVVM::SyncWarpOp::create(b, loc, e.i32(-1)); }
  Value view(Value byteOffset, ArrayRef<int64_t> shape, Type elt) {
    auto space = gpu::AddressSpaceAttr::get(
        b.getContext(), gpu::GPUDialect::getWorkgroupAddressSpace());
    return memref::ViewOp::create(b, loc,
                                  MemRefType::get(shape, elt, AffineMap(), space),
                                  sharedBase, byteOffset, ValueRange{});
  }
  void sequenceView(Value s);
  void buildUnion();
  /// Gathered (BlockMajor.cpp): the body of work item `item`.
  void buildGathered(Value item);
  /// Copies `rows` rows of `cols` elements from `src` into `dst` ([rows,
  /// stride] in shared memory): row r reads (row, head) `rowHead(r)`, or is
  /// zero-filled where `valid(r)` is false (every row is read without it).
  void copyRows(Value dst, int64_t rows, int64_t cols, Value src,
                function_ref<std::pair<Value, Value>(Value r)> rowHead,
                function_ref<Value(Value r)> valid);
  /// copyRows into the 128-byte-swizzled tile at byte `offset` (Wgmma.h).
  void copyRowsSwizzled(Value offset, int64_t rows, int64_t cols, Value src,
                        function_ref<std::pair<Value, Value>(Value r)> rowHead,
                        function_ref<Value(Value r)> valid);
  /// Waits for this thread's cp.async groups but `pending`, then for the
  /// block.
  void waitCopies(int64_t pending);
  /// The first key of key tile `kt`.
  Value tileStart(Value kt);
  void loadTile(Value stage, Value kt);
  /// TMA: `issuer` (thread 0 if null) starts the loads of tile `kt`'s
  /// `parts` into `stage`; every thread waits for them in `stage`, their
  /// `use`-th fill. Keys and values together are on ringBars; with overlap
  /// the keys alone are on ringBars and the values on vBars.
  void issueTile(Value stage, Value kt, TileParts parts = TileParts::Both,
                 Value issuer = Value());
  void waitTile(Value stage, Value use, TileParts parts = TileParts::Both);
  /// The TMA loads of the keys (or values) at `key` into `stage`, on
  /// `bars`.
  void tmaLoads(Value bars, Value stage, Value key, bool value);
  /// TMA key-tile loops without a block barrier per tile: this warp is done
  /// with `parts` of the tile in `stage`; the last warp of the block to say
  /// so starts the loads of tile `refill`'s into it (if below `numTiles`).
  /// A warp may run up to `stages` tiles ahead of the slowest.
  void releaseStage(Value stage, Value refill, Value numTiles,
                    TileParts parts = TileParts::Both);
  /// Lane 0 of the warp whose count of `counter` (an index into the
  /// release counts) completes a multiple of the block's warps.
  Value countOut(Value counter);
  Value stageView(Value stage, bool value);
  Value stageOffset(Value stage, bool value);
  /// The ldmatrix indices into a stage view of the element (`row`,
  /// `col` + `laneCol`) (col a multiple of 8, laneCol 0 or 8; with TMA
  /// row % 8 must be lane % 8).
  SmallVector<Value, 2> tileIndex(Value row, int64_t col, Value laneCol);
  /// S by wgmma: this warp's rows of the 64-row block against the tile in
  /// ring stage `stage`.
  Scores scoresWgmma(Value stage);
  /// Starts S by wgmma without waiting: the accumulators, in flight.
  SmallVector<Value> issueScores(Value stage);
  static Scores fragments(ArrayRef<Value> acc);
  /// O += P V by wgmma, V from ring stage curStage; with `wait` false the
  /// result is in flight.
  SmallVector<Value> accumulateWgmma(ArrayRef<SmallVector<Value, 4>> pFrags,
                                     ArrayRef<Value> o, bool wait = true);
  /// The key-tile loop of wgmma attention with at least 3 stages: tile
  /// kt + 1's S is issued before tile kt's softmax, and tile kt's P V
  /// completes under the next iteration's wait.
  void pipelinedLoop(Value numTiles);
  /// The key-tile loop of `overlap`: each iteration waits for tile kt's
  /// keys, issues its S and (with tile kt - 1's values) the last tile's
  /// P V, waits for S and frees the keys (the last warp loads those of tile
  /// kt + 2), runs the softmax while P V is in flight, then waits for P V,
  /// frees the values (tile kt + 1's come in) and rescales O. Nothing is
  /// in flight across the back edge.
  void overlappedLoop(Value numTiles);
  /// pingpong: this warpgroup waits for its turn (`take`) or hands the
  /// turn to the other.
  void turn(bool take);
  /// The key-tile loop of wgmma block selection: `stages` tiles ahead by
  /// TMA (a stage is free once its S completes: selection has no P V), and
  /// tile kt + 1's S on the tensor cores during tile kt's scoring.
  void pipelinedSelectLoop(Value numTiles);
  /// In a pipelined loop at tile kt, once the barrier has freed the stage
  /// of tile `ahead`: loads that tile (if any), waits for tile kt + 1 and
  /// issues its S; returns the accumulators in flight.
  SmallVector<Value> refillAndIssueNext(Value kt, Value ahead, Value numTiles);
  /// Waits for tile kt + 1 (if any) and issues its S; returns the
  /// accumulators in flight.
  SmallVector<Value> issueNext(Value kt, Value numTiles);
  /// S = Q K^T of this warp's rows and keys of the tile in `kS`.
  Scores scores(Value kS, Value keyW0);
  /// The keys [lo, hi] (i32) row `r` of token `tok` sees in tile `kt`.
  std::pair<Value, Value> interval(Value r, Value tok, Value kt);
  /// Whether every row of the block sees all keys of the tile from `k0`.
  Value wholeTileVisible(Value k0);

  // Attention: the online softmax.
  SmallVector<Value> attendInit();
  /// One tile's online-softmax update; with `deferPV` (the pipelined wgmma
  /// loops) P V is left to the caller and P, in f32 (packP packs it),
  /// follows the state: the caller packs it once the last P V is done
  /// with its registers.
  /// With `state` holding no O (overlap: max and sum only) the result
  /// holds the rows' rescale factors after the new max and sum, and O is
  /// the caller's to rescale.
  SmallVector<Value> attendTile(Value kt, Scores &s, Value vS, Value keyW0,
                                ValueRange state, bool deferPV = false);
  SmallVector<Value> attendTile(Value kt, Scores &s, Value vS, Value keyW0,
                                ValueRange state, bool mask, bool deferPV);
  /// P in f32, as attendTile's fragments in order, packed into bf16
  /// fragments for P V (four i32 of bf16 pairs per 16 keys).
  SmallVector<SmallVector<Value, 4>> packP(ArrayRef<Value> p);
  void attendFinish(ValueRange state);
  void writeRows(ArrayRef<Value> acc, Value mA, Value mB, Value lA, Value lB);

  // Selection: block scores and a running top-n.
  Value isForced(Value j, Value cBlock);
  Value selectionShared(int64_t offset, ArrayRef<int64_t> shape, Type elt);
  /// Per warp, 16 x (score bits, block, valid) i32: the ranked entries and
  /// the queue of entries waiting for the ranking.
  Value rankedEntries();
  Value queuedEntries();
  SmallVector<Value> selectInit();
  SmallVector<Value> selectTile(Value kt, Scores &s, ValueRange state);
  /// Block selection: the probabilities of key tile `kt` (starting at
  /// compressed block k0) summed over the warp's rows, into the warp's
  /// `columns` after the previous tile's carry.
  void sumColumns(Value kt, Scores &s, Value k0, Value warp, Value columns,
                  Value zero);
  /// Merges the `count` pending entries into the ranked ones (lanes 0-15
  /// of `state`); returns the new ranked entries.
  SmallVector<Value> selectMerge(ValueRange state, Value count);
  void selectFinish(ValueRange state);
};

/// A gpu.launch of `grid` blocks of `threads` threads named `kernelName`
/// (its kernel and module), in clusters of `cluster` blocks along x where
/// that is not 0 (sm_90), the builder left inside its empty body.
gpu::LaunchOp createNamedLaunch(OpBuilder &b, Location loc,
                                ArrayRef<Value> grid, int64_t threads,
                                int64_t sharedBytes, StringRef kernelName,
                                int64_t cluster = 0);

/// One launch of blocks of `threads` threads with a thread per (batch,
/// token, head) of `like` [B, T, ...] (`heads` heads): `body(e, batch, t,
/// head, tokens)` for each, with T the tokens.
gpu::LaunchOp
launchPerRow(OpBuilder &b, Location loc, Value like, int64_t heads,
             int64_t threads, StringRef kernelName,
             function_ref<void(Emit &, Value, Value, Value, Value)> body);

/// A TMA tensor map (made on the host) of `tensor` [B, T, H, D] bf16 whose
/// box is `keys` rows of `heads` heads and 64 columns (in shared memory
/// keys x heads rows of 128 bytes, head-minor), 128-byte swizzled, zero
/// past the end.
Value createTileMap(OpBuilder &b, Location loc, Value tensor, int64_t keys,
                    int64_t heads = 1);

} // namespace mlir::nsa::detail::flash

#endif // NSA_LIB_CONVERSION_NSATOGPU_FLASHBUILDER_H
