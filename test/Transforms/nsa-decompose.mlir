// RUN: nsa-opt %s --nsa-decompose --split-input-file | FileCheck %s --implicit-check-not=nsa.sparse_attention
// RUN: nsa-opt %s --nsa-decompose --cse --split-input-file | FileCheck %s --check-prefix=GRAD --implicit-check-not=nsa.sparse_attention

// The paper's layer: mean pooling, default scale 1/sqrt(192).

// CHECK-LABEL: func.func @paper
// CHECK-SAME: (%[[Q:.+]]: tensor<1x?x64x192xbf16>, %[[K:.+]]: tensor<1x?x4x192xbf16>, %[[V:.+]]: tensor<1x?x4x128xbf16>, %[[G:.+]]: tensor<1x?x64x3xbf16>)
// CHECK: %[[KC:.+]] = nsa.compress %[[K]] {block = 32 : i64, pool = #nsa.pool<mean>, stride = 16 : i64} : (tensor<1x?x4x192xbf16>) -> tensor<1x?x4x192xbf16>
// CHECK: %[[VC:.+]] = nsa.compress %[[V]] {block = 32 : i64, pool = #nsa.pool<mean>, stride = 16 : i64} : (tensor<1x?x4x128xbf16>) -> tensor<1x?x4x128xbf16>
// CHECK: %[[OC:.+]], %[[LSE:.+]] = nsa.compressed_attention %[[Q]], %[[KC]], %[[VC]] {block = 32 : i64, scale = 0.0721687824 : f32, stride = 16 : i64}
// CHECK: %[[IDX:.+]] = nsa.select_blocks %[[Q]], %[[KC]], %[[LSE]] {backbone = #nsa.backbone<initial = 1, local = 2>, cmp_block = 32 : i64, cmp_stride = 16 : i64, num_selected = 16 : i64, scale = 0.0721687824 : f32, slc_block = 64 : i64} : {{.+}} -> tensor<1x?x4x16xi32>
// CHECK: %[[OS:.+]], %{{.+}} = nsa.selected_attention %[[Q]], %[[K]], %[[V]], %[[IDX]] {block = 64 : i64, scale = 0.0721687824 : f32}
// CHECK: %[[OW:.+]], %{{.+}} = nsa.window_attention %[[Q]], %[[K]], %[[V]] {scale = 0.0721687824 : f32, window = 512 : i64}
// CHECK: %[[O:.+]] = nsa.combine %[[OC]], %[[OS]], %[[OW]], %[[G]]
// CHECK: return %[[O]]
func.func @paper(%q: tensor<1x?x64x192xbf16>, %k: tensor<1x?x4x192xbf16>,
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

// -----

// Learned phi, packed sequences, explicit scale: the weights are split into
// key and value weights and cu_seqlens reaches every branch.

// CHECK-LABEL: func.func @learned_packed
// CHECK-SAME: %[[W:[^:]+]]: tensor<2x2x16xf32>, %[[CU:[^:]+]]: tensor<3xi32>
// CHECK-DAG: %[[WK:.+]] = tensor.extract_slice %[[W]][0, 0, 0] [1, 2, 16] [1, 1, 1] : tensor<2x2x16xf32> to tensor<2x16xf32>
// CHECK-DAG: %[[WV:.+]] = tensor.extract_slice %[[W]][1, 0, 0] [1, 2, 16] [1, 1, 1] : tensor<2x2x16xf32> to tensor<2x16xf32>
// CHECK: nsa.compress %{{.+}} weights(%[[WK]]) cu_seqlens(%[[CU]]) {block = 16 : i64, pool = #nsa.pool<linear>, stride = 8 : i64} : (tensor<1x100x2x64xf16>, tensor<2x16xf32>, tensor<3xi32>) -> tensor<1x12x2x64xf16>
// CHECK: nsa.compress %{{.+}} weights(%[[WV]]) cu_seqlens(%[[CU]])
// CHECK: nsa.compressed_attention {{.+}} cu_seqlens(%[[CU]]) {block = 16 : i64, scale = 1.250000e-01 : f32, stride = 8 : i64}
// CHECK: nsa.select_blocks {{.+}} cu_seqlens(%[[CU]]) {backbone = #nsa.backbone<initial = 2>, {{.+}}num_selected = 4 : i64
// CHECK: nsa.selected_attention {{.+}} cu_seqlens(%[[CU]]) {block = 32 : i64
// CHECK: nsa.window_attention {{.+}} cu_seqlens(%[[CU]]) {scale = 1.250000e-01 : f32, window = 64 : i64}
// CHECK: nsa.combine
func.func @learned_packed(%q: tensor<1x100x8x64xf16>, %k: tensor<1x100x2x64xf16>,
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

// -----

// The gradient of a layer: the forward branches, then each branch's
// gradient, the indices of the forward held fixed, the sums rounded once.
// With the forward in the same function, CSE shares its branches.

// GRAD-LABEL: func.func @forward_and_grad
// GRAD-SAME: (%[[Q:[^:]+]]: {{[^,]+}}, %[[K:[^:]+]]: {{[^,]+}}, %[[V:[^:]+]]: {{[^,]+}}, %[[G:[^:]+]]: {{[^,]+}}, %[[DO:[^:]+]]: tensor<1x?x8x32xbf16>)
// GRAD: %[[KC:.+]] = nsa.compress %[[K]]
// GRAD: %[[VC:.+]] = nsa.compress %[[V]]
// GRAD: %[[OC:.+]], %[[LC:.+]] = nsa.compressed_attention %[[Q]], %[[KC]], %[[VC]]
// GRAD: %[[IDX:.+]] = nsa.select_blocks
// GRAD: %[[OS:.+]], %[[LS:.+]] = nsa.selected_attention %[[Q]], %[[K]], %[[V]], %[[IDX]]
// GRAD: %[[OW:.+]], %[[LW:.+]] = nsa.window_attention
// GRAD: %[[O:.+]] = nsa.combine %[[OC]], %[[OS]], %[[OW]], %[[G]]
// GRAD: %[[DC:.+]], %[[DS:.+]], %[[DW:.+]], %[[DG:.+]] = nsa.combine_grad %[[OC]], %[[OS]], %[[OW]], %[[G]], %[[DO]]
// GRAD: %[[DQ1:.+]], %[[DKC:.+]], %[[DVC:.+]] = nsa.compressed_attention_grad %[[Q]], %[[KC]], %[[VC]], %[[OC]], %[[LC]], %[[DC]] {block = 16 : i64, scale = 1.250000e-01 : f32, stride = 8 : i64} {{.+}} -> (tensor<1x?x8x64xf32>, tensor<1x?x2x64xf32>, tensor<1x?x2x32xf32>)
// GRAD: %[[DQ2:.+]], %[[DK2:.+]], %[[DV2:.+]] = nsa.selected_attention_grad %[[Q]], %[[K]], %[[V]], %[[IDX]], %[[OS]], %[[LS]], %[[DS]] {block = 32 : i64
// GRAD: %[[DQ3:.+]], %[[DK3:.+]], %[[DV3:.+]] = nsa.window_attention_grad %[[Q]], %[[K]], %[[V]], %[[OW]], %[[LW]], %[[DW]] {scale = 1.250000e-01 : f32, window = 64 : i64}
// GRAD: %[[DK1:.+]] = nsa.compress_grad %[[DKC]], %[[K]] {block = 16 : i64, pool = #nsa.pool<mean>, stride = 8 : i64}
// GRAD: %[[DV1:.+]] = nsa.compress_grad %[[DVC]], %[[V]]
// GRAD: %[[SQ:.+]] = linalg.generic {{.+}} ins(%[[DQ1]], %[[DQ2]], %[[DQ3]] : {{.+}}) outs(%{{.+}} : tensor<1x?x8x64xbf16>)
// GRAD: arith.addf
// GRAD: arith.addf
// GRAD: arith.truncf %{{.+}} : f32 to bf16
// GRAD: %[[SK:.+]] = linalg.generic {{.+}} ins(%[[DK1]], %[[DK2]], %[[DK3]] :
// GRAD: %[[SV:.+]] = linalg.generic {{.+}} ins(%[[DV1]], %[[DV2]], %[[DV3]] :
// GRAD: return %[[O]], %[[SQ]], %[[SK]], %[[SV]], %[[DG]]
func.func @forward_and_grad(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>,
                            %v: tensor<1x?x2x32xbf16>, %g: tensor<1x?x8x3xbf16>,
                            %do: tensor<1x?x8x32xbf16>)
    -> (tensor<1x?x8x32xbf16>, tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>,
        tensor<1x?x2x32xbf16>, tensor<1x?x8x3xbf16>) {
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<
         cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4,
         window = 64, scale = 0.125 : f32, backbone = <initial = 1>>}
       : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>,
          tensor<1x?x8x3xbf16>) -> tensor<1x?x8x32xbf16>
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do
       {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32,
        num_selected = 4, window = 64, scale = 0.125 : f32,
        backbone = <initial = 1>>}
       : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>,
          tensor<1x?x8x3xbf16>, tensor<1x?x8x32xbf16>)
       -> (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>,
           tensor<1x?x8x3xbf16>)
  return %o, %dq, %dk, %dv, %dg : tensor<1x?x8x32xbf16>, tensor<1x?x8x64xbf16>,
      tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>, tensor<1x?x8x3xbf16>
}

// -----

// Training (Spec section 9.1): the forward returns its saved state beside
// the output; the gradient takes it and rebuilds only the compression.

// CHECK-LABEL: func.func @train_forward
// CHECK: %[[OC:.+]], %[[LC:.+]] = nsa.compressed_attention
// CHECK: %[[IDX:.+]] = nsa.select_blocks
// CHECK: %[[OS:.+]], %[[LS:.+]] = nsa.selected_attention
// CHECK: %[[OW:.+]], %[[LW:.+]] = nsa.window_attention
// CHECK: %[[O:.+]] = nsa.combine %[[OC]], %[[OS]], %[[OW]]
// CHECK: return %[[O]], %[[OC]], %[[LC]], %[[IDX]], %[[OS]], %[[LS]], %[[OW]], %[[LW]]
func.func @train_forward(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>,
                         %v: tensor<1x?x2x32xbf16>, %g: tensor<1x?x8x3xbf16>)
    -> (tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>,
        tensor<1x?x2x4xi32>, tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>,
        tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>) {
  %o, %oc, %lc, %idx, %os, %ls, %ow, %lw = nsa.sparse_attention %q, %k, %v, %g
       {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32,
        num_selected = 4, window = 64, backbone = <initial = 1>>}
       : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>,
          tensor<1x?x8x3xbf16>)
       -> (tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>,
           tensor<1x?x2x4xi32>, tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>,
           tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>)
  return %o, %oc, %lc, %idx, %os, %ls, %ow, %lw
      : tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>,
        tensor<1x?x2x4xi32>, tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>,
        tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>
}

// CHECK-LABEL: func.func @train_backward
// CHECK-SAME: (%[[Q:[^:]+]]: {{[^,]+}}, %[[K:[^:]+]]: {{[^,]+}}, %[[V:[^:]+]]: {{[^,]+}}, %[[G:[^:]+]]: {{[^,]+}}, %[[DO:[^:]+]]: {{[^,]+}}, %[[OC:[^:]+]]: {{[^,]+}}, %[[LC:[^:]+]]: {{[^,]+}}, %[[IDX:[^:]+]]: {{[^,]+}}, %[[OS:[^:]+]]: {{[^,]+}}, %[[LS:[^:]+]]: {{[^,]+}}, %[[OW:[^:]+]]: {{[^,]+}}, %[[LW:[^:]+]]: {{[^)]+}})
// CHECK: %[[KC:.+]] = nsa.compress %[[K]]
// CHECK: %[[VC:.+]] = nsa.compress %[[V]]
// CHECK-NOT: nsa.compressed_attention %
// CHECK-NOT: nsa.select_blocks
// CHECK-NOT: nsa.selected_attention %
// CHECK-NOT: nsa.window_attention %
// CHECK: nsa.combine_grad %[[OC]], %[[OS]], %[[OW]], %[[G]], %[[DO]]
// CHECK: nsa.compressed_attention_grad %[[Q]], %[[KC]], %[[VC]], %[[OC]], %[[LC]], %{{.+}} {block = 16 : i64, scale = 1.250000e-01 : f32, stride = 8 : i64}
// CHECK: nsa.selected_attention_grad %[[Q]], %[[K]], %[[V]], %[[IDX]], %[[OS]], %[[LS]], %{{.+}} {block = 32 : i64, scale = 1.250000e-01 : f32}
// CHECK: nsa.window_attention_grad %[[Q]], %[[K]], %[[V]], %[[OW]], %[[LW]], %{{.+}} {scale = 1.250000e-01 : f32, window = 64 : i64}
// CHECK: nsa.compress_grad
// CHECK: nsa.compress_grad
func.func @train_backward(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>,
                          %v: tensor<1x?x2x32xbf16>, %g: tensor<1x?x8x3xbf16>,
                          %do: tensor<1x?x8x32xbf16>,
                          %oc: tensor<1x?x8x32xbf16>, %lc: tensor<1x?x8xf32>,
                          %idx: tensor<1x?x2x4xi32>,
                          %os: tensor<1x?x8x32xbf16>, %ls: tensor<1x?x8xf32>,
                          %ow: tensor<1x?x8x32xbf16>, %lw: tensor<1x?x8xf32>)
    -> (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>,
        tensor<1x?x8x3xbf16>) {
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do
       saved(%oc, %lc, %idx, %os, %ls, %ow, %lw)
       {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32,
        num_selected = 4, window = 64, backbone = <initial = 1>>}
       : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>,
          tensor<1x?x8x3xbf16>, tensor<1x?x8x32xbf16>,
          tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>, tensor<1x?x2x4xi32>,
          tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>,
          tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>)
       -> (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>,
           tensor<1x?x8x3xbf16>)
  return %dq, %dk, %dv, %dg : tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>,
      tensor<1x?x2x32xbf16>, tensor<1x?x8x3xbf16>
}

// -----

// Saved results more static than the operands (batch 2 declared, the query's
// batch dynamic): the branch values are cast to the declared types.

// CHECK-LABEL: func.func @train_forward_cast
// CHECK: %[[OC:.+]], %[[LC:.+]] = nsa.compressed_attention {{.+}} -> (tensor<?x?x8x32xbf16>, tensor<?x?x8xf32>)
// CHECK: %[[C:.+]] = tensor.cast %[[OC]] : tensor<?x?x8x32xbf16> to tensor<2x?x8x32xbf16>
// CHECK: return %{{.+}}, %[[C]], %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : tensor<?x?x8x32xbf16>, tensor<2x?x8x32xbf16>,
func.func @train_forward_cast(%q: tensor<?x?x8x64xbf16>, %k: tensor<?x?x2x64xbf16>,
                              %v: tensor<?x?x2x32xbf16>, %g: tensor<?x?x8x3xbf16>)
    -> (tensor<?x?x8x32xbf16>, tensor<2x?x8x32xbf16>, tensor<?x?x8xf32>,
        tensor<?x?x2x4xi32>, tensor<?x?x8x32xbf16>, tensor<?x?x8xf32>,
        tensor<?x?x8x32xbf16>, tensor<?x?x8xf32>) {
  %o, %oc, %lc, %idx, %os, %ls, %ow, %lw = nsa.sparse_attention %q, %k, %v, %g
       {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32,
        num_selected = 4, window = 64, backbone = <initial = 1>>}
       : (tensor<?x?x8x64xbf16>, tensor<?x?x2x64xbf16>, tensor<?x?x2x32xbf16>,
          tensor<?x?x8x3xbf16>)
       -> (tensor<?x?x8x32xbf16>, tensor<2x?x8x32xbf16>, tensor<?x?x8xf32>,
           tensor<?x?x2x4xi32>, tensor<?x?x8x32xbf16>, tensor<?x?x8xf32>,
           tensor<?x?x8x32xbf16>, tensor<?x?x8xf32>)
  return %o, %oc, %lc, %idx, %os, %ls, %ow, %lw
      : tensor<?x?x8x32xbf16>, tensor<2x?x8x32xbf16>, tensor<?x?x8xf32>,
        tensor<?x?x2x4xi32>, tensor<?x?x8x32xbf16>, tensor<?x?x8xf32>,
        tensor<?x?x8x32xbf16>, tensor<?x?x8xf32>
}

// -----

// Spec section 11's example: the forced blocks are counted at max_tokens
// (12 of n = 16 at 65536 tokens) by the config and by the select_blocks that
// decompose makes, which carries max_tokens; a static T above it (4096 >
// 1024 below) verifies too: past max_tokens the Spec's truncation applies.
// CHECK-LABEL: func.func @declared_max_tokens
// CHECK: nsa.select_blocks
// CHECK-SAME: max_tokens = 65536
// CHECK: nsa.select_blocks
// CHECK-SAME: max_tokens = 1024
func.func @declared_max_tokens(%q: tensor<1x?x4x64xbf16>, %k: tensor<1x?x1x64xbf16>,
    %v: tensor<1x?x1x64xbf16>, %g: tensor<1x?x4x3xbf16>,
    %q2: tensor<1x4096x4x64xbf16>, %k2: tensor<1x4096x1x64xbf16>,
    %v2: tensor<1x4096x1x64xbf16>, %g2: tensor<1x4096x4x3xbf16>)
    -> (tensor<1x?x4x64xbf16>, tensor<1x4096x4x64xbf16>) {
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32,
         cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512,
         backbone = <initial = 1, local = 2, log_levels = 15>, max_tokens = 65536>}
     : (tensor<1x?x4x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
        tensor<1x?x4x3xbf16>) -> tensor<1x?x4x64xbf16>
  %o2 = nsa.sparse_attention %q2, %k2, %v2, %g2 {config = #nsa.config<cmp_block = 32,
         cmp_stride = 16, slc_block = 64, num_selected = 6, window = 512,
         backbone = <initial = 1, local = 2, log_levels = 15>, max_tokens = 1024>}
     : (tensor<1x4096x4x64xbf16>, tensor<1x4096x1x64xbf16>, tensor<1x4096x1x64xbf16>,
        tensor<1x4096x4x3xbf16>) -> tensor<1x4096x4x64xbf16>
  return %o, %o2 : tensor<1x?x4x64xbf16>, tensor<1x4096x4x64xbf16>
}
