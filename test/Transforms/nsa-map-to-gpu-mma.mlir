// RUN: nsa-opt %s --split-input-file --nsa-map-to-gpu="block-size=64" | FileCheck %s

// Tile contractions on tensor cores. With 2 warps and a 32 x 40 result, a
// warp takes a 16-row strip of all five 8-column tiles: per 16-deep step one
// ldmatrix.x4 for A, two ldmatrix.x4 and one .x2 for B (two tiles, two
// tiles, one), five mma.sync sharing the A fragment; the accumulators stay
// in registers over K and are stored once.

#a = affine_map<(m, n, k) -> (m, k)>
#bt = affine_map<(m, n, k) -> (n, k)>
#bn = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>

// CHECK-LABEL: func.func @b_rows_n
// CHECK: gpu.launch
// The zero fill of the result is dropped: the accumulators start at zero.
// CHECK-NOT: memref.store
// CHECK-DAG: %[[A:.+]] = memref.memory_space_cast %{{.+}} : memref<32x64xbf16> to memref<32x64xbf16, #gpu.address_space<workgroup>>
// CHECK-DAG: %[[B:.+]] = memref.memory_space_cast %{{.+}} : memref<40x64xbf16> to memref<40x64xbf16, #gpu.address_space<workgroup>>
// CHECK-NOT: memref.load %{{.+}} : memref<32x40xf32>
// CHECK: scf.for
// CHECK: scf.for {{.+}} iter_args
// CHECK: nvgpu.ldmatrix %[[A]][{{.+}}] {numTiles = 4 : i32, transpose = false} : memref<32x64xbf16, #gpu.address_space<workgroup>> -> vector<4x2xbf16>
// CHECK: nvgpu.ldmatrix %[[B]][{{.+}}] {numTiles = 4 : i32, transpose = false}
// CHECK: nvgpu.ldmatrix %[[B]][{{.+}}] {numTiles = 4 : i32, transpose = false}
// CHECK: nvgpu.ldmatrix %[[B]][{{.+}}] {numTiles = 2 : i32, transpose = false}
// CHECK-COUNT-5: nvvm.mma.sync
// CHECK-NOT: nvvm.mma.sync
// CHECK: gpu.terminator
func.func @b_rows_n(%out: memref<4x32x40xf32>) {
  %zero = arith.constant 0.0 : f32
  scf.forall (%i) in (4) {
    %ta = memref.alloc() : memref<32x64xbf16>
    %tb = memref.alloc() : memref<40x64xbf16>
    %s = memref.alloc() : memref<32x40xf32>
    linalg.fill ins(%zero : f32) outs(%s : memref<32x40xf32>)
    linalg.generic {indexing_maps = [#a, #bt, #c], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%ta, %tb : memref<32x64xbf16>, memref<40x64xbf16>) outs(%s : memref<32x40xf32>) {
    ^bb0(%x: bf16, %y: bf16, %acc: f32):
      %xe = arith.extf %x : bf16 to f32
      %ye = arith.extf %y : bf16 to f32
      %p = arith.mulf %xe, %ye : f32
      %r = arith.addf %acc, %p : f32
      linalg.yield %r : f32
    }
    %o = memref.subview %out[%i, 0, 0] [1, 32, 40] [1, 1, 1] : memref<4x32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: ?>>
    memref.copy %s, %o : memref<32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: ?>>
  }
  return
}

// -----

// B stored [k][n] (the values of P V): ldmatrix with transposition.

#a = affine_map<(m, n, k) -> (m, k)>
#bn = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>

// CHECK-LABEL: func.func @b_rows_k
// CHECK: nvgpu.ldmatrix %{{.+}} {numTiles = 4 : i32, transpose = false} : memref<32x64xbf16, #gpu.address_space<workgroup>>
// CHECK: nvgpu.ldmatrix %{{.+}} {numTiles = 4 : i32, transpose = true} : memref<64x40xbf16, #gpu.address_space<workgroup>>
// CHECK: nvgpu.ldmatrix %{{.+}} {numTiles = 4 : i32, transpose = true}
// CHECK: nvgpu.ldmatrix %{{.+}} {numTiles = 2 : i32, transpose = true}
// CHECK-COUNT-5: nvvm.mma.sync
func.func @b_rows_k(%out: memref<4x32x40xf32>) {
  %zero = arith.constant 0.0 : f32
  scf.forall (%i) in (4) {
    %ta = memref.alloc() : memref<32x64xbf16>
    %tb = memref.alloc() : memref<64x40xbf16>
    %s = memref.alloc() : memref<32x40xf32>
    linalg.fill ins(%zero : f32) outs(%s : memref<32x40xf32>)
    linalg.generic {indexing_maps = [#a, #bn, #c], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%ta, %tb : memref<32x64xbf16>, memref<64x40xbf16>) outs(%s : memref<32x40xf32>) {
    ^bb0(%x: bf16, %y: bf16, %acc: f32):
      %xe = arith.extf %x : bf16 to f32
      %ye = arith.extf %y : bf16 to f32
      %p = arith.mulf %xe, %ye : f32
      %r = arith.addf %acc, %p : f32
      linalg.yield %r : f32
    }
    %o = memref.subview %out[%i, 0, 0] [1, 32, 40] [1, 1, 1] : memref<4x32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: ?>>
    memref.copy %s, %o : memref<32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: ?>>
  }
  return
}

// -----

// Operands ldmatrix cannot read: B in global memory, A in shared memory
// with rows 4 elements (8 bytes) off the 16-byte grid. Both are read with
// single loads in the fragment layout; the products stay on tensor cores.

#a = affine_map<(m, n, k) -> (m, k)>
#bt = affine_map<(m, n, k) -> (n, k)>
#c = affine_map<(m, n, k) -> (m, n)>

// CHECK-LABEL: func.func @no_ldmatrix
// CHECK-NOT: nvgpu.ldmatrix
// CHECK: memref.load %{{.+}} : memref<32x64xbf16, strided<[68, 1], offset: 4>>
// CHECK: memref.load %{{.+}} : memref<40x64xbf16, strided<[64, 1], offset: ?>>
// CHECK: nvvm.mma.sync
// CHECK-NOT: nvgpu.ldmatrix
func.func @no_ldmatrix(%b: memref<4x40x64xbf16>, %out: memref<4x32x40xf32>) {
  %zero = arith.constant 0.0 : f32
  scf.forall (%i) in (4) {
    %ta = memref.alloc() : memref<32x68xbf16>
    %a = memref.subview %ta[0, 4] [32, 64] [1, 1] : memref<32x68xbf16> to memref<32x64xbf16, strided<[68, 1], offset: 4>>
    %gb = memref.subview %b[%i, 0, 0] [1, 40, 64] [1, 1, 1] : memref<4x40x64xbf16> to memref<40x64xbf16, strided<[64, 1], offset: ?>>
    %s = memref.alloc() : memref<32x40xf32>
    linalg.fill ins(%zero : f32) outs(%s : memref<32x40xf32>)
    linalg.generic {indexing_maps = [#a, #bt, #c], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%a, %gb : memref<32x64xbf16, strided<[68, 1], offset: 4>>, memref<40x64xbf16, strided<[64, 1], offset: ?>>) outs(%s : memref<32x40xf32>) {
    ^bb0(%x: bf16, %y: bf16, %acc: f32):
      %xe = arith.extf %x : bf16 to f32
      %ye = arith.extf %y : bf16 to f32
      %p = arith.mulf %xe, %ye : f32
      %r = arith.addf %acc, %p : f32
      linalg.yield %r : f32
    }
    %o = memref.subview %out[%i, 0, 0] [1, 32, 40] [1, 1, 1] : memref<4x32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: ?>>
    memref.copy %s, %o : memref<32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: ?>>
  }
  return
}

// -----

// Reductions with few output points (a row max and a row sum of a 4 x 64
// tile, 64 threads): 16 lanes of a warp share each row, each folds every
// 16th column, and four xor shuffles combine the partials. Lane 0 alone
// reads the old value (the others start from the identity), so no lane
// reads the element lane 0 stores. The running max of online softmax and
// its row sums over a 16-row tile are of this kind.

// CHECK-LABEL: func.func @row_reductions
// CHECK: %[[OLD:.+]] = scf.if %{{.+}} -> (f32) {
// CHECK-NEXT: %[[V:.+]] = memref.load
// CHECK-NEXT: scf.yield %[[V]] : f32
// CHECK-NEXT: } else {
// CHECK-NEXT: scf.yield %cst{{.*}} : f32
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c16{{.*}} iter_args(%{{.+}} = %[[OLD]]) -> (f32)
// CHECK: arith.maximumf
// CHECK: gpu.shuffle  xor %{{.+}}, %c8_i32, %c32_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.+}}, %c4_i32, %c32_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.+}}, %c2_i32, %c32_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.+}}, %c1_i32, %c32_i32{{.*}} : f32
// CHECK: memref.store
// CHECK: scf.if %{{.+}} -> (f32) {
// CHECK-NEXT: memref.load
// CHECK: arith.addf
// CHECK-COUNT-4: gpu.shuffle  xor
#id = affine_map<(r, c) -> (r, c)>
#row = affine_map<(r, c) -> (r)>
func.func @row_reductions(%out: memref<4x2x4xf32>) {
  scf.forall (%i) in (4) {
    %s = memref.alloc() : memref<4x64xf32>
    %m = memref.alloc() : memref<2x4xf32>
    %max = memref.subview %m[0, 0] [1, 4] [1, 1] : memref<2x4xf32> to memref<4xf32>
    %sum = memref.subview %m[1, 0] [1, 4] [1, 1] : memref<2x4xf32> to memref<4xf32, strided<[1], offset: 4>>
    linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
        ins(%s : memref<4x64xf32>) outs(%max : memref<4xf32>) {
    ^bb0(%x: f32, %acc: f32):
      %y = arith.maximumf %x, %acc : f32
      linalg.yield %y : f32
    }
    linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
        ins(%s : memref<4x64xf32>) outs(%sum : memref<4xf32, strided<[1], offset: 4>>) {
    ^bb0(%x: f32, %acc: f32):
      %y = arith.addf %x, %acc : f32
      linalg.yield %y : f32
    }
    %o = memref.subview %out[%i, 0, 0] [1, 2, 4] [1, 1, 1] : memref<4x2x4xf32> to memref<2x4xf32, strided<[4, 1], offset: ?>>
    memref.copy %m, %o : memref<2x4xf32> to memref<2x4xf32, strided<[4, 1], offset: ?>>
  }
  return
}
