//===- GradientTest.cpp - compiled layer gradients vs the reference -------===//
//
// Each case is a layer compiled ahead of time with its gradient
// (nsa-gen-layer --gradient, nsa-to-ptx, llc): `_mlir_ciface_<case>_
// layer_grad` (one nsa.sparse_attention_grad) and `_branches` (for the
// selected indices the compiled forward chooses). The gradients of random
// inputs and a random output gradient are computed on the device into
// poisoned (NaN) buffers and compared with the float64 reference backward
// on the same indices: relative L2 <= 1e-2 (bf16) for dq, dk, dv, the gate
// gradients and the learned pool's weights. A second call into freshly
// poisoned buffers must give the same bits (the kernels use no float
// atomics whose order varies). Then the training path through the
// runtime's checked entries: nsaLayerForwardTrain must write @branches'
// tensors as its saved state and nsaLayerBackward, from that state, the
// bits of @layer_grad (which recomputes the forward). Skipped without a
// GPU.
//
//===----------------------------------------------------------------------===//

#include "DeviceArray.h"
#include "GPUTest.h"
#include "NSAReference.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

using namespace mlir::nsa;
using namespace nsa_gpu_test;

#define NSA_DECLARE_GRAD_CASE(name)                                            \
  extern "C" void _mlir_ciface_##name##_layer_grad();                          \
  extern "C" void _mlir_ciface_##name##_branches();                            \
  extern "C" void _mlir_ciface_##name##_layer();                               \
  extern "C" void _mlir_ciface_##name##_layer_train();                         \
  extern "C" void _mlir_ciface_##name##_layer_grad_saved();

/// The entries of gradient case `name`: layer_grad, branches, then the
/// forward and training entries of its nsaLayer.
#define NSA_GRAD_ENTRIES(name)                                                 \
  NSA_ENTRY(_mlir_ciface_##name##_layer_grad),                                 \
      NSA_ENTRY(_mlir_ciface_##name##_branches),                               \
      NSA_ENTRY(_mlir_ciface_##name##_layer),                                  \
      NSA_ENTRY(_mlir_ciface_##name##_layer_train),                            \
      NSA_ENTRY(_mlir_ciface_##name##_layer_grad_saved)
NSA_DECLARE_GRAD_CASE(grad_g1)
NSA_DECLARE_GRAD_CASE(grad_g4)
NSA_DECLARE_GRAD_CASE(grad_g4_chunks)
NSA_DECLARE_GRAD_CASE(grad_g4_anyorder)
NSA_DECLARE_GRAD_CASE(grad_g16)
NSA_DECLARE_GRAD_CASE(grad_g16_long)
NSA_DECLARE_GRAD_CASE(grad_packed)
NSA_DECLARE_GRAD_CASE(grad_packed_chunks)

namespace {

struct GradCase {
  const char *name;
  int64_t qHeads, kvHeads, qkDim, vDim;
  ref::Config config;
  Entry grad, branches, layer, train, backward;
  std::vector<int64_t> tokens;              ///< regular batches of `batch`
  std::vector<std::vector<int32_t>> packed; ///< B = 1, cu_seqlens
  int64_t batch = 2;
  /// The layer's dk, dv chunks add in a fixed order: repeated calls, and
  /// the gradient from the saved state, give the same bits.
  bool deterministic = true;
};

Result runGradCase(const GradCase &c, std::string &message) {
  if (nsaInit(0) != nsaSuccess)
    return message = std::string("no GPU: ") + nsaGetLastError(), Result::Skip;
  const double tol = 1e-2; // bf16
  uint64_t seed = 91;
  ref::Shape dims;
  dims.qHeads = c.qHeads;
  dims.kvHeads = c.kvHeads;
  dims.qkDim = c.qkDim;
  dims.vDim = c.vDim;
  for (const ref::Shape &s :
       ref::testShapes(dims, c.batch, c.tokens, c.packed)) {
    int64_t B = s.batch, T = s.tokens, n = c.config.numSelected;
    ref::Inputs in = randomLayerInputs(s, c.config, seed += 10);
    ref::Buffer dOut = ref::randomBuffer(B * T * s.qHeads * s.vDim, seed + 5);
    for (double &x : dOut)
      x = ref::fromBF16(ref::toBF16(static_cast<float>(x)));
    std::vector<int64_t> qShape = {B, T, s.qHeads, s.qkDim},
                         kShape = {B, T, s.kvHeads, s.qkDim},
                         vShape = {B, T, s.kvHeads, s.vDim},
                         gShape = {B, T, s.qHeads, 3},
                         wShape = {2, s.kvHeads, c.config.cmpBlock},
                         oShape = {B, T, s.qHeads, s.vDim},
                         lShape = {B, T, s.qHeads},
                         iShape = {B, T, s.kvHeads, n};
    DeviceInputs devIn(s, c.config, in);
    const std::vector<void *> &inputs = devIn.descs;
    DeviceArray dO(2, oShape);
    dO.upload(toBF16(dOut).data());

    // The indices the compiled forward selects.
    DeviceArray oc(2, oShape), os(2, oShape), ow(2, oShape), ob(2, oShape),
        lc(4, lShape), ls(4, lShape), lw(4, lShape), idx(4, iShape);
    std::vector<void *> branchArgs = inputs;
    for (DeviceArray *a : {&oc, &lc, &idx, &os, &ls, &ow, &lw, &ob})
      branchArgs.push_back(a->desc());
    if (!call(c.branches, branchArgs))
      return message = "unexpected branches arity", Result::Fail;

    // The gradients, into poisoned buffers (NaN in bf16 and f32).
    DeviceArray dq(2, qShape), dk(2, kShape), dv(2, vShape), dg(2, gShape),
        dw(4, wShape);
    for (DeviceArray *a : {&dq, &dk, &dv, &dg})
      nsaMemset32(a->ptr, 0x7fc07fc0u, (a->count + 1) / 2);
    nsaMemset32(dw.ptr, 0x7fc00000u, dw.count);
    std::vector<void *> gradArgs = inputs;
    gradArgs.push_back(dO.desc());
    for (DeviceArray *a : {&dq, &dk, &dv, &dg})
      gradArgs.push_back(a->desc());
    if (c.config.linearPool)
      gradArgs.push_back(dw.desc());
    if (nsaSynchronize() != nsaSuccess)
      return message = nsaGetLastError(), Result::Fail;
    auto start = std::chrono::steady_clock::now();
    if (!call(c.grad, gradArgs))
      return message = "unexpected gradient arity", Result::Fail;
    if (nsaSynchronize() != nsaSuccess || nsaTakeAsyncError() != nsaSuccess)
      return message = nsaGetLastError(), Result::Fail;
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();

    // The same call again: the same bits.
    if (c.deterministic) {
      DeviceArray dq2(2, qShape), dk2(2, kShape), dv2(2, vShape),
          dg2(2, gShape), dw2(4, wShape);
      for (DeviceArray *a : {&dq2, &dk2, &dv2, &dg2})
        nsaMemset32(a->ptr, 0x7fc07fc0u, (a->count + 1) / 2);
      nsaMemset32(dw2.ptr, 0x7fc00000u, dw2.count);
      std::vector<void *> again = inputs;
      again.push_back(dO.desc());
      for (DeviceArray *a : {&dq2, &dk2, &dv2, &dg2})
        again.push_back(a->desc());
      if (c.config.linearPool)
        again.push_back(dw2.desc());
      call(c.grad, again);
      if (nsaSynchronize() != nsaSuccess || nsaTakeAsyncError() != nsaSuccess)
        return message = nsaGetLastError(), Result::Fail;
      std::pair<DeviceArray *, DeviceArray *> pairs[] = {
          {&dq, &dq2}, {&dk, &dk2}, {&dv, &dv2}, {&dg, &dg2}, {&dw, &dw2}};
      for (auto [first, second] : pairs) {
        size_t bytes = first->count * first->elementBytes;
        std::vector<unsigned char> x(bytes), y(bytes);
        first->download(x.data());
        second->download(y.data());
        if (x != y)
          return message = std::string(c.name) + " T=" + std::to_string(T) +
                           ": a second call gave different bits",
                 Result::Fail;
      }
    }

    std::vector<int32_t> gotIdx(idx.count);
    idx.download(gotIdx.data());
    ref::Forward want = ref::forward(s, c.config, in);
    want.indices = gotIdx;
    want.slc = ref::selectedAttention(s, c.config, in.q, in.k, in.v, gotIdx);
    ref::Gradients ref = ref::backward(s, c.config, in, want, dOut);

    auto read16 = [](const DeviceArray &a) {
      std::vector<uint16_t> h(a.count);
      a.download(h.data());
      return fromBF16(h);
    };
    std::vector<float> dwHost(dw.count);
    dw.download(dwHost.data());
    struct Check {
      const char *what;
      ref::Buffer got, want;
    } checks[] = {{"dq", read16(dq), ref.q},
                  {"dk", read16(dk), ref.k},
                  {"dv", read16(dv), ref.v},
                  {"dgates", read16(dg), ref.gates},
                  {"dweights", ref::Buffer(dwHost.begin(), dwHost.end()),
                   ref.cmpWeights}};
    std::string where = std::string(c.name) + " T=" + std::to_string(T) +
                        (s.cuSeqlens.empty() ? " B=" + std::to_string(B)
                                             : std::string(" packed"));
    std::string errors;
    for (Check &ch : checks) {
      if (!c.config.linearPool && ch.want.empty())
        continue;
      double e = ref::relativeL2(ch.got, ch.want);
      if (!(e <= tol)) {
        // Where: the first non-finite element, else the largest difference.
        size_t at = 0;
        double worst = -1;
        for (size_t i = 0; i < ch.got.size() && i < ch.want.size(); ++i) {
          double d = std::abs(ch.got[i] - ch.want[i]);
          if (!std::isfinite(d) || d > worst) {
            at = i;
            worst = std::isfinite(d) ? d : INFINITY;
            if (!std::isfinite(d))
              break;
          }
        }
        char detail[160];
        std::snprintf(detail, sizeof(detail),
                      " (element %zu of %zu: %g, want %g)", at, ch.want.size(),
                      ch.got.size() > at ? ch.got[at] : NAN,
                      ch.want.size() > at ? ch.want[at] : NAN);
        return message = where + ": " + ch.what + " error " +
                         std::to_string(e) + detail,
               Result::Fail;
      }
      char part[48];
      std::snprintf(part, sizeof(part), " %s %.1e", ch.what, e);
      errors += part;
    }
    // Training through the runtime's checked entries: the forward's saved
    // state equals @branches' tensors, and the gradient from it equals
    // @layer_grad's (which recomputes the forward), bit for bit.
    nsaLayer layer = {c.name,
                      c.qHeads,
                      c.kvHeads,
                      c.qkDim,
                      c.vDim,
                      c.config.cmpBlock,
                      nsaBF16,
                      !s.cuSeqlens.empty(),
                      c.config.linearPool,
                      c.layer,
                      c.config.slcBlock,
                      n,
                      c.train,
                      c.backward};
    nsaLayerArgs args = {};
    args.batch = B;
    args.tokens = T;
    args.dtype = nsaBF16;
    args.q = devIn.q.ptr;
    args.k = devIn.k.ptr;
    args.v = devIn.v.ptr;
    args.gates = devIn.g.ptr;
    if (c.config.linearPool)
      args.cmpWeights = static_cast<const float *>(devIn.w.ptr);
    if (!s.cuSeqlens.empty()) {
      args.cuSeqlens = static_cast<const int32_t *>(devIn.cu.ptr);
      args.numSeqlens = static_cast<int64_t>(s.cuSeqlens.size());
    }
    DeviceArray toc(2, oShape), tos(2, oShape), tow(2, oShape), tout(2, oShape),
        tlc(4, lShape), tls(4, lShape), tlw(4, lShape), tidx(4, iShape);
    for (DeviceArray *a : {&toc, &tos, &tow, &tout, &tlc, &tls, &tlw})
      nsaMemset32(a->ptr, 0x7fc07fc0u, (a->count * a->elementBytes + 3) / 4);
    nsaMemset32(tidx.ptr, 0xfffffff9u, tidx.count);
    args.out = tout.ptr;
    nsaLayerSaved saved = {toc.ptr,
                           static_cast<float *>(tlc.ptr),
                           static_cast<int32_t *>(tidx.ptr),
                           tos.ptr,
                           static_cast<float *>(tls.ptr),
                           tow.ptr,
                           static_cast<float *>(tlw.ptr)};
    if (nsaLayerForwardTrain(&layer, &args, &saved) != nsaSuccess)
      return message = where + ": nsaLayerForwardTrain: " + nsaGetLastError(),
             Result::Fail;
    DeviceArray sdq(2, qShape), sdk(2, kShape), sdv(2, vShape), sdg(2, gShape),
        sdw(4, wShape);
    for (DeviceArray *a : {&sdq, &sdk, &sdv, &sdg})
      nsaMemset32(a->ptr, 0x7fc07fc0u, (a->count + 1) / 2);
    nsaMemset32(sdw.ptr, 0x7fc00000u, sdw.count);
    nsaLayerGrads grads = {
        dO.ptr,  sdq.ptr,
        sdk.ptr, sdv.ptr,
        sdg.ptr, c.config.linearPool ? static_cast<float *>(sdw.ptr) : nullptr};
    args.out = nullptr;
    auto backStart = std::chrono::steady_clock::now();
    if (nsaLayerBackward(&layer, &args, &saved, &grads) != nsaSuccess)
      return message = where + ": nsaLayerBackward: " + nsaGetLastError(),
             Result::Fail;
    double backSeconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - backStart)
                             .count();
    std::pair<const char *, std::pair<DeviceArray *, DeviceArray *>> same[] = {
        {"saved compressed output", {&toc, &oc}},
        {"saved compressed lse", {&tlc, &lc}},
        {"saved indices", {&tidx, &idx}},
        {"saved selected output", {&tos, &os}},
        {"saved selected lse", {&tls, &ls}},
        {"saved window output", {&tow, &ow}},
        {"saved window lse", {&tlw, &lw}},
        {"the training forward's output", {&tout, &ob}},
        {"dq from the saved state", {&sdq, &dq}},
        {"dk from the saved state", {&sdk, &dk}},
        {"dv from the saved state", {&sdv, &dv}},
        {"dgates from the saved state", {&sdg, &dg}},
        {"dweights from the saved state", {&sdw, &dw}}};
    for (auto &[what, pair] : same) {
      if (!c.config.linearPool && pair.first == &sdw)
        continue;
      // In any order, the gradients' sums may round differently: close to
      // @layer_grad's, not equal (the saved state itself must be).
      if (!c.deterministic &&
          std::string(what).find("from the saved") != std::string::npos) {
        ref::Buffer x, y;
        if (pair.first->elementBytes == 2) {
          x = read16(*pair.first);
          y = read16(*pair.second);
        } else {
          std::vector<float> fx(pair.first->count), fy(pair.second->count);
          pair.first->download(fx.data());
          pair.second->download(fy.data());
          x.assign(fx.begin(), fx.end());
          y.assign(fy.begin(), fy.end());
        }
        if (!(ref::relativeL2(x, y) <= 1e-3))
          return message = where + ": " + what + " is off by " +
                           std::to_string(ref::relativeL2(x, y)),
                 Result::Fail;
        continue;
      }
      size_t bytes = pair.first->count * pair.first->elementBytes;
      std::vector<unsigned char> x(bytes), y(bytes);
      pair.first->download(x.data());
      pair.second->download(y.data());
      if (x != y)
        return message = where + ": " + what + " differs in its bits",
               Result::Fail;
    }

    // Saved indices that name no block of their sequence are refused
    // before any launch, and the gradients stay as they were.
    for (int32_t bad : {-2, static_cast<int32_t>((T + c.config.slcBlock - 1) /
                                                 c.config.slcBlock)}) {
      int32_t keep = 0;
      nsaMemcpyDtoH(&keep, tidx.ptr, 4);
      nsaMemcpyHtoD(tidx.ptr, &bad, 4);
      nsaMemset32(sdq.ptr, 0x7fc07fc0u, (sdq.count + 1) / 2);
      nsaStatus st = nsaLayerBackward(&layer, &args, &saved, &grads);
      std::string got = nsaGetLastError();
      nsaMemcpyHtoD(tidx.ptr, &keep, 4);
      std::vector<uint16_t> dqAfter(sdq.count);
      sdq.download(dqAfter.data());
      if (st != nsaErrorInvalidArgument ||
          got.find("is neither -1 nor a block") == std::string::npos ||
          std::any_of(dqAfter.begin(), dqAfter.end(),
                      [](uint16_t x) { return x != 0x7fc0; }))
        return message = where + ": saved index " + std::to_string(bad) +
                         " not refused before launch: " + got,
               Result::Fail;
    }

    char line[256];
    std::snprintf(line, sizeof(line),
                  "\n    %s:%s, %.3f s (from the saved state %.3f s, %s)",
                  where.c_str(), errors.c_str(), seconds, backSeconds,
                  c.deterministic ? "same bits"
                                  : "within 1e-3 of the recomputing one");
    message += line;
  }
  return Result::Pass;
}

ref::Config config(int64_t l, int64_t d, int64_t lp, int64_t n, int64_t w,
                   bool linear = false) {
  ref::Config c;
  c.cmpBlock = l;
  c.cmpStride = d;
  c.slcBlock = lp;
  c.numSelected = n;
  c.window = w;
  c.backbone = {1, 2};
  c.linearPool = linear;
  return c;
}

} // namespace

NSA_GPU_TEST(GradientG1) {
  return runGradCase({"grad_g1",
                      2,
                      2,
                      64,
                      64,
                      config(16, 8, 32, 4, 64),
                      NSA_GRAD_ENTRIES(grad_g1),
                      {1, 65, 1000, 4096}},
                     message);
}

// G = 1 at T = 65536 (B = 1).
NSA_GPU_TEST(GradientG1Long) {
  return runGradCase({"grad_g1",
                      2,
                      2,
                      64,
                      64,
                      config(16, 8, 32, 4, 64),
                      NSA_GRAD_ENTRIES(grad_g1),
                      {65536},
                      {},
                      1},
                     message);
}

NSA_GPU_TEST(GradientG4) {
  return runGradCase({"grad_g4",
                      4,
                      1,
                      64,
                      64,
                      config(16, 8, 32, 4, 64),
                      NSA_GRAD_ENTRIES(grad_g4),
                      {1, 65, 1000, 4096}},
                     message);
}

// G = 4 with dk and dv of compressed and selected attention in chunks of
// 256 tokens (flash-grad-chunk-tokens=256), added in turn.
NSA_GPU_TEST(GradientG4Chunked) {
  return runGradCase({"grad_g4_chunks",
                      4,
                      1,
                      64,
                      64,
                      config(16, 8, 32, 4, 64),
                      NSA_GRAD_ENTRIES(grad_g4_chunks),
                      {1, 65, 1000, 4096}},
                     message);
}

// ... with the chunks adding as they finish (flash-grad-deterministic=0):
// within the tolerance, bits not compared.
NSA_GPU_TEST(GradientG4AnyOrder) {
  return runGradCase({"grad_g4_anyorder",
                      4,
                      1,
                      64,
                      64,
                      config(16, 8, 32, 4, 64),
                      NSA_GRAD_ENTRIES(grad_g4_anyorder),
                      {1, 65, 1000, 4096},
                      {},
                      2,
                      /*deterministic=*/false},
                     message);
}

// T = 65536 (B = 1) with the same layer: up to 256 chunks a compressed key
// tile, and the reference backward in float64 on the host.
NSA_GPU_TEST(GradientG4Long) {
  return runGradCase({"grad_g4_chunks",
                      4,
                      1,
                      64,
                      64,
                      config(16, 8, 32, 4, 64),
                      NSA_GRAD_ENTRIES(grad_g4_chunks),
                      {65536},
                      {},
                      1},
                     message);
}

// The paper's dims and blocks with one KV head: G = 16, Dqk 192, Dv 128.
NSA_GPU_TEST(GradientPaperG16) {
  return runGradCase({"grad_g16",
                      16,
                      1,
                      192,
                      128,
                      config(32, 16, 64, 16, 512),
                      NSA_GRAD_ENTRIES(grad_g16),
                      {1, 65, 1000, 4096},
                      {},
                      1},
                     message);
}

// G = 16 with the paper's blocks at T = 65536 (Dqk = Dv = 64).
NSA_GPU_TEST(GradientG16Long) {
  return runGradCase({"grad_g16_long",
                      16,
                      1,
                      64,
                      64,
                      config(32, 16, 64, 16, 512),
                      NSA_GRAD_ENTRIES(grad_g16_long),
                      {65536},
                      {},
                      1},
                     message);
}

// Packed sequences (varlen) with the learned pool.
NSA_GPU_TEST(GradientPackedLearnedPool) {
  return runGradCase({"grad_packed",
                      8,
                      4,
                      64,
                      32,
                      config(16, 8, 32, 6, 100, true),
                      NSA_GRAD_ENTRIES(grad_packed),
                      {},
                      {{0, 1, 700, 1000}, {0, 65, 4096}}},
                     message);
}

// ... with dk and dv in chunks of 256 tokens: each sequence's key tiles
// take their turns on counters of their own.
NSA_GPU_TEST(GradientPackedChunked) {
  return runGradCase(
      {"grad_packed_chunks",
       8,
       4,
       64,
       32,
       config(16, 8, 32, 6, 100, true),
       NSA_GRAD_ENTRIES(grad_packed_chunks),
       {},
       {{0, 1, 700, 1000}, {0, 65, 4096}, {0, 3000, 3001, 8192}}},
      message);
}

namespace {

const nsaLayer kTrainLayer = {"grad_g4",
                              4,
                              1,
                              64,
                              64,
                              16,
                              nsaBF16,
                              0,
                              0,
                              NSA_ENTRY(_mlir_ciface_grad_g4_layer),
                              32,
                              4,
                              NSA_ENTRY(_mlir_ciface_grad_g4_layer_train),
                              NSA_ENTRY(_mlir_ciface_grad_g4_layer_grad_saved)};
const nsaLayer kNoTraining = {
    "grad_g4", 4,       1, 64, 64,
    16,        nsaBF16, 0, 0,  NSA_ENTRY(_mlir_ciface_grad_g4_layer)};

} // namespace

// Every training call below is refused before anything is read or
// launched (also in CI, without a GPU); the saved indices' values are
// checked on the device in runGradCase.
NSA_GPU_TEST(TrainingRejectsBadArguments) {
  alignas(16) static char memory[64];
  void *m = memory;
  float *f = reinterpret_cast<float *>(memory);
  int32_t *i = reinterpret_cast<int32_t *>(memory);
  struct Bad {
    const char *expect;
    const nsaLayer *layer;
    bool backward;
    void (*edit)(nsaLayerArgs &, nsaLayerSaved &, nsaLayerGrads &);
    bool noSaved = false, noGrads = false;
  } cases[] = {
      {"nsaLayerForwardTrain: the layer has no training entries", &kNoTraining,
       false, [](auto &, auto &, auto &) {}},
      {"nsaLayerBackward: the layer has no training entries", &kNoTraining,
       true, [](auto &, auto &, auto &) {}},
      {"nsaLayerForwardTrain: no saved state", &kTrainLayer, false,
       [](auto &, auto &, auto &) {}, true},
      {"nsaLayerBackward: no gradients", &kTrainLayer, true,
       [](auto &, auto &, auto &) {}, false, true},
      {"nsaLayerForwardTrain: out is null", &kTrainLayer, false,
       [](nsaLayerArgs &a, auto &, auto &) { a.out = nullptr; }},
      {"nsaLayerBackward: batch and tokens must be positive", &kTrainLayer,
       true, [](nsaLayerArgs &a, auto &, auto &) { a.tokens = 0; }},
      {"nsaLayerForwardTrain: saved.indices is null", &kTrainLayer, false,
       [](auto &, nsaLayerSaved &sv, auto &) { sv.indices = nullptr; }},
      {"nsaLayerBackward: saved.winLse is not 16-byte aligned", &kTrainLayer,
       true,
       [](auto &, nsaLayerSaved &sv, auto &) { sv.winLse = sv.winLse + 1; }},
      {"nsaLayerBackward: grads.dout is null", &kTrainLayer, true,
       [](auto &, auto &, nsaLayerGrads &g) { g.dout = nullptr; }},
      {"nsaLayerBackward: grads.dk is null", &kTrainLayer, true,
       [](auto &, auto &, nsaLayerGrads &g) { g.dk = nullptr; }},
      {"nsaLayerBackward: the layer takes no grads.dcmpWeights", &kTrainLayer,
       true,
       [](auto &, auto &, nsaLayerGrads &g) {
         g.dcmpWeights = reinterpret_cast<float *>(g.dq);
       }},
      {"nsaLayerBackward: the layer was compiled for dtype", &kTrainLayer, true,
       [](nsaLayerArgs &a, auto &, auto &) { a.dtype = nsaF32; }},
  };
  for (const Bad &c : cases) {
    nsaLayerArgs a{};
    a.batch = 2;
    a.tokens = 64;
    a.dtype = nsaBF16;
    a.q = a.k = a.v = a.gates = a.out = m;
    nsaLayerSaved sv = {m, f, i, m, f, m, f};
    nsaLayerGrads g = {m, m, m, m, m, nullptr};
    c.edit(a, sv, g);
    nsaStatus st =
        c.backward
            ? nsaLayerBackward(c.layer, &a, c.noSaved ? nullptr : &sv,
                               c.noGrads ? nullptr : &g)
            : nsaLayerForwardTrain(c.layer, &a, c.noSaved ? nullptr : &sv);
    std::string got = nsaGetLastError();
    if (st != nsaErrorInvalidArgument ||
        got.find(c.expect) == std::string::npos)
      return message = std::string("expected '") + c.expect + "', got status " +
                       std::to_string(st) + ": " + got,
             Result::Fail;
  }
  message = std::to_string(std::size(cases)) +
            " bad training calls rejected before any launch";
  return Result::Pass;
}

int main() { return runAll(); }
