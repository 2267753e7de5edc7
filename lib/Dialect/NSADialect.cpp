//===- NSADialect.cpp - nsa dialect and attributes ------------------------===//
//
// Registers the nsa dialect and implements its typed attributes: the
// verifiers of `#nsa.backbone` and `#nsa.config` (constraints `backbone_c*`
// and `config_c*` of docs/Spec.md) and the helpers that state their meaning.
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Dialect/NSAOps.h"
#include "NSA/Dialect/NSAVerify.h"
#include "NSA/Reach.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>

using namespace mlir;
using namespace mlir::nsa;

#include "NSA/Dialect/NSADialect.cpp.inc"
#include "NSA/Dialect/NSAEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "NSA/Dialect/NSAAttrs.cpp.inc"

void NSADialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "NSA/Dialect/NSAAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "NSA/Dialect/NSAOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// BackboneAttr
//===----------------------------------------------------------------------===//

LogicalResult
BackboneAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                     int64_t initial, int64_t local, int64_t logLevels,
                     int64_t hubStride, DenseI64ArrayAttr blocks) {
  // backbone_c1
  if (initial < 0 || local < 0 || logLevels < 0 || hubStride < 0)
    return emitError() << "backbone parameters must be non-negative, found "
                          "initial = "
                       << initial << ", local = " << local
                       << ", log_levels = " << logLevels
                       << ", hub_stride = " << hubStride;
  // backbone_c2
  if (logLevels > 40)
    return emitError() << "log_levels must be at most 40, found " << logLevels;
  // backbone_c3
  if (blocks) {
    ArrayRef<int64_t> list = blocks.asArrayRef();
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i] < 0 || (i > 0 && list[i] <= list[i - 1]))
        return emitError() << "backbone blocks must be non-negative and "
                              "strictly increasing, found ["
                           << llvm::make_range(list.begin(), list.end())
                           << "]";
  }
  return success();
}

spec::Backbone BackboneAttr::getSpec() const {
  spec::Backbone b;
  b.initial = getInitial();
  b.local = getLocal();
  b.logLevels = getLogLevels();
  b.hubStride = getHubStride();
  if (DenseI64ArrayAttr list = getBlocks())
    b.blocks.assign(list.asArrayRef().begin(), list.asArrayRef().end());
  return b;
}

//===----------------------------------------------------------------------===//
// ConfigAttr
//===----------------------------------------------------------------------===//

LogicalResult nsa::verifyBlockParams(function_ref<InFlightDiagnostic()> emitError,
                                     int64_t cmpBlock, int64_t cmpStride,
                                     int64_t slcBlock, int64_t numSelected,
                                     BackboneAttr backbone, int64_t maxTokens) {
  // config_c1
  if (cmpBlock <= 0 || cmpStride <= 0 || slcBlock <= 0 || numSelected <= 0)
    return emitError() << "block sizes must be positive, found cmp_block = "
                       << cmpBlock << ", cmp_stride = " << cmpStride
                       << ", slc_block = " << slcBlock
                       << ", num_selected = " << numSelected;
  // config_c2
  if (cmpBlock % cmpStride != 0)
    return emitError() << "cmp_stride (d = " << cmpStride
                       << ") must divide cmp_block (l = " << cmpBlock << ")";
  // config_c3
  if (slcBlock % cmpStride != 0)
    return emitError() << "cmp_stride (d = " << cmpStride
                       << ") must divide slc_block (l' = " << slcBlock << ")";
  // config_c4
  if (cmpBlock > slcBlock)
    return emitError() << "cmp_block (l = " << cmpBlock
                       << ") must not exceed slc_block (l' = " << slcBlock
                       << ")";
  if (!backbone)
    return success();
  // config_c5: with hubs the count is bounded only by a sequence length.
  int64_t maxBlock =
      maxTokens > 0 ? spec::numSelectionBlocks(maxTokens, slcBlock) - 1 : -1;
  int64_t forced = backbone.getSpec().maxForcedBlocks(maxBlock);
  if (forced >= 0 && numSelected < forced)
    return emitError() << "num_selected (n = " << numSelected
                       << ") must be at least the number of forced blocks ("
                       << forced << ")";
  return success();
}
LogicalResult nsa::verifyScale(function_ref<InFlightDiagnostic()> emitError,
                               FloatAttr scale) {
  // config_c6
  if (!scale)
    return success();
  if (!scale.getType().isF32())
    return emitError() << "scale must be an f32 attribute, found "
                       << scale.getType();
  double value = scale.getValueAsDouble();
  if (!std::isfinite(value) || value <= 0.0)
    return emitError() << "scale must be positive and finite, found " << value;
  return success();
}

LogicalResult
ConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                   int64_t cmpBlock, int64_t cmpStride, int64_t slcBlock,
                   int64_t numSelected, int64_t window, FloatAttr scale,
                   PoolKind pool, BackboneAttr backbone, int64_t maxTokens,
                   int64_t maxHops) {
  // config_c7
  if (maxTokens < 0 || maxHops < 0)
    return emitError() << "max_tokens and max_hops must be non-negative, "
                          "found "
                       << maxTokens << " and " << maxHops;
  // config_c7
  if (backbone && backbone.getHubStride() > 0 && maxTokens == 0)
    return emitError() << "hub blocks (hub_stride = "
                       << backbone.getHubStride()
                       << ") grow with the sequence: declare max_tokens";
  if (failed(verifyBlockParams(emitError, cmpBlock, cmpStride, slcBlock,
                               numSelected, backbone, maxTokens)))
    return failure();
  // config_c1
  if (window <= 0)
    return emitError() << "window must be positive, found " << window;
  if (failed(verifyScale(emitError, scale)))
    return failure();
  if (maxHops == 0)
    return success();
  // config_c8
  if (maxTokens == 0)
    return emitError() << "max_hops needs max_tokens, the length at which "
                          "the bound holds";
  // config_c9
  int64_t blocks = spec::numSelectionBlocks(maxTokens, slcBlock);
  if (blocks > spec::kMaxReachBlocks)
    return emitError() << "max_hops is checked for at most "
                       << spec::kMaxReachBlocks
                       << " selection blocks, found " << blocks
                       << " at max_tokens = " << maxTokens << " (l' = "
                       << slcBlock << ")";
  spec::ReachReport reach =
      spec::analyzeReach(maxTokens, slcBlock, window, backbone.getSpec());
  if (reach.tooCostly)
    return emitError() << "max_hops: the hop bound at max_tokens = "
                       << maxTokens << " (l' = " << slcBlock << ", w = "
                       << window << ") is not computed: it takes more than "
                       << spec::kMaxReachSteps
                       << " search steps (or T is above 2^60); declare a "
                          "smaller max_tokens or drop max_hops";
  if (reach.hops < 0 || reach.hops > maxHops) {
    InFlightDiagnostic diag = emitError();
    diag << "the backbone and window need ";
    if (reach.hops < 0)
      diag << "unboundedly many hops (some later token is unreachable)";
    else
      diag << reach.hops << " hops";
    return diag << " at T = " << maxTokens << " (from the first token of "
                << "block " << reach.sourceBlock << " to block "
                << reach.targetBlock << "), more than max_hops = " << maxHops;
  }
  return success();
}

double ConfigAttr::getScaleOr(int64_t qkHeadDim) const {
  if (FloatAttr scale = getScale())
    return scale.getValueAsDouble();
  return 1.0 / std::sqrt(static_cast<double>(qkHeadDim));
}
