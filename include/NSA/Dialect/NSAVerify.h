//===- NSAVerify.h - shared nsa verification helpers -------------*- C++ -*-===//
//
// Checks shared by attribute and op verifiers (docs/Spec.md, "Constraints").
//
//===----------------------------------------------------------------------===//

#ifndef NSA_DIALECT_NSAVERIFY_H
#define NSA_DIALECT_NSAVERIFY_H

#include "NSA/Dialect/NSADialect.h"
#include "mlir/IR/Diagnostics.h"

namespace mlir::nsa {

/// Checks config_c1 .. config_c5 for the selection and compression block
/// parameters; `backbone` may be null (no forced blocks to count).
/// `maxTokens` (0: unknown) bounds the forced-block count of hub patterns;
/// without it that part of config_c5 cannot be checked and is skipped.
LogicalResult verifyBlockParams(function_ref<InFlightDiagnostic()> emitError,
                                int64_t cmpBlock, int64_t cmpStride,
                                int64_t slcBlock, int64_t numSelected,
                                BackboneAttr backbone, int64_t maxTokens = 0);

/// Checks config_c6: an f32 scale that is positive and finite (null passes).
LogicalResult verifyScale(function_ref<InFlightDiagnostic()> emitError,
                          FloatAttr scale);

} // namespace mlir::nsa

#endif // NSA_DIALECT_NSAVERIFY_H
