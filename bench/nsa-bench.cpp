//===- nsa-bench.cpp - time nsa layers compiled by nsa-to-ptx -------------===//
//
// Times the whole NSA layer forward, compiled ahead of time (bench/
// CMakeLists.txt), on random bf16 inputs at B = 1 for the sequence lengths
// given on the command line, and prints one JSON object per line:
//   {"impl": "nsa", "config": ..., "T": ..., "ms": median, "tflops": ...}
// and, with --branches, one line per branch from a profiled call (kernels
// timed by the runtime, grouped by the op nsa-to-ptx named them after).
// TF/s count useful FLOPs: 2 * (Dqk + Dv) per (query head, attended key)
// over the three branches (bench/README.md). Run by bench/run.sh.
//
//===----------------------------------------------------------------------===//

#include "NSA/Runtime/Descriptor.h"
#include "NSA/Runtime/nsa_runtime.h"
#include "NSA/Spec.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace mlir::nsa;

/// The entry of a layer that nsa_add_gpu_layer compiled: q, k, v, the gate
/// logits and the output, as memref descriptors.
using LayerFn = void(void *, void *, void *, void *, void *);
extern "C" {
LayerFn _mlir_ciface_bench_paper_layer, _mlir_ciface_bench_d128_layer,
    _mlir_ciface_bench_g4_layer, _mlir_ciface_bench_paper_generic_layer,
    _mlir_ciface_bench_paper_sm80_layer, _mlir_ciface_bench_paper_r128st3_layer,
    _mlir_ciface_bench_paper_r64st3_layer, _mlir_ciface_bench_paper_sel64_layer,
    _mlir_ciface_bench_paper_kv128_layer,
    _mlir_ciface_bench_paper_r128kv128_layer,
    _mlir_ciface_bench_paper_r128_layer, _mlir_ciface_bench_paper_byblock_layer,
    _mlir_ciface_bench_g4_token_layer, _mlir_ciface_bench_paper_slc64_layer,
    _mlir_ciface_bench_paper_slc16_layer, _mlir_ciface_bench_d128_slc16_layer,
    _mlir_ciface_bench_paper_nooverlap_layer,
    _mlir_ciface_bench_paper_pingpong_layer,
    _mlir_ciface_bench_paper_nofuse_layer;
}

/// The gradient entry of a layer compiled with --gradient: q, k, v, the gate
/// logits, the output's gradient, then dq, dk, dv and the gates' gradient.
using GradFn = void(void *, void *, void *, void *, void *, void *, void *,
                    void *, void *);
extern "C" GradFn _mlir_ciface_bench_paper_grad_layer_grad;
/// The same layer's forward and training entries (Spec section 9.1), called
/// through the runtime's checked nsaLayerForwardTrain and nsaLayerBackward.
extern "C" void _mlir_ciface_bench_paper_grad_layer(void),
    _mlir_ciface_bench_paper_grad_layer_train(void),
    _mlir_ciface_bench_paper_grad_layer_grad_saved(void),
    _mlir_ciface_bench_paper_grad_anyorder_layer(void),
    _mlir_ciface_bench_paper_grad_anyorder_layer_train(void),
    _mlir_ciface_bench_paper_grad_anyorder_layer_grad_saved(void);
/// The gradient variants of bench/CMakeLists.txt, each layer's three
/// entries.
#define NSA_GRAD_VARIANT(name)                                                \
  _mlir_ciface_bench_paper_grad_##name##_layer(void),                         \
      _mlir_ciface_bench_paper_grad_##name##_layer_train(void),               \
      _mlir_ciface_bench_paper_grad_##name##_layer_grad_saved(void)
extern "C" void NSA_GRAD_VARIANT(mmasync), NSA_GRAD_VARIANT(notma),
    NSA_GRAD_VARIANT(slcdq16), NSA_GRAD_VARIANT(nosum);
#undef NSA_GRAD_VARIANT
/// ... the last called directly (unchecked): q, k, v, gates, the output's
/// gradient, the 7 saved tensors, dq, dk, dv, dgates.
using GradSavedFn = void(void *, void *, void *, void *, void *, void *, void *,
                         void *, void *, void *, void *, void *, void *, void *,
                         void *, void *);

namespace {

struct Config {
  const char *name;
  int64_t qHeads, kvHeads, qkDim, vDim, l, d, lp, n, w;
  LayerFn *layer;
};

/// A layer with 4 KV heads, Dv = 128 and the paper's blocks (l = 32, d =
/// 16, l' = 64, n = 16, w = 512).
Config config(const char *name, int64_t qHeads, int64_t qkDim, LayerFn *layer) {
  return {name, qHeads, 4, qkDim, 128, 32, 16, 64, 16, 512, layer};
}

/// The paper layer's heads and dims (HQ 64, Dqk 192) compiled another way.
Config paper(const char *name, LayerFn *layer) {
  return config(name, 64, 192, layer);
}

struct DeviceArray {
  void *ptr = nullptr;
  std::vector<int64_t> descriptor;
  DeviceArray(std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t d : shape)
      count *= d;
    if (nsaMalloc(&ptr, count * 2) != nsaSuccess) {
      std::fprintf(stderr, "nsa-bench: %s\n", nsaGetLastError());
      std::exit(1);
    }
    // Random bf16 in [-1, 1): a fixed-seed LCG on the host, one upload.
    std::vector<uint16_t> host(count);
    uint64_t state = 0x9e3779b97f4a7c15ull * (count + 1);
    for (uint16_t &h : host) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      float f = static_cast<float>((state >> 40) * 0x1.0p-23 - 1.0);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      h = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    }
    nsaMemcpyHtoD(ptr, host.data(), count * 2);
    descriptor = nsa::runtime::contiguousDescriptor(ptr, shape);
  }
  ~DeviceArray() { nsaFree(ptr); }
  void *desc() { return descriptor.data(); }
};

/// Attended keys of each branch over a sequence of T tokens.
struct Keys {
  double compressed = 0, selected = 0, window = 0;
};
Keys attendedKeys(const Config &c, int64_t T) {
  Keys k;
  for (int64_t t = 0; t < T; ++t) {
    k.compressed += spec::numVisibleCompressedBlocks(t, c.l, c.d);
    k.selected += t / c.lp < c.n ? t + 1 : (c.n - 1) * c.lp + t % c.lp + 1;
    k.window += std::min<int64_t>(c.w, t + 1);
  }
  return k;
}

/// Useful forward FLOPs of `keys` attended keys per query head.
double flopsOf(const Config &c, double keys) {
  return 2.0 * (c.qkDim + c.vDim) * c.qHeads * keys;
}

/// Useful forward FLOPs of one layer: attended keys of the three branches.
double usefulFlops(const Config &c, int64_t T) {
  Keys k = attendedKeys(c, T);
  return flopsOf(c, k.compressed + k.selected + k.window);
}

/// One profiled call of the layer (or with `gradient` of its gradient): a
/// JSON line per op (kernels grouped by the op nsa-to-ptx named them
/// after), useful TF/s for the attention ops (their gradients: 2.5 times
/// the forward's FLOPs).
void printBranches(const Config &c, int64_t T,
                   const std::function<void()> &call, bool gradient = false,
                   const char *callName = "layer") {
  nsaProfileBegin();
  call();
  std::vector<nsaKernelTime> times(64);
  int64_t count = nsaProfileEnd(times.data(), times.size());
  times.resize(std::min<int64_t>(count, times.size()));
  Keys k = attendedKeys(c, T);
  struct Op {
    const char *key;
    double flops;
    double ms = 0;
    int64_t kernels = 0;
  };
  // The gradient ops first: their names contain the forward ops'.
  std::vector<Op> ops;
  if (gradient)
    ops = {{"compressed_attention_grad", 2.5 * flopsOf(c, k.compressed)},
           {"selected_attention_grad", 2.5 * flopsOf(c, k.selected)},
           {"window_attention_grad", 2.5 * flopsOf(c, k.window)},
           {"compress_grad", 0},
           {"combine_grad", 0}};
  std::vector<Op> forward = {{"compressed_attention", flopsOf(c, k.compressed)},
                             {"selected_attention", flopsOf(c, k.selected)},
                             {"window_attention", flopsOf(c, k.window)},
                             {"select_blocks", 0},
                             {"compress", 0},
                             {"combine", 0},
                             {"fill", 0},
                             {"", 0}}; // anything else
  ops.insert(ops.end(), forward.begin(), forward.end());
  double total = 0;
  for (const nsaKernelTime &t : times) {
    for (Op &op : ops)
      if (std::strstr(t.name, op.key)) {
        op.ms += t.ms;
        op.kernels += 1;
        break;
      }
    total += t.ms;
  }
  // The gradient's kernels one by one (its ops run several each).
  for (const nsaKernelTime &t : times)
    if (gradient)
      std::printf("{\"impl\": \"nsa kernel: %s\", \"config\": \"%s\", "
                  "\"T\": %lld, \"ms\": %.3f}\n",
                  t.name, c.name, static_cast<long long>(T), t.ms);
  for (const Op &op : ops) {
    if (!op.kernels)
      continue;
    std::printf("{\"impl\": \"nsa branch: %s\", \"call\": \"%s\", "
                "\"config\": \"%s\", \"T\": %lld, \"ms\": %.3f, "
                "\"share\": %.4f, \"kernels\": %lld",
                *op.key ? op.key : "other", callName, c.name,
                static_cast<long long>(T), op.ms,
                total > 0 ? op.ms / total : 0.0,
                static_cast<long long>(op.kernels));
    if (op.flops > 0)
      std::printf(", \"tflops\": %.4f", op.flops / (op.ms * 1e-3) * 1e-12);
    std::printf("}\n");
  }
  std::fflush(stdout);
}

/// Median wall-clock milliseconds of `reps` calls after one warm-up.
double medianMs(int reps, const std::function<void()> &call) {
  call();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    auto start = std::chrono::steady_clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// The layer `c`'s forward and its gradient `grad` (which recomputes the
/// forward) at each length, then the training pair (the forward with its
/// saved state, the gradient from it): a JSON line each for the gradient
/// calls, the training forward and forward + gradient. Useful FLOPs: the
/// backward counts 2.5 times the forward's (dq, dk, dv and the recomputed
/// scores, as FlashAttention counts them).
int benchGradient(const Config &c, GradFn *grad,
                  const std::vector<int64_t> &lengths, int reps,
                  bool branches) {
  for (int64_t T : lengths) {
    DeviceArray q({1, T, c.qHeads, c.qkDim}), k({1, T, c.kvHeads, c.qkDim}),
        v({1, T, c.kvHeads, c.vDim}), g({1, T, c.qHeads, 3}),
        out({1, T, c.qHeads, c.vDim}), dOut({1, T, c.qHeads, c.vDim}),
        dq({1, T, c.qHeads, c.qkDim}), dk({1, T, c.kvHeads, c.qkDim}),
        dv({1, T, c.kvHeads, c.vDim}), dg({1, T, c.qHeads, 3});
    double fwd = medianMs(reps, [&] {
      c.layer(q.desc(), k.desc(), v.desc(), g.desc(), out.desc());
    });
    double bwd = medianMs(reps, [&] {
      grad(q.desc(), k.desc(), v.desc(), g.desc(), dOut.desc(), dq.desc(),
           dk.desc(), dv.desc(), dg.desc());
    });
    if (nsaTakeAsyncError() != nsaSuccess) {
      std::fprintf(stderr, "nsa-bench: %s\n", nsaGetLastError());
      return 1;
    }
    // Training: the forward writes its saved state, the gradient takes it
    // (no recomputed forward); both through the runtime's checked entries,
    // the backward's check reading the indices back to the host.
    const nsaLayer layer = {"bench_paper_grad",
                            c.qHeads,
                            c.kvHeads,
                            c.qkDim,
                            c.vDim,
                            c.l,
                            nsaBF16,
                            0,
                            0,
                            &_mlir_ciface_bench_paper_grad_layer,
                            c.lp,
                            c.n,
                            &_mlir_ciface_bench_paper_grad_layer_train,
                            &_mlir_ciface_bench_paper_grad_layer_grad_saved};
    // Bytes as bf16 pairs: lse f32 [1, T, HQ], indices i32 [1, T, H, n].
    DeviceArray oc({1, T, c.qHeads, c.vDim}), os({1, T, c.qHeads, c.vDim}),
        ow({1, T, c.qHeads, c.vDim}), lc({1, T, c.qHeads, 2}),
        ls({1, T, c.qHeads, 2}), lw({1, T, c.qHeads, 2}),
        idx({1, T, c.kvHeads, c.n, 2});
    nsaLayerArgs args = {};
    args.batch = 1;
    args.tokens = T;
    args.dtype = nsaBF16;
    args.q = q.ptr;
    args.k = k.ptr;
    args.v = v.ptr;
    args.gates = g.ptr;
    args.out = out.ptr;
    nsaLayerSaved saved = {oc.ptr,
                           static_cast<float *>(lc.ptr),
                           static_cast<int32_t *>(idx.ptr),
                           os.ptr,
                           static_cast<float *>(ls.ptr),
                           ow.ptr,
                           static_cast<float *>(lw.ptr)};
    nsaLayerGrads grads = {dOut.ptr, dq.ptr, dk.ptr, dv.ptr, dg.ptr, nullptr};
    auto check = [](nsaStatus s) {
      if (s != nsaSuccess) {
        std::fprintf(stderr, "nsa-bench: %s\n", nsaGetLastError());
        std::exit(1);
      }
    };
    double fwdTrain = medianMs(
        reps, [&] { check(nsaLayerForwardTrain(&layer, &args, &saved)); });
    double bwdSaved = medianMs(
        reps, [&] { check(nsaLayerBackward(&layer, &args, &saved, &grads)); });
    // The same gradient with its dk, dv chunks adding in any order
    // (flash-grad-deterministic=0): what the fixed order costs.
    nsaLayer anyOrder = layer;
    anyOrder.entry = &_mlir_ciface_bench_paper_grad_anyorder_layer;
    anyOrder.train = &_mlir_ciface_bench_paper_grad_anyorder_layer_train;
    anyOrder.backward =
        &_mlir_ciface_bench_paper_grad_anyorder_layer_grad_saved;
    double bwdAnyOrder = medianMs(reps, [&] {
      check(nsaLayerBackward(&anyOrder, &args, &saved, &grads));
    });
    // The gradient variants (bench/CMakeLists.txt) from the same saved
    // state.
    struct Variant {
      const char *impl;
      void (*entry)(), (*train)(), (*backward)();
    } variants[] = {
        {"nsa gradient from the saved state, every gradient kernel on mma.sync "
         "(flash-grad-wgmma=0)",
         &_mlir_ciface_bench_paper_grad_mmasync_layer,
         &_mlir_ciface_bench_paper_grad_mmasync_layer_train,
         &_mlir_ciface_bench_paper_grad_mmasync_layer_grad_saved},
        {"nsa gradient from the saved state, the walked tiles by cp.async "
         "(flash-grad-tma=0)",
         &_mlir_ciface_bench_paper_grad_notma_layer,
         &_mlir_ciface_bench_paper_grad_notma_layer_train,
         &_mlir_ciface_bench_paper_grad_notma_layer_grad_saved},
        {"nsa gradient from the saved state, selected dq in blocks of 16 "
         "rows (flash-grad-selected-rows=16)",
         &_mlir_ciface_bench_paper_grad_slcdq16_layer,
         &_mlir_ciface_bench_paper_grad_slcdq16_layer_train,
         &_mlir_ciface_bench_paper_grad_slcdq16_layer_grad_saved},
        {"nsa gradient from the saved state, the branches' dq summed by a "
         "kernel of its own (flash-grad-fuse-sum=0)",
         &_mlir_ciface_bench_paper_grad_nosum_layer,
         &_mlir_ciface_bench_paper_grad_nosum_layer_train,
         &_mlir_ciface_bench_paper_grad_nosum_layer_grad_saved}};
    std::vector<std::pair<const char *, double>> variantMs;
    for (const Variant &v : variants) {
      nsaLayer other = layer;
      other.entry = v.entry;
      other.train = v.train;
      other.backward = v.backward;
      variantMs.push_back({v.impl, medianMs(reps, [&] {
                             check(nsaLayerBackward(&other, &args, &saved,
                                                    &grads));
                           })});
    }
    // The same entry without the runtime's checks (the saved indices read
    // back to the host and checked): what those cost.
    std::vector<int64_t> oShape = {1, T, c.qHeads, c.vDim},
                         lShape = {1, T, c.qHeads},
                         iShape = {1, T, c.kvHeads, c.n};
    std::vector<int64_t> savedDescs[] = {
        nsa::runtime::contiguousDescriptor(oc.ptr, oShape),
        nsa::runtime::contiguousDescriptor(lc.ptr, lShape),
        nsa::runtime::contiguousDescriptor(idx.ptr, iShape),
        nsa::runtime::contiguousDescriptor(os.ptr, oShape),
        nsa::runtime::contiguousDescriptor(ls.ptr, lShape),
        nsa::runtime::contiguousDescriptor(ow.ptr, oShape),
        nsa::runtime::contiguousDescriptor(lw.ptr, lShape)};
    auto *direct = reinterpret_cast<GradSavedFn *>(
        &_mlir_ciface_bench_paper_grad_layer_grad_saved);
    double bwdDirect = medianMs(reps, [&] {
      direct(q.desc(), k.desc(), v.desc(), g.desc(), dOut.desc(),
             savedDescs[0].data(), savedDescs[1].data(), savedDescs[2].data(),
             savedDescs[3].data(), savedDescs[4].data(), savedDescs[5].data(),
             savedDescs[6].data(), dq.desc(), dk.desc(), dv.desc(), dg.desc());
      check(nsaTakeAsyncError());
    });

    double flops = usefulFlops(c, T);
    struct Line {
      const char *impl;
      double ms, flops;
    } lines[] = {{"nsa gradient", bwd, 2.5 * flops},
                 {"nsa forward + gradient", fwd + bwd, 3.5 * flops},
                 {"nsa training forward (saved state)", fwdTrain, flops},
                 {"nsa gradient from the saved state", bwdSaved, 2.5 * flops},
                 {"nsa gradient from the saved state, unchecked entry",
                  bwdDirect, 2.5 * flops},
                 {"nsa gradient from the saved state, dk dv chunks in any "
                  "order (flash-grad-deterministic=0)",
                  bwdAnyOrder, 2.5 * flops},
                 {"nsa training forward + gradient from the saved state",
                  fwdTrain + bwdSaved, 3.5 * flops}};
    std::vector<Line> all(std::begin(lines), std::end(lines));
    for (const auto &[impl, ms] : variantMs)
      all.push_back({impl, ms, 2.5 * flops});
    for (const Line &l : all)
      std::printf("{\"impl\": \"%s\", \"config\": \"%s\", \"T\": %lld, "
                  "\"ms\": %.3f, \"tflops\": %.4f, \"reps\": %d}\n",
                  l.impl, c.name, static_cast<long long>(T), l.ms,
                  l.flops / (l.ms * 1e-3) * 1e-12, reps);
    std::fflush(stdout);
    if (branches) {
      printBranches(
          c, T,
          [&] {
            grad(q.desc(), k.desc(), v.desc(), g.desc(), dOut.desc(), dq.desc(),
                 dk.desc(), dv.desc(), dg.desc());
          },
          /*gradient=*/true, "layer_grad");
      printBranches(
          c, T, [&] { check(nsaLayerBackward(&layer, &args, &saved, &grads)); },
          /*gradient=*/true, "layer_grad_saved");
    }
    if (nsaTakeAsyncError() != nsaSuccess) {
      std::fprintf(stderr, "nsa-bench: %s\n", nsaGetLastError());
      return 1;
    }
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  int reps = 3;
  std::vector<int64_t> lengths;
  const char *only = nullptr; // --configs=<substring of the config name>
  bool branches = false;      // --branches: one profiled call per point
  bool gradient = false;      // --gradient: the paper layer's gradient
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0)
      reps = std::atoi(argv[i] + 7);
    else if (std::strncmp(argv[i], "--configs=", 10) == 0)
      only = argv[i] + 10;
    else if (std::strcmp(argv[i], "--branches") == 0)
      branches = true;
    else if (std::strcmp(argv[i], "--gradient") == 0)
      gradient = true;
    else
      lengths.push_back(std::atoll(argv[i]));
  }
  if (reps < 1 || lengths.empty() ||
      std::any_of(lengths.begin(), lengths.end(),
                  [](int64_t T) { return T < 1; })) {
    std::fprintf(stderr, "usage: nsa-bench [--reps=N>=1] "
                         "[--configs=SUBSTRING] [--branches] [--gradient] T...  "
                         "(T >= 1)\n");
    return 2;
  }
  if (nsaInit(0) != nsaSuccess) {
    std::fprintf(stderr, "nsa-bench: %s\n", nsaGetLastError());
    return 1;
  }
  const Config configs[] = {
      config("paper (HQ64 H4 Dqk192 Dv128)", 64, 192,
             _mlir_ciface_bench_paper_layer),
      config("D128 (HQ64 H4 D128)", 64, 128, _mlir_ciface_bench_d128_layer),
      config("G4 (HQ16 H4 Dqk192 Dv128)", 16, 192, _mlir_ciface_bench_g4_layer),
      paper("paper, generic mapping (attention-strategy=generic)",
            _mlir_ciface_bench_paper_generic_layer),
      paper("paper, flash on mma.sync (attention-strategy=flash-sm80)",
            _mlir_ciface_bench_paper_sm80_layer),
      paper("paper, 128-row blocks, 3-stage ring",
            _mlir_ciface_bench_paper_r128st3_layer),
      paper("paper, 64-row blocks, 3-stage ring",
            _mlir_ciface_bench_paper_r64st3_layer),
      paper("paper, flash selection in 64-row blocks",
            _mlir_ciface_bench_paper_sel64_layer),
      paper("paper, 128-key tiles", _mlir_ciface_bench_paper_kv128_layer),
      paper("paper, 128-row blocks, 128-key tiles",
            _mlir_ciface_bench_paper_r128kv128_layer),
      paper("paper, 128-row blocks", _mlir_ciface_bench_paper_r128_layer),
      paper("paper, block-major selected attention",
            _mlir_ciface_bench_paper_byblock_layer),
      config("G4, token-major selected attention", 16, 192,
             _mlir_ciface_bench_g4_token_layer),
      paper("paper, selected attention in 64-row blocks",
            _mlir_ciface_bench_paper_slc64_layer),
      paper("paper, selected attention in 16-row blocks",
            _mlir_ciface_bench_paper_slc16_layer),
      config("D128, selected attention in 16-row blocks", 64, 128,
             _mlir_ciface_bench_d128_slc16_layer),
      paper("paper, compressed attention not overlapped "
            "(flash-overlap=0)",
            _mlir_ciface_bench_paper_nooverlap_layer),
      paper("paper, compressed attention's warpgroups taking turns "
            "(flash-pingpong=1)",
            _mlir_ciface_bench_paper_pingpong_layer),
      paper("paper, combine not fused into window attention "
            "(flash-fuse-combine=0)",
            _mlir_ciface_bench_paper_nofuse_layer)};
  if (gradient)
    return benchGradient(configs[0], _mlir_ciface_bench_paper_grad_layer_grad,
                         lengths, reps, branches);
  for (const Config &c : configs) {
    if (only && !std::strstr(c.name, only))
      continue;
    for (int64_t T : lengths) {
      DeviceArray q({1, T, c.qHeads, c.qkDim}), k({1, T, c.kvHeads, c.qkDim}),
          v({1, T, c.kvHeads, c.vDim}), g({1, T, c.qHeads, 3}),
          out({1, T, c.qHeads, c.vDim});
      c.layer(q.desc(), k.desc(), v.desc(), g.desc(), out.desc()); // warm-up
      std::vector<double> ms;
      for (int r = 0; r < reps; ++r) {
        auto start = std::chrono::steady_clock::now();
        c.layer(q.desc(), k.desc(), v.desc(), g.desc(), out.desc());
        ms.push_back(std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now() - start)
                         .count());
      }
      if (nsaTakeAsyncError() != nsaSuccess) {
        std::fprintf(stderr, "nsa-bench: %s\n", nsaGetLastError());
        return 1;
      }
      std::sort(ms.begin(), ms.end());
      double median = ms[ms.size() / 2];
      std::printf("{\"impl\": \"nsa (mapping v1)\", \"config\": \"%s\", "
                  "\"T\": %lld, \"ms\": %.3f, \"tflops\": %.4f, "
                  "\"reps\": %d}\n",
                  c.name, static_cast<long long>(T), median,
                  usefulFlops(c, T) / (median * 1e-3) * 1e-12, reps);
      std::fflush(stdout);
      if (branches)
        printBranches(c, T, [&] {
          c.layer(q.desc(), k.desc(), v.desc(), g.desc(), out.desc());
        });
      if (nsaTakeAsyncError() != nsaSuccess) {
        std::fprintf(stderr, "nsa-bench: %s\n", nsaGetLastError());
        return 1;
      }
    }
  }
  return 0;
}
