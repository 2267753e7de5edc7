//===- embed.cpp - nsa from C++ in a project of its own -------------------===//
//
// Registers the nsa dialect and pipelines in a context, parses an nsa
// module (the paper's layer), runs nsa-to-ptx and reports what came out.
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Dialect/NSAOps.h"
#include "NSA/Pipelines/Pipelines.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    llvm::errs() << "usage: embed-cpp <layer.mlir>\n";
    return 2;
  }
  mlir::DialectRegistry registry;
  mlir::nsa::registerNSAPipelineDialects(registry);
  mlir::MLIRContext context(registry);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceFile<mlir::ModuleOp>(argv[1], &context);
  if (!module)
    return 1;
  int layers = 0;
  module->walk([&](mlir::nsa::SparseAttentionOp) { ++layers; });

  mlir::PassManager pm(&context);
  mlir::nsa::NSAToPTXOptions options;
  options.format = "isa";
  if (mlir::failed(mlir::nsa::verifyNSAToPTXOptions(
          options, [](const llvm::Twine &message) {
            llvm::errs() << message << "\n";
            return mlir::failure();
          })))
    return 1;
  mlir::nsa::buildNSAToPTXPipeline(pm, options);
  if (mlir::failed(pm.run(*module)))
    return 1;
  int binaries = 0;
  module->walk([&](mlir::gpu::BinaryOp) { ++binaries; });
  llvm::outs() << "embed-cpp: " << layers
               << " nsa.sparse_attention -> nsa-to-ptx: " << binaries
               << " gpu.binary\n";
  return layers > 0 && binaries > 0 ? 0 : 1;
}
