//===- Passes.cpp - nsa passes and pipelines, C API ------------------------===//
//
// NSA-c/Passes.h: the generated pass C API (Passes.capi.cpp.inc) over the
// passes of Passes.td, and the pipelines over the C++ registration and
// builders (include/NSA/Pipelines/Pipelines.h).
//
//===----------------------------------------------------------------------===//

#include "NSA-c/Passes.h"

#include "NSA/Pipelines/Pipelines.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/CAPI/IR.h"
#include "mlir/CAPI/Pass.h"
#include "mlir/CAPI/Support.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::nsa;

#include "NSA/Transforms/Passes.capi.cpp.inc"

void nsaRegisterPipelineDialects(MlirDialectRegistry registry) {
  if (mlirDialectRegistryIsNull(registry))
    return; // nothing to register into
  nsa::registerNSAPipelineDialects(*unwrap(registry));
}

void nsaRegisterPipelines(void) {
  static bool once = [] {
    nsa::registerNSAPipelines();
    return true;
  }();
  (void)once;
}

namespace {

/// Parses `text` into `Options`, checks it with `verify` and builds the
/// pipeline into `pm`; a failure is left for nsaGetLastError as
/// "<fn>: <reason>".
template <typename Options, typename Verify, typename Build>
MlirLogicalResult buildPipeline(const char *fn, MlirOpPassManager pm,
                                MlirStringRef text, Verify verify,
                                Build build) {
  nsaSetLastError(nullptr);
  auto report = [&](const Twine &message) {
    nsaSetLastError((fn + Twine(": ") + message).str().c_str());
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
    StringRef detail = StringRef(parseErrors).trim();
    report("invalid pipeline options '" + unwrap(text) + "'" +
           (detail.empty() ? "" : ": ") + detail);
    return mlirLogicalResultFailure();
  }
  if (failed(verify(options, report)))
    return mlirLogicalResultFailure();
  build(*unwrap(pm), options);
  return mlirLogicalResultSuccess();
}

} // namespace

MlirLogicalResult nsaBuildToCPUPipeline(MlirOpPassManager pm,
                                        MlirStringRef options) {
  // Like nsa-opt's nsa-to-cpu: the tile sizes are checked by nsa-tile.
  return buildPipeline<nsa::NSAToCPUOptions>(
      "nsaBuildToCPUPipeline", pm, options,
      [](const nsa::NSAToCPUOptions &,
         function_ref<LogicalResult(const Twine &)>) { return success(); },
      nsa::buildNSAToCPUPipeline);
}

MlirLogicalResult nsaBuildToPTXPipeline(MlirOpPassManager pm,
                                        MlirStringRef options) {
  return buildPipeline<nsa::NSAToPTXOptions>(
      "nsaBuildToPTXPipeline", pm, options, nsa::verifyNSAToPTXOptions,
      nsa::buildNSAToPTXPipeline);
}
