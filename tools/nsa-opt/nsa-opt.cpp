//===- nsa-opt.cpp - the nsa optimizer driver -----------------------------===//
//
// MlirOptMain with the nsa dialect, its passes and pipelines, and the
// upstream dialects and passes those pipelines use (selective registration).
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Pipelines/Pipelines.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/Support/CommandLine.h"

/// Hides the options the linked LLVM libraries registered when they were
/// loaded (back-end flags of every target libLLVM holds): --help shows the
/// nsa passes and pipelines and MLIR's own options, which MlirOptMain
/// registers after this; --help-hidden still lists everything.
static void hideLibraryOptions() {
  for (auto &entry : llvm::cl::getRegisteredOptions()) {
    llvm::StringRef name = entry.first;
    if (name != "help" && name != "help-list" && name != "version")
      entry.second->setHiddenFlag(llvm::cl::Hidden);
  }
}

int main(int argc, char **argv) {
  hideLibraryOptions();
  mlir::DialectRegistry registry;
  mlir::nsa::registerNSAPipelineDialects(registry);
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
  // To run the stages of nsa-to-cpu / nsa-to-ptx one at a time.
  mlir::bufferization::registerOneShotBufferizePass();
  mlir::nsa::registerNSAPasses();
  mlir::nsa::registerNSAPipelines();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "nsa optimizer driver\n", registry));
}
