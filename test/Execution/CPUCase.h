//===- CPUCase.h - the layer cases of the CPU execution tests ---*- C++ -*-===//
//
// What the CPU forward and gradient tests share: one layer configuration
// with the sequence lengths it runs, the compiled spec and the shapes of a
// case, and random inputs rounded to the case's element type.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_TEST_EXECUTION_CPUCASE_H
#define NSA_TEST_EXECUTION_CPUCASE_H

#include "CPURunner.h"
#include "NSAReference.h"

#include <cstdint>
#include <vector>

namespace nsa_cpu_test {

using namespace mlir::nsa;
using namespace mlir::nsa::cpu;

struct Case {
  const char *name;
  int64_t qHeads, kvHeads, qkDim, vDim;
  int64_t l, d, lp, n, w, initial, local;
  bool linear;
  DType dtype;
  std::vector<int64_t> tokens;             ///< regular batches, B = 2
  std::vector<std::vector<int32_t>> packed; ///< cu_seqlens of packed runs
  int64_t queryTile = 16, kvTile = 64;
  /// Every token has the same key: block scores tie exactly, so top-n must
  /// break ties towards the lower block index (Spec 5.4).
  bool constantKeys = false;
  /// Further backbone patterns (issue 5) and the declared length they need.
  int64_t logLevels = 0, hubStride = 0;
  std::vector<int64_t> blocks;
  int64_t maxTokens = 0;
};

/// The compiled configuration of `tc` (not yet packed).
inline LayerSpec layerSpecOf(const Case &tc) {
  LayerSpec spec;
  spec.qHeads = tc.qHeads;
  spec.kvHeads = tc.kvHeads;
  spec.qkDim = tc.qkDim;
  spec.vDim = tc.vDim;
  spec.config.cmpBlock = tc.l;
  spec.config.cmpStride = tc.d;
  spec.config.slcBlock = tc.lp;
  spec.config.numSelected = tc.n;
  spec.config.window = tc.w;
  spec.config.backbone = {tc.initial, tc.local, tc.logLevels, tc.hubStride,
                          tc.blocks};
  spec.config.maxTokens = tc.maxTokens;
  spec.config.linearPool = tc.linear;
  spec.dtype = tc.dtype;
  spec.queryTile = tc.queryTile;
  spec.kvTile = tc.kvTile;
  return spec;
}

/// Batches of 2 for `tc.tokens`, then the packed runs.
inline std::vector<ref::Shape> shapesOf(const Case &tc) {
  ref::Shape dims;
  dims.qHeads = tc.qHeads;
  dims.kvHeads = tc.kvHeads;
  dims.qkDim = tc.qkDim;
  dims.vDim = tc.vDim;
  return ref::testShapes(dims, 2, tc.tokens, tc.packed);
}

inline ref::Inputs randomInputs(const ref::Shape &s, const ref::Config &c,
                         DType dtype, uint64_t seed, bool constantKeys) {
  int64_t rows = s.batch * s.tokens;
  ref::Inputs in;
  in.q = ref::randomBuffer(rows * s.qHeads * s.qkDim, seed + 1);
  in.k = ref::randomBuffer(rows * s.kvHeads * s.qkDim, seed + 2);
  if (constantKeys)
    for (int64_t i = s.kvHeads * s.qkDim; i < rows * s.kvHeads * s.qkDim; ++i)
      in.k[i] = in.k[i % (s.kvHeads * s.qkDim)];
  in.v = ref::randomBuffer(rows * s.kvHeads * s.vDim, seed + 3);
  in.gates = ref::randomBuffer(rows * s.qHeads * 3, seed + 4, -3.0, 3.0);
  // Inputs as the kernels see them, so the reference computes on the same
  // numbers.
  for (ref::Buffer *b : {&in.q, &in.k, &in.v, &in.gates})
    for (double &x : *b)
      x = roundTo(dtype, x);
  if (c.linearPool)
    in.cmpWeights = ref::randomBuffer(2 * s.kvHeads * c.cmpBlock, seed + 5,
                                      0.0, 2.0 / c.cmpBlock);
  return in;
}

} // namespace nsa_cpu_test

#endif // NSA_TEST_EXECUTION_CPUCASE_H
