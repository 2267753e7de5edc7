//===- NSAToCPU.cpp - the nsa-to-cpu pipeline -----------------------------===//
//
//   nsa.sparse_attention            (tensors)
//     nsa-decompose                 branch ops
//     nsa-tile                      scf.forall + scf.for + linalg.generic
//     one-shot-bufferize            memrefs, function boundaries included
//     buffer deallocation           ownership-based, no leaks in loops
//     convert-linalg-to-loops       scalar loops
//     scf-forall-to-for             sequential on the host
//     ... -> LLVM                   strided metadata, affine, bf16 expansion,
//     scf/cf, math,
//                                   memref, arith, index, func
//     nsa-verify-dialects           only llvm and builtin remain
//
//===----------------------------------------------------------------------===//

#include "NSA/Pipelines/Pipelines.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/SCF/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void nsa::buildNSAToCPUPipeline(OpPassManager &pm,
                                const NSAToCPUOptions &options) {
  pm.addPass(createDecompose());
  buildNSATilePipeline(pm, options.queryTile, options.kvTile);
  buildNSABufferizePipeline(pm);
  bufferization::buildBufferDeallocationPipeline(pm);
  pm.addPass(createConvertBufferizationToMemRefPass());
  pm.addPass(createCanonicalizerPass());

  pm.addPass(createConvertLinalgToLoopsPass());
  pm.addPass(createForallToForLoopPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  arith::ArithExpandOpsPassOptions expand;
  expand.includeBf16 = true;
  pm.addPass(arith::createArithExpandOpsPass(expand));
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());

  VerifyDialectsOptions verify;
  verify.allowed = {"builtin", "llvm"};
  pm.addPass(createVerifyDialects(verify));
}
