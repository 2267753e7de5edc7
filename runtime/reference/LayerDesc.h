//===- LayerDesc.h - C layer descriptions to the reference's types -*- C++ -*-===//
//
// The C API describes a layer with nsaLayerDesc (include/NSA-c/Layer.h) and
// passes host float64 arrays. These helpers check a description and one
// call's arguments (the same rules for the float64 reference and the CPU
// JIT, before anything runs) and convert them to ref::Shape, ref::Config
// and ref::Inputs. No MLIR dependency.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_RUNTIME_REFERENCE_LAYERDESC_H
#define NSA_RUNTIME_REFERENCE_LAYERDESC_H

#include "NSA-c/Layer.h"
#include "NSAReference.h"

#include <string>

namespace mlir::nsa::ref {

/// Checks `desc` (positive heads and dims, GQA, dtype, the config rules
/// config_c1 .. config_c7 of docs/Spec.md) and converts its config. Returns
/// false with `error` set.
bool configFromDesc(const nsaLayerDesc &desc, Config &config,
                    std::string &error);

/// The host arrays of one call, as the C API takes them.
struct CallArgs {
  int64_t batch, tokens;
  const double *q, *k, *v, *gates, *cmpWeights;
  const int32_t *cuSeqlens;
  int64_t numSeqlens;
  double *out;
};

/// Checks `args` against `desc` (sizes, overflow, pointers, cu_seqlens: 0
/// first, non-decreasing, `tokens` last) and copies them into `shape` and
/// `inputs`. Returns false with `error` set.
bool inputsFromArgs(const nsaLayerDesc &desc, const Config &config,
                    const CallArgs &args, Shape &shape, Inputs &inputs,
                    std::string &error);

} // namespace mlir::nsa::ref

#endif // NSA_RUNTIME_REFERENCE_LAYERDESC_H
