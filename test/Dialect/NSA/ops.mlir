// RUN: nsa-opt %s | FileCheck %s
// RUN: nsa-opt %s | nsa-opt | FileCheck %s
// RUN: nsa-opt %s --mlir-print-op-generic | nsa-opt | FileCheck %s

// Every op and every attribute form round-trips through the custom and the
// generic syntax.

// CHECK-LABEL: func.func @paper_layer
// CHECK-SAME: (%[[Q:.+]]: tensor<1x?x64x192xbf16>, %[[K:.+]]: tensor<1x?x4x192xbf16>, %[[V:.+]]: tensor<1x?x4x128xbf16>, %[[G:.+]]: tensor<1x?x64x3xbf16>)
// CHECK: nsa.sparse_attention %[[Q]], %[[K]], %[[V]], %[[G]]
// The paper's backbone is the default: printed without it.
// CHECK-SAME: config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512>}
// CHECK-SAME: -> tensor<1x?x64x128xbf16>
func.func @paper_layer(%q: tensor<1x?x64x192xbf16>, %k: tensor<1x?x4x192xbf16>,
                       %v: tensor<1x?x4x128xbf16>, %g: tensor<1x?x64x3xbf16>)
    -> tensor<1x?x64x128xbf16> {
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<
         cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16,
         window = 512, backbone = <initial = 1, local = 2>>}
       : (tensor<1x?x64x192xbf16>, tensor<1x?x4x192xbf16>,
          tensor<1x?x4x128xbf16>, tensor<1x?x64x3xbf16>)
       -> tensor<1x?x64x128xbf16>
  return %o : tensor<1x?x64x128xbf16>
}

// CHECK-LABEL: func.func @learned_packed_scaled
// CHECK: nsa.sparse_attention %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} cmp_weights(%{{[a-z0-9_]+}}) cu_seqlens(%{{[a-z0-9_]+}})
// CHECK-SAME: scale = 1.250000e-01 : f32, pool = linear, backbone = <initial = 2>
func.func @learned_packed_scaled(%q: tensor<1x100x8x64xf16>, %k: tensor<1x100x2x64xf16>,
                                 %v: tensor<1x100x2x32xf16>, %g: tensor<1x100x8x3xf32>,
                                 %w: tensor<2x2x16xf32>, %cu: tensor<3xi32>)
    -> tensor<1x100x8x32xf16> {
  %o = nsa.sparse_attention %q, %k, %v, %g cmp_weights(%w) cu_seqlens(%cu)
       {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32,
        num_selected = 4, window = 64, scale = 0.125 : f32, pool = linear,
        backbone = <initial = 2>>}
       : (tensor<1x100x8x64xf16>, tensor<1x100x2x64xf16>, tensor<1x100x2x32xf16>,
          tensor<1x100x8x3xf32>, tensor<2x2x16xf32>, tensor<3xi32>)
       -> tensor<1x100x8x32xf16>
  return %o : tensor<1x100x8x32xf16>
}

// CHECK-LABEL: func.func @branches
func.func @branches(%q: tensor<2x1000x8x64xf32>, %k: tensor<2x1000x2x64xf32>,
                    %v: tensor<2x1000x2x64xf32>, %g: tensor<2x1000x8x3xf32>,
                    %w: tensor<2x32xf32>) -> tensor<2x1000x8x64xf32> {
  // CHECK: %[[KC:.+]] = nsa.compress %{{[a-z0-9_]+}} {block = 32 : i64, pool = #nsa.pool<mean>, stride = 16 : i64} : (tensor<2x1000x2x64xf32>) -> tensor<2x61x2x64xf32>
  %kc = nsa.compress %k {block = 32, stride = 16, pool = #nsa.pool<mean>}
      : (tensor<2x1000x2x64xf32>) -> tensor<2x61x2x64xf32>
  // CHECK: %[[VC:.+]] = nsa.compress %{{[a-z0-9_]+}} weights(%{{[a-z0-9_]+}}) {block = 32 : i64, pool = #nsa.pool<linear>, stride = 16 : i64}
  %vc = nsa.compress %v weights(%w) {block = 32, stride = 16, pool = #nsa.pool<linear>}
      : (tensor<2x1000x2x64xf32>, tensor<2x32xf32>) -> tensor<2x61x2x64xf32>
  // CHECK: %[[OC:.+]], %[[LSE:.+]] = nsa.compressed_attention %{{[a-z0-9_]+}}, %[[KC]], %[[VC]] {block = 32 : i64, scale = 1.250000e-01 : f32, stride = 16 : i64}
  %oc, %lse = nsa.compressed_attention %q, %kc, %vc {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<2x1000x8x64xf32>, tensor<2x61x2x64xf32>, tensor<2x61x2x64xf32>)
      -> (tensor<2x1000x8x64xf32>, tensor<2x1000x8xf32>)
  // CHECK: %[[IDX:.+]] = nsa.select_blocks %{{[a-z0-9_]+}}, %[[KC]], %[[LSE]] {backbone = #nsa.backbone<initial = 1, local = 2>, cmp_block = 32 : i64, cmp_stride = 16 : i64, num_selected = 16 : i64, scale = 1.250000e-01 : f32, slc_block = 64 : i64}
  %idx = nsa.select_blocks %q, %kc, %lse
      {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16,
       scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>}
      : (tensor<2x1000x8x64xf32>, tensor<2x61x2x64xf32>, tensor<2x1000x8xf32>)
      -> tensor<2x1000x2x16xi32>
  // CHECK: nsa.selected_attention %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %[[IDX]] {block = 64 : i64, scale = 1.250000e-01 : f32}
  %os, %lses = nsa.selected_attention %q, %k, %v, %idx {block = 64, scale = 0.125 : f32}
      : (tensor<2x1000x8x64xf32>, tensor<2x1000x2x64xf32>, tensor<2x1000x2x64xf32>,
         tensor<2x1000x2x16xi32>) -> (tensor<2x1000x8x64xf32>, tensor<2x1000x8xf32>)
  // CHECK: nsa.window_attention %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} {scale = 1.250000e-01 : f32, window = 512 : i64}
  %ow, %lsew = nsa.window_attention %q, %k, %v {window = 512, scale = 0.125 : f32}
      : (tensor<2x1000x8x64xf32>, tensor<2x1000x2x64xf32>, tensor<2x1000x2x64xf32>)
      -> (tensor<2x1000x8x64xf32>, tensor<2x1000x8xf32>)
  // CHECK: nsa.combine %[[OC]], %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : (tensor<2x1000x8x64xf32>, tensor<2x1000x8x64xf32>, tensor<2x1000x8x64xf32>, tensor<2x1000x8x3xf32>) -> tensor<2x1000x8x64xf32>
  %o = nsa.combine %oc, %os, %ow, %g
      : (tensor<2x1000x8x64xf32>, tensor<2x1000x8x64xf32>, tensor<2x1000x8x64xf32>,
         tensor<2x1000x8x3xf32>) -> tensor<2x1000x8x64xf32>
  return %o : tensor<2x1000x8x64xf32>
}

// CHECK-LABEL: func.func @packed_branches
func.func @packed_branches(%q: tensor<1x?x4x16xbf16>, %k: tensor<1x?x1x16xbf16>,
                           %v: tensor<1x?x1x16xbf16>, %cu: tensor<?xi32>) {
  // CHECK: nsa.compress %{{[a-z0-9_]+}} cu_seqlens(%{{[a-z0-9_]+}})
  %kc = nsa.compress %k cu_seqlens(%cu) {block = 8, stride = 4, pool = #nsa.pool<mean>}
      : (tensor<1x?x1x16xbf16>, tensor<?xi32>) -> tensor<1x?x1x16xbf16>
  // CHECK: nsa.compressed_attention %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} cu_seqlens(%{{[a-z0-9_]+}})
  %oc, %lse = nsa.compressed_attention %q, %kc, %kc cu_seqlens(%cu) {block = 8, stride = 4, scale = 0.25 : f32}
      : (tensor<1x?x4x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x1x16xbf16>, tensor<?xi32>)
      -> (tensor<1x?x4x16xbf16>, tensor<1x?x4xf32>)
  // CHECK: nsa.select_blocks %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} cu_seqlens(%{{[a-z0-9_]+}})
  // CHECK-SAME: backbone = #nsa.backbone<>
  %idx = nsa.select_blocks %q, %kc, %lse cu_seqlens(%cu)
      {cmp_block = 8, cmp_stride = 4, slc_block = 8, num_selected = 2,
       scale = 0.25 : f32, backbone = #nsa.backbone<>}
      : (tensor<1x?x4x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x4xf32>, tensor<?xi32>)
      -> tensor<1x?x1x2xi32>
  // CHECK: nsa.selected_attention %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} cu_seqlens(%{{[a-z0-9_]+}})
  %os, %l1 = nsa.selected_attention %q, %k, %v, %idx cu_seqlens(%cu) {block = 8, scale = 0.25 : f32}
      : (tensor<1x?x4x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x1x16xbf16>,
         tensor<1x?x1x2xi32>, tensor<?xi32>) -> (tensor<1x?x4x16xbf16>, tensor<1x?x4xf32>)
  // CHECK: nsa.window_attention %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} cu_seqlens(%{{[a-z0-9_]+}})
  %ow, %l2 = nsa.window_attention %q, %k, %v cu_seqlens(%cu) {window = 16, scale = 0.25 : f32}
      : (tensor<1x?x4x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x1x16xbf16>, tensor<?xi32>)
      -> (tensor<1x?x4x16xbf16>, tensor<1x?x4xf32>)
  return
}

// Every backbone pattern, and a declared hop bound that the verifier checks.

// CHECK-LABEL: func.func @backbones
// CHECK: backbone = <initial = 1, local = 2, log_levels = 11>, max_tokens = 65536, max_hops = 8>
// CHECK: backbone = <local = 1, hub_stride = 16, blocks = [3, 5]>, max_tokens = 4096>
// CHECK: window = 64, backbone = <>>}
func.func @backbones(%q: tensor<1x?x4x64xbf16>, %k: tensor<1x?x1x64xbf16>,
                     %v: tensor<1x?x1x64xbf16>, %g: tensor<1x?x4x3xbf16>) {
  %a = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32,
         cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512,
         backbone = <initial = 1, local = 2, log_levels = 11>,
         max_tokens = 65536, max_hops = 8>}
       : (tensor<1x?x4x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
          tensor<1x?x4x3xbf16>) -> tensor<1x?x4x64xbf16>
  %b = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32,
         cmp_stride = 16, slc_block = 64, num_selected = 8, window = 512,
         backbone = <local = 1, hub_stride = 16, blocks = [3, 5]>, max_tokens = 4096>}
       : (tensor<1x?x4x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
          tensor<1x?x4x3xbf16>) -> tensor<1x?x4x64xbf16>
  // No forced blocks: printed, unlike the default.
  %c = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32,
         cmp_stride = 16, slc_block = 64, num_selected = 2, window = 64,
         backbone = <>>}
       : (tensor<1x?x4x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
          tensor<1x?x4x3xbf16>) -> tensor<1x?x4x64xbf16>
  return
}
