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
thread_local std::string lastError;

void setError(const std::string &message) { lastError = message; }
} // namespace

const char *nsaCApiGetLastError(void) { return lastError.c_str(); }

nsaCpuLayer *nsaCpuLayerCreate(const nsaLayerDesc *desc) {
  lastError.clear();
  if (!desc) {
    setError("nsaCpuLayerCreate: no layer description");
    return nullptr;
  }
  try {
    auto layer = std::make_unique<nsaCpuLayer>();
    std::string error;
    if (!ref::configFromDesc(*desc, layer->config, error)) {
      setError("nsaCpuLayerCreate: " + error);
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
    layer->source = cpu::CompiledLayer::moduleText(spec);
    layer->compiled = cpu::CompiledLayer::compile(spec, error);
    if (!layer->compiled) {
      setError("nsaCpuLayerCreate: " + error);
      return nullptr;
    }
    return layer.release();
  } catch (const std::exception &e) {
    setError(std::string("nsaCpuLayerCreate: ") + e.what());
    return nullptr;
  }
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
  lastError.clear();
  if (!layer) {
    setError("nsaCpuLayerForward: no layer");
    return 1;
  }
  try {
    ref::Shape shape;
    ref::Inputs inputs;
    std::string error;
    ref::CallArgs args{batch,  tokens,     q,         k,          v,
                       gates,  cmpWeights, cuSeqlens, numSeqlens, out};
    if (!ref::inputsFromArgs(layer->desc, layer->config, args, shape, inputs,
                             error)) {
      setError("nsaCpuLayerForward: " + error);
      return 1;
    }
    if (tokens == 0)
      return 0;
    ref::Buffer result;
    if (!layer->compiled->runLayer(shape, inputs, result, error)) {
      setError("nsaCpuLayerForward: " + error);
      return 1;
    }
    std::copy(result.begin(), result.end(), out);
    return 0;
  } catch (const std::exception &e) {
    setError(std::string("nsaCpuLayerForward: ") + e.what());
    return 1;
  }
}
