/*===- NSA-c/CPU.h - JIT-compiled NSA layers on the host ------------*- C -*-===*
 *
 * One layer description (NSA-c/Layer.h) lowered by nsa-to-cpu and compiled
 * by MLIR's ExecutionEngine; one compilation serves every batch and
 * sequence length. The layer reads and writes float64 host arrays: inputs
 * are rounded to the layer's dtype first, as the compiled code sees them,
 * and the output is read back as float64.
 *
 * Functions report failure (NULL or nonzero) with a message that
 * nsaGetLastError() (NSA-c/Error.h) returns. Every argument is
 * checked before anything runs.
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_CPU_H
#define NSA_C_CPU_H

#include "NSA-c/Error.h"
#include "NSA-c/Layer.h"
#include "mlir-c/Support.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nsaCpuLayer nsaCpuLayer;

/* Builds, verifies (the dialect's own checks), lowers and JIT-compiles the
 * layer; NULL on failure. */
MLIR_CAPI_EXPORTED nsaCpuLayer *nsaCpuLayerCreate(const nsaLayerDesc *desc);

/* nsaCpuLayerCreate that also compiles the layer's gradient
 * (nsa.sparse_attention_grad) for nsaCpuLayerBackward. */
MLIR_CAPI_EXPORTED nsaCpuLayer *
nsaCpuLayerCreateTrainable(const nsaLayerDesc *desc);

MLIR_CAPI_EXPORTED void nsaCpuLayerDestroy(nsaCpuLayer *layer);

/* The nsa module that was compiled (entry points @layer and @branches);
 * valid until the layer is destroyed. */
MLIR_CAPI_EXPORTED const char *nsaCpuLayerSource(const nsaCpuLayer *layer);

/* Runs the layer: q [B,T,HQ,Dqk], k [B,T,H,Dqk], v [B,T,H,Dv], gates
 * [B,T,HQ,3] (logits), cmpWeights [2,H,l] with the learned pool (else
 * NULL), cuSeqlens [numSeqlens] when packed (batch 1; 0 first, tokens last,
 * non-decreasing), out [B,T,HQ,Dv]. Returns 0 on success. */
MLIR_CAPI_EXPORTED int
nsaCpuLayerForward(nsaCpuLayer *layer, int64_t batch, int64_t tokens,
                   const double *q, const double *k, const double *v,
                   const double *gates, const double *cmpWeights,
                   const int32_t *cuSeqlens, int64_t numSeqlens, double *out);

/* The gradients of sum(out * dout) (Spec section 9; the selected blocks
 * those the forward on the same inputs selects): the inputs as for
 * nsaCpuLayerForward, dout [B,T,HQ,Dv], and dq, dk, dv, dgates shaped as
 * q, k, v, gates, dcmpWeights [2,H,l] with the learned pool (else NULL).
 * Needs a layer made by nsaCpuLayerCreateTrainable. Returns 0 on success. */
MLIR_CAPI_EXPORTED int
nsaCpuLayerBackward(nsaCpuLayer *layer, int64_t batch, int64_t tokens,
                    const double *q, const double *k, const double *v,
                    const double *gates, const double *cmpWeights,
                    const int32_t *cuSeqlens, int64_t numSeqlens,
                    const double *dout, double *dq, double *dk, double *dv,
                    double *dgates, double *dcmpWeights);

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_CPU_H */
