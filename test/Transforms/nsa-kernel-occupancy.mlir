// RUN: nsa-opt %s --pass-pipeline="builtin.module(gpu.module(nsa-kernel-occupancy))" | FileCheck %s
// RUN: nsa-opt %s --pass-pipeline="builtin.module(gpu.module(nsa-kernel-occupancy{min-blocks-per-sm=2}))" | FileCheck %s --check-prefix=TWO
// RUN: not nsa-opt %s --pass-pipeline="builtin.module(gpu.module(nsa-kernel-occupancy{min-blocks-per-sm=0}))" 2>&1 | FileCheck %s --check-prefix=BAD

// Kernels get nvvm.minctasm (PTX .minnctapersm); one that has it keeps it,
// device functions that are not kernels get none.

// CHECK-LABEL: gpu.func @tile
// CHECK-SAME: nvvm.minctasm = 1 : i32
// CHECK-LABEL: gpu.func @tuned
// CHECK-SAME: nvvm.minctasm = 4 : i32
// CHECK-LABEL: gpu.func @helper
// CHECK-NOT: nvvm.minctasm
// TWO: gpu.func @tile
// TWO-SAME: nvvm.minctasm = 2 : i32
// BAD: nsa-kernel-occupancy: min-blocks-per-sm must be in 1..32, found 0
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @tile() kernel {
      gpu.return
    }
    gpu.func @tuned() kernel attributes {nvvm.minctasm = 4 : i32} {
      gpu.return
    }
    gpu.func @helper() {
      gpu.return
    }
  }
}
