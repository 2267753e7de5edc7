//===- CPUGradientTest.cpp - the tiled gradient IR vs the reference -------===//
//
// Compiles nsa.sparse_attention_grad through `nsa-to-cpu`, runs it with the
// JIT on random inputs and output gradients (fixed seeds, gradients
// poisoned first) and compares every gradient (query, key, value, gates
// and the learned phi weights) with the float64 reference backward on the
// same selected blocks, then again from a training forward's saved state
// (@layer_train into @layer_grad_saved), which must give the same bits
// (NaN never equals, so unwritten entries fail). Tolerances: relative L2 <=
// 1e-4 with f32 inputs,
// <= 1e-2 with bf16; NaN fails. Shapes include T that are not multiples of
// any tile, T = 1, GQA groups 1..16 and packed batches.
//
//===----------------------------------------------------------------------===//

#include "CPUCase.h"

#include "gtest/gtest.h"

using namespace nsa_cpu_test;

namespace {

void runGradCase(const Case &tc) {
  LayerSpec spec = layerSpecOf(tc);
  spec.gradient = true;
  double tol = tc.dtype == DType::F32 ? 1e-4 : 1e-2;
  std::vector<ref::Shape> shapes = shapesOf(tc);
  for (bool packed : {false, true}) {
    spec.packed = packed;
    std::unique_ptr<CompiledLayer> layer;
    uint64_t seed = 7000;
    for (const ref::Shape &s : shapes) {
      if (s.cuSeqlens.empty() == packed)
        continue;
      if (!layer) {
        std::string error;
        layer = CompiledLayer::compile(spec, error);
        ASSERT_TRUE(layer) << error;
      }
      std::string what = std::string(tc.name) +
                         " T=" + std::to_string(s.tokens) +
                         (packed ? " packed" : " B=2");
      seed += 10;
      ref::Inputs in = randomInputs(s, spec.config, tc.dtype, seed, false);
      ref::Buffer dOut = ref::randomBuffer(
          s.batch * s.tokens * s.qHeads * s.vDim, seed + 6);
      for (double &x : dOut)
        x = roundTo(tc.dtype, x);

      // The reference on the blocks the compiled forward selects (f32 may
      // order near-ties differently; the CPU execution tests check them).
      RunResult fwd;
      std::string error;
      ASSERT_TRUE(layer->run(s, in, fwd, error)) << what << ": " << error;
      ref::Forward want = ref::forward(s, spec.config, in);
      want.indices = fwd.indices;
      want.slc =
          ref::selectedAttention(s, spec.config, in.q, in.k, in.v, fwd.indices);
      ref::Gradients ref = ref::backward(s, spec.config, in, want, dOut);

      ref::Gradients got;
      ASSERT_TRUE(layer->runBackward(s, in, dOut, got, error))
          << what << ": " << error;
      EXPECT_LE(ref::relativeL2(got.q, ref.q), tol) << what << " dq";
      EXPECT_LE(ref::relativeL2(got.k, ref.k), tol) << what << " dk";
      EXPECT_LE(ref::relativeL2(got.v, ref.v), tol) << what << " dv";
      EXPECT_LE(ref::relativeL2(got.gates, ref.gates), tol)
          << what << " dgates";
      if (tc.linear) {
        EXPECT_LE(ref::relativeL2(got.cmpWeights, ref.cmpWeights), tol)
            << what << " dweights";
      }

      // Training: @layer_train's saved state into @layer_grad_saved (Spec
      // section 9.1) gives the recomputing gradient's bits.
      ref::Gradients saved;
      ASSERT_TRUE(layer->runBackward(s, in, dOut, saved, error,
                                     /*fromSaved=*/true))
          << what << ": " << error;
      for (auto [name, a, b] :
           {std::tuple<const char *, ref::Buffer *, ref::Buffer *>{
                "dq", &saved.q, &got.q},
            {"dk", &saved.k, &got.k},
            {"dv", &saved.v, &got.v},
            {"dgates", &saved.gates, &got.gates},
            {"dweights", &saved.cmpWeights, &got.cmpWeights}}) {
        ASSERT_EQ(a->size(), b->size()) << what << " " << name;
        size_t differ = 0;
        for (size_t i = 0; i < a->size(); ++i)
          differ += !((*a)[i] == (*b)[i]);
        EXPECT_EQ(differ, 0u) << what << " " << name
                              << " from the saved state: entries that differ "
                                 "from the recomputing gradient";
      }
    }
  }
}

// clang-format off
TEST(CPUGradient, G4F32) {
  runGradCase({"g4-f32", 8, 2, 64, 32, 16, 8, 32, 4, 64, 1, 1, false,
               DType::F32, {1, 65, 300}, {{0, 1, 100, 250}}, 16, 32});
}

TEST(CPUGradient, G1LearnedPoolF32) {
  runGradCase({"g1-linear-f32", 2, 2, 32, 32, 8, 4, 16, 3, 16, 0, 1, true,
               DType::F32, {65, 200}, {{0, 77, 200}}, 8, 16});
}

TEST(CPUGradient, G4LearnedPoolBF16) {
  runGradCase({"g4-linear-bf16", 8, 2, 64, 64, 16, 8, 32, 6, 100, 2, 2, true,
               DType::BF16, {63, 500}, {{0, 250, 251, 600}}, 8, 16});
}

// The paper's layer (one KV head, G = 16, Dqk 192, Dv 128) in bf16.
TEST(CPUGradient, PaperLayerBF16) {
  runGradCase({"paper-bf16", 16, 1, 192, 128, 32, 16, 64, 16, 512, 1, 2,
               false, DType::BF16, {65, 1000}, {{0, 700, 1000}}, 16, 64});
}

// The tiles of nsa-to-ptx's generic mapping (128 rows, 32 keys): G = 1
// gives 128-token query tiles.
TEST(CPUGradient, G1WideQueryTiles) {
  runGradCase({"g1-wide-tiles", 2, 2, 64, 64, 16, 8, 32, 4, 64, 1, 2, false,
               DType::F32, {1000}, {}, 128, 32});
}
// clang-format on

} // namespace
