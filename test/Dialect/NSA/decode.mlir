// RUN: nsa-opt %s | FileCheck %s
// RUN: nsa-opt %s | nsa-opt | FileCheck %s
// RUN: nsa-opt %s --mlir-print-op-generic | nsa-opt | FileCheck %s

// Decoding (docs/Spec.md section 12): the layer's decode step, the
// compressed cache's append and the branch ops with kv_lens round-trip.

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>

// CHECK-LABEL: func.func @step
// CHECK: nsa.compress_append %{{.*}}, %{{.*}} kv_lens(%{{.*}}) {appended = 1 : i64, block = 32 : i64, pool = #nsa.pool<mean>, stride = 16 : i64}
// CHECK: nsa.compress_append %{{.*}}, %{{.*}} kv_lens(%{{.*}}) weights(%{{.*}}) {appended = 4 : i64
// CHECK: nsa.sparse_attention_decode %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} kv_lens(%{{.*}}) {config = #nsa.config<
// CHECK-SAME: -> tensor<4x1x64x128xbf16>
func.func @step(%q: tensor<4x1x64x192xbf16>, %k: tensor<4x1024x4x192xbf16>, %v: tensor<4x1024x4x128xbf16>,
                %kc: tensor<4x63x4x192xbf16>, %vc: tensor<4x63x4x128xbf16>, %g: tensor<4x1x64x3xbf16>,
                %lens: tensor<4xi32>, %w: tensor<4x32xf32>) -> tensor<4x1x64x128xbf16> {
  %kc1 = nsa.compress_append %k, %kc kv_lens(%lens) {block = 32, stride = 16, pool = #nsa.pool<mean>, appended = 1}
      : (tensor<4x1024x4x192xbf16>, tensor<4x63x4x192xbf16>, tensor<4xi32>) -> tensor<4x63x4x192xbf16>
  %vc1 = nsa.compress_append %v, %vc kv_lens(%lens) weights(%w) {block = 32, stride = 16, pool = #nsa.pool<linear>, appended = 4}
      : (tensor<4x1024x4x128xbf16>, tensor<4x63x4x128xbf16>, tensor<4xi32>, tensor<4x32xf32>) -> tensor<4x63x4x128xbf16>
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc1, %vc1, %g kv_lens(%lens) {config = #cfg}
      : (tensor<4x1x64x192xbf16>, tensor<4x1024x4x192xbf16>, tensor<4x1024x4x128xbf16>, tensor<4x63x4x192xbf16>,
         tensor<4x63x4x128xbf16>, tensor<4x1x64x3xbf16>, tensor<4xi32>) -> tensor<4x1x64x128xbf16>
  return %o : tensor<4x1x64x128xbf16>
}

// CHECK-LABEL: func.func @branches
// CHECK: nsa.compressed_attention %{{.*}}, %{{.*}}, %{{.*}} kv_lens(%{{.*}})
// CHECK: nsa.select_blocks %{{.*}}, %{{.*}}, %{{.*}} kv_lens(%{{.*}})
// CHECK: nsa.selected_attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} kv_lens(%{{.*}})
// CHECK: nsa.window_attention %{{.*}}, %{{.*}}, %{{.*}} kv_lens(%{{.*}})
func.func @branches(%q: tensor<2x3x8x64xf32>, %k: tensor<2x?x2x64xf32>, %v: tensor<2x?x2x32xf32>,
                    %kc: tensor<2x?x2x64xf32>, %vc: tensor<2x?x2x32xf32>, %lens: tensor<2xi32>) {
  %oc, %lc = nsa.compressed_attention %q, %kc, %vc kv_lens(%lens) {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<2x3x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>, tensor<2xi32>) -> (tensor<2x3x8x32xf32>, tensor<2x3x8xf32>)
  %idx = nsa.select_blocks %q, %kc, %lc kv_lens(%lens) {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4,
      scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>}
      : (tensor<2x3x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x3x8xf32>, tensor<2xi32>) -> tensor<2x3x2x4xi32>
  %os, %ls = nsa.selected_attention %q, %k, %v, %idx kv_lens(%lens) {block = 64, scale = 0.125 : f32}
      : (tensor<2x3x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>, tensor<2x3x2x4xi32>, tensor<2xi32>) -> (tensor<2x3x8x32xf32>, tensor<2x3x8xf32>)
  %ow, %lw = nsa.window_attention %q, %k, %v kv_lens(%lens) {window = 64, scale = 0.125 : f32}
      : (tensor<2x3x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>, tensor<2xi32>) -> (tensor<2x3x8x32xf32>, tensor<2x3x8xf32>)
  return
}
