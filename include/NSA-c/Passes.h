/*===- NSA-c/Passes.h - nsa passes and pipelines, C API -------------*- C -*-===*
 *
 * Registration of the nsa passes and named pipelines (nsa-to-cpu,
 * nsa-to-ptx) and builders that add a pipeline, with its options in the
 * textual form nsa-opt takes ("chip=sm_90a format=isa"), to a pass manager.
 * An option that does not parse, or an nsa-to-ptx option that
 * verifyNSAToPTXOptions refuses, makes the builder fail before anything is
 * added and report through `errorCallback`; nsa-to-cpu's tile sizes are
 * checked when nsa-tile runs, as with nsa-opt.
 *
 *   MlirContext ctx = mlirContextCreateWithRegistry(registry, false);
 *   MlirPassManager pm = mlirPassManagerCreate(ctx);
 *   if (mlirLogicalResultIsFailure(nsaBuildToPTXPipeline(
 *           mlirPassManagerGetAsOpPassManager(pm),
 *           mlirStringRefCreateFromCString("format=isa"), onError, NULL)))
 *     ...;
 *   mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module));
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_PASSES_H
#define NSA_C_PASSES_H

#include "mlir-c/IR.h"
#include "mlir-c/Pass.h"
#include "mlir-c/Support.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Inserts the nsa dialect, every dialect the nsa pipelines produce and the
 * interface models their passes use (bufferization, LLVM IR translation,
 * the NVVM target) into `registry`. */
MLIR_CAPI_EXPORTED void
nsaRegisterPipelineDialects(MlirDialectRegistry registry);

/* Registers the nsa passes (nsa-decompose, nsa-tile, ...) and the named
 * pipelines nsa-to-cpu and nsa-to-ptx with the global registry, so that
 * mlirParsePassPipeline and mlirOpPassManagerAddPipeline find them. Safe to
 * call more than once. */
MLIR_CAPI_EXPORTED void nsaRegisterPasses(void);

/* Adds nsa-to-cpu (nsa ops on tensors -> LLVM dialect for the host) with
 * `options` ("query-tile=16 kv-tile=64"; empty for the defaults). */
MLIR_CAPI_EXPORTED MlirLogicalResult
nsaBuildToCPUPipeline(MlirOpPassManager pm, MlirStringRef options,
                      MlirStringCallback errorCallback, void *userData);

/* Adds nsa-to-ptx (nsa ops on device tensors -> kernels as PTX or cubin in
 * a gpu.binary, host code on the mgpu* ABI of the nsa runtime) with
 * `options` ("chip=sm_90a format=bin attention-strategy=flash", ...). */
MLIR_CAPI_EXPORTED MlirLogicalResult
nsaBuildToPTXPipeline(MlirOpPassManager pm, MlirStringRef options,
                      MlirStringCallback errorCallback, void *userData);

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_PASSES_H */
