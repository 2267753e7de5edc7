//===- NSAReference.h - float64 reference of NSA -----------------*- C++
//-*-===//
//
// A float64 implementation of docs/Spec.md, forward and backward, written for
// clarity rather than speed: every kernel and every compiled pipeline of the
// project is tested against it. No MLIR dependency.
//
// Tensors are dense row-major float64 arrays in the dialect's layout
// [B, T, heads, dim]; compressed tensors are [B, Nc, H, D] (or the packed
// layout of Spec section 3). Packed batches pass `cuSeqlens`.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_RUNTIME_REFERENCE_NSAREFERENCE_H
#define NSA_RUNTIME_REFERENCE_NSAREFERENCE_H

#include "NSA/Spec.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace mlir::nsa::ref {

/// Sizes of one layer (Spec section 1).
struct Shape {
  int64_t batch = 1, tokens = 1, qHeads = 1, kvHeads = 1, qkDim = 1, vDim = 1;
  /// Packed sequence offsets (Spec section 2); empty for a regular batch.
  std::vector<int32_t> cuSeqlens;

  int64_t group() const { return qHeads / kvHeads; }
  /// Rows of the compressed key/value tensors for `cmpBlock`, `cmpStride`.
  int64_t compressedRows(int64_t cmpBlock, int64_t cmpStride) const;
};

/// Hyperparameters of one layer (`#nsa.config`), the scale resolved.
struct Config {
  int64_t cmpBlock = 32, cmpStride = 16, slcBlock = 64, numSelected = 16,
          window = 512;
  double scale = 0.0; ///< 0 means 1/sqrt(Dqk).
  bool linearPool = false;
  spec::Backbone backbone{1, 2};
  int64_t maxTokens = 0; ///< declared maximum T (needed with hub blocks)

  double scaleFor(const Shape &s) const;
};

using Buffer = std::vector<double>;

/// One sequence: `length` tokens starting at token row `tokenRow` (counted
/// over B*T) whose compressed blocks start at compressed row `cmpRow`.
struct Sequence {
  int64_t tokenRow, length, cmpRow;
};
std::vector<Sequence> sequences(const Shape &s, const Config &c);

/// Attention outputs of one branch.
struct Attention {
  Buffer out; ///< [B, T, HQ, Dv]
  Buffer lse; ///< [B, T, HQ]; -inf where the key set is empty
};

//===--------------------------------------------------------------------===//
// Branches (Spec sections 3-8).
//===--------------------------------------------------------------------===//

/// phi over `x` [B, T, H, D]; `weights` [H, l] for the linear pool.
Buffer compress(const Shape &s, const Config &c, const Buffer &x, int64_t dim,
                const Buffer *weights);
Attention compressedAttention(const Shape &s, const Config &c, const Buffer &q,
                              const Buffer &kc, const Buffer &vc);
/// Selected block indices [B, T, H, n], increasing, padded with -1.
std::vector<int32_t> selectBlocks(const Shape &s, const Config &c,
                                  const Buffer &q, const Buffer &kc,
                                  const Buffer &lseCmp);
/// The Eq. 9/10 block scores of one token and KV head, for tests:
/// `scores[j]` for the causal blocks `j = 0 .. t / l'`.
std::vector<double> blockScores(const Shape &s, const Config &c,
                                const Buffer &q, const Buffer &kc,
                                const Buffer &lseCmp, int64_t row, int64_t h);
Attention selectedAttention(const Shape &s, const Config &c, const Buffer &q,
                            const Buffer &k, const Buffer &v,
                            const std::vector<int32_t> &indices);
Attention windowAttention(const Shape &s, const Config &c, const Buffer &q,
                          const Buffer &k, const Buffer &v);
/// sigmoid-gated sum; `gates` [B, T, HQ, 3] are logits.
Buffer combine(const Shape &s, const Buffer &cmp, const Buffer &slc,
               const Buffer &win, const Buffer &gates);

//===--------------------------------------------------------------------===//
// The whole layer.
//===--------------------------------------------------------------------===//

struct Inputs {
  Buffer q, k, v, gates;
  Buffer cmpWeights; ///< [2, H, l] for the linear pool, else empty.
};

/// Everything the forward pass computes; the backward pass reuses it.
struct Forward {
  Buffer kc, vc;
  Attention cmp, slc, win;
  std::vector<int32_t> indices;
  Buffer out;
};

Forward forward(const Shape &s, const Config &c, const Inputs &in);

struct Gradients {
  Buffer q, k, v, gates, cmpWeights;
};

/// Gradients of `sum(out * dOut)` with respect to every input (Spec section
/// 9); the selected indices are held fixed.
Gradients backward(const Shape &s, const Config &c, const Inputs &in,
                   const Forward &fwd, const Buffer &dOut);

//===--------------------------------------------------------------------===//
// Test helpers shared by the reference, CPU and GPU tests.
//===--------------------------------------------------------------------===//

/// The shapes a test case runs, with the heads and dims of `dims`: a batch
/// of `batch` sequences for each length in `tokens`, then one packed batch
/// (B = 1) for each cu_seqlens list in `packed`.
std::vector<Shape> testShapes(const Shape &dims, int64_t batch,
                              const std::vector<int64_t> &tokens,
                              const std::vector<std::vector<int32_t>> &packed);

/// 16-bit floating-point storage (round to nearest even).
uint16_t toBF16(float f);
float fromBF16(uint16_t bits);
uint16_t toF16(float f);
float fromF16(uint16_t bits);

/// `size` values uniform in [lo, hi) from a fixed-seed generator.
Buffer randomBuffer(int64_t size, uint64_t seed, double lo = -1.0,
                    double hi = 1.0);

/// ||a - b|| / ||b||, or +inf when any value is NaN/inf or sizes differ;
/// ||a - b|| when b is all zero.
double relativeL2(const Buffer &a, const Buffer &b);

/// How the n selected blocks `got` of (row, KV head h) differ from the
/// reference's `fwd.indices`, in the reference's float64 block scores.
struct SelectionGap {
  bool same = true;  ///< the index lists are equal
  bool valid = true; ///< as many distinct entries, each in -1 .. blocks-1
  double lowestChosen = INFINITY;  ///< lowest score only `got` keeps
  double highestOther = -INFINITY; ///< highest score only the reference keeps
};
SelectionGap selectionGap(const Shape &s, const Config &c, const Inputs &in,
                          const Forward &fwd, const int32_t *got, int64_t row,
                          int64_t h);

} // namespace mlir::nsa::ref

#endif // NSA_RUNTIME_REFERENCE_NSAREFERENCE_H
