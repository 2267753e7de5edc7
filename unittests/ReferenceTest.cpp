//===- ReferenceTest.cpp - tests of the float64 NSA reference -------------===//
//
// Hand-checked tiny cases, invariants that tie the branches to dense causal
// attention, and gradients against central finite differences.
//
//===----------------------------------------------------------------------===//

#include "NSAReference.h"

#include "gtest/gtest.h"

#include <cmath>
#include <random>
#include <set>

using namespace mlir::nsa;
using namespace mlir::nsa::ref;

namespace {

/// A config with the given sizes and no forced blocks unless set.
Shape makeShape(int64_t tokens, int64_t qHeads, int64_t kvHeads,
                int64_t qkDim, int64_t vDim,
                std::vector<int32_t> cuSeqlens = {}) {
  Shape s;
  s.tokens = tokens;
  s.qHeads = qHeads;
  s.kvHeads = kvHeads;
  s.qkDim = qkDim;
  s.vDim = vDim;
  s.cuSeqlens = std::move(cuSeqlens);
  return s;
}

Config makeConfig(int64_t l, int64_t d, int64_t lp, int64_t n, int64_t w,
                  spec::Backbone backbone = {1, 2}) {
  Config c;
  c.cmpBlock = l;
  c.cmpStride = d;
  c.slcBlock = lp;
  c.numSelected = n;
  c.window = w;
  c.backbone = backbone;
  return c;
}

Inputs randomInputs(const Shape &s, const Config &c, uint64_t seed) {
  int64_t rows = s.batch * s.tokens;
  Inputs in;
  in.q = randomBuffer(rows * s.qHeads * s.qkDim, seed + 1);
  in.k = randomBuffer(rows * s.kvHeads * s.qkDim, seed + 2);
  in.v = randomBuffer(rows * s.kvHeads * s.vDim, seed + 3);
  in.gates = randomBuffer(rows * s.qHeads * 3, seed + 4, -2.0, 2.0);
  if (c.linearPool)
    in.cmpWeights = randomBuffer(2 * s.kvHeads * c.cmpBlock, seed + 5, 0.0,
                                 2.0 / c.cmpBlock);
  return in;
}

/// Dense causal attention of every sequence, the ground truth for the
/// invariants.
Attention denseCausal(const Shape &s, const Config &c, const Inputs &in) {
  Config all = c;
  all.window = s.tokens;
  return windowAttention(s, all, in.q, in.k, in.v);
}

TEST(Reference, WindowByHand) {
  // One head, D = 1, q = 1, k = [0, 1, 2, 3], v = [10, 20, 30, 40], w = 2,
  // scale 1: token 2 sees keys 1 and 2.
  Shape s;
  s.tokens = 4;
  Config c = makeConfig(2, 1, 2, 1, 2, {0, 1});
  c.scale = 1.0;
  Buffer q = {1, 1, 1, 1}, k = {0, 1, 2, 3}, v = {10, 20, 30, 40};
  Attention a = windowAttention(s, c, q, k, v);
  double e1 = std::exp(1.0), e2 = std::exp(2.0);
  EXPECT_NEAR(a.out[2], (20 * e1 + 30 * e2) / (e1 + e2), 1e-12);
  EXPECT_NEAR(a.lse[2], std::log(e1 + e2), 1e-12);
  EXPECT_NEAR(a.out[0], 10.0, 1e-12); // token 0 sees only itself
}

TEST(Reference, CompressionByHand) {
  // T = 6, l = 4, d = 2: blocks [0, 4) and [2, 6); x = 1..6.
  Shape s;
  s.tokens = 6;
  Config c = makeConfig(4, 2, 4, 1, 4, {0, 1});
  Buffer x = {1, 2, 3, 4, 5, 6};
  Buffer xc = compress(s, c, x, 1, nullptr);
  ASSERT_EQ(xc.size(), 2u);
  EXPECT_DOUBLE_EQ(xc[0], 2.5);
  EXPECT_DOUBLE_EQ(xc[1], 4.5);
  Buffer w = {1, 0, 0, 2}; // linear pool: x[i*d] + 2 x[i*d + 3]
  Buffer lin = compress(s, c, x, 1, &w);
  EXPECT_DOUBLE_EQ(lin[0], 1 + 2 * 4);
  EXPECT_DOUBLE_EQ(lin[1], 3 + 2 * 6);

  // Token 2 sees nothing, tokens 3..4 see block 0, token 5 sees both.
  c.scale = 1.0;
  Buffer q(6, 1.0);
  Attention a = compressedAttention(s, c, q, xc, xc);
  EXPECT_EQ(a.lse[2], -INFINITY);
  EXPECT_EQ(a.out[2], 0.0);
  EXPECT_NEAR(a.out[3], 2.5, 1e-12);
  EXPECT_NEAR(a.out[4], 2.5, 1e-12);
  double e0 = std::exp(2.5), e1 = std::exp(4.5);
  EXPECT_NEAR(a.out[5], (2.5 * e0 + 4.5 * e1) / (e0 + e1), 1e-12);
}

TEST(Reference, SelectionWorkedExampleOfSpec) {
  // docs/Spec.md 5.4: l = 32, d = 16, l' = 64, n = 3, initial = 1, local = 1,
  // t = 200. p4 = p9 = 0.5 ties blocks 1 and 2; the lower index wins.
  Shape s;
  s.tokens = 201;
  Config c = makeConfig(32, 16, 64, 3, 64, {1, 1});
  c.scale = 1.0;
  Buffer q(s.tokens, 1.0);
  auto select = [&](double p4, double p9) {
    Buffer kc(s.compressedRows(32, 16), -1000.0);
    kc[4] = std::log(p4);
    kc[9] = std::log(p9);
    Buffer lse(s.tokens, 0.0);
    std::vector<int32_t> idx = selectBlocks(s, c, q, kc, lse);
    return std::vector<int32_t>(idx.begin() + 200 * 3, idx.begin() + 201 * 3);
  };
  EXPECT_EQ(select(0.5, 0.5), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(select(0.4, 0.6), (std::vector<int32_t>{0, 2, 3}));
  // Both scores include the overlap weights of Eq. 9.
  Buffer kc(s.compressedRows(32, 16), -1000.0);
  kc[4] = std::log(0.5);
  kc[9] = std::log(0.5);
  std::vector<double> scores =
      blockScores(s, c, q, kc, Buffer(s.tokens, 0.0), 200, 0);
  ASSERT_EQ(scores.size(), 4u);
  EXPECT_NEAR(scores[1], 1.0, 1e-12);
  EXPECT_NEAR(scores[2], 1.0, 1e-12);
}

TEST(Reference, PaddingAndOrder) {
  // n = 16 with 4 causal blocks: [0, 1, 2, 3, -1 x 12].
  Shape s;
  s.tokens = 256;
  s.qkDim = s.vDim = 4;
  Config c = makeConfig(32, 16, 64, 16, 64);
  Inputs in = randomInputs(s, c, 7);
  Forward f = forward(s, c, in);
  const int32_t *last = &f.indices[255 * 16];
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(last[i], i < 4 ? i : -1) << i;
}

TEST(Reference, FullSelectionAndWideWindowAreDenseCausal) {
  for (bool packed : {false, true}) {
    Shape s = makeShape(130, 4, 2, 8, 6);
    if (packed)
      s.cuSeqlens = {0, 50, 51, 130};
    Config c = makeConfig(8, 4, 16, 9, 130, {0, 1});
    Inputs in = randomInputs(s, c, 11);
    Forward f = forward(s, c, in);
    Attention dense = denseCausal(s, c, in);
    EXPECT_LT(relativeL2(f.slc.out, dense.out), 1e-13) << packed;
    EXPECT_LT(relativeL2(f.win.out, dense.out), 1e-13) << packed;
    EXPECT_LT(relativeL2(f.slc.lse, dense.lse), 1e-13) << packed;
  }
}

TEST(Reference, GroupSharesSelectionAndIgnoresHeadOrder) {
  // Eq. 10 sums over the group: permuting the query heads of a group leaves
  // the indices unchanged, while the scores genuinely depend on every head.
  Shape s = makeShape(300, 8, 2, 8, 4);
  Config c = makeConfig(16, 8, 32, 3, 32, {1, 1});
  Inputs in = randomInputs(s, c, 3);
  Forward f = forward(s, c, in);
  Inputs swapped = in;
  for (int64_t row = 0; row < s.tokens; ++row)
    for (int64_t e = 0; e < s.qkDim; ++e)
      std::swap(swapped.q[(row * 8 + 0) * 8 + e],
                swapped.q[(row * 8 + 3) * 8 + e]);
  Forward g = forward(s, c, swapped);
  EXPECT_EQ(f.indices, g.indices);
  // Not every token picks the same non-forced block: selection is real.
  std::set<int32_t> picked;
  for (int64_t row = 200; row < 300; ++row)
    picked.insert(f.indices[(row * 2) * 3 + 1]);
  EXPECT_GT(picked.size(), 1u);
}

/// Checks analytic gradients against central differences on `samples`
/// entries of each input.
void checkGradients(const Shape &s, const Config &c, uint64_t seed) {
  Inputs in = randomInputs(s, c, seed);
  Forward f = forward(s, c, in);
  Buffer dOut = randomBuffer(f.out.size(), seed + 9);
  Gradients g = backward(s, c, in, f, dOut);
  auto loss = [&](const Inputs &x) {
    Forward y = forward(s, c, x);
    EXPECT_EQ(y.indices, f.indices) << "a perturbation changed the selection";
    double sum = 0.0;
    for (size_t i = 0; i < y.out.size(); ++i)
      sum += y.out[i] * dOut[i];
    return sum;
  };
  struct Entry {
    const char *name;
    Buffer Inputs::*field;
    const Buffer *grad;
  };
  Entry entries[] = {{"q", &Inputs::q, &g.q},
                     {"k", &Inputs::k, &g.k},
                     {"v", &Inputs::v, &g.v},
                     {"gates", &Inputs::gates, &g.gates},
                     {"cmp_weights", &Inputs::cmpWeights, &g.cmpWeights}};
  std::mt19937_64 gen(seed);
  const double eps = 1e-5;
  for (const Entry &e : entries) {
    Buffer &x = in.*e.field;
    if (x.empty())
      continue;
    ASSERT_EQ(e.grad->size(), x.size()) << e.name;
    Buffer numeric, analytic;
    for (int sample = 0; sample < 40; ++sample) {
      size_t i = std::uniform_int_distribution<size_t>(0, x.size() - 1)(gen);
      double saved = x[i];
      x[i] = saved + eps;
      double up = loss(in);
      x[i] = saved - eps;
      double down = loss(in);
      x[i] = saved;
      numeric.push_back((up - down) / (2 * eps));
      analytic.push_back((*e.grad)[i]);
    }
    EXPECT_LT(relativeL2(analytic, numeric), 1e-6) << e.name;
  }
}

TEST(Reference, GradientsMatchFiniteDifferences) {
  Shape s = makeShape(70, 4, 2, 6, 5);
  Config c = makeConfig(8, 4, 16, 3, 20, {1, 1});
  checkGradients(s, c, 100);
}

TEST(Reference, GradientsMatchFiniteDifferencesLearnedPacked) {
  Shape s = makeShape(75, 2, 1, 4, 3, {0, 33, 75});
  Config c = makeConfig(8, 4, 8, 3, 12, {1, 1});
  c.linearPool = true;
  checkGradients(s, c, 200);
}

} // namespace
