//===- Passes.cpp - nsa passes and pipelines, C API ------------------------===//
//
// NSA-c/Passes.h over the C++ registration (lib/Conversion/Registration.cpp)
// and pipeline builders (include/NSA/Pipelines/Pipelines.h).
//
//===----------------------------------------------------------------------===//

#include "NSA-c/Passes.h"

#include "NSA/Pipelines/Pipelines.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/CAPI/IR.h"
#include "mlir/CAPI/Pass.h"
#include "mlir/CAPI/Support.h"
#include "mlir/CAPI/Utils.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;

void nsaRegisterPipelineDialects(MlirDialectRegistry registry) {
  if (mlirDialectRegistryIsNull(registry))
    return; // nothing to register into
  nsa::registerNSAPipelineDialects(*unwrap(registry));
}

void nsaRegisterPasses(void) {
  static bool once = [] {
    nsa::registerNSAPasses();
    nsa::registerNSAPipelines();
    return true;
  }();
  (void)once;
}

namespace {

/// Parses `text` into `Options`, checks it with `verify` and builds the
/// pipeline into `pm`; errors go to `callback`.
template <typename Options, typename Verify, typename Build>
MlirLogicalResult buildPipeline(MlirOpPassManager pm, MlirStringRef text,
                                MlirStringCallback callback, void *userData,
                                Verify verify, Build build) {
  auto report = [&](const Twine &message) {
    if (callback) {
      std::string s = message.str();
      callback(mlirStringRefCreate(s.data(), s.size()), userData);
    }
    return failure();
  };
  if (!pm.ptr) {
    report("the pass manager is null");
    return mlirLogicalResultFailure();
  }
  Options options;
  std::string parseErrors;
  llvm::raw_string_ostream os(parseErrors);
  if (failed(options.parseFromString(unwrap(text), os))) {
    report("invalid pipeline options '" + unwrap(text) + "': " + parseErrors);
    return mlirLogicalResultFailure();
  }
  if (failed(verify(options, report)))
    return mlirLogicalResultFailure();
  build(*unwrap(pm), options);
  return mlirLogicalResultSuccess();
}

} // namespace

MlirLogicalResult nsaBuildToCPUPipeline(MlirOpPassManager pm,
                                        MlirStringRef options,
                                        MlirStringCallback errorCallback,
                                        void *userData) {
  // Like nsa-opt's nsa-to-cpu: the tile sizes are checked by nsa-tile.
  return buildPipeline<nsa::NSAToCPUOptions>(
      pm, options, errorCallback, userData,
      [](const nsa::NSAToCPUOptions &,
         function_ref<LogicalResult(const Twine &)>) { return success(); },
      nsa::buildNSAToCPUPipeline);
}

MlirLogicalResult nsaBuildToPTXPipeline(MlirOpPassManager pm,
                                        MlirStringRef options,
                                        MlirStringCallback errorCallback,
                                        void *userData) {
  return buildPipeline<nsa::NSAToPTXOptions>(
      pm, options, errorCallback, userData, nsa::verifyNSAToPTXOptions,
      nsa::buildNSAToPTXPipeline);
}
