/*===- NSA-c/Layer.h - the description of one NSA layer, in C ------*- C -*-===*
 *
 * What a layer is compiled for: heads, dims, element type and the
 * `#nsa.config` hyperparameters (docs/Spec.md sections 1-5). The CPU JIT
 * (NSA-c/CPU.h), the float64 reference (NSA-c/Reference.h) and the libraries
 * of ahead-of-time GPU layers (NSA-c/Runtime.h) take it. No MLIR types.
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_LAYER_H
#define NSA_C_LAYER_H

#include "NSA/Runtime/nsa_runtime.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* `#nsa.config<...>`: the paper's values are l = 32, d = 16, l' = 64,
 * n = 16, w = 512, backbone <initial = 1, local = 2>. */
typedef struct nsaLayerConfig {
  int64_t cmpBlock;    /* l: tokens per compressed block */
  int64_t cmpStride;   /* d: stride between compressed blocks */
  int64_t slcBlock;    /* l': tokens per selection block */
  int64_t numSelected; /* n: selection blocks per (token, KV head) */
  int64_t window;      /* w: sliding-window length */
  double scale;        /* softmax scale; 0 means 1/sqrt(qkDim) */
  int32_t linearPool;  /* 1: learned pool, weights [2, H, l] (f32) */
  int32_t reserved;    /* 0 */
  /* The always-on blocks (Spec 5.4). */
  int64_t initialBlocks, localBlocks, logLevels, hubStride;
  const int64_t *blocks; /* explicit blocks, strictly increasing */
  int64_t numBlocks;
  int64_t maxTokens; /* declared maximum T; 0: none (hubs need one) */
} nsaLayerConfig;

typedef struct nsaLayerDesc {
  int64_t qHeads, kvHeads, qkDim, vDim; /* HQ, H, Dqk, Dv */
  nsaDType dtype; /* of q, k, v, gates and the output */
  int32_t packed; /* takes cu_seqlens (packed sequences, batch 1) */
  nsaLayerConfig config;
} nsaLayerDesc;

/* The paper's configuration (above), for `qHeads` x `qkDim`/`vDim` with
 * `kvHeads` KV heads, bf16, not packed. */
static inline nsaLayerDesc nsaPaperLayerDesc(int64_t qHeads, int64_t kvHeads,
                                             int64_t qkDim, int64_t vDim) {
  nsaLayerDesc d;
  d.qHeads = qHeads;
  d.kvHeads = kvHeads;
  d.qkDim = qkDim;
  d.vDim = vDim;
  d.dtype = nsaBF16;
  d.packed = 0;
  d.config.cmpBlock = 32;
  d.config.cmpStride = 16;
  d.config.slcBlock = 64;
  d.config.numSelected = 16;
  d.config.window = 512;
  d.config.scale = 0.0;
  d.config.linearPool = 0;
  d.config.reserved = 0;
  d.config.initialBlocks = 1;
  d.config.localBlocks = 2;
  d.config.logLevels = 0;
  d.config.hubStride = 0;
  d.config.blocks = 0;
  d.config.numBlocks = 0;
  d.config.maxTokens = 0;
  return d;
}

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_LAYER_H */
