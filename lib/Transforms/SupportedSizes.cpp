//===- SupportedSizes.cpp - the sizes nsa's lowering supports --------------===//
//
// Legal NSA is wider than what the lowering can compile: positions and
// block indices are i32 in every kernel, and the number of selected blocks
// and the block sizes fix the static tile shapes. checkSupportedSizes
// refuses, before anything is built, an nsa op whose sizes lie outside
// docs/Spec.md section 13 ("Supported sizes"), so that nsa-decompose and
// nsa-tile never emit IR whose shapes overflow.
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"

using namespace mlir;
using namespace mlir::nsa;

namespace {

constexpr int64_t kMaxI32 = (int64_t{1} << 31) - 1;

/// One named size and its bound.
struct Bound {
  StringRef name;
  int64_t max;
};

/// The bounds of docs/Spec.md section 13, by attribute name.
constexpr Bound kAttributeBounds[] = {
    {"num_selected", kMaxSelected}, {"cmp_block", kMaxBlockTokens},
    {"cmp_stride", kMaxBlockTokens}, {"slc_block", kMaxBlockTokens},
    {"block", kMaxBlockTokens},      {"stride", kMaxBlockTokens},
    {"window", kMaxI32},             {"max_tokens", kMaxI32},
};

LogicalResult refuse(Operation *op, StringRef what, int64_t value,
                     int64_t max) {
  return op->emitOpError()
         << what << " = " << value << " is above " << max
         << ", the most nsa's lowering supports (docs/Spec.md section 13)";
}

LogicalResult checkConfig(Operation *op, ConfigAttr config) {
  for (auto [name, value] :
       {std::pair<StringRef, int64_t>{"num_selected", config.getNumSelected()},
        {"cmp_block", config.getCmpBlock()},
        {"cmp_stride", config.getCmpStride()},
        {"slc_block", config.getSlcBlock()},
        {"window", config.getWindow()},
        {"max_tokens", config.getMaxTokens()}})
    for (const Bound &b : kAttributeBounds)
      if (b.name == name && value > b.max)
        return refuse(op, name, value, b.max);
  return success();
}

/// Heads and head dims (dims 2 and 3 of rank-4 activations) and the token
/// count (dim 1) of every static operand shape.
LogicalResult checkShapes(Operation *op) {
  for (Type type : op->getOperandTypes()) {
    auto shaped = dyn_cast<RankedTensorType>(type);
    if (!shaped || shaped.getRank() != 4)
      continue;
    ArrayRef<int64_t> dims = shaped.getShape();
    if (!ShapedType::isDynamic(dims[1]) && dims[1] > kMaxI32)
      return refuse(op, "the token count", dims[1], kMaxI32);
    if (!ShapedType::isDynamic(dims[2]) && dims[2] > kMaxHeads)
      return refuse(op, "the head count", dims[2], kMaxHeads);
    if (!ShapedType::isDynamic(dims[3]) && dims[3] > kMaxHeadDim)
      return refuse(op, "the head dim", dims[3], kMaxHeadDim);
  }
  return success();
}

LogicalResult checkOp(Operation *op) {
  if (!isa_and_nonnull<NSADialect>(op->getDialect()))
    return success();
  for (NamedAttribute attr : op->getAttrs()) {
    if (auto config = dyn_cast<ConfigAttr>(attr.getValue())) {
      if (failed(checkConfig(op, config)))
        return failure();
      continue;
    }
    auto value = dyn_cast<IntegerAttr>(attr.getValue());
    if (!value)
      continue;
    for (const Bound &b : kAttributeBounds)
      if (b.name == attr.getName().strref() && value.getInt() > b.max)
        return refuse(op, b.name, value.getInt(), b.max);
  }
  return checkShapes(op);
}

} // namespace

LogicalResult mlir::nsa::checkSupportedSizes(Operation *root) {
  WalkResult result = root->walk([](Operation *op) {
    return failed(checkOp(op)) ? WalkResult::interrupt()
                               : WalkResult::advance();
  });
  return failure(result.wasInterrupted());
}
