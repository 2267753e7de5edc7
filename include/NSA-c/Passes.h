/*===- NSA-c/Passes.h - nsa passes and pipelines, C API -------------*- C -*-===*
 *
 * The nsa passes, generated from Passes.td as upstream generates its own
 * (mlir-c/Transforms.h):
 *
 *   mlirRegisterNSAPasses();                   every nsa pass, by name
 *   MlirPass p = mlirCreateNSADecompose();     one pass, to add to a pm
 *   mlirRegisterNSATile();                     one pass's registration
 *
 * and, written by hand, the two named pipelines (nsa-to-cpu, nsa-to-ptx)
 * and builders that add a pipeline, with its options in nsa-opt's text
 * form ("chip=sm_90a format=isa"), to a pass manager. A builder checks the
 * options before it adds anything; on failure it returns a failed
 * MlirLogicalResult and nsaGetLastError() says why (NSA-c/Error.h).
 * nsa-to-cpu's tile sizes are checked when nsa-tile runs, as with nsa-opt.
 *
 * libNSA-C also holds upstream's pass C API (mlir-c/Pass.h) and the core
 * transforms' (mlir-c/Transforms.h): call mlirRegisterTransformsPasses()
 * to use canonicalize, cse, ... in a textual pipeline.
 *
 *   MlirContext ctx = mlirContextCreateWithRegistry(registry, false);
 *   MlirPassManager pm = mlirPassManagerCreate(ctx);
 *   if (mlirLogicalResultIsFailure(nsaBuildToPTXPipeline(
 *           mlirPassManagerGetAsOpPassManager(pm),
 *           mlirStringRefCreateFromCString("format=isa"))))
 *     fprintf(stderr, "%s\n", nsaGetLastError());
 *   mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module));
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_PASSES_H
#define NSA_C_PASSES_H

#include "NSA-c/Error.h"
#include "mlir-c/IR.h"
#include "mlir-c/Pass.h"
#include "mlir-c/Support.h"

#include "NSA/Transforms/Passes.capi.h.inc"

#ifdef __cplusplus
extern "C" {
#endif

/* Inserts the nsa dialect, every dialect the nsa pipelines produce and the
 * interface models their passes use (bufferization, LLVM IR translation,
 * the NVVM target) into `registry` (a null registry: nothing). */
MLIR_CAPI_EXPORTED void
nsaRegisterPipelineDialects(MlirDialectRegistry registry);

/* Registers the named pipelines nsa-to-cpu and nsa-to-ptx with the global
 * registry, so that mlirParsePassPipeline finds them. Safe to call more
 * than once. (The passes: mlirRegisterNSAPasses.) */
MLIR_CAPI_EXPORTED void nsaRegisterPipelines(void);

/* Adds nsa-to-cpu (nsa ops on tensors -> LLVM dialect for the host) with
 * `options` ("query-tile=16 kv-tile=64"; empty for the defaults). */
MLIR_CAPI_EXPORTED MlirLogicalResult
nsaBuildToCPUPipeline(MlirOpPassManager pm, MlirStringRef options);

/* Adds nsa-to-ptx (nsa ops on device tensors -> kernels as PTX or cubin in
 * a gpu.binary, host code on the mgpu* ABI of the nsa runtime) with
 * `options` ("chip=sm_90a format=bin attention-strategy=flash", ...). */
MLIR_CAPI_EXPORTED MlirLogicalResult
nsaBuildToPTXPipeline(MlirOpPassManager pm, MlirStringRef options);

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_PASSES_H */
