// RUN: nsa-opt %s --nsa-to-ptx="format=isa" 2>/dev/null | FileCheck %s
// RUN: nsa-opt %s --nsa-to-cpu 2>/dev/null | FileCheck %s --check-prefix=CPU

// A gradient with a dynamic batch and f32 gates beside bf16 activations:
// the combine gradient the flash kernels decline goes to the generic
// mapping, and both pipelines take the layer (nsa-to-ptx once failed with
// "shapes do not match" where nsa-to-cpu took it).

// CHECK: llvm.func @g(
// CHECK: gpu.binary
// CPU: llvm.func @g(
func.func @g(%q: tensor<?x?x4x32xbf16>, %k: tensor<?x?x2x32xbf16>, %v: tensor<?x?x2x32xbf16>, %g: tensor<?x?x4x3xf32>, %do: tensor<?x?x4x32xbf16>)
    -> (tensor<?x?x4x32xbf16>, tensor<?x?x2x32xbf16>, tensor<?x?x2x32xbf16>, tensor<?x?x4x3xf32>) {
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do
      {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64>}
      : (tensor<?x?x4x32xbf16>, tensor<?x?x2x32xbf16>, tensor<?x?x2x32xbf16>, tensor<?x?x4x3xf32>, tensor<?x?x4x32xbf16>)
      -> (tensor<?x?x4x32xbf16>, tensor<?x?x2x32xbf16>, tensor<?x?x2x32xbf16>, tensor<?x?x4x3xf32>)
  return %dq, %dk, %dv, %dg : tensor<?x?x4x32xbf16>, tensor<?x?x2x32xbf16>, tensor<?x?x2x32xbf16>, tensor<?x?x4x3xf32>
}
