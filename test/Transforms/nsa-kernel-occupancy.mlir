// RUN: nsa-opt %s --nsa-kernel-occupancy | FileCheck %s
// RUN: nsa-opt %s --nsa-kernel-occupancy=threads-per-sm=1024 | FileCheck %s --check-prefix=MORE
// RUN: not nsa-opt %s --nsa-kernel-occupancy=threads-per-sm=32 2>&1 | FileCheck %s --check-prefix=BAD

// nvvm.minctasm = the blocks of a kernel that fit on one SM: by shared
// memory (228 KiB, 1 KiB reserved per block) and by threads-per-sm (512 by
// default), the fewest over its launches; 1 where a launch's sizes are not
// constant. A kernel that has the attribute keeps it; device functions
// that are not kernels get none.

// CHECK-LABEL: gpu.func @attention
// CHECK-SAME: nvvm.minctasm = 1 : i32
// CHECK-LABEL: gpu.func @selection
// CHECK-SAME: nvvm.minctasm = 4 : i32
// CHECK-LABEL: gpu.func @twice
// CHECK-SAME: nvvm.minctasm = 2 : i32
// CHECK-LABEL: gpu.func @unknown
// CHECK-SAME: nvvm.minctasm = 1 : i32
// CHECK-LABEL: gpu.func @tuned
// CHECK-SAME: nvvm.minctasm = 3 : i32
// CHECK-LABEL: gpu.func @helper
// CHECK-NOT: nvvm.minctasm
// MORE-LABEL: gpu.func @attention
// MORE-SAME: nvvm.minctasm = 1 : i32
// MORE-LABEL: gpu.func @selection
// MORE-SAME: nvvm.minctasm = 5 : i32
// BAD: nsa-kernel-occupancy: threads-per-sm must be in 64..2048, found 32
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @attention() kernel {
      gpu.return
    }
    gpu.func @selection() kernel {
      gpu.return
    }
    gpu.func @twice() kernel {
      gpu.return
    }
    gpu.func @unknown() kernel {
      gpu.return
    }
    gpu.func @tuned() kernel attributes {nvvm.minctasm = 3 : i32} {
      gpu.return
    }
    gpu.func @helper() {
      gpu.return
    }
  }
  func.func @host(%shared: i32) {
    %c1 = arith.constant 1 : index
    %c64 = arith.constant 64 : index
    %c128 = arith.constant 128 : index
    %c384 = arith.constant 384 : index
    %none = arith.constant 0 : i32
    %s40k = arith.constant 40960 : i32
    %s100k = arith.constant 102400 : i32
    %s140k = arith.constant 143360 : i32
    // 1 block by shared memory.
    gpu.launch_func @kernels::@attention blocks in (%c1, %c1, %c1) threads in (%c384, %c1, %c1) dynamic_shared_memory_size %s140k
    // 5 by shared memory, 4 by threads.
    gpu.launch_func @kernels::@selection blocks in (%c1, %c1, %c1) threads in (%c128, %c1, %c1) dynamic_shared_memory_size %s40k
    // 8 blocks, then 2.
    gpu.launch_func @kernels::@twice blocks in (%c1, %c1, %c1) threads in (%c64, %c1, %c1) dynamic_shared_memory_size %none
    gpu.launch_func @kernels::@twice blocks in (%c1, %c1, %c1) threads in (%c64, %c1, %c1) dynamic_shared_memory_size %s100k
    gpu.launch_func @kernels::@unknown blocks in (%c1, %c1, %c1) threads in (%c64, %c1, %c1) dynamic_shared_memory_size %shared
    gpu.launch_func @kernels::@tuned blocks in (%c1, %c1, %c1) threads in (%c64, %c1, %c1)
    return
  }
}
