// RUN: nsa-opt %s --split-input-file --verify-diagnostics --nsa-decompose
// RUN: nsa-opt %s --split-input-file --verify-diagnostics --nsa-to-cpu
// RUN: nsa-opt %s --split-input-file --verify-diagnostics --nsa-tile

// Legal NSA beyond docs/Spec.md section 13 is refused by name before any IR
// is built (it used to overflow into "'linalg.fill' op unexpected result
// less than 0" or compile for minutes).

func.func @f(%q: tensor<1x?x4x16xf32>, %k: tensor<1x?x2x16xf32>, %v: tensor<1x?x2x16xf32>, %g: tensor<1x?x4x3xf32>) -> tensor<1x?x4x16xf32> {
  // expected-error @+1 {{'nsa.sparse_attention' op num_selected = 9223372036854775807 is above 1024, the most nsa's lowering supports (docs/Spec.md section 13)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 9223372036854775807, window = 16>}
     : (tensor<1x?x4x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x4x3xf32>) -> tensor<1x?x4x16xf32>
  return %o : tensor<1x?x4x16xf32>
}

// -----

func.func @f(%q: tensor<1x?x4x16xf32>, %k: tensor<1x?x2x16xf32>, %v: tensor<1x?x2x16xf32>, %g: tensor<1x?x4x3xf32>) -> tensor<1x?x4x16xf32> {
  // expected-error @+1 {{slc_block = 1099511627776 is above 4096}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 1099511627776, num_selected = 4, window = 16>}
     : (tensor<1x?x4x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x4x3xf32>) -> tensor<1x?x4x16xf32>
  return %o : tensor<1x?x4x16xf32>
}

// -----

func.func @f(%q: tensor<1x?x2048x16xf32>, %k: tensor<1x?x2x16xf32>, %v: tensor<1x?x2x16xf32>, %g: tensor<1x?x2048x3xf32>) -> tensor<1x?x2048x16xf32> {
  // expected-error @+1 {{the head count = 2048 is above 1024}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 4, window = 16>}
     : (tensor<1x?x2048x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x2048x3xf32>) -> tensor<1x?x2048x16xf32>
  return %o : tensor<1x?x2048x16xf32>
}

// -----

// A branch op written directly, as nsa-tile sees it.
func.func @f(%q: tensor<1x100x8x64xf32>, %kc: tensor<1x5x2x64xf32>, %lse: tensor<1x100x8xf32>) -> tensor<1x100x2x2000xi32> {
  // expected-error @+1 {{'nsa.select_blocks' op num_selected = 2000 is above 1024}}
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 2000, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>}
      : (tensor<1x100x8x64xf32>, tensor<1x5x2x64xf32>, tensor<1x100x8xf32>) -> tensor<1x100x2x2000xi32>
  return %idx : tensor<1x100x2x2000xi32>
}
