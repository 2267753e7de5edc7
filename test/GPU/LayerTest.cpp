//===- LayerTest.cpp - nsa layers compiled by nsa-to-ptx vs the reference -===//
//
// Each case is a layer configuration compiled ahead of time (nsa-gen-layer,
// nsa-to-ptx, llc) into `_mlir_ciface_<case>_layer` (one
// nsa.sparse_attention) and `_mlir_ciface_<case>_branches` (every branch's
// output, lse and the selected indices). They run on device buffers whose
// outputs are poisoned (NaN, -7) first, and are compared with the float64
// reference: relative L2 <= 1e-2 (bf16), lse -inf exactly where expected,
// selections equal up to float64 near-ties. Skipped without a GPU.
//
//===----------------------------------------------------------------------===//

#include "DeviceArray.h"
#include "GPUTest.h"
#include "NSAReference.h"

#include "NSA/Runtime/Descriptor.h"
#include "NSA/Runtime/nsa_runtime.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

using namespace mlir::nsa;
using namespace nsa_gpu_test;

// The compiled entry points take every memref as a pointer to its
// descriptor: 4 inputs (+ cmp_weights, + cu_seqlens) and 1 or 8 outputs, so
// 5 to 14 pointers; `call` casts to the exact signature.
#define NSA_DECLARE_CASE(name)                                                 \
  extern "C" void _mlir_ciface_##name##_layer();                               \
  extern "C" void _mlir_ciface_##name##_branches();
NSA_DECLARE_CASE(small)
NSA_DECLARE_CASE(paper)
NSA_DECLARE_CASE(g1d128)
NSA_DECLARE_CASE(packed)
NSA_DECLARE_CASE(long)
NSA_DECLARE_CASE(backbone)

namespace {

struct Case {
  const char *name;
  int64_t qHeads, kvHeads, qkDim, vDim;
  ref::Config config;
  Entry layer, branches;
  std::vector<int64_t> tokens;               ///< regular batches of `batch`
  std::vector<std::vector<int32_t>> packed;  ///< B = 1, cu_seqlens
  int64_t batch = 2;
};

/// Relative L2 of lse values, requiring -inf exactly where `want` has it.
bool lseMatches(const ref::Buffer &got, const ref::Buffer &want, double tol,
                std::string &why) {
  ref::Buffer g, w;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      if (!(std::isinf(got[i]) && got[i] < 0)) {
        why = "lse[" + std::to_string(i) + "] should be -inf";
        return false;
      }
      continue;
    }
    g.push_back(got[i]);
    w.push_back(want[i]);
  }
  double e = ref::relativeL2(g, w);
  if (!(e <= tol)) {
    why = "lse error " + std::to_string(e);
    return false;
  }
  return true;
}

/// Rows whose selection differs from the reference by more than a
/// float64 near-tie (relative 1e-3 in score).
int64_t badSelections(const ref::Shape &s, const ref::Config &c,
                      const ref::Inputs &in, const ref::Forward &fwd,
                      const std::vector<int32_t> &got, int64_t &differing) {
  int64_t bad = 0;
  differing = 0;
  for (int64_t row = 0; row < s.batch * s.tokens; ++row)
    for (int64_t h = 0; h < s.kvHeads; ++h) {
      ref::SelectionGap gap = ref::selectionGap(
          s, c, in, fwd, &got[(row * s.kvHeads + h) * c.numSelected], row, h);
      if (gap.same)
        continue;
      ++differing;
      if (!gap.valid || std::abs(gap.highestOther - gap.lowestChosen) >
                            1e-3 * std::max(1.0, std::abs(gap.highestOther)))
        ++bad;
    }
  return bad;
}

Result runCase(const Case &c, std::string &message) {
  if (nsaInit(0) != nsaSuccess)
    return message = std::string("no GPU: ") + nsaGetLastError(), Result::Skip;
  const double tol = 1e-2; // bf16
  uint64_t seed = 77;
  std::string report;
  ref::Shape dims;
  dims.qHeads = c.qHeads;
  dims.kvHeads = c.kvHeads;
  dims.qkDim = c.qkDim;
  dims.vDim = c.vDim;
  for (const ref::Shape &s :
       ref::testShapes(dims, c.batch, c.tokens, c.packed)) {
    int64_t B = s.batch, T = s.tokens, n = c.config.numSelected;
    ref::Inputs in = randomLayerInputs(s, c.config, seed += 10);
    DeviceInputs devIn(s, c.config, in);
    const std::vector<void *> &inputs = devIn.descs;
    std::vector<int64_t> oShape = {B, T, s.qHeads, s.vDim},
                         lShape = {B, T, s.qHeads},
                         iShape = {B, T, s.kvHeads, n};
    DeviceArray out(2, oShape), oc(2, oShape), os(2, oShape), ow(2, oShape),
        ob(2, oShape), lc(4, lShape), ls(4, lShape), lw(4, lShape),
        idx(4, iShape);
    // Poison every output: NaN (0x7fc0 bf16, 0x7fc00000 f32), indices -7.
    for (DeviceArray *a : {&out, &oc, &os, &ow, &ob})
      nsaMemset32(a->ptr, 0x7fc07fc0u, (a->count + 1) / 2);
    for (DeviceArray *a : {&lc, &ls, &lw})
      nsaMemset32(a->ptr, 0x7fc00000u, a->count);
    nsaMemset32(idx.ptr, static_cast<uint32_t>(-7), idx.count);

    auto start = std::chrono::steady_clock::now();
    std::vector<void *> layerArgs = inputs, branchArgs = inputs;
    layerArgs.push_back(out.desc());
    for (DeviceArray *a : {&oc, &lc, &idx, &os, &ls, &ow, &lw, &ob})
      branchArgs.push_back(a->desc());
    if (!call(c.layer, layerArgs) || !call(c.branches, branchArgs))
      return message = "unexpected entry point arity", Result::Fail;
    double seconds = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count();
    if (nsaTakeAsyncError() != nsaSuccess)
      return message = nsaGetLastError(), Result::Fail;

    auto read16 = [](const DeviceArray &a) {
      std::vector<uint16_t> h(a.count);
      a.download(h.data());
      return fromBF16(h);
    };
    auto read32 = [](const DeviceArray &a) {
      std::vector<float> h(a.count);
      a.download(h.data());
      return ref::Buffer(h.begin(), h.end());
    };
    std::vector<int32_t> gotIdx(idx.count);
    idx.download(gotIdx.data());

    ref::Forward want = ref::forward(s, c.config, in);
    ref::Attention slc = ref::selectedAttention(s, c.config, in.q, in.k, in.v,
                                                gotIdx);
    ref::Buffer combined =
        ref::combine(s, want.cmp.out, slc.out, want.win.out, in.gates);
    std::string where = std::string(c.name) + " T=" + std::to_string(T) +
                        (s.cuSeqlens.empty() ? " B=" + std::to_string(B) : std::string(" packed")) + ": ";
    struct Check {
      const char *what;
      ref::Buffer got, want;
    } checks[] = {{"compressed", read16(oc), want.cmp.out},
                  {"window", read16(ow), want.win.out},
                  {"selected", read16(os), slc.out},
                  {"branches combined", read16(ob), combined},
                  {"layer", read16(out), combined}};
    for (Check &ch : checks) {
      double e = ref::relativeL2(ch.got, ch.want);
      if (e <= tol)
        continue;
      // Where: the first non-finite element, else the largest difference.
      size_t at = 0;
      double worst = -1;
      for (size_t i = 0; i < ch.got.size(); ++i) {
        double d = std::abs(ch.got[i] - ch.want[i]);
        if (!std::isfinite(ch.got[i]) || d > worst) {
          at = i;
          worst = std::isfinite(ch.got[i]) ? d : INFINITY;
          if (!std::isfinite(ch.got[i]))
            break;
        }
      }
      int64_t row = static_cast<int64_t>(at) / s.vDim;
      char detail[160];
      std::snprintf(detail, sizeof(detail),
                    " (batch %lld, token %lld, head %lld: %g, want %g)",
                    static_cast<long long>(row / s.qHeads / T),
                    static_cast<long long>(row / s.qHeads % T),
                    static_cast<long long>(row % s.qHeads), ch.got[at],
                    ch.want[at]);
      return message = where + ch.what + " error " + std::to_string(e) +
                       detail,
             Result::Fail;
    }
    std::string why;
    if (!lseMatches(read32(lc), want.cmp.lse, tol, why) ||
        !lseMatches(read32(lw), want.win.lse, tol, why) ||
        !lseMatches(read32(ls), slc.lse, tol, why))
      return message = where + why, Result::Fail;
    int64_t differing = 0;
    int64_t bad = badSelections(s, c.config, in, want, gotIdx, differing);
    if (bad)
      return message = where + std::to_string(bad) +
                       " rows select other blocks than the reference",
             Result::Fail;
    char line[200];
    std::snprintf(line, sizeof(line),
                  "\n    %s layer error %.2e, %lld near-tie rows, %.3f s",
                  where.c_str(), ref::relativeL2(checks[4].got, combined),
                  static_cast<long long>(differing), seconds);
    report += line;
  }
  message = report;
  return Result::Pass;
}

ref::Config config(int64_t l, int64_t d, int64_t lp, int64_t n, int64_t w) {
  ref::Config c;
  c.cmpBlock = l;
  c.cmpStride = d;
  c.slcBlock = lp;
  c.numSelected = n;
  c.window = w;
  c.backbone = {1, 2};
  return c;
}

} // namespace

NSA_GPU_TEST(SmallLayerG4) {
  return runCase({"small", 4, 1, 64, 64, config(16, 8, 32, 4, 64),
                  NSA_ENTRY(_mlir_ciface_small_layer),
                  NSA_ENTRY(_mlir_ciface_small_branches),
                  {1, 63, 64, 65, 1000}, {}},
                 message);
}

NSA_GPU_TEST(PaperLayerG16) {
  return runCase({"paper", 16, 1, 192, 128, config(32, 16, 64, 16, 512),
                  NSA_ENTRY(_mlir_ciface_paper_layer),
                  NSA_ENTRY(_mlir_ciface_paper_branches), {65, 1000, 3001},
                  {}},
                 message);
}

NSA_GPU_TEST(G1D128Long) {
  return runCase({"g1d128", 2, 2, 128, 128, config(32, 16, 64, 16, 512),
                  NSA_ENTRY(_mlir_ciface_g1d128_layer),
                  NSA_ENTRY(_mlir_ciface_g1d128_branches), {64, 4096}, {}},
                 message);
}

NSA_GPU_TEST(PaperBlocksAt64K) {
  Case c{"long", 2, 1, 64, 64, config(32, 16, 64, 16, 512),
         NSA_ENTRY(_mlir_ciface_long_layer),
         NSA_ENTRY(_mlir_ciface_long_branches), {65536}, {}};
  c.batch = 1;
  return runCase(c, message);
}

NSA_GPU_TEST(EveryBackbonePattern) {
  // Initial, local, log-spaced, hub and explicit blocks together: the
  // reference forces the same blocks (spec::Backbone::isForced).
  ref::Config c = config(16, 8, 32, 12, 64);
  c.backbone.logLevels = 3;
  c.backbone.hubStride = 8;
  c.backbone.blocks = {3, 13};
  c.maxTokens = 1000;
  return runCase({"backbone", 8, 2, 64, 32, c,
                  NSA_ENTRY(_mlir_ciface_backbone_layer),
                  NSA_ENTRY(_mlir_ciface_backbone_branches),
                  {1, 65, 700, 1000}, {}},
                 message);
}

NSA_GPU_TEST(PackedLearnedG2) {
  ref::Config c = config(16, 8, 32, 6, 100);
  c.linearPool = true;
  return runCase({"packed", 8, 4, 64, 32, c, NSA_ENTRY(_mlir_ciface_packed_layer),
                  NSA_ENTRY(_mlir_ciface_packed_branches),
                  {},
                  {{0, 700, 1000}, {0, 1, 64, 200}}},
                 message);
}

namespace {

// The same layers through the runtime's checked entry, nsaLayerForward.
const nsaLayer kSmallLayer = {"small", 4, 1, 64, 64, 16, nsaBF16, 0, 0,
                              NSA_ENTRY(_mlir_ciface_small_layer)};
const nsaLayer kPackedLayer = {"packed", 8, 4, 64, 32, 16, nsaBF16, 1, 1,
                               NSA_ENTRY(_mlir_ciface_packed_layer)};

// Hand-made layer descriptions the runtime must refuse.
const nsaLayer kNegativeHeads = {"bad", -4, 1, 64, 64, 16, nsaBF16, 0, 0,
                                 NSA_ENTRY(_mlir_ciface_small_layer)};
const nsaLayer kZeroDim = {"bad", 4, 1, 0, 64, 16, nsaBF16, 0, 0,
                           NSA_ENTRY(_mlir_ciface_small_layer)};
const nsaLayer kHugeHeads = {"bad", int64_t(1) << 40, 1, 64, 64, 16, nsaBF16,
                             0, 0, NSA_ENTRY(_mlir_ciface_small_layer)};

/// Valid-looking arguments over `memory` (never dereferenced: every case
/// below is rejected before anything is read or launched).
nsaLayerArgs fakeArgs(const nsaLayer &l, char *memory) {
  nsaLayerArgs a{};
  a.batch = l.packed ? 1 : 2;
  a.tokens = 64;
  a.dtype = l.dtype;
  a.q = a.k = a.v = a.gates = memory;
  a.out = memory;
  if (l.learnedPool)
    a.cmpWeights = reinterpret_cast<const float *>(memory);
  if (l.packed) {
    a.cuSeqlens = reinterpret_cast<const int32_t *>(memory);
    a.numSeqlens = 2;
  }
  return a;
}

} // namespace

NSA_GPU_TEST(LayerForwardRejectsBadArguments) {
  alignas(16) static char memory[64];
  struct Bad {
    const char *expect;
    const nsaLayer *layer;
    void (*edit)(nsaLayerArgs &);
  } cases[] = {
      {"no compiled layer", nullptr, [](nsaLayerArgs &) {}},
      {"must be positive", &kSmallLayer, [](nsaLayerArgs &a) { a.batch = 0; }},
      {"must be positive", &kSmallLayer, [](nsaLayerArgs &a) { a.tokens = -3; }},
      {"dtype", &kSmallLayer, [](nsaLayerArgs &a) { a.dtype = nsaF16; }},
      {"q is null", &kSmallLayer, [](nsaLayerArgs &a) { a.q = nullptr; }},
      {"out is null", &kSmallLayer, [](nsaLayerArgs &a) { a.out = nullptr; }},
      {"k is not 16-byte aligned", &kSmallLayer,
       [](nsaLayerArgs &a) { a.k = static_cast<const char *>(a.k) + 2; }},
      {"takes no cmpWeights", &kSmallLayer,
       [](nsaLayerArgs &a) { a.cmpWeights = static_cast<const float *>(a.q); }},
      {"takes no cuSeqlens", &kSmallLayer,
       [](nsaLayerArgs &a) { a.numSeqlens = 3; }},
      {"cmpWeights is null", &kPackedLayer,
       [](nsaLayerArgs &a) { a.cmpWeights = nullptr; }},
      {"cuSeqlens is null", &kPackedLayer,
       [](nsaLayerArgs &a) { a.cuSeqlens = nullptr; }},
      {"need batch 1", &kPackedLayer, [](nsaLayerArgs &a) { a.batch = 2; }},
      {"2 to 65536 offsets", &kPackedLayer,
       [](nsaLayerArgs &a) { a.numSeqlens = 1; }},
      // Issue 13: 2^40 offsets were read into a host vector (bad_alloc).
      {"2 to 65536 offsets", &kPackedLayer,
       [](nsaLayerArgs &a) { a.numSeqlens = int64_t(1) << 40; }},
      {"tokens must be at most 2147483647", &kSmallLayer,
       [](nsaLayerArgs &a) { a.tokens = int64_t(1) << 31; }},
      {"batch must be at most 65535", &kSmallLayer,
       [](nsaLayerArgs &a) { a.batch = 65536; }},
      {"heads and dims must be positive", &kNegativeHeads,
       [](nsaLayerArgs &) {}},
      {"heads and dims must be positive", &kZeroDim, [](nsaLayerArgs &) {}},
      {"overflows 64-bit sizes", &kHugeHeads,
       [](nsaLayerArgs &a) { a.tokens = INT32_MAX; }},
  };
  for (const Bad &c : cases) {
    nsaLayerArgs a = fakeArgs(c.layer ? *c.layer : kSmallLayer, memory);
    c.edit(a);
    nsaStatus s = nsaLayerForward(c.layer, &a);
    std::string got = nsaGetLastError();
    if (s != nsaErrorInvalidArgument || got.find(c.expect) == std::string::npos)
      return message = std::string("expected '") + c.expect + "', got status " +
                       std::to_string(s) + ": " + got,
             Result::Fail;
  }
  if (nsaLayerForward(&kSmallLayer, nullptr) != nsaErrorInvalidArgument)
    return message = "null arguments accepted", Result::Fail;
  message = std::to_string(std::size(cases) + 1) +
            " bad calls rejected before any launch";
  return Result::Pass;
}

namespace {

/// Runs `layer` directly and through nsaLayerForward on the same random
/// inputs; the two outputs must be bit-identical (LayerTest's other cases
/// check the direct call against the reference). With `badCu`, the
/// offsets are invalid: the call must be refused and `out` left poisoned.
Result compareWithDirectCall(const nsaLayer &l, int64_t B,
                             std::vector<int32_t> cuSeqlens, bool badCu,
                             int64_t T, std::string &message) {
  DeviceArray q(2, {B, T, l.qHeads, l.qkDim}), k(2, {B, T, l.kvHeads, l.qkDim}),
      v(2, {B, T, l.kvHeads, l.vDim}), g(2, {B, T, l.qHeads, 3}),
      w(4, {2, l.kvHeads, l.cmpBlock}),
      cu(4, {static_cast<int64_t>(cuSeqlens.size())}),
      direct(2, {B, T, l.qHeads, l.vDim}), checked(2, {B, T, l.qHeads, l.vDim});
  uint64_t seed = 5;
  for (DeviceArray *a : {&q, &k, &v, &g})
    a->upload(toBF16(ref::randomBuffer(a->count, ++seed)).data());
  std::vector<float> weights(w.count, 1.0f / l.cmpBlock);
  w.upload(weights.data());
  if (!cuSeqlens.empty())
    cu.upload(cuSeqlens.data());
  for (DeviceArray *a : {&direct, &checked})
    nsaMemset32(a->ptr, 0x7fc07fc0u, (a->count + 1) / 2);

  nsaLayerArgs a{};
  a.batch = B;
  a.tokens = T;
  a.dtype = nsaBF16;
  a.q = q.ptr;
  a.k = k.ptr;
  a.v = v.ptr;
  a.gates = g.ptr;
  a.out = checked.ptr;
  if (l.learnedPool)
    a.cmpWeights = static_cast<const float *>(w.ptr);
  if (l.packed) {
    a.cuSeqlens = static_cast<const int32_t *>(cu.ptr);
    a.numSeqlens = cuSeqlens.size();
  }
  nsaStatus s = nsaLayerForward(&l, &a);
  std::vector<uint16_t> got(checked.count), want(direct.count);
  checked.download(got.data());
  if (badCu) {
    std::string why = nsaGetLastError();
    if (s != nsaErrorInvalidArgument || why.find("cuSeqlens") == std::string::npos)
      return message = "bad cu_seqlens accepted: " + why, Result::Fail;
    for (uint16_t x : got)
      if (x != 0x7fc0)
        return message = "out written despite the refusal", Result::Fail;
    message += "\n    refused: " + why;
    return Result::Pass;
  }
  if (s != nsaSuccess)
    return message = nsaGetLastError(), Result::Fail;
  std::vector<void *> args = {q.desc(), k.desc(), v.desc(), g.desc()};
  if (l.learnedPool)
    args.push_back(w.desc());
  if (l.packed)
    args.push_back(cu.desc());
  args.push_back(direct.desc());
  call(l.entry, args);
  if (nsaTakeAsyncError() != nsaSuccess)
    return message = nsaGetLastError(), Result::Fail;
  direct.download(want.data());
  if (got != want)
    return message = std::string(l.name) + ": nsaLayerForward differs from "
                                           "the direct call",
           Result::Fail;
  message += std::string("\n    ") + l.name + " T=" + std::to_string(T) +
             ": bit-identical to the direct call";
  return Result::Pass;
}

} // namespace

NSA_GPU_TEST(LayerForwardMatchesTheDirectCall) {
  if (nsaInit(0) != nsaSuccess)
    return message = std::string("no GPU: ") + nsaGetLastError(), Result::Skip;
  Result r = compareWithDirectCall(kSmallLayer, 2, {}, false, 129, message);
  if (r == Result::Pass)
    r = compareWithDirectCall(kPackedLayer, 1, {0, 700, 1000}, false, 1000,
                              message);
  for (std::vector<int32_t> bad : std::vector<std::vector<int32_t>>{
           {0, 800, 700, 1000}, {0, 500}, {1, 1000}})
    if (r == Result::Pass)
      r = compareWithDirectCall(kPackedLayer, 1, bad, true, 1000, message);
  return r;
}

int main() { return nsa_gpu_test::runAll(); }
