/*===- NSA-c/Dialects.h - the nsa dialect's C API -------------------*- C -*-===*
 *
 * The dialect handle, in the style of upstream's mlir-c/Dialect/*.h:
 *
 *   MlirDialectHandle h = mlirGetDialectHandle__nsa__();
 *   mlirDialectHandleRegisterDialect(h, ctx);   // or InsertDialect(h, reg)
 *   mlirDialectHandleLoadDialect(h, ctx);
 *
 * A context that runs the nsa pipelines needs more dialects and interface
 * models than nsa itself: see nsaRegisterPipelineDialects (NSA-c/Passes.h).
 *
 * `#nsa.config<...>` is built from, and read into, the nsaLayerConfig of
 * NSA-c/Layer.h; building checks the Spec's rules (docs/Spec.md section 4,
 * config_c1 .. config_c9) and on failure returns a null attribute with the
 * rule that failed in nsaGetLastError() (NSA-c/Error.h).
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_DIALECTS_H
#define NSA_C_DIALECTS_H

#include "NSA-c/Error.h"
#include "NSA-c/Layer.h"
#include "mlir-c/IR.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(NSA, nsa);

/* Whether `attr` is an #nsa.config. */
MLIR_CAPI_EXPORTED bool nsaAttributeIsAConfig(MlirAttribute attr);

/* The #nsa.config of `config` (scale 0: absent, i.e. 1/sqrt(Dqk); the
 * backbone from initialBlocks .. blocks) with the declared hop bound
 * `maxHops` (0: none), checked against the Spec's rules; a null attribute
 * (mlirAttributeIsNull) when a rule or an argument fails. */
MLIR_CAPI_EXPORTED MlirAttribute nsaConfigAttrGet(MlirContext ctx,
                                                  const nsaLayerConfig *config,
                                                  int64_t maxHops);

/* Reads an #nsa.config into `*config`: `blocks` points into the
 * attribute's storage (valid while its context lives), an absent scale
 * reads as 0. Fails when `attr` is not an #nsa.config or `config` is NULL. */
MLIR_CAPI_EXPORTED MlirLogicalResult
nsaConfigAttrGetFields(MlirAttribute attr, nsaLayerConfig *config);

/* The declared hop bound of an #nsa.config (0: none; -1: not a config). */
MLIR_CAPI_EXPORTED int64_t nsaConfigAttrGetMaxHops(MlirAttribute attr);

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_DIALECTS_H */
