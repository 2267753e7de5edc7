//===- CPUDecodeTest.cpp - decoding over a KV cache vs the forward --------===//
//
// docs/Spec.md section 12: a decoding step's output row (b, j) equals row
// kv_lens[b] - Tq + j of the forward over the first kv_lens[b] tokens, and
// nsa.compress_append leaves the compressed caches as nsa.compress of those
// tokens would make them. Each case compiles `@decode_step` through
// `nsa-to-cpu`, fills the caches from random sequences (every cache row
// past a sequence's tokens, and every compressed row the step must write,
// is NaN), runs one step and compares with the float64 reference run on
// each batch row's whole sequence. Batch rows have different lengths: below
// one compressed block, at and one before a block's completion, across a
// selection block's boundary, and long enough for every branch.
//
//===----------------------------------------------------------------------===//

#include "CPUCase.h"

#include "gtest/gtest.h"

#include <cmath>
#include <limits>

using namespace nsa_cpu_test;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct DecodeCase {
  Case layer;
  int64_t queries, cacheTokens;
  std::vector<int32_t> kvLens;
};

/// Rows [row0, row0 + count) of batch row `b` of `x [B, T, width]`.
ref::Buffer rowsOf(const ref::Buffer &x, int64_t T, int64_t width, int64_t b,
                   int64_t row0, int64_t count) {
  auto first = x.begin() + (b * T + row0) * width;
  return ref::Buffer(first, first + count * width);
}

/// Writes `rows` ([count, width]) at row `row0` of batch row `b` of `x`.
void putRows(ref::Buffer &x, int64_t T, int64_t width, int64_t b, int64_t row0,
             const ref::Buffer &rows) {
  std::copy(rows.begin(), rows.end(), x.begin() + (b * T + row0) * width);
}

/// Whether every element of `x` is NaN.
bool allNaN(const ref::Buffer &x) {
  return std::all_of(x.begin(), x.end(),
                     [](double v) { return std::isnan(v); });
}

void runDecodeCase(const DecodeCase &dc) {
  const Case &tc = dc.layer;
  LayerSpec spec = layerSpecOf(tc);
  spec.decodeQueries = dc.queries;
  std::string error;
  std::unique_ptr<CompiledLayer> layer = CompiledLayer::compile(spec, error);
  ASSERT_TRUE(layer) << error;
  const ref::Config &c = spec.config;
  int64_t B = dc.kvLens.size(), Tq = dc.queries, Lmax = dc.cacheTokens;
  int64_t rows = spec::numCompressedBlocks(Lmax, c.cmpBlock, c.cmpStride);
  int64_t hq = tc.qHeads, h = tc.kvHeads, dqk = tc.qkDim, dv = tc.vDim;

  // B sequences of Lmax tokens; batch row b keeps its first kv_lens[b].
  ref::Shape all;
  all.batch = B;
  all.tokens = Lmax;
  all.qHeads = hq;
  all.kvHeads = h;
  all.qkDim = dqk;
  all.vDim = dv;
  ref::Inputs seqs = randomInputs(all, c, tc.dtype, 77, false);

  DecodeInputs in;
  in.batch = B;
  in.queries = Tq;
  in.cacheTokens = Lmax;
  in.kvLens = dc.kvLens;
  in.q.assign(B * Tq * hq * dqk, kNaN);
  in.gates.assign(B * Tq * hq * 3, kNaN);
  in.k.assign(B * Lmax * h * dqk, kNaN);
  in.v.assign(B * Lmax * h * dv, kNaN);
  in.kc.assign(B * rows * h * dqk, kNaN);
  in.vc.assign(B * rows * h * dv, kNaN);
  in.cmpWeights = seqs.cmpWeights;

  std::vector<ref::Forward> want(B);
  std::vector<int64_t> validRows(B);
  for (int64_t b = 0; b < B; ++b) {
    int64_t L = dc.kvLens[b], before = L - Tq;
    ref::Shape s = all;
    s.batch = 1;
    s.tokens = L;
    ref::Inputs one;
    one.q = rowsOf(seqs.q, Lmax, hq * dqk, b, 0, L);
    one.k = rowsOf(seqs.k, Lmax, h * dqk, b, 0, L);
    one.v = rowsOf(seqs.v, Lmax, h * dv, b, 0, L);
    one.gates = rowsOf(seqs.gates, Lmax, hq * 3, b, 0, L);
    one.cmpWeights = seqs.cmpWeights;
    want[b] = ref::forward(s, c, one);
    validRows[b] = s.compressedRows(c.cmpBlock, c.cmpStride);

    putRows(in.q, Tq, hq * dqk, b, 0,
            rowsOf(one.q, L, hq * dqk, 0, before, Tq));
    putRows(in.gates, Tq, hq * 3, b, 0,
            rowsOf(one.gates, L, hq * 3, 0, before, Tq));
    putRows(in.k, Lmax, h * dqk, b, 0, one.k);
    putRows(in.v, Lmax, h * dv, b, 0, one.v);
    // The compressed caches before the step: the blocks complete then, as
    // nsa.compress stores them (rounded to the element type).
    int64_t old = spec::numCompressedBlocks(before, c.cmpBlock, c.cmpStride);
    ref::Buffer kc = rowsOf(want[b].kc, validRows[b], h * dqk, 0, 0, old);
    ref::Buffer vc = rowsOf(want[b].vc, validRows[b], h * dv, 0, 0, old);
    for (ref::Buffer *x : {&kc, &vc})
      for (double &e : *x)
        e = roundTo(tc.dtype, e);
    putRows(in.kc, rows, h * dqk, b, 0, kc);
    putRows(in.vc, rows, h * dv, b, 0, vc);
  }

  DecodeResult got;
  ASSERT_TRUE(layer->runDecode(in, got, error)) << error;
  double tol = tc.dtype == DType::F32 ? 1e-5 : 1e-2;
  for (int64_t b = 0; b < B; ++b) {
    int64_t L = dc.kvLens[b];
    std::string what = std::string(tc.name) + " Tq=" + std::to_string(Tq) +
                       " b=" + std::to_string(b) + " L=" + std::to_string(L);
    EXPECT_LE(ref::relativeL2(rowsOf(got.out, Tq, hq * dv, b, 0, Tq),
                              rowsOf(want[b].out, L, hq * dv, 0, L - Tq, Tq)),
              tol)
        << what << ": output against the forward's last rows";
    int64_t valid = validRows[b];
    EXPECT_LE(
        ref::relativeL2(rowsOf(got.kc, rows, h * dqk, b, 0, valid), want[b].kc),
        tol)
        << what << ": compressed keys";
    EXPECT_LE(
        ref::relativeL2(rowsOf(got.vc, rows, h * dv, b, 0, valid), want[b].vc),
        tol)
        << what << ": compressed values";
    // Rows of blocks not complete yet are the step's to leave alone.
    EXPECT_TRUE(allNaN(rowsOf(got.kc, rows, h * dqk, b, valid, rows - valid)))
        << what << ": a compressed key row past Nc(L) was written";
    EXPECT_TRUE(allNaN(rowsOf(got.vc, rows, h * dv, b, valid, rows - valid)))
        << what << ": a compressed value row past Nc(L) was written";
  }
}

const Case kPaperBF16{"paper-bf16", 16, 1,   192, 128, 32,    16,
                      64,           16, 512, 1,   2,   false, DType::BF16};

// The paper's layer (one KV head of G = 16 heads). Lengths: below one
// compressed block (1, 31), the step that completes block 0 (32), one
// before and at a later block's completion (1007, 1008), and the window
// full (1000 + more than w).
TEST(CPUDecode, PaperLayerOneToken) {
  runDecodeCase({kPaperBF16, 1, 1100, {1, 31, 32, 1007, 1008, 1100}});
}

// Four new tokens that cross a selection block's boundary (62 .. 65) and a
// compressed block's completion (44 .. 47 completes block 1), with f32 to
// check the arithmetic tightly.
TEST(CPUDecode, PaperLayerFourTokensF32) {
  Case tc = kPaperBF16;
  tc.name = "paper-f32";
  tc.dtype = DType::F32;
  runDecodeCase({tc, 4, 700, {4, 48, 66, 700}});
}

// Sixteen tokens a step with d = 8: two blocks complete in one step; the
// learned pool; G = 4 over two KV heads.
TEST(CPUDecode, SixteenTokensLearnedPoolG4) {
  Case tc = kPaperBF16;
  tc.name = "g4-linear-bf16";
  tc.qHeads = 8;
  tc.kvHeads = 2;
  tc.qkDim = tc.vDim = 64;
  tc.l = 16;
  tc.d = 8;
  tc.lp = 32;
  tc.n = 6;
  tc.w = 100;
  tc.initial = 2;
  tc.linear = true;
  runDecodeCase({tc, 16, 600, {16, 17, 40, 599}});
}

// Bad arguments are refused before anything runs.
TEST(CPUDecode, ArgumentChecks) {
  Case tc{"checks", 2, 1, 16, 16, 8, 4, 16, 3, 16, 1, 1, false, DType::F32};
  LayerSpec spec = layerSpecOf(tc);
  spec.decodeQueries = 2;
  std::string error;
  std::unique_ptr<CompiledLayer> layer = CompiledLayer::compile(spec, error);
  ASSERT_TRUE(layer) << error;
  int64_t rows = spec::numCompressedBlocks(64, 8, 4);
  DecodeInputs in;
  in.batch = 1;
  in.queries = 2;
  in.cacheTokens = 64;
  in.q.assign(2 * 2 * 16, 0.5);
  in.gates.assign(2 * 2 * 3, 0.5);
  in.k.assign(64 * 16, 0.5);
  in.v.assign(64 * 16, 0.5);
  in.kc.assign(rows * 16, 0.5);
  in.vc.assign(rows * 16, 0.5);
  DecodeResult got;
  for (int32_t bad : {1, 65}) {
    in.kvLens = {bad};
    EXPECT_FALSE(layer->runDecode(in, got, error));
    EXPECT_NE(error.find("kv_lens[0] = " + std::to_string(bad)),
              std::string::npos)
        << error;
  }
  in.kvLens = {10, 10};
  EXPECT_FALSE(layer->runDecode(in, got, error));
  EXPECT_NE(error.find("expects 1 kv_lens"), std::string::npos) << error;
  in.kvLens = {10};
  in.kc.pop_back();
  EXPECT_FALSE(layer->runDecode(in, got, error));
  EXPECT_NE(error.find("elements of kc"), std::string::npos) << error;
  in.kc.push_back(0.5);
  in.queries = 3;
  EXPECT_FALSE(layer->runDecode(in, got, error));
  EXPECT_NE(error.find("Tq = 2"), std::string::npos) << error;
  in.queries = 2;
  EXPECT_TRUE(layer->runDecode(in, got, error)) << error;
}

} // namespace
