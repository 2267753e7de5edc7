//===- CPURunner.h - JIT-compile and run nsa layers on the host --*- C++
//-*-===//
//
// Builds an nsa module for one layer configuration, lowers it with the
// `nsa-to-cpu` pipeline, JIT-compiles it with MLIR's ExecutionEngine and runs
// it on host buffers. The CPU tests and the demo use it to check the tiled IR
// against the float64 reference (runtime/reference).
//
// The module holds two entry points with the same inputs:
//   @layer     one nsa.sparse_attention (exercises nsa-decompose);
//   @branches  the explicit branch ops, writing every intermediate result
//              (compressed/selected/window outputs and lse, indices);
// and, when asked for, a third that also takes the output's gradient:
//   @layer_grad  one nsa.sparse_attention_grad, writing every gradient;
// and a decoding step over a KV cache:
//   @decode_step nsa.compress_append, then nsa.sparse_attention_decode.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_RUNTIME_CPU_CPURUNNER_H
#define NSA_RUNTIME_CPU_CPURUNNER_H

#include "NSAReference.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mlir {
class ExecutionEngine;
class MLIRContext;
} // namespace mlir

namespace mlir::nsa::cpu {

enum class DType { F32, F16, BF16 };

/// The MLIR spelling ("f32", "f16", "bf16").
const char *dtypeName(DType dtype);

/// Rounds `x` to `dtype` and back, as the kernels see their inputs.
double roundTo(DType dtype, double x);

/// A layer configuration: everything static in the compiled code.
struct LayerSpec {
  int64_t qHeads = 1, kvHeads = 1, qkDim = 64, vDim = 64;
  ref::Config config;
  DType dtype = DType::F32;
  bool packed = false; ///< takes cu_seqlens
  /// Also compile `@layer_grad` (nsa.sparse_attention_grad) for
  /// runBackward.
  bool gradient = false;
  int64_t queryTile = 16, kvTile = 64;
  /// Also compile `@decode_step` for runDecode with this many new tokens
  /// per step (0: none).
  int64_t decodeQueries = 0;
};

/// One decoding step (docs/Spec.md section 12): batch row `b` of the caches
/// holds `kvLens[b]` tokens, the last `queries` of them new this step.
struct DecodeInputs {
  int64_t batch = 1, queries = 1, cacheTokens = 1; ///< B, Tq, Lmax
  std::vector<int32_t> kvLens;                     ///< [B]
  ref::Buffer q, gates;                            ///< [B, Tq, HQ, *]
  ref::Buffer k, v;                                ///< [B, Lmax, H, *]
  /// The compressed caches [B, Nc(Lmax), H, *] as they were before this
  /// step: rows of blocks complete before it valid, any values past them.
  ref::Buffer kc, vc;
  ref::Buffer cmpWeights; ///< [2, H, l] for the linear pool
};

/// What a decoding step writes: the output [B, Tq, HQ, Dv] and the updated
/// compressed caches.
struct DecodeResult {
  ref::Buffer out, kc, vc;
};

/// The results of one run, read back as float64.
struct RunResult {
  ref::Buffer out;                                     // @layer
  ref::Buffer cmpOut, cmpLse, slcOut, slcLse, winOut, winLse, branchOut;
  std::vector<int32_t> indices;                        // @branches
};

class CompiledLayer {
public:
  ~CompiledLayer();

  /// The nsa module for `spec` (what gets compiled); its entry points are
  /// `@<prefix>layer` and `@<prefix>branches`.
  static std::string moduleText(const LayerSpec &spec,
                                const std::string &prefix = "");

  /// Lowers and JIT-compiles `spec`; null with `error` set on failure.
  static std::unique_ptr<CompiledLayer> compile(const LayerSpec &spec,
                                                std::string &error);

  /// Lowers and JIT-compiles a user module whose first
  /// nsa.sparse_attention defines the spec (its tiles from `tiles`). Its
  /// functions are run with runFunction.
  static std::unique_ptr<CompiledLayer>
  compileSource(const std::string &source, const LayerSpec &tiles,
                std::string &error);

  /// Runs function `name` with signature
  /// `(q, k, v, gates[, cmp_weights][, cu_seqlens]) -> out` on `in`.
  bool runFunction(const std::string &name, const ref::Shape &shape,
                   const ref::Inputs &in, ref::Buffer &out, std::string &error);

  /// Runs `@layer` alone for `shape` into `out` (poisoned first).
  bool runLayer(const ref::Shape &shape, const ref::Inputs &in,
                ref::Buffer &out, std::string &error);

  /// Runs both entry points for `shape` (batch, tokens, cu_seqlens; heads
  /// and dims must match the spec) on `in` rounded to the spec's dtype.
  /// Every output buffer is poisoned (NaN, or -7 for indices) first.
  bool run(const ref::Shape &shape, const ref::Inputs &in, RunResult &result,
           std::string &error);

  /// Runs the layer's gradient (the spec needs `gradient`) for `shape` on
  /// `in` and the output gradient `dOut` [B, T, HQ, Dv], all rounded to the
  /// spec's dtype; every gradient buffer is poisoned (NaN) first. Without
  /// `fromSaved`, `@layer_grad` recomputes the forward; with it,
  /// `@layer_train` runs first (into poisoned buffers) and
  /// `@layer_grad_saved` takes its saved state (Spec section 9.1).
  bool runBackward(const ref::Shape &shape, const ref::Inputs &in,
                   const ref::Buffer &dOut, ref::Gradients &grads,
                   std::string &error, bool fromSaved = false);

  /// Runs `@decode_step` (the spec needs `decodeQueries`): nsa.compress_append
  /// of the step's complete blocks into copies of `in.kc`, `in.vc`, then
  /// nsa.sparse_attention_decode. Checks the arguments first (`Tq <=
  /// kvLens[b] <= Lmax`, buffer sizes) and fails with `error` on bad ones;
  /// the output is poisoned (NaN) before the run.
  bool runDecode(const DecodeInputs &in, DecodeResult &result,
                 std::string &error);

  const LayerSpec &spec() const { return layerSpec; }

private:
  CompiledLayer() = default;
  bool lowerAndLoad(const std::string &text, std::string &error);
  bool checkShape(const ref::Shape &shape, std::string &error) const;

  LayerSpec layerSpec;
  std::unique_ptr<MLIRContext> context;
  std::unique_ptr<ExecutionEngine> engine;
};

} // namespace mlir::nsa::cpu

#endif // NSA_RUNTIME_CPU_CPURUNNER_H
