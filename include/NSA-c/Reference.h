/*===- NSA-c/Reference.h - the float64 reference of NSA, in C -------*- C -*-===*
 *
 * The float64 implementation of docs/Spec.md that every kernel is tested
 * against (runtime/reference), for a layer description (NSA-c/Layer.h).
 * Library libnsa_reference: no MLIR, no GPU. Arrays are dense row-major
 * float64 in the layout of NSA-c/CPU.h, taken as they are (no rounding).
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_REFERENCE_H
#define NSA_C_REFERENCE_H

#include "NSA-c/Error.h"
#include "NSA-c/Layer.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Checks the description (heads, dims, the config rules of Spec section 4)
 * and the arguments as nsaCpuLayerForward does, then computes the layer
 * into `out` [B,T,HQ,Dv] and, where `indices` is not NULL, the selected
 * blocks [B,T,H,n] (increasing, -1 padded). Returns 0 on success. */
int nsaReferenceForward(const nsaLayerDesc *desc, int64_t batch,
                        int64_t tokens, const double *q, const double *k,
                        const double *v, const double *gates,
                        const double *cmpWeights, const int32_t *cuSeqlens,
                        int64_t numSeqlens, double *out, int32_t *indices);

/* nsaReferenceForward, and where `margins` is not NULL the selection
 * margin of every (token, KV head) [B,T,H]: how far the lowest block score
 * the top-n picked (forced blocks aside) lies above the highest it left
 * out, relative to max(1, |that score|); +inf when nothing was left out.
 * A bf16 or f16 kernel may pick another block where the margin is below
 * its rounding (the GPU tests allow that below 1e-3). */
int nsaReferenceForwardWithMargins(const nsaLayerDesc *desc, int64_t batch,
                                   int64_t tokens, const double *q,
                                   const double *k, const double *v,
                                   const double *gates,
                                   const double *cmpWeights,
                                   const int32_t *cuSeqlens,
                                   int64_t numSeqlens, double *out,
                                   int32_t *indices, double *margins);

/* The float64 reference backward (Spec section 9): the gradients of
 * sum(out * dout) with respect to q, k, v, the gate logits and, for the
 * learned pool, cmpWeights, the selected blocks held fixed. `indices`
 * [B,T,H,n] names those blocks (those a compiled forward chose, say; each
 * -1 or a block of its sequence) or is NULL for the reference's own
 * selection. Outputs: dq, dk, dv, dgates with the shapes of q, k, v, gates;
 * dcmpWeights [2,H,l] exactly for the learned pool (else NULL). The
 * arguments are checked as nsaReferenceForward checks them. Returns 0 on
 * success. */
int nsaReferenceBackward(const nsaLayerDesc *desc, int64_t batch,
                         int64_t tokens, const double *q, const double *k,
                         const double *v, const double *gates,
                         const double *cmpWeights, const int32_t *cuSeqlens,
                         int64_t numSeqlens, const int32_t *indices,
                         const double *dout, double *dq, double *dk,
                         double *dv, double *dgates, double *dcmpWeights);

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_REFERENCE_H */
