// RUN: nsa-opt %s --nsa-to-ptx="format=isa" | FileCheck %s

// TMA through the nsa runtime: the host encodes a tensor map of a bf16
// matrix in device memory (nvgpu.tma.create.descriptor lowers to the
// runtime's mgpuTensorMapEncodeTiledMemref), each block loads one 64x64 tile
// with cp.async.bulk.tensor onto an mbarrier and writes it back out. Shapes
// that are not tile multiples exercise TMA's zero fill. Compiled ahead of
// time by nsa_add_gpu_object and run by RuntimeSmokeTest.cpp.

// CHECK-LABEL: llvm.func @tma_copy
// CHECK: llvm.call @mgpuTensorMapEncodeTiledMemref
// CHECK: gpu.binary @tma_copy_kernel
// CHECK-SAME: .target sm_90a
// CHECK-SAME: mbarrier.init
// CHECK-SAME: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK-SAME: mbarrier.try_wait.parity

!tile = memref<64x64xbf16, #gpu.address_space<workgroup>>
!desc = !nvgpu.tensormap.descriptor<tensor = memref<64x64xbf16, 3>, swizzle = none, l2promo = none, oob = zero, interleave = none>
!bar = !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>>

module attributes {gpu.container_module} {
  // Copies `in_h` to `out_h` through 64x64 TMA tiles: block (bx, by) loads
  // rows [64 by, +64) x columns [64 bx, +64) and writes the part inside the
  // tensor; nonzero_h[0] counts tile elements outside the tensor that TMA
  // did not fill with zeros.
  func.func @tma_copy(%in_h: memref<?x?xbf16>, %out_h: memref<?x?xbf16>,
                      %nonzero_h: memref<1xi32>)
      attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c64 = arith.constant 64 : index
    %c128 = arith.constant 128 : index
    %c4096 = arith.constant 4096 : index
    %c8192 = arith.constant 8192 : index
    %ticks = arith.constant 10000000 : index
    %false = arith.constant false
    %one = arith.constant 1 : i32
    %zero = arith.constant 0.0 : bf16
    %smem = arith.constant 8192 : i32
    %rows = memref.dim %in_h, %c0 : memref<?x?xbf16>
    %cols = memref.dim %in_h, %c1 : memref<?x?xbf16>
    %t0 = gpu.wait async
    %in, %t1 = gpu.alloc async [%t0] (%rows, %cols) : memref<?x?xbf16>
    %out, %t2 = gpu.alloc async [%t1] (%rows, %cols) : memref<?x?xbf16>
    %nonzero, %t3 = gpu.alloc async [%t2] () : memref<1xi32>
    %t4 = gpu.memcpy async [%t3] %in, %in_h : memref<?x?xbf16>, memref<?x?xbf16>
    %t5 = gpu.memcpy async [%t4] %out, %out_h : memref<?x?xbf16>, memref<?x?xbf16>
    %t6 = gpu.memcpy async [%t5] %nonzero, %nonzero_h : memref<1xi32>, memref<1xi32>
    gpu.wait [%t6]
    %unranked = memref.cast %in : memref<?x?xbf16> to memref<*xbf16>
    %d = nvgpu.tma.create.descriptor %unranked box[%c64, %c64] : memref<*xbf16> -> !desc
    %gx = arith.ceildivui %cols, %c64 : index
    %gy = arith.ceildivui %rows, %c64 : index
    gpu.launch blocks(%bx, %by, %bz) in (%sx = %gx, %sy = %gy, %sz = %c1)
               threads(%tid, %ty, %tz) in (%nx = %c128, %ny = %c1, %nz = %c1)
               dynamic_shared_memory_size %smem {
      %raw = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
      %tile = memref.view %raw[%c0][] : memref<?xi8, #gpu.address_space<workgroup>> to !tile
      %bar = nvgpu.mbarrier.create -> !bar
      %first = arith.cmpi eq, %tid, %c0 : index
      scf.if %first {
        nvgpu.mbarrier.init %bar[%c0], %c1 : !bar
      }
      gpu.barrier
      %col0 = arith.muli %bx, %c64 : index
      %row0 = arith.muli %by, %c64 : index
      scf.if %first {
        nvgpu.mbarrier.arrive.expect_tx %bar[%c0], %c8192 : !bar
        // Coordinates innermost first: (column, row).
        nvgpu.tma.async.load %d[%col0, %row0], %bar[%c0] to %tile : !desc, !bar -> !tile
      }
      nvgpu.mbarrier.try_wait.parity %bar[%c0], %false, %ticks : !bar
      scf.for %i = %tid to %c4096 step %c128 {
        %r = arith.divui %i, %c64 : index
        %c = arith.remui %i, %c64 : index
        %gr = arith.addi %row0, %r : index
        %gc = arith.addi %col0, %c : index
        %inr = arith.cmpi ult, %gr, %rows : index
        %inc = arith.cmpi ult, %gc, %cols : index
        %inside = arith.andi %inr, %inc : i1
        %v = memref.load %tile[%r, %c] : !tile
        scf.if %inside {
          memref.store %v, %out[%gr, %gc] : memref<?x?xbf16>
        } else {
          %bad = arith.cmpf une, %v, %zero : bf16
          scf.if %bad {
            %old = memref.atomic_rmw addi %one, %nonzero[%c0] : (i32, memref<1xi32>) -> i32
          }
        }
      }
      gpu.terminator
    }
    %t7 = gpu.wait async
    %t9 = gpu.memcpy async [%t7] %out_h, %out : memref<?x?xbf16>, memref<?x?xbf16>
    %t10 = gpu.memcpy async [%t9] %nonzero_h, %nonzero : memref<1xi32>, memref<1xi32>
    %t11 = gpu.dealloc async [%t10] %in : memref<?x?xbf16>
    %t12 = gpu.dealloc async [%t11] %out : memref<?x?xbf16>
    %t13 = gpu.dealloc async [%t12] %nonzero : memref<1xi32>
    gpu.wait [%t13]
    return
  }
}
