// RUN: nsa-opt %s --nsa-async-launches --split-input-file | FileCheck %s

// The ops nsa-map-to-gpu leaves (an allocation after its own token and a
// host wait for it, synchronous launches, a free) become one chain: the
// host waits once, before the return.
// CHECK-LABEL: func.func @chain
// CHECK: %[[T0:.+]] = gpu.wait async
// CHECK-NEXT: %{{.+}}, %[[T1:.+]] = gpu.alloc async [%[[T0]]]
// CHECK-NEXT: %[[T2:.+]] = gpu.launch async [%[[T1]]]
// CHECK: %[[T3:.+]] = gpu.launch async [%[[T2]]]
// CHECK: %[[T4:.+]] = gpu.dealloc async [%[[T3]]]
// CHECK-NEXT: gpu.wait [%[[T4]]]
// CHECK-NEXT: return
func.func @chain(%n: index, %out: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %t0 = gpu.wait async
  %m, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf32>
  gpu.wait [%t1]
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c1, %b = %c1, %c = %c1) {
    %f = arith.constant 1.0 : f32
    memref.store %f, %m[%tx] : memref<?xf32>
    gpu.terminator
  }
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c1, %b = %c1, %c = %c1) {
    %v = memref.load %m[%tx] : memref<?xf32>
    memref.store %v, %out[%tx] : memref<?xf32>
    gpu.terminator
  }
  %t2 = gpu.wait async
  %t3 = gpu.dealloc async [%t2] %m : memref<?xf32>
  gpu.wait [%t3]
  return
}

// -----

// The host reads memory between the launches: it waits for the first one,
// and the second one starts a new chain.
// CHECK-LABEL: func.func @host_read
// CHECK: %[[T0:.+]] = gpu.wait async
// CHECK-NEXT: %[[T1:.+]] = gpu.launch async [%[[T0]]]
// CHECK: gpu.wait [%[[T1]]]
// CHECK-NEXT: memref.load
// CHECK-NEXT: %[[T2:.+]] = gpu.wait async
// CHECK-NEXT: %[[T3:.+]] = gpu.launch async [%[[T2]]]
// CHECK: gpu.wait [%[[T3]]]
// CHECK-NEXT: return
func.func @host_read(%m: memref<4xf32>, %h: memref<4xf32>) -> f32 {
  %c1 = arith.constant 1 : index
  %c0 = arith.constant 0 : index
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c1, %b = %c1, %c = %c1) {
    %f = arith.constant 1.0 : f32
    memref.store %f, %m[%tx] : memref<4xf32>
    gpu.terminator
  }
  %r = memref.load %h[%c0] : memref<4xf32>
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c1, %b = %c1, %c = %c1) {
    %f = arith.constant 2.0 : f32
    memref.store %f, %m[%tx] : memref<4xf32>
    gpu.terminator
  }
  return %r : f32
}

// -----

// Host control flow is a synchronization point too.
// CHECK-LABEL: func.func @host_if
// CHECK: %[[T1:.+]] = gpu.launch async
// CHECK: gpu.wait [%[[T1]]]
// CHECK-NEXT: scf.if
// CHECK: %[[T3:.+]] = gpu.launch async
// CHECK: gpu.wait [%[[T3]]]
// CHECK-NEXT: }
func.func @host_if(%m: memref<4xf32>, %p: i1) {
  %c1 = arith.constant 1 : index
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c1, %b = %c1, %c = %c1) {
    %f = arith.constant 1.0 : f32
    memref.store %f, %m[%tx] : memref<4xf32>
    gpu.terminator
  }
  scf.if %p {
    gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
               threads(%tx, %ty, %tz) in (%a = %c1, %b = %c1, %c = %c1) {
      %f = arith.constant 2.0 : f32
      memref.store %f, %m[%tx] : memref<4xf32>
      gpu.terminator
    }
  }
  return
}
