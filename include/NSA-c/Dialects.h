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
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_DIALECTS_H
#define NSA_C_DIALECTS_H

#include "mlir-c/IR.h"

#ifdef __cplusplus
extern "C" {
#endif

MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(NSA, nsa);

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_DIALECTS_H */
