//===- LayerDesc.cpp - C layer descriptions to the reference's types ------===//
//
// See LayerDesc.h. The config rules are those of ConfigAttr::verify
// (lib/Dialect/NSADialect.cpp), stated here for callers without MLIR; the
// constraint ids are docs/Spec.md's.
//
//===----------------------------------------------------------------------===//

#include "LayerDesc.h"

#include <climits>
#include <cmath>

using namespace mlir::nsa;

namespace {

std::string str(int64_t v) { return std::to_string(v); }

/// `a * b * ...` without overflow, or -1.
int64_t product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (f < 0 || __builtin_mul_overflow(p, f, &p))
      return -1;
  return p;
}

} // namespace

bool ref::configFromDesc(const nsaLayerDesc &d, Config &c,
                         std::string &error) {
  if (d.qHeads < 1 || d.kvHeads < 1 || d.qkDim < 1 || d.vDim < 1) {
    error = "heads and dims must be positive, found qHeads = " +
            str(d.qHeads) + ", kvHeads = " + str(d.kvHeads) +
            ", qkDim = " + str(d.qkDim) + ", vDim = " + str(d.vDim);
    return false;
  }
  if (d.qHeads % d.kvHeads) {
    error = "qHeads (" + str(d.qHeads) + ") must be a multiple of kvHeads (" +
            str(d.kvHeads) + ")";
    return false;
  }
  if (d.dtype != nsaBF16 && d.dtype != nsaF16 && d.dtype != nsaF32) {
    error = "dtype must be nsaBF16, nsaF16 or nsaF32, found " +
            str(d.dtype);
    return false;
  }
  const nsaLayerConfig &k = d.config;
  // config_c1
  if (k.cmpBlock <= 0 || k.cmpStride <= 0 || k.slcBlock <= 0 ||
      k.numSelected <= 0 || k.window <= 0) {
    error = "block sizes and the window must be positive, found cmpBlock = " +
            str(k.cmpBlock) + ", cmpStride = " + str(k.cmpStride) +
            ", slcBlock = " + str(k.slcBlock) + ", numSelected = " +
            str(k.numSelected) + ", window = " + str(k.window);
    return false;
  }
  // config_c2, config_c3
  if (k.cmpBlock % k.cmpStride || k.slcBlock % k.cmpStride) {
    error = "cmpStride (" + str(k.cmpStride) + ") must divide cmpBlock (" +
            str(k.cmpBlock) + ") and slcBlock (" + str(k.slcBlock) + ")";
    return false;
  }
  // config_c4
  if (k.cmpBlock > k.slcBlock) {
    error = "cmpBlock (" + str(k.cmpBlock) + ") must not exceed slcBlock (" +
            str(k.slcBlock) + ")";
    return false;
  }
  // config_c6
  if (!std::isfinite(k.scale) || k.scale < 0.0) {
    error = "scale must be 0 (1/sqrt(qkDim)) or positive and finite";
    return false;
  }
  if (k.linearPool != 0 && k.linearPool != 1) {
    error = "linearPool must be 0 or 1, found " + str(k.linearPool);
    return false;
  }
  if (k.reserved != 0) {
    error = "reserved must be 0, found " + str(k.reserved);
    return false;
  }
  // backbone_c1 .. backbone_c3
  if (k.initialBlocks < 0 || k.localBlocks < 0 || k.logLevels < 0 ||
      k.hubStride < 0 || k.logLevels > 40 || k.numBlocks < 0 ||
      (k.numBlocks > 0 && !k.blocks)) {
    error = "backbone parameters must be non-negative (logLevels at most "
            "40) and blocks given when numBlocks > 0";
    return false;
  }
  for (int64_t i = 0; i < k.numBlocks; ++i)
    if (k.blocks[i] < 0 || (i > 0 && k.blocks[i] <= k.blocks[i - 1])) {
      error = "backbone blocks must be non-negative and strictly increasing";
      return false;
    }
  // config_c7
  if (k.maxTokens < 0 || (k.hubStride > 0 && k.maxTokens == 0)) {
    error = "maxTokens must be non-negative, and declared with hub blocks";
    return false;
  }
  c = Config();
  c.cmpBlock = k.cmpBlock;
  c.cmpStride = k.cmpStride;
  c.slcBlock = k.slcBlock;
  c.numSelected = k.numSelected;
  c.window = k.window;
  c.scale = k.scale;
  c.linearPool = k.linearPool != 0;
  c.backbone = spec::Backbone{k.initialBlocks, k.localBlocks};
  c.backbone.logLevels = k.logLevels;
  c.backbone.hubStride = k.hubStride;
  c.backbone.blocks.assign(k.blocks, k.blocks + k.numBlocks);
  c.maxTokens = k.maxTokens;
  // config_c5
  int64_t maxBlock =
      k.maxTokens > 0 ? spec::numSelectionBlocks(k.maxTokens, k.slcBlock) - 1
                      : -1;
  int64_t forced = c.backbone.maxForcedBlocks(maxBlock);
  if (forced >= 0 && k.numSelected < forced) {
    error = "numSelected (" + str(k.numSelected) +
            ") must be at least the number of forced blocks (" + str(forced) +
            ")";
    return false;
  }
  return true;
}

bool ref::inputsFromArgs(const nsaLayerDesc &d, const Config &c,
                         const CallArgs &a, Shape &shape, Inputs &in,
                         std::string &error) {
  if (a.batch < 1 || a.tokens < 0) {
    error = "batch must be positive and tokens non-negative, found " +
            str(a.batch) + " and " + str(a.tokens);
    return false;
  }
  if (a.tokens > INT32_MAX) {
    error = "tokens must be at most 2147483647, found " + str(a.tokens);
    return false;
  }
  int64_t rows = product({a.batch, a.tokens});
  int64_t qSize = product({rows, d.qHeads, d.qkDim}),
          kSize = product({rows, d.kvHeads, d.qkDim}),
          vSize = product({rows, d.kvHeads, d.vDim}),
          gSize = product({rows, d.qHeads, 3}),
          oSize = product({rows, d.qHeads, d.vDim});
  if (qSize < 0 || oSize < 0 || gSize < 0 || product({qSize, 8}) < 0 ||
      product({oSize, 8}) < 0) {
    error = "batch x tokens x heads x dim overflows 64-bit sizes";
    return false;
  }
  struct Pointer {
    const char *name;
    const void *ptr;
    bool needed; // must not be null
    bool taken;  // may be given
  };
  bool packed = d.packed != 0;
  // With no tokens there is nothing to read or write: the tensors may be
  // empty (null) then.
  bool hasRows = a.tokens > 0;
  for (const Pointer &p : {Pointer{"q", a.q, hasRows, true},
                           {"k", a.k, hasRows, true},
                           {"v", a.v, hasRows, true},
                           {"gates", a.gates, hasRows, true},
                           {"out", a.out, hasRows, true},
                           {"cmpWeights", a.cmpWeights, c.linearPool,
                            c.linearPool},
                           {"cuSeqlens", a.cuSeqlens, packed, packed}}) {
    if (p.needed && !p.ptr) {
      error = std::string(p.name) + " is null";
      return false;
    }
    if (!p.taken && p.ptr) {
      error = std::string("the layer takes no ") + p.name;
      return false;
    }
  }
  shape = Shape();
  shape.batch = a.batch;
  shape.tokens = a.tokens;
  shape.qHeads = d.qHeads;
  shape.kvHeads = d.kvHeads;
  shape.qkDim = d.qkDim;
  shape.vDim = d.vDim;
  if (packed) {
    if (a.batch != 1) {
      error = "packed sequences need batch 1, found " + str(a.batch);
      return false;
    }
    if (a.numSeqlens < 2 || a.numSeqlens > 65536) {
      error = "cuSeqlens needs 2 to 65536 offsets, found " +
              str(a.numSeqlens);
      return false;
    }
    shape.cuSeqlens.assign(a.cuSeqlens, a.cuSeqlens + a.numSeqlens);
    if (shape.cuSeqlens.front() != 0 || shape.cuSeqlens.back() != a.tokens) {
      error = "cuSeqlens must start at 0 and end at tokens (" +
              str(a.tokens) + ")";
      return false;
    }
    for (size_t i = 1; i < shape.cuSeqlens.size(); ++i)
      if (shape.cuSeqlens[i] < shape.cuSeqlens[i - 1]) {
        error = "cuSeqlens decreases at entry " + str(i);
        return false;
      }
  } else if (a.numSeqlens) {
    error = "the layer takes no cuSeqlens";
    return false;
  }
  in = Inputs();
  in.q.assign(a.q, a.q + qSize);
  in.k.assign(a.k, a.k + kSize);
  in.v.assign(a.v, a.v + vSize);
  in.gates.assign(a.gates, a.gates + gSize);
  if (c.linearPool)
    in.cmpWeights.assign(a.cmpWeights, a.cmpWeights + 2 * d.kvHeads *
                                                          d.config.cmpBlock);
  return true;
}
