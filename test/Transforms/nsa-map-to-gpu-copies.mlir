// RUN: nsa-opt %s --nsa-map-to-gpu | FileCheck %s

// Copies outside any tile: between identity layouts a gpu.memcpy; into or
// out of a subview with an offset (the two halves of a learned pool's
// weight gradient) a kernel of its own, since gpu.memcpy copies from each
// buffer's aligned pointer without its offset.

// CHECK-LABEL: func.func @copies
// CHECK: gpu.memcpy async [%{{.+}}] %{{.+}}, %{{.+}} : memref<4x16xf32>, memref<4x16xf32>
// CHECK: gpu.launch
// CHECK: vector.store %{{.+}} : memref<4x16xf32, strided<[16, 1], offset: 64>>, vector<4xf32>
// CHECK-NOT: gpu.memcpy
// CHECK: return
func.func @copies(%a: memref<4x16xf32>, %b: memref<4x16xf32>,
                  %all: memref<2x4x16xf32>) {
  memref.copy %a, %b : memref<4x16xf32> to memref<4x16xf32>
  %hi = memref.subview %all[1, 0, 0] [1, 4, 16] [1, 1, 1]
      : memref<2x4x16xf32> to memref<4x16xf32, strided<[16, 1], offset: 64>>
  memref.copy %a, %hi : memref<4x16xf32> to memref<4x16xf32, strided<[16, 1], offset: 64>>
  return
}
