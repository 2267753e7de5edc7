// RUN: nsa-opt %s --nsa-to-cpu="query-tile=8 kv-tile=16" | FileCheck %s --implicit-check-not=nsa. --implicit-check-not=linalg. --implicit-check-not=scf. --implicit-check-not=tensor. --implicit-check-not=memref. --implicit-check-not=bufferization.

// The whole layer reaches the LLVM dialect; the execution tests
// (test/Execution) run this pipeline's output and compare with the reference.

// CHECK-LABEL: llvm.func @layer
// CHECK: llvm.call @malloc
// CHECK: llvm.intr.exp
// CHECK: llvm.intr.log
// CHECK: llvm.call @free
// CHECK: llvm.return
func.func @layer(%q: tensor<1x?x4x16xbf16>, %k: tensor<1x?x2x16xbf16>, %v: tensor<1x?x2x8xbf16>,
                 %g: tensor<1x?x4x3xbf16>) -> tensor<1x?x4x8xbf16> {
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4,
         slc_block = 16, num_selected = 3, window = 16, backbone = <initial = 1, local = 1>>}
     : (tensor<1x?x4x16xbf16>, tensor<1x?x2x16xbf16>, tensor<1x?x2x8xbf16>, tensor<1x?x4x3xbf16>)
     -> tensor<1x?x4x8xbf16>
  return %o : tensor<1x?x4x8xbf16>
}
