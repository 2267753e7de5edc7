// RUN: nsa-opt %s --nsa-to-ptx="format=isa block-size=64" | FileCheck %s

// Per 16-deep step: path 0 one A and two B ldmatrix.x4 plus a B .x2; path 1
// the same with B transposed; path 2 only A's .x4; path 3 only B's (two
// .x4, one .x2): 7 .x4, 2 .x2, 2 .x4.trans, 1 .x2.trans, 20 mma.sync. The
// four steps of the 64-deep product are unrolled (the kernel's loop bounds
// are constants, sunk into it): four times as many.
// CHECK-COUNT-80: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// CHECK-NOT: mma.sync
// RUN: nsa-opt %s --nsa-to-ptx="format=isa block-size=64" | grep -o 'ldmatrix[.a-z0-9]*' | sort | uniq -c | FileCheck %s --check-prefix=LDM
// LDM: 8 ldmatrix.sync.aligned.m8n8.x2.shared.b16
// LDM-NEXT: 4 ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16
// LDM-NEXT: 28 ldmatrix.sync.aligned.m8n8.x4.shared.b16
// LDM-NEXT: 8 ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16

// The fragment paths of the tensor-core lowering (lib/Transforms/
// TensorCore.cpp), run on the GPU by TensorCoreTest.cpp against a float64
// product. Compiled with block-size=64: two warps, so each takes a 16-row
// strip of all five 8-column tiles of a 32 x 40 result (ldmatrix.x4 and
// .x2 for B). Per tile i of 4, out[path, i] = A_i B_i^T with
//   path 0: A [m][k] and B [n][k] in shared memory (ldmatrix),
//   path 1: B stored [k][n] in shared memory (ldmatrix.trans),
//   path 2: B read from global memory (single loads),
//   path 3: A in shared memory 8 bytes off the 16-byte grid (single loads).

#a = affine_map<(m, n, k) -> (m, k)>
#bt = affine_map<(m, n, k) -> (n, k)>
#bn = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>

func.func @mma_paths(%ha: memref<4x32x64xbf16>, %hb: memref<4x40x64xbf16>,
                     %hbn: memref<4x64x40xbf16>, %hout: memref<4x4x32x40xf32>)
    attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  %a = memref.alloc() : memref<4x32x64xbf16>
  memref.copy %ha, %a : memref<4x32x64xbf16> to memref<4x32x64xbf16>
  %b = memref.alloc() : memref<4x40x64xbf16>
  memref.copy %hb, %b : memref<4x40x64xbf16> to memref<4x40x64xbf16>
  %bn = memref.alloc() : memref<4x64x40xbf16>
  memref.copy %hbn, %bn : memref<4x64x40xbf16> to memref<4x64x40xbf16>
  %out = memref.alloc() : memref<4x4x32x40xf32>
  scf.forall (%i) in (4) {
    %ga = memref.subview %a[%i, 0, 0] [1, 32, 64] [1, 1, 1] : memref<4x32x64xbf16> to memref<32x64xbf16, strided<[64, 1], offset: ?>>
    %gb = memref.subview %b[%i, 0, 0] [1, 40, 64] [1, 1, 1] : memref<4x40x64xbf16> to memref<40x64xbf16, strided<[64, 1], offset: ?>>
    %gbn = memref.subview %bn[%i, 0, 0] [1, 64, 40] [1, 1, 1] : memref<4x64x40xbf16> to memref<64x40xbf16, strided<[40, 1], offset: ?>>
    %ta = memref.alloc() : memref<32x64xbf16>
    memref.copy %ga, %ta : memref<32x64xbf16, strided<[64, 1], offset: ?>> to memref<32x64xbf16>
    %tb = memref.alloc() : memref<40x64xbf16>
    memref.copy %gb, %tb : memref<40x64xbf16, strided<[64, 1], offset: ?>> to memref<40x64xbf16>
    %tbn = memref.alloc() : memref<64x40xbf16>
    memref.copy %gbn, %tbn : memref<64x40xbf16, strided<[40, 1], offset: ?>> to memref<64x40xbf16>
    %tam = memref.alloc() : memref<32x68xbf16>
    %am = memref.subview %tam[0, 4] [32, 64] [1, 1] : memref<32x68xbf16> to memref<32x64xbf16, strided<[68, 1], offset: 4>>
    memref.copy %ga, %am : memref<32x64xbf16, strided<[64, 1], offset: ?>> to memref<32x64xbf16, strided<[68, 1], offset: 4>>
    %s = memref.alloc() : memref<4x32x40xf32>
    linalg.fill ins(%zero : f32) outs(%s : memref<4x32x40xf32>)
    %s0 = memref.subview %s[0, 0, 0] [1, 32, 40] [1, 1, 1] : memref<4x32x40xf32> to memref<32x40xf32>
    %s1 = memref.subview %s[1, 0, 0] [1, 32, 40] [1, 1, 1] : memref<4x32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: 1280>>
    %s2 = memref.subview %s[2, 0, 0] [1, 32, 40] [1, 1, 1] : memref<4x32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: 2560>>
    %s3 = memref.subview %s[3, 0, 0] [1, 32, 40] [1, 1, 1] : memref<4x32x40xf32> to memref<32x40xf32, strided<[40, 1], offset: 3840>>
    linalg.generic {indexing_maps = [#a, #bt, #c], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%ta, %tb : memref<32x64xbf16>, memref<40x64xbf16>) outs(%s0 : memref<32x40xf32>) {
    ^bb0(%x: bf16, %y: bf16, %acc: f32):
      %xe = arith.extf %x : bf16 to f32
      %ye = arith.extf %y : bf16 to f32
      %p = arith.mulf %xe, %ye : f32
      %r = arith.addf %acc, %p : f32
      linalg.yield %r : f32
    }
    linalg.generic {indexing_maps = [#a, #bn, #c], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%ta, %tbn : memref<32x64xbf16>, memref<64x40xbf16>) outs(%s1 : memref<32x40xf32, strided<[40, 1], offset: 1280>>) {
    ^bb0(%x: bf16, %y: bf16, %acc: f32):
      %xe = arith.extf %x : bf16 to f32
      %ye = arith.extf %y : bf16 to f32
      %p = arith.mulf %xe, %ye : f32
      %r = arith.addf %acc, %p : f32
      linalg.yield %r : f32
    }
    linalg.generic {indexing_maps = [#a, #bt, #c], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%ta, %gb : memref<32x64xbf16>, memref<40x64xbf16, strided<[64, 1], offset: ?>>) outs(%s2 : memref<32x40xf32, strided<[40, 1], offset: 2560>>) {
    ^bb0(%x: bf16, %y: bf16, %acc: f32):
      %xe = arith.extf %x : bf16 to f32
      %ye = arith.extf %y : bf16 to f32
      %p = arith.mulf %xe, %ye : f32
      %r = arith.addf %acc, %p : f32
      linalg.yield %r : f32
    }
    linalg.generic {indexing_maps = [#a, #bt, #c], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%am, %tb : memref<32x64xbf16, strided<[68, 1], offset: 4>>, memref<40x64xbf16>) outs(%s3 : memref<32x40xf32, strided<[40, 1], offset: 3840>>) {
    ^bb0(%x: bf16, %y: bf16, %acc: f32):
      %xe = arith.extf %x : bf16 to f32
      %ye = arith.extf %y : bf16 to f32
      %p = arith.mulf %xe, %ye : f32
      %r = arith.addf %acc, %p : f32
      linalg.yield %r : f32
    }
    %o = memref.subview %out[0, %i, 0, 0] [4, 1, 32, 40] [1, 1, 1, 1] : memref<4x4x32x40xf32> to memref<4x32x40xf32, strided<[5120, 40, 1], offset: ?>>
    memref.copy %s, %o : memref<4x32x40xf32> to memref<4x32x40xf32, strided<[5120, 40, 1], offset: ?>>
  }
  memref.copy %out, %hout : memref<4x4x32x40xf32> to memref<4x4x32x40xf32>
  return
}
