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

int main(int argc, char **argv) {
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
