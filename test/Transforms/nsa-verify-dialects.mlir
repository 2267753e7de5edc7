// RUN: nsa-opt %s --nsa-verify-dialects="allowed=builtin,func,arith" | FileCheck %s
// RUN: nsa-opt %s --nsa-verify-dialects="allowed=builtin,func" -verify-diagnostics

// CHECK-LABEL: func.func @f
func.func @f(%a: i32) -> i32 {
  // expected-error @+1 {{nsa-verify-dialects: 'arith.addi' remains after lowering; only builtin, func may remain}}
  %0 = arith.addi %a, %a : i32
  return %0 : i32
}
