//===- FlashDecodeBuilder.h - a decoding step's kernel builder --*- C++ -*-===//
//
// The builder of FlashDecode.h's launches, shared by FlashDecode.cpp (the
// launches, the attention over a split's chunks, the merges) and
// FlashDecodeSelect.cpp (the selected kernel's choice of blocks).
//
// Private to lib/Conversion/NSAToGPU.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_LIB_CONVERSION_NSATOGPU_FLASHDECODEBUILDER_H
#define NSA_LIB_CONVERSION_NSATOGPU_FLASHDECODEBUILDER_H

#include "FlashBuilder.h"
#include "FlashDecode.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

#include <cmath>
#include <functional>
#include <optional>

namespace mlir::nsa::detail::decode {

// The flash kernel builders' helpers (Emit, alignUp, ...).
using namespace flash;

/// Whether a step of `c` may take `_cluster` (FlashDecode.h).
inline bool mayCluster(const DecodeConfig &c) {
  return c.clusterBlocks > 1 && c.gridDeps && c.rowTiles() == 1;
}

/// Which keys a partial block walks.
enum class DecodeKeys { Compressed, Window, Selected };

/// lg2.approx.ftz.f32.
inline Value lg2(Emit &e, Value x) {
  return LLVM::InlineAsmOp::create(
             e.b, e.loc, e.b.getF32Type(), ValueRange{x},
             e.b.getStringAttr("lg2.approx.ftz.f32 $0, $1;"),
             e.b.getStringAttr("=f,f"), UnitAttr(), UnitAttr(),
             LLVM::TailCallKindAttr::get(
                 e.b.getContext(), LLVM::tailcallkind::TailCallKind::None),
             LLVM::AsmDialectAttr(), ArrayAttr())
      .getResult(0);
}

inline Value isNegInf(Emit &e, Value x) {
  return e.fcmp(arith::CmpFPredicate::OEQ, x, e.f32(-INFINITY));
}

/// The host's choices and the workspace of one step; every value is an
/// index on the host, captured by the launches.
struct Plan {
  Value batch, cacheTokens, cmpRows;
  /// Chunks a split of each branch walks, and the splits.
  Value cmpChunks, cmpPer, winPer, slcPer;
  Value cmpSplits, winSplits, slcSplits, splits;
  /// i1: the step takes the `_cluster` launch.
  Value clustered;
  /// Index, 1 where `_cluster` pools the compressed caches' new rows (the
  /// appends folded in, DecodeOperands), else 0.
  Value foldedAppends;
  /// f32 workspace and its regions' offsets (elements); per row tile an
  /// i32 count of the selected splits done (zeroed by the partial kernel).
  Value work, statsAt, outAt, refAt, partAt, preAt, done;
};

/// Byte offsets of a partial (or selected) block's shared memory.
struct PartialLayout {
  int64_t qStride, kStride, vStride, pStride, sStride;
  int64_t q, k, v, p, s, stats, lse, best, lists, flag, chosen, cands, bars,
      pooled, recvBar, stamps, total;
  /// Trace stamps a block records (DecodeBuilder::Stamp).
  static constexpr int64_t kStampCount = 12;
  /// Block selection in the selected kernel, a pass of `passChunks`
  /// compressed chunks' candidates at a time, `perThread` a thread; the
  /// pass's chunks (and the one before) staged in the K, V, P and S
  /// buffers, which the attention does not use yet: each chunk's factors
  /// exp2(m - lse) per row, its Eq. 9 partials per row and slot, and their
  /// sums over the group's rows per slot. perThread is 0 where no pass fits.
  int64_t perThread = 0, passChunks = 0, factors = 0, parts = 0, sums = 0;
  /// Candidates (key, block) scoreInCluster holds at once: the buffers
  /// before the statistics (Q, K, V, P, S), free between the branches.
  int64_t clusterCandidates() const { return stats / 8; }
  explicit PartialLayout(const DecodeConfig &c) {
    int64_t n = c.chunkKeys, threads = 2 * n;
    int64_t rows = 16 * c.rowTiles(), slots = c.slotsPerChunk();
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
    // Selection: the group's lse per row, the best n so far (key, block),
    // the tournament's lists (a warp's n best of a pass), the last
    // block's flag, the n chosen blocks in rank order, the block's n
    // best candidates in rank order (`_cluster`: its peers read them), the
    // mbarriers of the K and V buffers' bulk copies, then a new compressed
    // row's K and V (`_cluster` with the appends folded in).
    lse = alignUp(stats + 16 * 3 * 4, 16);
    best = alignUp(lse + rows * 4, 16);
    lists = alignUp(best + c.numSelected * 2 * 4, 16);
    flag = alignUp(lists + threads / 32 * c.numSelected * 2 * 4, 16);
    chosen = alignUp(flag + 4, 16);
    cands = alignUp(chosen + c.numSelected * 4, 16);
    bars = alignUp(cands + c.numSelected * 2 * 4, 16);
    pooled = bars + 16;
    // The pushed splits' two mbarriers (`_cluster` with clusterPush).
    recvBar = alignUp(pooled + (c.qkDim + c.vDim) * 2, 16);
    // Trace stamps (DecodeConfig::trace), u64 each.
    stamps = recvBar + 16;
    total = c.trace ? stamps + kStampCount * 8 : stamps;
    // Candidates of a chunk: threads / perChunk = 2 l' / d chunks a pass
    // give each thread one.
    if (!c.cmpStride || !c.slcBlock || c.slcBlock % c.cmpStride)
      return;
    int64_t perChunk = n / (c.slcBlock / c.cmpStride);
    for (int64_t each = 4; each > 0; --each) {
      int64_t chunks = each * threads / std::max<int64_t>(perChunk, 1);
      int64_t staged = chunks + 1;
      factors = k;
      parts = alignUp(factors + staged * rows * 4, 16);
      sums = alignUp(parts + staged * rows * slots * 4, 16);
      if (alignUp(sums + staged * slots * 4, 16) <= stats) {
        perThread = each;
        passChunks = chunks;
        return;
      }
    }
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
    auto splitLaunches = [&] {
      buildPartialLaunch(name.str() + "_partial" + pdl, /*selected=*/false);
      buildPartialLaunch(name.str() + "_selected" + pdl, /*selected=*/true);
    };
    if (!clusters()) {
      splitLaunches();
      return;
    }
    scf::IfOp::create(
        b, loc, p.clustered,
        [&](OpBuilder &, Location) {
          buildClusterLaunch(name.str() + "_cluster" + pdl);
          scf::YieldOp::create(b, loc);
        },
        [&](OpBuilder &, Location) {
          splitLaunches();
          scf::YieldOp::create(b, loc);
        });
  }

private:
  Emit e;
  OpBuilder &b;
  Location loc;
  const DecodeConfig &c;
  const DecodeOperands &ops;
  PartialLayout lay;
  Plan p;
  /// Building `_cluster`: its selected splits neither merge nor count.
  bool inCluster = false;
  /// Building a launch that waited at its entry (waitAtEntry).
  bool waitedAtEntry = false;
  /// Building `_cluster`'s selected splits: `chosen` is filled before them
  /// (gatherChosen), they do not choose.
  bool chosenReady = false;

  /// Whether the step may take `_cluster` (FlashDecode.h).
  bool clusters() const { return mayCluster(c); }
  /// The phases DecodeConfig::trace stamps, in `_cluster`.
  enum Stamp : int64_t {
    Start,         ///< the block's first instruction
    Compressed,    ///< its compressed split done (before the first barrier)
    Barrier,       ///< past the first cluster barrier
    Lse,           ///< selected: the group's lse in shared memory
    Sums,          ///< selected: a pass's Eq. 10 sums (the last pass's)
    Chosen,        ///< selected: the n blocks chosen
    Issued,        ///< late splits: the first chunk's K and V issued
    Attended,      ///< late splits: the split's (max, sum, O) final
    Pushed,        ///< late splits (clusterPush): pushed to the owners
    OwnCompressed, ///< owners: the compressed results and gates stashed
    Received,      ///< owners: the pushes in
    Stored         ///< the block's output rows stored
  };
  /// DecodeConfig::trace: thread 0 records %globaltimer as `stamp`.
  void stamp(Stamp which);
  /// DecodeConfig::trace: thread 0 of the first cluster's blocks prints
  /// the stamps (a block's last act).
  void printStamps(Value rank);
  /// Chunks a selected or window split of `_cluster` walks: the fewest
  /// with which both branches' splits fit a cluster.
  int64_t clusterLatePer() const {
    int64_t per = 1;
    while ((winChunks() + per - 1) / per + (slcChunks() + per - 1) / per >
           c.clusterBlocks)
      ++per;
    return per;
  }

  /// `_cluster`'s selected and window splits (ranks [0, lateSplits())).
  int64_t lateSplits() const {
    int64_t per = clusterLatePer();
    return (winChunks() + per - 1) / per + (slcChunks() + per - 1) / per;
  }
  /// clusterPush: the blocks of ranks [lateSplits(), clusterBlocks) own
  /// pushRows() rows of the tile each (the last ones fewer), in their K and
  /// V buffers: the pushed O ([row][late split][Dv] f32) at lay.k, the
  /// pushed (max, sum) ([row][late split][2]) at pushStatsAt(), and, per
  /// (item, lane) of their merge, the compressed result, the three gates
  /// and the window's result at pushStashAt().
  int64_t pushOwners() const { return c.clusterBlocks - lateSplits(); }
  int64_t pushRows() const {
    return pushOwners() > 0 ? (16 + pushOwners() - 1) / pushOwners() : 0;
  }
  int64_t pushStatsAt() const {
    return lay.k + pushRows() * lateSplits() * c.vDim * 4;
  }
  int64_t pushStashAt() const {
    return alignUp(pushStatsAt() + pushRows() * lateSplits() * 2 * 4, 16);
  }
  /// Whether `_cluster` merges by pushes (DecodeConfig::clusterPush).
  bool pushMerge() const {
    int64_t lanes = pushRows() * (c.vDim / 8) * 8;
    return clusters() && c.clusterPush && !c.clusterSelect &&
           pushOwners() > 0 && pushRows() * (c.vDim / 8) % 4 == 0 &&
           pushStashAt() + lanes * 5 * 4 <= lay.stats;
  }

  int64_t qHeads() const { return c.kvHeads * c.group; }
  /// Chunks [s per, min((s + 1) per, chunks)) of split s.
  std::pair<Value, Value> chunkRange(Value s, Value per, Value chunks) {
    Value begin = e.mul(s, per);
    return {begin, e.min(e.add(begin, per), chunks)};
  }
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
  /// one wrote is visible after it. Every block must reach it. (Nothing
  /// where the launch waited at its entry.)
  void waitForPredecessor() {
    if (c.gridDeps && !waitedAtEntry)
      NVVM::GriddepcontrolOp::create(b, loc, NVVM::GridDepActionKind::wait);
  }
  /// A launch that may be a step's first (`_partial`, `_cluster`) waits at
  /// its entry, before it reads or writes global memory: its predecessor
  /// may be the caller's kernel that wrote the caches or the query, or the
  /// step before on the stream, whose workspace it shares. Then it lets
  /// the next launch start (which waits the same way).
  void waitAtEntry() {
    waitForPredecessor();
    waitedAtEntry = true;
    releaseSuccessor();
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
  /// A PTX statement with side effects and a memory clobber, its operands
  /// `in` as `$0, $1, ...` by `constraints` ("r", "l").
  void ptx(StringRef text, ValueRange in, StringRef constraints);
  /// The shared-window address (i32) of byte `offset` of the dynamic
  /// shared memory.
  Value sharedAddress(int64_t offset);
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

  /// The row tile (of batch row `batch`) of group row rho (Value, < 16 x
  /// rowTiles) of token `token` and KV head `head`.
  Value groupTileIndex(Value batch, Value token, Value head, Value rho) {
    Value first =
        e.mul(e.add(e.mul(token, e.idx(c.kvHeads)), head), e.idx(c.rowTiles()));
    return e.add(e.mul(batch, e.idx(c.tiles())),
                 e.add(first, e.divs(rho, e.idx(16))));
  }
  /// The bf16-rounded quotient o / l (0 where l <= 0): a branch's result.
  Value branchResult(Value o, Value l);

  void plan();
  void buildPartialLaunch(const std::string &name, bool selected);
  void buildClusterLaunch(const std::string &name);
  void clusterBarrier();
  void clusterMerge(Value batch, Tile tile, Value tileIndex, Value rank,
                    Value tid);
  /// clusterPush, in an owner (rank >= lateSplits()) before the first
  /// cluster barrier: its two mbarriers (window, selected) initialized and
  /// told the bytes those splits push to it.
  void initPushed(Value rank, Value tid);
  /// clusterPush, at the end of a late split (`late` its index among
  /// them, rows' (max, sum) in `stats`): each row's (max, sum) and O
  /// pushed to its owner.
  void pushSplit(Value late, Value stats, ArrayRef<Value> acc, Value warp,
                 Value tid, int64_t vGroups);
  /// clusterPush, an owner after the first cluster barrier: its rows'
  /// compressed results (from the workspace) and gates, then, as each
  /// branch's pushes come in, the window's and the selected splits'
  /// results, and the gated output rows.
  void clusterMergePushed(Value batch, Tile tile, Value tileIndex, Value rank,
                          Value tid);
  /// One split of a branch's keys for row tile `y`: chunks [chunkBegin,
  /// chunkEnd) attended, the split's (max, sum, O) written as split
  /// `outSplit` (FlashDecodeSplit.cpp).
  void attendSplit(DecodeKeys keys, Value batch, Value y, Value chunkBegin,
                   Value chunkEnd, Value outSplit);
  /// The token's n blocks (Spec 5.2-5.4) into `chosen` in rank order, -1
  /// where fewer, ranked by this block alone (FlashDecodeSelect.cpp).
  void chooseBlocks(Value batch, Tile tile, Value t, Value tid, Value chosen);
  /// What the steps of chooseBlocks share.
  struct Choice {
    Value batch, tid, warp, lane;
    Tile tile;
    /// Shared memory: the group's lse per row, the best n so far and the
    /// warps' lists (key, ~block), the staged factors, partials and the
    /// per-slot sums of a pass.
    Value lseS, best, lists, factorS, partS, sumS;
    /// The token's selection block, the compressed chunks it sees, the
    /// passes over them; a blank candidate's keys.
    Value last, chunkEnd, passes, blankKey, blankBlock;
  };
  Choice beginChoice(Value batch, Tile tile, Value t, Value tid);
  /// The row tile of the group's row rho.
  Value choiceTile(const Choice &ch, Value rho);
  /// Staged chunk `local` of the pass starting at chunk c0: its index and
  /// whether the token sees it.
  std::pair<Value, Value> stagedChunk(const Choice &ch, Value c0, Value local);
  /// The pass from chunk c0's partials and reference maxima, by cp.async
  /// as one group.
  void stageChunks(const Choice &ch, Value c0);
  void waitStaged();
  /// 1. The group's compressed lse per row into `lseS` (the first pass
  /// staged on the way).
  void groupLse(const Choice &ch);
  /// One pass: the slots' sums, the next pass staged, the candidates and
  /// the tournament into `best`.
  void choosePass(const Choice &ch, Value pass);
  /// 2, 3. The staged chunks' factors, then per chunk and slot the sum
  /// over the group's rows (Eq. 10).
  void passSums(const Choice &ch, Value c0);
  /// 4. This thread's candidates of the pass and (threads < n) the best n
  /// so far, as (key, ~block) pairs.
  void passCandidates(const Choice &ch, Value c0, SmallVector<Value> &keys,
                      SmallVector<Value> &keys2);
  /// A thread's candidates into rank order.
  void sortPairs(SmallVector<Value> &k1, SmallVector<Value> &k2);
  /// 5. The warp's n best of its lanes' sorted candidates, round r's to
  /// put(r, key, key2) by lane 0.
  void tournament(const Choice &ch, ArrayRef<Value> k1, ArrayRef<Value> k2,
                  function_ref<void(Value, Value, Value)> put);
  /// The group's compressed lse per row (log2 units, -inf for padding rows
  /// and rows that saw no block) from split s's (max, sum) `loaded` (lane
  /// s of warp w holds row w + warps i's at 2 i, 2 i + 1; -inf, 0 for no
  /// split) into `lseS`.
  void storeGroupLse(ArrayRef<Value> loaded, Value tid, Value lseS);
  /// `_cluster` (FlashDecodeSelect.cpp): block `rank` of the cluster scores
  /// its share of the token's blocks (Eq. 9, 10 from the compressed splits'
  /// partials) and keeps the n best of them in rank order in its shared
  /// memory (`lay.cands`); every block of the cluster, after the first
  /// cluster barrier.
  void scoreInCluster(Value batch, Tile tile, Value t, Value tid, Value rank);
  /// `_cluster`, after the cluster barrier that follows scoreInCluster:
  /// the n best of the cluster's blocks' candidates, by their ranks among
  /// the sorted lists of the peers (distributed shared memory), as the
  /// token's n blocks into `chosen` in rank order (-1 where fewer).
  void gatherChosen(Value tid, Value chosen);
  /// The shared::cluster address (i32) of byte `offset` + `byteIndex` of
  /// block `rank`'s dynamic shared memory.
  Value peerAddress(int64_t offset, Value byteIndex, Value rank);
  int64_t clusterCandidates() const { return lay.clusterCandidates(); }
  /// The appends folded into `_cluster` (FlashDecodeAppend.cpp): the new
  /// compressed row, its chunk, and whether this block pools it (i1).
  struct PooledRow {
    Value first, chunk, here;
  };
  /// At a compressed split's start: where the new row is in chunks
  /// [chunkBegin, chunkEnd), pools it into shared memory and (the last
  /// token's row tiles) the caches.
  PooledRow poolAppended(Value batch, Tile tile, Value tid, Value chunkBegin,
                         Value chunkEnd);
  /// After the wait for chunk `chunk`'s K (V) in `into`: the pooled row in
  /// place of its copy, then a block barrier (where it is in the chunk).
  void placeAppended(const PooledRow &row, Value chunk, bool values,
                     Value into, Value tid);
  /// What the steps of attendSplit share.
  struct Split {
    DecodeKeys keys;
    Value batch, chunkBegin, chunkEnd, outSplit;
    Value tid, warp, lane, laneI32;
    LaneFragments f;
    /// The dynamic shared memory and its views: Q, the chunk's K and V,
    /// P (bf16) and S (f32) of the 16 rows, and the rows' (max, sum,
    /// alpha); the selected blocks.
    Value shared, qS, kS, vS, pS, sS, stats, chosen;
    Tile tile;
    /// The token's position, the row tile's index, the compressed blocks
    /// the token sees, the rows of the cache the keys come from.
    Value t, tileIndex, visible, cacheRows, kSrc, vSrc;
    /// The K and V mbarriers (bulk copies), Q's cp.async group, the scale
    /// in log2 units.
    Value kBar, vBar, qToken, scaleLog2;
    /// K and V by cp.async (`_cluster`), else by bulk copies.
    bool noBulk = false;
    /// Warps; the 16-key groups of a chunk and 16-column groups of Dv a
    /// warp takes (of vGroupsAll).
    int64_t warps = 0, kGroups = 0, vGroupsAll = 0, vGroups = 0;
    /// The global address (i64) of a row of K or V of the tile's head.
    std::function<Value(Value)> kRow, vRow;
    SmallVector<SmallVector<Value, 4>> qFrags;
  };
  /// A chunk's online softmax, a thread's share: its row, its part of the
  /// row (`per` keys from `first`) and their probabilities (f32).
  struct ChunkRows {
    static constexpr int64_t per = 8;
    Value row, part, first;
    SmallVector<Value> pvs;
  };
  /// The split's views, Q on its way, the mbarriers, its chosen blocks.
  Split beginSplit(DecodeKeys keys, Value batch, Value y, Value chunkBegin,
                   Value chunkEnd, Value outSplit);
  /// The i-th 16-column group of Dv of this warp.
  Value vGroupOf(const Split &s, int64_t i);
  /// 1. Key kk of a chunk: its row (0 where unseen) and whether the token
  /// sees it (computed where used: a list in shared memory costs a
  /// barrier and a dependent load a row).
  std::pair<Value, Value> splitKey(const Split &s, Value chunk, Value kk);
  std::function<Value(Value)> rowAddresses(const Split &s, Value src);
  /// 2. Chunk `chunk`'s K or V into shared memory: by cp.async (unseen
  /// rows zero-filled) or by bulk copies on the mbarrier.
  void issueChunk(const Split &s, Value chunk, bool values);
  void issueChunkAsync(const Split &s, Value chunk, bool values);
  void issueChunkBulk(const Split &s, Value chunk, bool values);
  void commitChunk(const Split &s);
  void waitChunk(const Split &s, Value chunk, bool values);
  /// One iteration of the chunk loop: the accumulators after chunk
  /// `chunk`, the next chunk's K and V issued on the way.
  SmallVector<Value> attendChunk(const Split &s,
                                 const std::optional<PooledRow> &pooled,
                                 Value chunk, ValueRange accIn);
  /// 3. S = Q K^T into shared memory.
  void scoreChunk(const Split &s, Value chunk);
  /// 4. The online softmax of S: P into shared memory, the rows' (max,
  /// sum, alpha) updated.
  ChunkRows softmaxChunk(const Split &s, Value chunk);
  /// Whether a compressed chunk's Eq. 9 partials come from registers
  /// (else from S in shared memory).
  bool partialsInRegisters() const;
  void storeChunkPartials(const Split &s, Value chunk, const ChunkRows &rows);
  /// 5. O = alpha O + P V.
  void accumulateChunk(const Split &s, SmallVector<Value> &acc);
  /// The split's (max, sum) and O out (or pushed); the selected kernel's
  /// last block of a row tile merges.
  void endSplit(const Split &s, ValueRange acc);
  std::pair<SmallVector<Value>, Value> mergeRange(Value tileIndex, Value r,
                                                  Value col, Value begin,
                                                  Value end, Value k,
                                                  int64_t lanes);
  /// The (max, sum, O[8]) `st` of `lanes` consecutive lanes merged by xor
  /// shuffles: every lane gets the (unnormalized) O and the sum.
  std::pair<SmallVector<Value>, Value> mergeLanes(SmallVector<Value> st,
                                                  int64_t lanes);
  /// A split's (max, sum, O[8]): 2 f32 of `stats` at element statsAt and
  /// 8 of `o` at oAt; the max -inf where `valid` is false.
  SmallVector<Value> loadEntry(Value stats, Value statsAt, Value o, Value oAt,
                               Value valid);
  /// Row r's (max, sum, O[col, col + 8)) of splits begin + k + 8 u for
  /// u < `perLane`, loaded (not merged): (max, sum, O) a split, -inf max
  /// past `end`.
  SmallVector<SmallVector<Value>> loadSplits(Value tileIndex, Value r,
                                             Value col, Value begin, Value end,
                                             Value k, int64_t perLane);
  /// loadSplits' splits of `lanes` (4 or 8) consecutive lanes merged:
  /// (O[col + k 8 / lanes + j] for j < 8 / lanes, sum) on lane k (k <
  /// lanes) of them.
  std::pair<SmallVector<Value>, Value>
  mergeLoaded(ArrayRef<SmallVector<Value>> loaded, Value k, int64_t lanes = 8);
  void preMerge(Value tileIndex, Value split, Value tid);
  void finalMerge(Value batch, Tile tile, Value tileIndex, Value tid);
};

} // namespace mlir::nsa::detail::decode

#endif // NSA_LIB_CONVERSION_NSATOGPU_FLASHDECODEBUILDER_H
