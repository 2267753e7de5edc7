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
// atomics whose order varies). Skipped without a GPU.
//
//===----------------------------------------------------------------------===//

#include "DeviceArray.h"
#include "GPUTest.h"
#include "NSAReference.h"

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

using namespace mlir::nsa;
using namespace nsa_gpu_test;

#define NSA_DECLARE_GRAD_CASE(name)                                            \
  extern "C" void _mlir_ciface_##name##_layer_grad();                          \
  extern "C" void _mlir_ciface_##name##_branches();
NSA_DECLARE_GRAD_CASE(grad_g1)
NSA_DECLARE_GRAD_CASE(grad_g4)
NSA_DECLARE_GRAD_CASE(grad_g4_chunks)
NSA_DECLARE_GRAD_CASE(grad_g16)
NSA_DECLARE_GRAD_CASE(grad_packed)
NSA_DECLARE_GRAD_CASE(grad_packed_chunks)

namespace {

struct GradCase {
  const char *name;
  int64_t qHeads, kvHeads, qkDim, vDim;
  ref::Config config;
  Entry grad, branches;
  std::vector<int64_t> tokens;              ///< regular batches of `batch`
  std::vector<std::vector<int32_t>> packed; ///< B = 1, cu_seqlens
  int64_t batch = 2;
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
    {
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
    char line[256];
    std::snprintf(line, sizeof(line), "\n    %s:%s, %.3f s", where.c_str(),
                  errors.c_str(), seconds);
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
                      NSA_ENTRY(_mlir_ciface_grad_g1_layer_grad),
                      NSA_ENTRY(_mlir_ciface_grad_g1_branches),
                      {1, 65, 1000}},
                     message);
}

NSA_GPU_TEST(GradientG4) {
  return runGradCase({"grad_g4",
                      4,
                      1,
                      64,
                      64,
                      config(16, 8, 32, 4, 64),
                      NSA_ENTRY(_mlir_ciface_grad_g4_layer_grad),
                      NSA_ENTRY(_mlir_ciface_grad_g4_branches),
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
                      NSA_ENTRY(_mlir_ciface_grad_g4_chunks_layer_grad),
                      NSA_ENTRY(_mlir_ciface_grad_g4_chunks_branches),
                      {1, 65, 1000, 4096}},
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
                      NSA_ENTRY(_mlir_ciface_grad_g4_chunks_layer_grad),
                      NSA_ENTRY(_mlir_ciface_grad_g4_chunks_branches),
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
                      NSA_ENTRY(_mlir_ciface_grad_g16_layer_grad),
                      NSA_ENTRY(_mlir_ciface_grad_g16_branches),
                      {65, 1000, 4096},
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
                      NSA_ENTRY(_mlir_ciface_grad_packed_layer_grad),
                      NSA_ENTRY(_mlir_ciface_grad_packed_branches),
                      {},
                      {{0, 1, 700, 1000}, {0, 65, 4096}}},
                     message);
}

// ... with dk and dv in chunks of 256 tokens: each sequence's key tiles
// take their turns on counters of their own.
NSA_GPU_TEST(GradientPackedChunked) {
  return runGradCase({"grad_packed_chunks",
                      8,
                      4,
                      64,
                      32,
                      config(16, 8, 32, 6, 100, true),
                      NSA_ENTRY(_mlir_ciface_grad_packed_chunks_layer_grad),
                      NSA_ENTRY(_mlir_ciface_grad_packed_chunks_branches),
                      {},
                      {{0, 1, 700, 1000}, {0, 65, 4096}, {0, 3000, 3001, 8192}}},
                     message);
}

int main() { return runAll(); }
