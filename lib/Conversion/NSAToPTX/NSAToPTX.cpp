//===- NSAToPTX.cpp - the nsa-to-ptx pipeline -----------------------------===//
//
//   GPU-mapped IR (gpu.launch / gpu.launch_func + gpu.module)
//     nsa-verify-dialects{forbidden=nsa}   nsa tiles must be mapped first
//     gpu-kernel-outlining, nvvm-attach-target (sm_90a, +ptx80),
//     scf/affine/memref lowering, convert-gpu-to-nvvm in the kernels,
//     gpu-to-llvm on the host, gpu-module-to-binary (PTX or cubin)
//     nsa-verify-dialects                  builtin, gpu, llvm, nvvm only
//
// The host side calls the mgpu* ABI implemented by runtime/gpu; translate
// the result with `mlir-translate --mlir-to-llvmir` and compile it with `llc`
// (runtime/gpu/CMakeLists.txt: nsa_add_gpu_object).
//
//===----------------------------------------------------------------------===//

#include "NSA/Pipelines/Pipelines.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

void nsa::buildNSAToPTXPipeline(OpPassManager &pm,
                                const NSAToPTXOptions &options) {
  NSAVerifyDialectsOptions noNSA;
  noNSA.forbidden = {"nsa"};
  pm.addPass(createNSAVerifyDialects(noNSA));

  // Kernels: outline, attach the NVVM target, lower to NVVM.
  pm.addPass(createGpuKernelOutliningPass());
  GpuNVVMAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features;
  target.optLevel = options.optLevel;
  target.cmdOptions = options.ptxasOptions;
  pm.addPass(createGpuNVVMAttachTarget(target));
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createConvertNVGPUToNVVMPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createConvertGpuOpsToNVVMOps());
  pm.addPass(createConvertNVVMToLLVMPass());

  // Host: the launches become calls of the mgpu* ABI.
  pm.addPass(createGpuToLLVMConversionPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());

  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  binary.cmdOptions = options.ptxasOptions;
  pm.addPass(createGpuModuleToBinaryPass(binary));

  NSAVerifyDialectsOptions verify;
  verify.allowed = {"builtin", "gpu", "llvm", "nvvm"};
  pm.addPass(createNSAVerifyDialects(verify));
}
