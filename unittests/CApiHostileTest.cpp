//===- CApiHostileTest.cpp - hostile arguments at the C entry points -------===//
//
// A seeded generator throws layer descriptions and calls at every C entry
// point that takes them (nsaConfigAttrGet, nsaReferenceForward,
// nsaReferenceBackward, nsaCpuLayerCreate): each field valid or one of
// 0, -1, INT64_MIN, INT64_MAX, 2^40, 5000, bad enums, NaN and infinite
// scales, null, unsorted or long block lists; batch and token counts whose
// element counts overflow; null tensors; bad cu_seqlens. Buffers always
// hold what the call claims whenever the claim is allocatable (the C API
// cannot know a buffer's size). Every call must succeed with finite
// outputs or fail with "<function>: <reason>" in nsaGetLastError; a crash
// kills the test. NSA_CAPI_HOSTILE_CASES (default 2000) sets the count.
//
//===----------------------------------------------------------------------===//

#include "NSA-c/CPU.h"
#include "NSA-c/Dialects.h"
#include "NSA-c/Error.h"
#include "NSA-c/Passes.h"
#include "NSA-c/Reference.h"

#include "mlir-c/IR.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

class Generator {
public:
  explicit Generator(uint64_t seed) : rng(seed) {}

  /// `valid` most of the time, else a hostile value.
  int64_t field(int64_t valid) {
    static const int64_t hostile[] = {0,    -1,        kMin,    kMax,
                                      5000, 1LL << 40, 1LL << 31};
    if (pick(24) != 0)
      return valid;
    return hostile[pick(std::size(hostile))];
  }

  nsaLayerDesc desc(std::vector<int64_t> &blocks) {
    nsaLayerDesc d = nsaPaperLayerDesc(field(4), field(2), field(8),
                                       field(8));
    d.dtype = pick(6) ? static_cast<nsaDType>(pick(3))
                      : static_cast<nsaDType>(field(7));
    d.packed = pick(5) ? 0 : static_cast<int32_t>(field(1));
    nsaLayerConfig &c = d.config;
    c.cmpBlock = field(8);
    c.cmpStride = field(4);
    c.slcBlock = field(16);
    c.numSelected = field(3);
    c.window = field(12);
    static const double scales[] = {0.0, 0.3, -1.0, NAN, INFINITY, 1e300};
    c.scale = pick(3) ? 0.0 : scales[pick(std::size(scales))];
    c.linearPool = pick(4) ? 0 : static_cast<int32_t>(field(1));
    c.reserved = pick(10) ? 0 : 1;
    c.initialBlocks = field(1);
    c.localBlocks = field(1);
    c.logLevels = pick(4) ? 0 : field(2);
    c.hubStride = pick(6) ? 0 : field(2);
    c.maxTokens = pick(4) ? 0 : field(256);
    blocks.clear();
    switch (pick(6)) {
    case 0:
      blocks = {2};
      break;
    case 1:
      blocks = {5, 2}; // not increasing
      break;
    case 2:
      blocks = {-3};
      break;
    default:
      break;
    }
    if (pick(20) == 0) { // a hostile count: its entries where allocatable
      int64_t count = field(2);
      blocks.clear();
      if (count >= 0 && count <= (1 << 22))
        for (int64_t i = 0; i < count; ++i)
          blocks.push_back(pick(64) ? i : 0); // a repeat now and then
      c.blocks = blocks.empty() ? nullptr : blocks.data();
      c.numBlocks = count;
      return d;
    }
    c.blocks = blocks.empty() ? nullptr : blocks.data();
    c.numBlocks = static_cast<int64_t>(blocks.size());
    return d;
  }

  size_t pick(size_t n) {
    return std::uniform_int_distribution<size_t>(0, n - 1)(rng);
  }
  double uniform() {
    return std::uniform_real_distribution<double>(-1, 1)(rng);
  }

private:
  std::mt19937_64 rng;
};

/// Buffers for `count` doubles when that is small enough to allocate, else
/// none (the call must then be refused before it reads any).
struct Tensor {
  std::vector<double> data;
  const double *ptr = nullptr;
  Tensor(Generator &gen, int64_t a, int64_t b, int64_t c, int64_t d,
         bool null) {
    constexpr int64_t kMaxCount = 1 << 22;
    int64_t n = 1;
    for (int64_t x : {a, b, c, d}) {
      if (null || x < 0 || x > kMaxCount || n * x > kMaxCount)
        return;
      n *= x;
    }
    data.resize(static_cast<size_t>(n));
    for (double &x : data)
      x = gen.uniform();
    ptr = data.data();
  }
};

void expectOutcome(int rc, const char *fn, const std::vector<double> &out) {
  std::string error = nsaGetLastError();
  if (rc != 0) {
    EXPECT_EQ(error.rfind(std::string(fn) + ": ", 0), 0u)
        << "no '" << fn << ": <reason>' message: '" << error << "'";
    EXPECT_GT(error.size(), std::string(fn).size() + 2) << error;
    return;
  }
  for (double x : out)
    ASSERT_TRUE(std::isfinite(x)) << fn << " wrote a non-finite value";
}

TEST(CApiHostile, EveryCallSucceedsOrSaysWhy) {
  const char *env = std::getenv("NSA_CAPI_HOSTILE_CASES");
  int cases = env ? std::atoi(env) : 2000;
  Generator gen(20261207);
  MlirContext ctx = mlirContextCreate();
  std::vector<int64_t> blocks;
  int refused = 0, ran = 0, created = 0;
  for (int i = 0; i < cases; ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    nsaLayerDesc d = gen.desc(blocks);
    int64_t B = gen.field(1), T = gen.field(37);
    if (gen.pick(8) == 0) { // element counts past int64
      B = 4;
      T = 1LL << 62;
    }
    const nsaLayerConfig &c = d.config;
    bool nulls = gen.pick(10) == 0;
    Tensor q(gen, B, T, d.qHeads, d.qkDim, nulls && gen.pick(2));
    Tensor k(gen, B, T, d.kvHeads, d.qkDim, false);
    Tensor v(gen, B, T, d.kvHeads, d.vDim, false);
    Tensor g(gen, B, T, d.qHeads, 3, nulls && gen.pick(2));
    Tensor w(gen, 2, d.kvHeads, c.cmpBlock, 1, false);
    Tensor dout(gen, B, T, d.qHeads, d.vDim, false);
    std::vector<int32_t> cu;
    if (d.packed || gen.pick(10) == 0) {
      int32_t t = static_cast<int32_t>(
          std::max<int64_t>(0, std::min<int64_t>(T, 1 << 20)));
      cu = gen.pick(3) ? std::vector<int32_t>{0, t / 3, t}
                       : std::vector<int32_t>{0, t, t / 2};
    }
    const double *wp = c.linearPool ? w.ptr : nullptr;
    std::vector<double> out(q.ptr && v.ptr ? dout.data.size() : 0, NAN);
    double *outp = out.empty() ? nullptr : out.data();

    (void)nsaConfigAttrGet(ctx, &c, 0);
    if (!mlirAttributeIsNull(nsaConfigAttrGet(ctx, &c, 0)))
      EXPECT_STREQ(nsaGetLastError(), "");

    int rc = nsaReferenceForward(&d, B, T, q.ptr, k.ptr, v.ptr, g.ptr, wp,
                                 cu.empty() ? nullptr : cu.data(),
                                 static_cast<int64_t>(cu.size()), outp,
                                 nullptr);
    expectOutcome(rc, "nsaReferenceForward", out);
    rc ? ++refused : ++ran;

    std::vector<double> dq(q.data.size(), NAN), dk(k.data.size(), NAN),
        dv(v.data.size(), NAN), dg(g.data.size(), NAN),
        dw(c.linearPool ? w.data.size() : 0, NAN);
    int brc = nsaReferenceBackward(
        &d, B, T, q.ptr, k.ptr, v.ptr, g.ptr, wp,
        cu.empty() ? nullptr : cu.data(), static_cast<int64_t>(cu.size()),
        nullptr, dout.ptr, dq.empty() ? nullptr : dq.data(),
        dk.empty() ? nullptr : dk.data(), dv.empty() ? nullptr : dv.data(),
        dg.empty() ? nullptr : dg.data(), dw.empty() ? nullptr : dw.data());
    expectOutcome(brc, "nsaReferenceBackward", dq);

    // The JIT on descriptions the reference refuses (no tokens: the
    // description alone is checked) must refuse them too; a valid one
    // compiles for a second or more, so only a few are.
    int32_t noTokens[] = {0, 0};
    bool descValid =
        (!c.linearPool || w.ptr) &&
        nsaReferenceForward(&d, 1, 0, nullptr, nullptr, nullptr, nullptr,
                            c.linearPool ? w.ptr : nullptr,
                            d.packed ? noTokens : nullptr, d.packed ? 2 : 0,
                            nullptr, nullptr) == 0;
    std::string refError = nsaGetLastError();
    if (!descValid || created < 3) {
      nsaCpuLayer *layer = nsaCpuLayerCreate(&d);
      if (!layer) {
        std::string error = nsaGetLastError();
        EXPECT_EQ(error.rfind("nsaCpuLayerCreate: ", 0), 0u) << error;
      } else {
        EXPECT_TRUE(descValid) << "the JIT took a description the "
                                  "reference refuses: "
                               << refError;
        ++created;
        nsaCpuLayerDestroy(layer);
      }
    }
    if (HasFatalFailure())
      break;
  }
  mlirContextDestroy(ctx);
  std::printf("%d cases: %d refused by the reference, %d ran; %d JIT "
              "layers compiled\n",
              cases, refused, ran, created);
}

TEST(CApiHostile, PipelineOptions) {
  // Option strings a caller may get wrong: each builder adds its pipeline or
  // refuses with "<function>: <reason>", never crashes or aborts.
  const char *options[] = {
      "",        "chip=sm_90a format=isa", "chip=sm_12", "format=elf",
      "{{{",     "query-tile=-5",          "query-tile=abc",
      "kv-tile=99999999999999999999",      "block-size=0", "chip=",
      "attention-strategy=quantum",        "query-tile=8 query-tile=16",
      "format=isa chip=sm_80 attention-strategy=flash-sm80",
      "=", "flash-query-rows=100000",      "kernel-block-sizes=compress=7"};
  MlirContext ctx = mlirContextCreate();
  for (const char *text : options) {
    SCOPED_TRACE(text);
    MlirPassManager pm = mlirPassManagerCreate(ctx);
    MlirOpPassManager opm = mlirPassManagerGetAsOpPassManager(pm);
    MlirStringRef ref = mlirStringRefCreateFromCString(text);
    for (auto [fn, build] :
         {std::pair<const char *, MlirLogicalResult (*)(MlirOpPassManager,
                                                       MlirStringRef)>{
              "nsaBuildToCPUPipeline", nsaBuildToCPUPipeline},
          {"nsaBuildToPTXPipeline", nsaBuildToPTXPipeline}}) {
      if (mlirLogicalResultIsFailure(build(opm, ref))) {
        std::string error = nsaGetLastError();
        EXPECT_EQ(error.rfind(std::string(fn) + ": ", 0), 0u) << error;
      } else {
        EXPECT_STREQ(nsaGetLastError(), "");
      }
    }
    mlirPassManagerDestroy(pm);
  }
  mlirContextDestroy(ctx);
}

} // namespace
