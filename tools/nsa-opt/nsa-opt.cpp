//===- nsa-opt.cpp - the nsa optimizer driver -----------------------------===//
//
// MlirOptMain with the nsa dialect, its passes and pipelines, and the
// upstream dialects and passes those pipelines use (selective registration).
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::nsa::NSADialect, mlir::arith::ArithDialect,
                  mlir::func::FuncDialect, mlir::tensor::TensorDialect>();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
  mlir::nsa::registerNSAPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "nsa optimizer driver\n", registry));
}
