//===- NSADialect.h - nsa dialect, attributes and enums ----------*- C++ -*-===//
//
// The nsa dialect class with its typed attributes (`#nsa.config`,
// `#nsa.backbone`, `#nsa.pool`). Ops are declared in NSAOps.h.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_DIALECT_NSADIALECT_H
#define NSA_DIALECT_NSADIALECT_H

#include "NSA/Spec.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dialect.h"

#include "NSA/Dialect/NSADialect.h.inc"
#include "NSA/Dialect/NSAEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "NSA/Dialect/NSAAttrs.h.inc"

#endif // NSA_DIALECT_NSADIALECT_H
