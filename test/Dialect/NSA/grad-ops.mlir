// RUN: nsa-opt %s | FileCheck %s
// RUN: nsa-opt %s | nsa-opt | FileCheck %s
// RUN: nsa-opt %s --mlir-print-op-generic | nsa-opt | FileCheck %s

// Every gradient op round-trips through the custom and the generic syntax.

// CHECK-LABEL: func.func @layer_grad
// CHECK: nsa.sparse_attention_grad %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} cmp_weights(%{{[a-z0-9_]+}}) cu_seqlens(%{{[a-z0-9_]+}})
// CHECK-SAME: -> (tensor<1x100x8x64xbf16>, tensor<1x100x2x64xbf16>, tensor<1x100x2x32xbf16>, tensor<1x100x8x3xf32>, tensor<2x2x16xf32>)
func.func @layer_grad(%q: tensor<1x100x8x64xbf16>, %k: tensor<1x100x2x64xbf16>,
                      %v: tensor<1x100x2x32xbf16>, %g: tensor<1x100x8x3xf32>,
                      %do: tensor<1x100x8x32xbf16>, %w: tensor<2x2x16xf32>,
                      %cu: tensor<3xi32>) {
  %dq, %dk, %dv, %dg, %dw = nsa.sparse_attention_grad %q, %k, %v, %g, %do
      cmp_weights(%w) cu_seqlens(%cu)
      {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32,
       num_selected = 4, window = 64, pool = linear, backbone = <initial = 1>>}
      : (tensor<1x100x8x64xbf16>, tensor<1x100x2x64xbf16>,
         tensor<1x100x2x32xbf16>, tensor<1x100x8x3xf32>,
         tensor<1x100x8x32xbf16>, tensor<2x2x16xf32>, tensor<3xi32>)
      -> (tensor<1x100x8x64xbf16>, tensor<1x100x2x64xbf16>,
          tensor<1x100x2x32xbf16>, tensor<1x100x8x3xf32>, tensor<2x2x16xf32>)
  return
}

// CHECK-LABEL: func.func @branch_grads
// CHECK: nsa.combine_grad
// CHECK: nsa.compressed_attention_grad {{.+}} {block = 32 : i64, scale = 1.250000e-01 : f32, stride = 16 : i64} : {{.+}} -> (tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>)
// CHECK: nsa.selected_attention_grad {{.+}} {block = 64 : i64, scale = 1.250000e-01 : f32}
// CHECK: nsa.window_attention_grad {{.+}} {scale = 1.250000e-01 : f32, window = 512 : i64}
// CHECK: nsa.compress_grad %{{.+}}, %{{.+}} {block = 32 : i64, pool = #nsa.pool<mean>, stride = 16 : i64} : (tensor<2x?x2x64xf32>, tensor<2x?x2x64xbf16>) -> tensor<2x?x2x64xf32>
// CHECK: nsa.compress_grad %{{.+}}, %{{.+}} weights(%{{.+}}) {block = 32 : i64, pool = #nsa.pool<linear>, stride = 16 : i64} : {{.+}} -> (tensor<2x?x2x32xf32>, tensor<2x32xf32>)
func.func @branch_grads(%q: tensor<2x?x8x64xbf16>, %k: tensor<2x?x2x64xbf16>,
                        %v: tensor<2x?x2x32xbf16>, %kc: tensor<2x?x2x64xbf16>,
                        %vc: tensor<2x?x2x32xbf16>, %idx: tensor<2x?x2x16xi32>,
                        %o: tensor<2x?x8x32xbf16>, %lse: tensor<2x?x8xf32>,
                        %g: tensor<2x?x8x3xbf16>, %do: tensor<2x?x8x32xbf16>,
                        %w: tensor<2x32xf32>) {
  %dc, %ds, %dw, %dg = nsa.combine_grad %o, %o, %o, %g, %do
      : (tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>,
         tensor<2x?x8x3xbf16>, tensor<2x?x8x32xbf16>)
      -> (tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>,
          tensor<2x?x8x3xbf16>)
  %dq0, %dkc, %dvc = nsa.compressed_attention_grad %q, %kc, %vc, %o, %lse, %dc
      {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<2x?x8x64xbf16>, tensor<2x?x2x64xbf16>, tensor<2x?x2x32xbf16>,
         tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>, tensor<2x?x8x32xbf16>)
      -> (tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>)
  %dq1, %dk1, %dv1 = nsa.selected_attention_grad %q, %k, %v, %idx, %o, %lse, %ds
      {block = 64, scale = 0.125 : f32}
      : (tensor<2x?x8x64xbf16>, tensor<2x?x2x64xbf16>, tensor<2x?x2x32xbf16>,
         tensor<2x?x2x16xi32>, tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>,
         tensor<2x?x8x32xbf16>)
      -> (tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>)
  %dq2, %dk2, %dv2 = nsa.window_attention_grad %q, %k, %v, %o, %lse, %dw
      {window = 512, scale = 0.125 : f32}
      : (tensor<2x?x8x64xbf16>, tensor<2x?x2x64xbf16>, tensor<2x?x2x32xbf16>,
         tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>, tensor<2x?x8x32xbf16>)
      -> (tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>)
  %dk3 = nsa.compress_grad %dkc, %k {block = 32, stride = 16, pool = #nsa.pool<mean>}
      : (tensor<2x?x2x64xf32>, tensor<2x?x2x64xbf16>) -> tensor<2x?x2x64xf32>
  %dv3, %dwv = nsa.compress_grad %dvc, %v weights(%w)
      {block = 32, stride = 16, pool = #nsa.pool<linear>}
      : (tensor<2x?x2x32xf32>, tensor<2x?x2x32xbf16>, tensor<2x32xf32>)
      -> (tensor<2x?x2x32xf32>, tensor<2x32xf32>)
  return
}

// CHECK-LABEL: func.func @train
// CHECK: nsa.sparse_attention %{{.+}} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>) -> (tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x2x4xi32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>)
// CHECK: nsa.sparse_attention_grad %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} saved(%{{[a-z0-9_#]+}}, %{{[a-z0-9_#]+}}, %{{[a-z0-9_#]+}}, %{{[a-z0-9_#]+}}, %{{[a-z0-9_#]+}}, %{{[a-z0-9_#]+}}, %{{[a-z0-9_#]+}})
func.func @train(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8x32xbf16>) {
  %o, %oc, %lc, %idx, %os, %ls, %ow, %lw = nsa.sparse_attention %q, %k, %v, %g
      {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>}
      : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>) -> (tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x2x4xi32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>)
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do
      saved(%oc, %lc, %idx, %os, %ls, %ow, %lw) {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>}
      : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x2x4xi32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>)
      -> (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}
