//===- Dialects.cpp - the nsa dialect's C API ------------------------------===//

#include "NSA-c/Dialects.h"

#include "NSA/Dialect/NSADialect.h"

#include "mlir/CAPI/Registration.h"

MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(NSA, nsa, mlir::nsa::NSADialect)
