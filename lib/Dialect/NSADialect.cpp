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
                     int64_t initial, int64_t local) {
  // backbone_c1
  if (initial < 0 || local < 0)
    return emitError() << "backbone block counts must be non-negative, found "
                          "initial = "
                       << initial << ", local = " << local;
  return success();
}

spec::Backbone BackboneAttr::getSpec() const {
  return spec::Backbone{getInitial(), getLocal()};
}

//===----------------------------------------------------------------------===//
// ConfigAttr
//===----------------------------------------------------------------------===//

LogicalResult nsa::verifyBlockParams(function_ref<InFlightDiagnostic()> emitError,
                                     int64_t cmpBlock, int64_t cmpStride,
                                     int64_t slcBlock, int64_t numSelected,
                                     BackboneAttr backbone) {
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
  // config_c5
  if (backbone && numSelected < backbone.getSpec().maxForcedBlocks())
    return emitError() << "num_selected (n = " << numSelected
                       << ") must be at least the number of forced blocks ("
                       << backbone.getSpec().maxForcedBlocks() << ")";
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
                   PoolKind pool, BackboneAttr backbone) {
  if (failed(verifyBlockParams(emitError, cmpBlock, cmpStride, slcBlock,
                               numSelected, backbone)))
    return failure();
  // config_c1
  if (window <= 0)
    return emitError() << "window must be positive, found " << window;
  return verifyScale(emitError, scale);
}

double ConfigAttr::getScaleOr(int64_t qkHeadDim) const {
  if (FloatAttr scale = getScale())
    return scale.getValueAsDouble();
  return 1.0 / std::sqrt(static_cast<double>(qkHeadDim));
}
