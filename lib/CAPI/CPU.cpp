//===- CPU.cpp - JIT-compiled NSA layers on the host, C API ----------------===//
//
// NSA-c/CPU.h over runtime/cpu's CompiledLayer. Descriptions and arguments
// are checked by runtime/reference/LayerDesc.h before anything is built or
// run; no C++ exception leaves these functions.
//
//===----------------------------------------------------------------------===//

#include "NSA-c/CPU.h"

#include "CPURunner.h"
#include "LayerDesc.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <string>

using namespace mlir::nsa;

struct nsaCpuLayer {
  nsaLayerDesc desc;
  std::vector<int64_t> blocks; // desc.config.blocks points here
  ref::Config config;
  std::unique_ptr<cpu::CompiledLayer> compiled;
  std::string source;
};

namespace {
void setError(const std::string &message) {
  nsaSetLastError(message.c_str());
}

/// Records "<fn>: <message>" as the thread's last error; returns 1.
int fail(const char *fn, const std::string &message) {
  setError(std::string(fn) + ": " + message);
  return 1;
}

/// Checks a call's tensors against the layer (ref::inputsFromArgs) and
/// reads its inputs; `out` takes part in the pointer checks only.
bool parseCall(const nsaCpuLayer &layer, int64_t batch, int64_t tokens,
               const double *q, const double *k, const double *v,
               const double *gates, const double *cmpWeights,
               const int32_t *cuSeqlens, int64_t numSeqlens, double *out,
               ref::Shape &shape, ref::Inputs &inputs, std::string &error) {
  ref::CallArgs args{batch, tokens,     q,         k,          v,
                     gates, cmpWeights, cuSeqlens, numSeqlens, out};
  return ref::inputsFromArgs(layer.desc, layer.config, args, shape, inputs,
                             error);
}
} // namespace

namespace {
nsaCpuLayer *createLayer(const char *name, const nsaLayerDesc *desc,
                         bool gradient) {
  nsaSetLastError(nullptr);
  if (!desc) {
    setError(std::string(name) + ": no layer description");
    return nullptr;
  }
  try {
    auto layer = std::make_unique<nsaCpuLayer>();
    std::string error;
    if (!ref::configFromDesc(*desc, layer->config, error)) {
      setError(std::string(name) + ": " + error);
      return nullptr;
    }
    layer->desc = *desc;
    layer->blocks.assign(desc->config.blocks,
                         desc->config.blocks + desc->config.numBlocks);
    layer->desc.config.blocks = layer->blocks.data();
    cpu::LayerSpec spec;
    spec.qHeads = desc->qHeads;
    spec.kvHeads = desc->kvHeads;
    spec.qkDim = desc->qkDim;
    spec.vDim = desc->vDim;
    spec.config = layer->config;
    spec.dtype = desc->dtype == nsaF32   ? cpu::DType::F32
                 : desc->dtype == nsaF16 ? cpu::DType::F16
                                         : cpu::DType::BF16;
    spec.packed = desc->packed != 0;
    spec.gradient = gradient;
    layer->source = cpu::CompiledLayer::moduleText(spec);
    layer->compiled = cpu::CompiledLayer::compile(spec, error);
    if (!layer->compiled) {
      setError(std::string(name) + ": " + error);
      return nullptr;
    }
    return layer.release();
  } catch (const std::exception &e) {
    setError(std::string(name) + ": " + e.what());
    return nullptr;
  }
}
} // namespace

nsaCpuLayer *nsaCpuLayerCreate(const nsaLayerDesc *desc) {
  return createLayer("nsaCpuLayerCreate", desc, /*gradient=*/false);
}

nsaCpuLayer *nsaCpuLayerCreateTrainable(const nsaLayerDesc *desc) {
  return createLayer("nsaCpuLayerCreateTrainable", desc, /*gradient=*/true);
}

void nsaCpuLayerDestroy(nsaCpuLayer *layer) { delete layer; }

const char *nsaCpuLayerSource(const nsaCpuLayer *layer) {
  return layer ? layer->source.c_str() : "";
}

int nsaCpuLayerForward(nsaCpuLayer *layer, int64_t batch, int64_t tokens,
                       const double *q, const double *k, const double *v,
                       const double *gates, const double *cmpWeights,
                       const int32_t *cuSeqlens, int64_t numSeqlens,
                       double *out) {
  const char *fn = "nsaCpuLayerForward";
  nsaSetLastError(nullptr);
  if (!layer)
    return fail(fn, "no layer");
  try {
    ref::Shape shape;
    ref::Inputs inputs;
    std::string error;
    if (!parseCall(*layer, batch, tokens, q, k, v, gates, cmpWeights,
                   cuSeqlens, numSeqlens, out, shape, inputs, error))
      return fail(fn, error);
    if (tokens == 0)
      return 0;
    ref::Buffer result;
    if (!layer->compiled->runLayer(shape, inputs, result, error))
      return fail(fn, error);
    std::copy(result.begin(), result.end(), out);
    return 0;
  } catch (const std::exception &e) {
    return fail(fn, e.what());
  }
}

int nsaCpuLayerBackward(nsaCpuLayer *layer, int64_t batch, int64_t tokens,
                        const double *q, const double *k, const double *v,
                        const double *gates, const double *cmpWeights,
                        const int32_t *cuSeqlens, int64_t numSeqlens,
                        const double *dout, double *dq, double *dk,
                        double *dv, double *dgates, double *dcmpWeights) {
  const char *fn = "nsaCpuLayerBackward";
  nsaSetLastError(nullptr);
  if (!layer)
    return fail(fn, "no layer");
  if (!layer->compiled->spec().gradient)
    return fail(fn, "the layer was made without its gradient (use "
                    "nsaCpuLayerCreateTrainable)");
  try {
    ref::Shape shape;
    ref::Inputs inputs;
    std::string error;
    // The output pointer only takes part in the checks: dq stands in.
    if (!parseCall(*layer, batch, tokens, q, k, v, gates, cmpWeights,
                   cuSeqlens, numSeqlens, dq, shape, inputs, error))
      return fail(fn, error);
    const nsaLayerDesc &d = layer->desc;
    bool pool = d.config.linearPool != 0;
    const char *missing = !dout ? "dout"
                          : !dq ? "dq"
                          : !dk ? "dk"
                          : !dv ? "dv"
                          : !dgates ? "dgates"
                          : pool && !dcmpWeights ? "dcmpWeights"
                                                 : nullptr;
    if (missing)
      return fail(fn, std::string(missing) + " is null");
    if (!pool && dcmpWeights)
      return fail(fn, "dcmpWeights must be null without the learned pool");
    int64_t rows = batch * tokens;
    int64_t nq = rows * d.qHeads * d.qkDim, nk = rows * d.kvHeads * d.qkDim,
            nv = rows * d.kvHeads * d.vDim, ng = rows * d.qHeads * 3,
            nw = 2 * d.kvHeads * d.config.cmpBlock;
    if (tokens == 0) {
      std::fill(dq, dq + nq, 0.0);
      std::fill(dk, dk + nk, 0.0);
      std::fill(dv, dv + nv, 0.0);
      std::fill(dgates, dgates + ng, 0.0);
      if (pool)
        std::fill(dcmpWeights, dcmpWeights + nw, 0.0);
      return 0;
    }
    ref::Buffer dOut(dout, dout + rows * d.qHeads * d.vDim);
    ref::Gradients grads;
    if (!layer->compiled->runBackward(shape, inputs, dOut, grads, error))
      return fail(fn, error);
    std::copy(grads.q.begin(), grads.q.end(), dq);
    std::copy(grads.k.begin(), grads.k.end(), dk);
    std::copy(grads.v.begin(), grads.v.end(), dv);
    std::copy(grads.gates.begin(), grads.gates.end(), dgates);
    if (pool)
      std::copy(grads.cmpWeights.begin(), grads.cmpWeights.end(),
                dcmpWeights);
    return 0;
  } catch (const std::exception &e) {
    return fail(fn, e.what());
  }
}
