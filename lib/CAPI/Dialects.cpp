//===- Dialects.cpp - the nsa dialect's C API ------------------------------===//
//
// NSA-c/Dialects.h: the dialect handle and #nsa.config from and to the
// nsaLayerConfig of NSA-c/Layer.h.
//
//===----------------------------------------------------------------------===//

#include "NSA-c/Dialects.h"

#include "NSA/Dialect/NSADialect.h"

#include "mlir/CAPI/IR.h"
#include "mlir/CAPI/Registration.h"
#include "mlir/CAPI/Support.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"

#include <cmath>
#include <string>

MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(NSA, nsa, mlir::nsa::NSADialect)

using namespace mlir;
using namespace mlir::nsa;

namespace {

MlirAttribute failConfig(const std::string &message) {
  nsaSetLastError(("nsaConfigAttrGet: " + message).c_str());
  return MlirAttribute{nullptr};
}

/// The backbone and config of `c` through the attributes' own verifiers;
/// their first diagnostic becomes the error.
MlirAttribute buildConfig(MLIRContext *ctx, const nsaLayerConfig &c,
                          int64_t maxHops) {
  std::string diagnostics;
  ScopedDiagnosticHandler capture(ctx, [&](Diagnostic &diag) {
    if (diagnostics.empty())
      diagnostics = diag.str();
    return success();
  });
  auto emitError = [&] { return mlir::emitError(UnknownLoc::get(ctx)); };
  Builder b(ctx);
  DenseI64ArrayAttr blocks;
  if (c.numBlocks > 0)
    blocks = b.getDenseI64ArrayAttr(ArrayRef<int64_t>(c.blocks, c.numBlocks));
  BackboneAttr backbone = BackboneAttr::getChecked(
      emitError, ctx, c.initialBlocks, c.localBlocks, c.logLevels, c.hubStride,
      blocks);
  if (!backbone)
    return failConfig(diagnostics);
  FloatAttr scale;
  if (c.scale != 0.0)
    scale = b.getF32FloatAttr(static_cast<float>(c.scale));
  ConfigAttr config = ConfigAttr::getChecked(
      emitError, ctx, c.cmpBlock, c.cmpStride, c.slcBlock, c.numSelected,
      c.window, scale, c.linearPool ? PoolKind::Linear : PoolKind::Mean,
      backbone, c.maxTokens, maxHops);
  if (!config)
    return failConfig(diagnostics);
  return wrap(Attribute(config));
}

} // namespace

bool nsaAttributeIsAConfig(MlirAttribute attr) {
  return !mlirAttributeIsNull(attr) && isa<ConfigAttr>(unwrap(attr));
}

MlirAttribute nsaConfigAttrGet(MlirContext ctx, const nsaLayerConfig *config,
                               int64_t maxHops) {
  nsaSetLastError(nullptr);
  if (mlirContextIsNull(ctx))
    return failConfig("the context is null");
  if (!config)
    return failConfig("the config is null");
  if (config->reserved != 0)
    return failConfig("reserved must be 0, found " +
                      std::to_string(config->reserved));
  if (config->linearPool != 0 && config->linearPool != 1)
    return failConfig("linearPool must be 0 or 1, found " +
                      std::to_string(config->linearPool));
  if (config->numBlocks < 0 || (config->numBlocks > 0 && !config->blocks))
    return failConfig("blocks must hold numBlocks (" +
                      std::to_string(config->numBlocks) + ") entries");
  if (!std::isfinite(config->scale) || config->scale < 0.0)
    return failConfig("scale must be 0 (1/sqrt(Dqk)) or positive and "
                      "finite, found " +
                      std::to_string(config->scale));
  unwrap(ctx)->getOrLoadDialect<NSADialect>();
  return buildConfig(unwrap(ctx), *config, maxHops);
}

MlirLogicalResult nsaConfigAttrGetFields(MlirAttribute attr,
                                         nsaLayerConfig *config) {
  nsaSetLastError(nullptr);
  if (!nsaAttributeIsAConfig(attr) || !config) {
    nsaSetLastError(config ? "nsaConfigAttrGetFields: not an #nsa.config"
                           : "nsaConfigAttrGetFields: config is null");
    return mlirLogicalResultFailure();
  }
  auto c = cast<ConfigAttr>(unwrap(attr));
  BackboneAttr backbone = c.getBackbone();
  *config = nsaLayerConfig{};
  config->cmpBlock = c.getCmpBlock();
  config->cmpStride = c.getCmpStride();
  config->slcBlock = c.getSlcBlock();
  config->numSelected = c.getNumSelected();
  config->window = c.getWindow();
  config->scale = c.getScale() ? c.getScale().getValueAsDouble() : 0.0;
  config->linearPool = c.getPool() == PoolKind::Linear;
  config->initialBlocks = backbone.getInitial();
  config->localBlocks = backbone.getLocal();
  config->logLevels = backbone.getLogLevels();
  config->hubStride = backbone.getHubStride();
  if (DenseI64ArrayAttr blocks = backbone.getBlocks()) {
    config->blocks = blocks.asArrayRef().data();
    config->numBlocks = blocks.size();
  }
  config->maxTokens = c.getMaxTokens();
  return mlirLogicalResultSuccess();
}

int64_t nsaConfigAttrGetMaxHops(MlirAttribute attr) {
  if (!nsaAttributeIsAConfig(attr))
    return -1;
  return cast<ConfigAttr>(unwrap(attr)).getMaxHops();
}
