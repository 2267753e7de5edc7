//===- NSAPlugin.cpp - nsa as a plugin of upstream's mlir-opt --------------===//
//
// libNSAPlugin is both a dialect plugin and a pass plugin, so that a tool
// built on MlirOptMain (upstream's mlir-opt among them) runs nsa:
//
//   mlir-opt --load-dialect-plugin=libNSAPlugin.so \
//            --load-pass-plugin=libNSAPlugin.so \
//            --pass-pipeline='builtin.module(nsa-to-cpu)' layer.mlir
//
// The dialect side inserts the nsa dialect and what its pipelines need into
// the tool's registry; the pass side registers every nsa pass and the
// nsa-to-cpu and nsa-to-ptx pipelines.
//
//===----------------------------------------------------------------------===//

#include "NSA/Pipelines/Pipelines.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Tools/Plugins/DialectPlugin.h"
#include "mlir/Tools/Plugins/PassPlugin.h"
#include "llvm/Config/llvm-config.h"

using namespace mlir;

extern "C" LLVM_ATTRIBUTE_WEAK DialectPluginLibraryInfo
mlirGetDialectPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "NSA", LLVM_VERSION_STRING,
          [](DialectRegistry *registry) {
            nsa::registerNSAPipelineDialects(*registry);
          }};
}

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo mlirGetPassPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "NSAPasses", LLVM_VERSION_STRING, [] {
            nsa::registerNSAPasses();
            nsa::registerNSAPipelines();
          }};
}
