// RUN: nsa-opt %s --nsa-tile="query-tile=16 kv-tile=32" --split-input-file | FileCheck %s --implicit-check-not=nsa.

// The gradient ops under nsa-tile (lib/Transforms/TileGradients.cpp).

// Window attention's gradient: D = rowsum(grad * output) once; a forall
// over query tiles (16 tokens x G = 4 heads) accumulating dq over the key
// tiles the window reaches; a forall over key tiles of 32 tokens
// accumulating dk and dv over the query tiles that see them. Each writes
// only rows it owns.

// CHECK-LABEL: func.func @window_grad
// CHECK: %[[DELTA:.+]] = linalg.generic {{.+}}iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%{{.+}}, %{{.+}} : tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>) outs(%{{.+}} : tensor<2x?x8xf32>)
// CHECK: %[[DQ:.+]] = scf.forall (%{{.+}}, %{{.+}}, %{{.+}}) in (%{{.+}}, 2, %{{.+}}) shared_outs(%{{.+}} = %{{.+}}) -> (tensor<2x?x8x64xf32>)
// CHECK: tensor.extract_slice %[[DELTA]]
// CHECK: scf.for {{.+}} -> (tensor<64x64xf32>)
// The recomputed probabilities and scaled score gradients, rounded to bf16.
// CHECK: math.exp
// CHECK: arith.select
// CHECK: arith.subf
// CHECK: arith.truncf %{{.+}} : f32 to bf16
// CHECK: arith.truncf %{{.+}} : f32 to bf16
// dq += dS k.
// CHECK: linalg.generic {{.+}} ins(%{{.+}}, %{{.+}} : tensor<64x32xbf16>, tensor<32x64xbf16>) outs(%{{.+}} : tensor<64x64xf32>)
// CHECK: scf.forall.in_parallel
// CHECK: tensor.parallel_insert_slice %{{.+}} : tensor<?x4x64xf32> into tensor<2x?x8x64xf32>
// CHECK: %[[DKV:.+]]:2 = scf.forall (%{{.+}}, %{{.+}}, %{{.+}}) in (%{{.+}}, 2, %{{.+}}) shared_outs(%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) -> (tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>)
// CHECK: scf.for {{.+}} -> (tensor<32x64xf32>, tensor<32x32xf32>)
// dk += dS^T q and dv += P^T grad.
// CHECK: linalg.generic {indexing_maps = [#[[TA:.+]], #{{.+}}, #{{.+}}], {{.+}} ins(%{{.+}}, %{{.+}} : tensor<64x32xbf16>, tensor<64x64xbf16>) outs(%{{.+}} : tensor<32x64xf32>)
// CHECK: linalg.generic {indexing_maps = [#[[TA]], #{{.+}}, #{{.+}}], {{.+}} ins(%{{.+}}, %{{.+}} : tensor<64x32xbf16>, tensor<64x32xbf16>) outs(%{{.+}} : tensor<32x32xf32>)
// CHECK: scf.forall.in_parallel
// CHECK: tensor.parallel_insert_slice %{{.+}} : tensor<?x1x64xf32> into tensor<2x?x2x64xf32>
// CHECK: tensor.parallel_insert_slice %{{.+}} : tensor<?x1x32xf32> into tensor<2x?x2x32xf32>
// CHECK: return %[[DQ]], %[[DKV]]#0, %[[DKV]]#1
func.func @window_grad(%q: tensor<2x?x8x64xbf16>, %k: tensor<2x?x2x64xbf16>,
                       %v: tensor<2x?x2x32xbf16>, %o: tensor<2x?x8x32xbf16>,
                       %lse: tensor<2x?x8xf32>, %do: tensor<2x?x8x32xbf16>)
    -> (tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>) {
  %dq, %dk, %dv = nsa.window_attention_grad %q, %k, %v, %o, %lse, %do
      {window = 128, scale = 0.125 : f32}
      : (tensor<2x?x8x64xbf16>, tensor<2x?x2x64xbf16>, tensor<2x?x2x32xbf16>,
         tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>, tensor<2x?x8x32xbf16>)
      -> (tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>)
  return %dq, %dk, %dv : tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>
}

// -----

// Selected attention's gradient: key tiles are selection blocks of 64
// tokens; per pair of tiles, a flag per token says whether its index row
// lists the block, and pairs without a flag are skipped.

// CHECK-LABEL: func.func @selected_grad
// CHECK: scf.forall
// CHECK: scf.for
// CHECK: tensor.extract_slice %{{.+}} : tensor<1x?x2x16xi32> to tensor<?x16xi32>
// CHECK: arith.cmpi eq
// CHECK: arith.ori
// CHECK: %[[ANY:.+]] = tensor.extract %{{.+}}[] : tensor<i1>
// CHECK: scf.if %[[ANY]] -> (tensor<64x64xf32>)
// CHECK: tensor.extract %{{.+}}[%{{.+}}] : tensor<16xi1>
// CHECK: scf.forall
// CHECK: scf.for {{.+}} -> (tensor<64x64xf32>, tensor<64x32xf32>)
// CHECK: scf.if %{{.+}} -> (tensor<64x64xf32>, tensor<64x32xf32>)
func.func @selected_grad(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>,
                         %v: tensor<1x?x2x32xbf16>, %idx: tensor<1x?x2x16xi32>,
                         %o: tensor<1x?x8x32xbf16>, %lse: tensor<1x?x8xf32>,
                         %do: tensor<1x?x8x32xbf16>)
    -> (tensor<1x?x8x64xf32>, tensor<1x?x2x64xf32>, tensor<1x?x2x32xf32>) {
  %dq, %dk, %dv = nsa.selected_attention_grad %q, %k, %v, %idx, %o, %lse, %do
      {block = 64, scale = 0.125 : f32}
      : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>,
         tensor<1x?x2x16xi32>, tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>,
         tensor<1x?x8x32xbf16>)
      -> (tensor<1x?x8x64xf32>, tensor<1x?x2x64xf32>, tensor<1x?x2x32xf32>)
  return %dq, %dk, %dv : tensor<1x?x8x64xf32>, tensor<1x?x2x64xf32>, tensor<1x?x2x32xf32>
}

// -----

// The compression's gradient (l = 32, d = 16): a token tile of 32 tokens
// is covered by 32/16 + 32/16 - 1 = 3 blocks, loaded into one zero-padded
// tile; each token sums l/d = 2 of them. The learned weights' gradient is
// one iteration per KV head over every sequence's blocks.

// CHECK-DAG: #[[G:.+]] = affine_map<(d0, d1, d2, d3) -> (d0 - d3 + 1, d2)>
// CHECK-DAG: #[[W:.+]] = affine_map<(d0, d1, d2, d3) -> (d3, d1)>
// CHECK-DAG: #[[X:.+]] = affine_map<(d0, d1, d2) -> (d1 * 16 + d0, d2)>
// CHECK-LABEL: func.func @compress_grad
// CHECK: scf.forall (%{{.+}}, %{{.+}}, %{{.+}}) in (%{{.+}}, 2, %{{.+}}) shared_outs(%{{.+}} = %{{.+}}) -> (tensor<1x?x2x64xf32>)
// CHECK: tensor.insert_slice %{{.+}} into %{{.+}}[%{{.+}}, 0] [%{{.+}}, 64] [1, 1] : tensor<?x64xf32> into tensor<3x64xf32>
// CHECK: tensor.expand_shape %{{.+}} {{\[\[}}0, 1]] output_shape [2, 16] : tensor<32xf32> into tensor<2x16xf32>
// CHECK: linalg.generic {indexing_maps = [#[[G]], #[[W]], #{{.+}}], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%{{.+}}, %{{.+}} : tensor<3x64xf32>, tensor<2x16xf32>) outs(%{{.+}} : tensor<2x16x64xf32>)
// CHECK: scf.forall (%{{.+}}) in (2) shared_outs(%{{.+}} = %{{.+}}) -> (tensor<2x32xf32>)
// CHECK: scf.for
// CHECK: scf.for
// CHECK: linalg.generic {indexing_maps = [#[[X]], {{.+}}iterator_types = ["parallel", "reduction", "reduction"]}
// CHECK: tensor.parallel_insert_slice %{{.+}} into %{{.+}}[%{{.+}}, 0] [1, 32] [1, 1] : tensor<32xf32> into tensor<2x32xf32>
func.func @compress_grad(%dkc: tensor<1x?x2x64xf32>, %k: tensor<1x?x2x64xbf16>,
                         %w: tensor<2x32xf32>)
    -> (tensor<1x?x2x64xf32>, tensor<2x32xf32>) {
  %dk, %dw = nsa.compress_grad %dkc, %k weights(%w)
      {block = 32, stride = 16, pool = #nsa.pool<linear>}
      : (tensor<1x?x2x64xf32>, tensor<1x?x2x64xbf16>, tensor<2x32xf32>)
      -> (tensor<1x?x2x64xf32>, tensor<2x32xf32>)
  return %dk, %dw : tensor<1x?x2x64xf32>, tensor<2x32xf32>
}

// -----

// The gating's gradient: the branch gradients in one elementwise generic,
// the o_b . grad dots in one reduction, the gate gradients from them.

// CHECK-LABEL: func.func @combine_grad
// CHECK: linalg.generic {{.+}}iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%{{.+}} : tensor<1x?x8x32xbf16>, tensor<1x?x8x3xbf16>, tensor<1x?x8x3xbf16>, tensor<1x?x8x3xbf16>) outs({{.+}}) {
// CHECK: math.exp
// CHECK: linalg.generic {{.+}}iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
// CHECK: linalg.generic {{.+}}iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%{{.+}} : tensor<1x?x8x3xbf16>, tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>) outs(%{{.+}} : tensor<1x?x8x3xbf16>)
// CHECK: linalg.index 3
func.func @combine_grad(%o: tensor<1x?x8x32xbf16>, %g: tensor<1x?x8x3xbf16>,
                        %do: tensor<1x?x8x32xbf16>)
    -> (tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>,
        tensor<1x?x8x3xbf16>) {
  %a, %b, %c, %d = nsa.combine_grad %o, %o, %o, %g, %do
      : (tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>,
         tensor<1x?x8x3xbf16>, tensor<1x?x8x32xbf16>)
      -> (tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>,
          tensor<1x?x8x3xbf16>)
  return %a, %b, %c, %d : tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>,
      tensor<1x?x8x32xbf16>, tensor<1x?x8x3xbf16>
}
