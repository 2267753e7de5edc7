//===- NSAOps.h - nsa operations ---------------------------------*- C++ -*-===//
//
// Operation classes of the nsa dialect, generated from NSAOps.td.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_DIALECT_NSAOPS_H
#define NSA_DIALECT_NSAOPS_H

#include "NSA/Dialect/NSADialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "NSA/Dialect/NSAOps.h.inc"

#endif // NSA_DIALECT_NSAOPS_H
