//===- TileBuilder.h - building blocks of the tiled nsa IR -------*- C++ -*-===//
//
// Emits the pieces that `nsa-tile` assembles into block-aligned, GQA-grouped
// loops: index arithmetic of the spec (include/NSA/Spec.h) on `index`
// values, the per-sequence view of a (possibly packed) batch, zero-padded
// tile loads, and one step of online softmax over a key tile written as
// linalg.generic ops on tensors (contractions stay contractions, so the GPU
// mapping can turn them into tensor-core ops).
//
//===----------------------------------------------------------------------===//

#ifndef NSA_LIB_TRANSFORMS_TILEBUILDER_H
#define NSA_LIB_TRANSFORMS_TILEBUILDER_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

#include <functional>
#include <utility>

namespace mlir::nsa::detail {

/// One sequence of a batch: its batch index, first token row, length and
/// first compressed row (Spec sections 2 and 3), and its query rows: the
/// first one's row in the query tensor and position in the sequence, and how
/// many there are. Those are `tokenStart`, 0 and `length` except when
/// decoding (`kv_lens`, Spec section 12): then the queries are the last
/// `queryLength` of `length` tokens, in rows 0 .. of their batch row.
struct SequenceView {
  Value batch, tokenStart, length, cmpStart;
  Value queryRowStart, queryStart, queryLength;
};

/// Dims 0 and 2 of a tile forall's (sequence, KV head, tile) grid.
struct TileGrid {
  OpFoldResult sequences, tiles;
};

/// A sequence and one of its tiles.
struct SequenceTile {
  Value sequence, tile;
};

/// One query token of a per-token tile: whether it lies inside its sequence
/// (`live`, and `count` = 1 or 0 rows to write), its row in the token
/// dimension (`row`, for slices, possibly one past the end), a row that
/// is always in bounds (`safeRow`, for element reads) and its position in
/// the sequence (`pos`).
struct TokenView {
  Value live, count, row, safeRow, pos;
};

/// The query tile of `tileRows` rows starting at query row `r0` of a
/// sequence: its first position `t0`, its live rows `count` and its first
/// row in the query tensor `row0`.
struct QueryTileView {
  Value t0, count, row0;
};

/// Running statistics of online softmax for `R` query rows: the row max,
/// the row sum of exp(score - max) and the unnormalised output `[R, Dv]`,
/// all f32.
struct SoftmaxState {
  Value max, sum, acc;
};

/// Builds a predicate `valid(row, col)` of one score tile element inside a
/// linalg.generic body.
using TileMaskFn =
    function_ref<Value(OpBuilder &, Location, Value row, Value col)>;

class TileBuilder {
public:
  TileBuilder(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  OpBuilder &b;
  Location loc;

  // Index arithmetic.
  Value idx(int64_t v);
  Value add(Value x, Value y);
  Value sub(Value x, Value y);
  Value mul(Value x, Value y);
  Value mul(Value x, int64_t y) { return mul(x, idx(y)); }
  Value div(Value x, int64_t y);
  Value ceilDiv(Value x, int64_t y);
  Value min(Value x, Value y);
  Value max(Value x, Value y);
  Value lt(Value x, Value y);
  Value select(Value cond, Value x, Value y);
  /// max(lo, min(v, hi)).
  Value clamp(Value v, int64_t lo, Value hi);
  Value dim(Value tensor, int64_t d);
  /// Dimension `d` of `tensor`: an attribute when static, else tensor.dim.
  OpFoldResult mixedDim(Value tensor, int64_t d);
  /// An i32 element of `tensor` as an index.
  Value loadIndex(Value tensor, ValueRange indices);

  // The spec's arithmetic on index values.
  Value numCompressedBlocks(Value seqLen, int64_t block, int64_t stride);

  /// The sequences of a batch: `B` of them, or `cu_seqlens` entries - 1.
  Value numSequences(Value tokens4d, Value cuSeqlens);
  /// Sequence `s`; with `kvLens` (decoding, no `cuSeqlens`) batch row `s`
  /// holds `kvLens[s]` tokens whose last `dim(tokens4d, 1)` are the queries.
  SequenceView sequence(Value s, Value tokens4d, Value cuSeqlens,
                        int64_t cmpBlock, int64_t cmpStride, Value kvLens = {});
  /// Dims 0 and 2 of a tile forall's (sequence, KV head, tile) grid, over
  /// tiles of `tile` units (a unit is `unit` tokens: 1 for tokens, d for
  /// compressed rows) of each sequence of `tokens4d`. Without `cuSeqlens`
  /// every batch row's ceil(extent / tile) tiles. Packed, dim 0 is 1 and
  /// dim 2 numbers the sequences' tiles in turn, sequence s's from
  /// cu[s] / (tile * unit) + s: at most T / (tile * unit) + S of them, so
  /// that many short sequences cost no more iterations than one long one.
  TileGrid sequenceTiles(Value tokens4d, Value cuSeqlens, OpFoldResult extent,
                         int64_t tile, int64_t unit);
  /// The sequence and its tile of the iteration (`iv0`, `iv2`) of a grid of
  /// sequenceTiles (packed: a binary search of cu_seqlens). A tile index
  /// past the sequence's tiles means an empty tile.
  SequenceTile sequenceTile(Value iv0, Value iv2, Value cuSeqlens,
                            int64_t tile, int64_t unit);
  /// Query `token` (an index into the sequence's query rows) of the tensor
  /// `tokens4d`.
  TokenView tokenOf(const SequenceView &seq, Value token, Value tokens4d);
  /// The query tile of `tileRows` rows from query row `r0` of `seq`.
  QueryTileView queryTile(const SequenceView &seq, Value r0, int64_t tileRows);

  /// The pool weights of KV head `h` as `[l]` f32: row `h` of `weights
  /// [H, l]`, or `1/l` for the mean pool (`weights` null), a filled tile
  /// rather than a constant so that it lives with the other tiles.
  Value poolWeights(Value weights, Value h, int64_t l);

  // Tensors.
  Value empty(ArrayRef<OpFoldResult> sizes, Type elt);
  Value fill(ArrayRef<OpFoldResult> sizes, Type elt, double value);
  /// An uninitialised `[rows, cols]` tile. When its rows would be a
  /// multiple of 128 bytes long, they are laid 16 bytes further apart (a
  /// slice of a wider tile): the threads of a warp that walk down a column,
  /// and ldmatrix's eight row reads, then hit different shared-memory banks.
  Value tile(int64_t rows, int64_t cols, Type elt);
  /// The elements tile() adds to each row of `cols` elements.
  static int64_t rowPadding(int64_t cols, Type elt);
  Value f32(double v);

  /// Rows `[row0, row0 + count)` and heads `[head0, head0 + heads)` of
  /// `src [B, T, Hs, D]` in batch `batch`, zero-padded to `rows` rows and
  /// flattened to `[rows * heads, D]` (row-major: token, then head).
  Value loadTile(Value src, Value batch, Value row0, Value count, Value head0,
                 int64_t heads, int64_t rows);

  /// Slices the first `count * heads` rows of a flattened tile
  /// `[rows * heads, D...]` back to `[count, heads, D...]`, ready for a
  /// parallel_insert_slice at `[batch, row0, head0, 0]`.
  Value unflattenTile(Value tile, Value count, int64_t heads, int64_t rows);

  /// Online softmax: initial state for `rows` query rows and `vDim`.
  SoftmaxState initSoftmax(int64_t rows, int64_t vDim);

  /// One key tile: scores `scale * q k^T` masked by `valid`, then the state
  /// update of online softmax. `q [R, Dqk]`, `k [N, Dqk]`, `v [N, Dv]` have
  /// the input element type; probabilities are rounded to it before the
  /// `P V` contraction, as tensor cores do.
  SoftmaxState attendTile(Value q, Value k, Value v, double scale,
                          TileMaskFn valid, const SoftmaxState &state);

  /// Final output `[R, Dv]` (element type `elt`) and log-sum-exp `[R]` f32;
  /// rows that saw no key get 0 and -inf (Spec section 1).
  std::pair<Value, Value> finishSoftmax(const SoftmaxState &state, Type elt);

  /// `sum_e a[r, e] * b[c, e]` as a contraction generic: `[R, N]` f32.
  Value matmulTransposeB(Value a, Value bT);

  /// `acc[i, e] += sum_c a[i, c] * b[c, e]`, or `sum_c a[c, i] * b[c, e]`
  /// when `transposeA`; `acc` f32, `a` and `b` any float type.
  Value contract(Value a, Value b, Value acc, bool transposeA);

  /// Rows `[row0, row0 + count)` and heads `[head0, head0 + heads)` of a
  /// per-row statistic `src [B, T, Hs]` (f32), zero-padded to `rows` rows
  /// and flattened to `[rows * heads]`, like loadTile.
  Value loadRowTile(Value src, Value batch, Value row0, Value count,
                    Value head0, int64_t heads, int64_t rows);

  /// One key tile of attention backward for the query rows `q [R, Dqk]`
  /// with output gradients `dOut [R, Dv]`, log-sum-exps `lse [R]` and
  /// `delta [R] = rowsum(dOut * out)`: the probabilities
  /// `P = exp(scale * q k^T - lse)` where `valid`, else 0, and the score
  /// gradients `scale * P * (dOut v^T - delta)`, both `[R, N]` rounded to
  /// the input element type, as tensor cores consume them.
  std::pair<Value, Value> attendGradTile(Value q, Value dOut, Value lse,
                                         Value delta, Value k, Value v,
                                         double scale, TileMaskFn valid);

  /// Extends `v` to f32 (no-op for f32), or rounds an f32 to `elt`.
  Value toF32(OpBuilder &nb, Location nloc, Value v);
  Value fromF32(OpBuilder &nb, Location nloc, Value v, Type elt);
};

/// Sizes every tiled branch needs, read off the query, key and value types.
struct Sizes {
  int64_t qHeads, kvHeads, group, qkDim, vDim;
  Type elt;
};
Sizes sizesOf(Value q, Value k, Value v);

/// Whether the head counts and head dims of `q`, `k`, `v` are static.
bool hasStaticHeads(Value q, Value k, Value v);

inline Value andI1(OpBuilder &b, Location loc, Value x, Value y) {
  return arith::AndIOp::create(b, loc, x, y);
}

/// `1 / (1 + exp(-x))` on an f32 `x` (Spec section 8).
Value sigmoidOf(OpBuilder &b, Location loc, Value x);

/// The forall over (sequence, KV head, tile) with `outputs` as shared outs;
/// the builder is left inside its body. Its location carries `kernel`, the
/// op it computes, which names the GPU kernel it becomes (nsa-map-to-gpu).
scf::ForallOp createTileLoop(OpBuilder &b, Location loc, StringRef kernel,
                             ArrayRef<OpFoldResult> bounds, ValueRange outputs);

/// Inserts `tile` ([count, heads, D...]) at `[batch, row0, head0, 0...]` of
/// the shared out `dest` in the forall's in_parallel region.
void insertTile(OpBuilder &b, Location loc, scf::ForallOp forall, Value tile,
                Value dest, Value batch, Value row0, Value count, Value head0);

/// The keys of one attention branch (Spec sections 4, 6, 7) as the tiled
/// loops of its forward and gradient walk them.
struct KeySet {
  /// Keys are compressed rows of blocks of `cmpBlock` every `cmpStride`
  /// tokens (else tokens).
  bool compressed = false;
  int64_t cmpBlock = 1, cmpStride = 1;
  /// Keys per key tile.
  int64_t keyTile = 1;
  /// Whether token `t` sees key `key` (positions in the sequence).
  std::function<Value(TileBuilder &, Value t, Value key)> visible;
  /// The key tiles `[lo, hi)` that tokens `[t0, t0 + count)` may see.
  std::function<std::pair<Value, Value>(TileBuilder &, Value t0, Value count)>
      keyTiles;
  /// The tokens `[first, end)` of a sequence of `length` tokens that may see
  /// keys `[k0, k0 + kCount)`.
  std::function<std::pair<Value, Value>(TileBuilder &, Value k0, Value kCount,
                                        Value length)>
      queryTokens;
};

/// Where the key rows of `seq` start in the key tensor and how many there
/// are: its compressed rows or its tokens.
std::pair<Value, Value> keyRows(TileBuilder &t, const KeySet &keys,
                                const SequenceView &seq);

/// Compressed attention (Spec 4): block `i` is visible to `t` when
/// `i*d + l - 1 <= t`.
KeySet compressedKeySet(int64_t block, int64_t stride, int64_t keyTile);
/// Sliding window (Spec 7): `t - w < key <= t`.
KeySet windowKeySet(int64_t window, int64_t keyTile);
/// Selected attention (Spec 6) in tiles of one selection block: causal
/// inside the block; whether a token lists the block is the caller's.
KeySet selectedKeySet(int64_t block);

/// `loc` named `kernel` (the op a loop computes): nsa-map-to-gpu names the
/// GPU kernel of the loop after it, so profilers show which op is which.
inline Location kernelLoc(OpBuilder &b, Location loc, StringRef kernel) {
  return NameLoc::get(b.getStringAttr(kernel), loc);
}

} // namespace mlir::nsa::detail

#endif // NSA_LIB_TRANSFORMS_TILEBUILDER_H
