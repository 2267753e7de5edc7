// RUN: nsa-opt %s --nsa-map-to-gpu | FileCheck %s --implicit-check-not="vector<128xi1>"

// Buffers of i1 (the selection flags of nsa.selected_attention_grad's
// tiles) hold one byte per element, while a vector of i1 is bit-packed:
// their fills and copies are distributed element by element, f32 buffers
// by 16-byte vectors.

// CHECK-LABEL: func.func @flags
// CHECK: gpu.launch
// CHECK: memref.store %{{.+}} : memref<128xi1>
// CHECK: vector.store %{{.+}} : memref<128xf32>, vector<4xf32>
// CHECK: memref.store %{{.+}} : memref<128xi1, strided<[1], offset: ?>>
func.func @flags(%out: memref<4x128xi1>, %outf: memref<4x128xf32>) {
  scf.forall (%i) in (4) {
    %false = arith.constant false
    %zero = arith.constant 0.0 : f32
    %a = memref.alloc() : memref<128xi1>
    linalg.fill ins(%false : i1) outs(%a : memref<128xi1>)
    %b = memref.alloc() : memref<128xf32>
    linalg.fill ins(%zero : f32) outs(%b : memref<128xf32>)
    %s = memref.subview %out[%i, 0] [1, 128] [1, 1]
        : memref<4x128xi1> to memref<128xi1, strided<[1], offset: ?>>
    memref.copy %a, %s : memref<128xi1> to memref<128xi1, strided<[1], offset: ?>>
    %t = memref.subview %outf[%i, 0] [1, 128] [1, 1]
        : memref<4x128xf32> to memref<128xf32, strided<[1], offset: ?>>
    memref.copy %b, %t : memref<128xf32> to memref<128xf32, strided<[1], offset: ?>>
  }
  return
}
