// RUN: nsa-opt %s --nsa-to-ptx="format=isa" | FileCheck %s
// RUN: not nsa-opt %s --nsa-to-ptx="format=isa chip=sm_90a features=+ptx60" 2>&1 | FileCheck %s --check-prefix=OLDPTX
// RUN: not nsa-opt %s --nsa-to-ptx="format=isa kernel-block-sizes=select_blocks=7" 2>&1 | FileCheck %s --check-prefix=BADSIZE
// RUN: not nsa-opt %s --nsa-to-ptx="format=isa threads-per-sm=10" 2>&1 | FileCheck %s --check-prefix=BADOCC
// RUN: not nsa-opt %s --nsa-to-ptx="format=isa attention-strategy=banana" 2>&1 | FileCheck %s --check-prefix=BADSTRATEGY
// RUN: not nsa-opt %s --nsa-to-ptx="format=isa chip=sm_75 features=+ptx80" 2>&1 | FileCheck %s --check-prefix=OLDFLASH
// RUN: not nsa-opt %s --nsa-to-ptx="format=isa flash-kv-tile=40" 2>&1 | FileCheck %s --check-prefix=BADFLASH
// RUN: not nsa-opt %s --nsa-to-ptx="format=isa flash-select-rows=8" 2>&1 | FileCheck %s --check-prefix=BADSELECT
// RUN: not nsa-opt %s --nsa-to-ptx="format=isa chip=sm_80 attention-strategy=flash-sm90" 2>&1 | FileCheck %s --check-prefix=SM90ONLY

// The PTX targets sm_90a with PTX 8.1 (8.0 is the least sm_90a takes; 8.1
// adds st.async, which one-launch decoding steps use); the host launches
// through the mgpu* ABI once the module is translated to LLVM IR.
// CHECK: gpu.binary @kernels
// CHECK-SAME: .version 8.1
// CHECK-SAME: .target sm_90a
// CHECK-SAME: .entry double_in_place
// CHECK-LABEL: llvm.func @double_on_gpu
// OLDPTX: nsa-to-ptx: sm_90a needs PTX 8.0 or newer (features=+ptx80), found +ptx60
// BADSIZE: nsa-map-to-gpu: kernel-block-sizes entries are op=threads with threads a multiple of 32 in 32..1024, found 'select_blocks=7'
// BADOCC: nsa-to-ptx: threads-per-sm must be 64..2048, found 10
// BADSTRATEGY: attention-strategy must be flash, flash-sm80, flash-sm90 or generic, found 'banana'
// OLDFLASH: attention-strategy=flash needs sm_80 or newer (bf16 mma.sync), found sm_75
// SM90ONLY: attention-strategy=flash-sm90 needs sm_90a (wgmma), found sm_80
// BADSELECT: nsa-to-ptx: flash-select-rows must be 0 or a multiple of 16 in 16..128, found 8
// BADFLASH: flash-query-rows and flash-kv-tile must be 0 or multiples of 16 in 16..128 and flash-stages 2..4, found 0, 40 and 2

// The runtime smoke test's GPU code: a kernel that doubles a vector in
// place, with host code that allocates device memory, copies, launches with
// dynamic shared memory above 48 KiB, copies back and frees. Compiled ahead
// of time by nsa_add_gpu_object (nsa-to-ptx, mlir-translate, llc) and run by
// RuntimeSmokeTest.cpp through the nsa runtime.

module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @double_in_place(%a: memref<?xf32>, %n: index) kernel {
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %base = arith.muli %bid, %bdim : index
      %i = arith.addi %base, %tid : index
      %inside = arith.cmpi slt, %i, %n : index
      scf.if %inside {
        %x = memref.load %a[%i] : memref<?xf32>
        %y = arith.addf %x, %x : f32
        memref.store %y, %a[%i] : memref<?xf32>
      }
      gpu.return
    }
  }

  func.func @double_on_gpu(%host: memref<?xf32>) attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c128 = arith.constant 128 : index
    %smem = arith.constant 65536 : i32
    %n = memref.dim %host, %c0 : memref<?xf32>
    %grid = arith.ceildivsi %n, %c128 : index
    %t0 = gpu.wait async
    %dev, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf32>
    %t2 = gpu.memcpy async [%t1] %dev, %host : memref<?xf32>, memref<?xf32>
    %t3 = gpu.launch_func async [%t2] @kernels::@double_in_place
        blocks in (%grid, %c1, %c1) threads in (%c128, %c1, %c1)
        dynamic_shared_memory_size %smem
        args(%dev : memref<?xf32>, %n : index)
    %t4 = gpu.memcpy async [%t3] %host, %dev : memref<?xf32>, memref<?xf32>
    %t5 = gpu.dealloc async [%t4] %dev : memref<?xf32>
    gpu.wait [%t5]
    return
  }
}
