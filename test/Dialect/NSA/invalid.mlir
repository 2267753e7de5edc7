// RUN: nsa-opt %s -split-input-file -verify-diagnostics

// One case per verifier diagnostic; the titles name the constraint ids of
// docs/Spec.md ("Constraints").

// backbone_c1
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+2 {{backbone parameters must be non-negative, found initial = -1, local = 2, log_levels = 0, hub_stride = 0}}
  // expected-error @+1 {{failed to parse NSA_ConfigAttr parameter}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = -1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// backbone_c2
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+2 {{log_levels must be at most 40, found 41}}
  // expected-error @+1 {{failed to parse NSA_ConfigAttr parameter}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 60, window = 64, backbone = <log_levels = 41>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// backbone_c3
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+2 {{backbone blocks must be non-negative and strictly increasing, found [4, 2]}}
  // expected-error @+1 {{failed to parse NSA_ConfigAttr parameter}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <blocks = [4, 2]>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c7: hubs need a length
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{hub blocks (hub_stride = 8) grow with the sequence: declare max_tokens}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <hub_stride = 8>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c7: negative bounds
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{max_tokens and max_hops must be non-negative, found -1 and 0}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <>, max_tokens = -1>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c5: hub count at max_tokens
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{num_selected (n = 4) must be at least the number of forced blocks (9)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <local = 1, hub_stride = 8>, max_tokens = 4096>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c8
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{max_hops needs max_tokens, the length at which the bound holds}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <>, max_hops = 3>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c9: bound exceeded
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{the backbone and window need 129 hops at T = 65536 (from the first token of block 1 to block 1023), more than max_hops = 20}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>, max_tokens = 65536, max_hops = 20>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c9: unreachable
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{the backbone and window need unboundedly many hops (some later token is unreachable) at T = 100 (from the first token of block 0 to block 0), more than max_hops = 5}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 1, backbone = <>, max_tokens = 100, max_hops = 5>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c1: block sizes
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{block sizes must be positive, found cmp_block = 32, cmp_stride = 0, slc_block = 64, num_selected = 4}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 0, slc_block = 64, num_selected = 4, window = 64, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c1: window
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{window must be positive, found 0}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 0, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c2
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{cmp_stride (d = 12) must divide cmp_block (l = 32)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 12, slc_block = 48, num_selected = 4, window = 64, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c3
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{cmp_stride (d = 16) must divide slc_block (l' = 72)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 72, num_selected = 4, window = 64, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c4
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{cmp_block (l = 64) must not exceed slc_block (l' = 32)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 64, cmp_stride = 16, slc_block = 32, num_selected = 4, window = 64, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c5
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{num_selected (n = 2) must be at least the number of forced blocks (3)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 2, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c6: type
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{scale must be an f32 attribute, found 'f64'}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, scale = 0.5 : f64, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// config_c6: value
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{scale must be positive and finite, found -5.000000e-01}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, scale = -0.5 : f32, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c1: rank
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects key to be a rank-4 tensor [B, T, H, Dqk], found 'tensor<128x2x64xbf16>'}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c2: query type
func.func @f(%q: tensor<1x128x8x64xi8>, %k: tensor<1x128x2x64xi8>, %v: tensor<1x128x2x32xi8>, %g: tensor<1x128x8x3xi8>) {
  // expected-error @+1 {{expects query element type f16, bf16 or f32, found 'i8'}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xi8>, tensor<1x128x2x64xi8>, tensor<1x128x2x32xi8>, tensor<1x128x8x3xi8>) -> tensor<1x128x8x32xi8>
  return
}

// -----

// op_c2: key type
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects key element type 'bf16', found 'f16'}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c7: positive sizes
func.func @f(%q: tensor<1x128x0x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects query to have positive sizes, found [1, 128, 0, 64]}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x0x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c3: token count
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x100x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects key of shape [B, T, H, Dqk] = [1, 128, 2, 64], found [1, 100, 2, 64]}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x100x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c6: Dqk
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x48xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects key of shape [B, T, H, Dqk] = [1, 128, 2, 64], found [1, 128, 2, 48]}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x48xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c5: KV heads
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x4x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects value of shape [B, T, H, Dv] = [1, 128, 2, 32], found [1, 128, 4, 32]}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x4x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c4: GQA grouping
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x3x64xbf16>, %v: tensor<1x128x3x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects the query head count (HQ = 8) to be a multiple of the KV head count (H = 3)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x3x64xbf16>, tensor<1x128x3x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c8: output shape
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects the output of shape [B, T, HQ, Dv] = [1, 128, 8, 32], found [1, 128, 8, 64]}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x64xbf16>
  return
}

// -----

// op_c8: output type
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{expects the output element type 'bf16', found 'f32'}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xf32>
  return
}

// -----

// op_c13: gates shape
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x2xbf16>) {
  // expected-error @+1 {{expects gates of shape [B, T, HQ, 3] = [1, 128, 8, 3], found [1, 128, 8, 2]}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x2xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c13: gates type
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xf16>) {
  // expected-error @+1 {{expects gates element type 'bf16' or f32, found 'f16'}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c10: cu_seqlens type
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>, %cu: tensor<3xi64>) {
  // expected-error @+1 {{expects cu_seqlens element type 'i32', found 'i64'}}
  %o = nsa.sparse_attention %q, %k, %v, %g cu_seqlens(%cu) {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>, tensor<3xi64>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c10: cu_seqlens rank
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>, %cu: tensor<1x3xi32>) {
  // expected-error @+1 {{expects cu_seqlens to be a rank-1 tensor [S + 1], found 'tensor<1x3xi32>'}}
  %o = nsa.sparse_attention %q, %k, %v, %g cu_seqlens(%cu) {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>, tensor<1x3xi32>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c10: cu_seqlens size
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>, %cu: tensor<1xi32>) {
  // expected-error @+1 {{expects cu_seqlens to hold at least 2 offsets, found 1}}
  %o = nsa.sparse_attention %q, %k, %v, %g cu_seqlens(%cu) {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>, tensor<1xi32>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c10: packed batch
func.func @f(%q: tensor<2x128x8x64xbf16>, %k: tensor<2x128x2x64xbf16>, %v: tensor<2x128x2x32xbf16>, %g: tensor<2x128x8x3xbf16>, %cu: tensor<3xi32>) {
  // expected-error @+1 {{expects batch size 1 with cu_seqlens (packed sequences), found 2}}
  %o = nsa.sparse_attention %q, %k, %v, %g cu_seqlens(%cu) {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<2x128x8x64xbf16>, tensor<2x128x2x64xbf16>, tensor<2x128x2x32xbf16>, tensor<2x128x8x3xbf16>, tensor<3xi32>) -> tensor<2x128x8x32xbf16>
  return
}

// -----

// op_c14: linear pool needs weights
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) {
  // expected-error @+1 {{pool linear requires cmp_weights}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, pool = linear, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c14: mean pool takes none
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>, %w: tensor<2x2x32xf32>) {
  // expected-error @+1 {{pool mean takes no cmp_weights}}
  %o = nsa.sparse_attention %q, %k, %v, %g cmp_weights(%w) {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>, tensor<2x2x32xf32>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c14: weights shape
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>, %w: tensor<2x2x16xf32>) {
  // expected-error @+1 {{expects cmp_weights of shape [2, H, l] = [2, 2, 32], found [2, 2, 16]}}
  %o = nsa.sparse_attention %q, %k, %v, %g cmp_weights(%w) {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, pool = linear, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>, tensor<2x2x16xf32>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c14: weights type
func.func @f(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>, %w: tensor<2x2x32xbf16>) {
  // expected-error @+1 {{expects cmp_weights element type 'f32', found 'bf16'}}
  %o = nsa.sparse_attention %q, %k, %v, %g cmp_weights(%w) {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, pool = linear, backbone = <>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>, tensor<2x2x32xbf16>) -> tensor<1x128x8x32xbf16>
  return
}

// -----

// op_c11: compress result rows
func.func @f(%k: tensor<2x1000x2x64xf32>) {
  // expected-error @+1 {{expects the result of shape [B, Nc, H, D] = [2, 61, 2, 64], found [2, 62, 2, 64]}}
  %kc = nsa.compress %k {block = 32, stride = 16, pool = #nsa.pool<mean>} : (tensor<2x1000x2x64xf32>) -> tensor<2x62x2x64xf32>
  return
}

// -----

// op_c11: packed compress rows
func.func @f(%k: tensor<1x1000x2x64xf32>, %cu: tensor<3xi32>) {
  // expected-error @+1 {{expects the result of shape [B, Nc, H, D] = [1, 62, 2, 64], found [1, 61, 2, 64]}}
  %kc = nsa.compress %k cu_seqlens(%cu) {block = 32, stride = 16, pool = #nsa.pool<mean>} : (tensor<1x1000x2x64xf32>, tensor<3xi32>) -> tensor<1x61x2x64xf32>
  return
}

// -----

// op_c2: compress input
func.func @f(%k: tensor<2x1000x2x64xi32>) {
  // expected-error @+1 {{expects input element type f16, bf16 or f32, found 'i32'}}
  %kc = nsa.compress %k {block = 32, stride = 16, pool = #nsa.pool<mean>} : (tensor<2x1000x2x64xi32>) -> tensor<2x61x2x64xi32>
  return
}

// -----

// op_c14: compress weights
func.func @f(%k: tensor<2x1000x2x64xf32>, %w: tensor<4x32xf32>) {
  // expected-error @+1 {{expects weights of shape [H, l] = [2, 32], found [4, 32]}}
  %kc = nsa.compress %k weights(%w) {block = 32, stride = 16, pool = #nsa.pool<linear>} : (tensor<2x1000x2x64xf32>, tensor<4x32xf32>) -> tensor<2x61x2x64xf32>
  return
}

// -----

// config_c2: compress stride
func.func @f(%k: tensor<2x1000x2x64xf32>) {
  // expected-error @+1 {{cmp_stride (d = 24) must divide cmp_block (l = 32)}}
  %kc = nsa.compress %k {block = 32, stride = 24, pool = #nsa.pool<mean>} : (tensor<2x1000x2x64xf32>) -> tensor<2x40x2x64xf32>
  return
}

// -----

// ODS: positive block attribute
func.func @f(%k: tensor<2x1000x2x64xf32>) {
  // expected-error @+1 {{attribute 'block' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  %kc = nsa.compress %k {block = 0, stride = 16, pool = #nsa.pool<mean>} : (tensor<2x1000x2x64xf32>) -> tensor<2x61x2x64xf32>
  return
}

// -----

// op_c11: compressed attention rows
func.func @f(%q: tensor<1x100x8x64xf32>, %kc: tensor<1x6x2x64xf32>) {
  // expected-error @+1 {{expects 5 compressed rows for T = 100 (l = 32, d = 16), found 6}}
  %o, %lse = nsa.compressed_attention %q, %kc, %kc {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<1x100x8x64xf32>, tensor<1x6x2x64xf32>, tensor<1x6x2x64xf32>) -> (tensor<1x100x8x64xf32>, tensor<1x100x8xf32>)
  return
}

// -----

// op_c9: lse type
func.func @f(%q: tensor<1x100x8x64xf32>, %kc: tensor<1x5x2x64xf32>) {
  // expected-error @+1 {{expects lse element type 'f32', found 'bf16'}}
  %o, %lse = nsa.compressed_attention %q, %kc, %kc {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<1x100x8x64xf32>, tensor<1x5x2x64xf32>, tensor<1x5x2x64xf32>) -> (tensor<1x100x8x64xf32>, tensor<1x100x8xbf16>)
  return
}

// -----

// op_c9: lse shape
func.func @f(%q: tensor<1x100x8x64xf32>, %kc: tensor<1x5x2x64xf32>) {
  // expected-error @+1 {{expects lse of shape [B, T, HQ] = [1, 100, 8], found [1, 100, 2]}}
  %o, %lse = nsa.compressed_attention %q, %kc, %kc {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<1x100x8x64xf32>, tensor<1x5x2x64xf32>, tensor<1x5x2x64xf32>) -> (tensor<1x100x8x64xf32>, tensor<1x100x2xf32>)
  return
}

// -----

// config_c6: branch scale
func.func @f(%q: tensor<1x100x8x64xf32>, %k: tensor<1x100x2x64xf32>) {
  // expected-error @+1 {{scale must be positive and finite, found 0.000000e+00}}
  %o, %lse = nsa.window_attention %q, %k, %k {window = 16, scale = 0.0 : f32}
      : (tensor<1x100x8x64xf32>, tensor<1x100x2x64xf32>, tensor<1x100x2x64xf32>) -> (tensor<1x100x8x64xf32>, tensor<1x100x8xf32>)
  return
}

// -----

// op_c12: selected count
func.func @f(%q: tensor<1x100x8x64xf32>, %kc: tensor<1x5x2x64xf32>, %lse: tensor<1x100x8xf32>) {
  // expected-error @+1 {{expects the indices of shape [B, T, H, n] = [1, 100, 2, 16], found [1, 100, 2, 8]}}
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>}
      : (tensor<1x100x8x64xf32>, tensor<1x5x2x64xf32>, tensor<1x100x8xf32>) -> tensor<1x100x2x8xi32>
  return
}

// -----

// op_c12: index type
func.func @f(%q: tensor<1x100x8x64xf32>, %kc: tensor<1x5x2x64xf32>, %lse: tensor<1x100x8xf32>) {
  // expected-error @+1 {{expects the indices element type 'i32', found 'i64'}}
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>}
      : (tensor<1x100x8x64xf32>, tensor<1x5x2x64xf32>, tensor<1x100x8xf32>) -> tensor<1x100x2x16xi64>
  return
}

// -----

// config_c5: select_blocks forced blocks
func.func @f(%q: tensor<1x1000x8x64xf32>, %kc: tensor<1x61x2x64xf32>, %lse: tensor<1x1000x8xf32>) {
  // expected-error @+1 {{num_selected (n = 2) must be at least the number of forced blocks (4)}}
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 2, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 2, local = 2>}
      : (tensor<1x1000x8x64xf32>, tensor<1x61x2x64xf32>, tensor<1x1000x8xf32>) -> tensor<1x1000x2x2xi32>
  return
}

// -----

// config_c5 at select_blocks' max_tokens: with max_tokens = 64 (one block)
// the forced blocks of T = 1000 do not count, but max_tokens < 0 is refused.
func.func @f(%q: tensor<1x1000x8x64xf32>, %kc: tensor<1x61x2x64xf32>, %lse: tensor<1x1000x8xf32>) {
  // expected-error @+1 {{max_tokens must be non-negative, found -1}}
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 2, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 2, local = 2>, max_tokens = -1}
      : (tensor<1x1000x8x64xf32>, tensor<1x61x2x64xf32>, tensor<1x1000x8xf32>) -> tensor<1x1000x2x2xi32>
  return
}

// -----

// op_c12: selected_attention indices
func.func @f(%q: tensor<1x100x8x64xf32>, %k: tensor<1x100x2x64xf32>, %idx: tensor<1x100x8x16xi32>) {
  // expected-error @+1 {{expects indices of shape [B, T, H, n] = [1, 100, 2, ?], found [1, 100, 8, 16]}}
  %o, %lse = nsa.selected_attention %q, %k, %k, %idx {block = 64, scale = 0.125 : f32}
      : (tensor<1x100x8x64xf32>, tensor<1x100x2x64xf32>, tensor<1x100x2x64xf32>, tensor<1x100x8x16xi32>) -> (tensor<1x100x8x64xf32>, tensor<1x100x8xf32>)
  return
}

// -----

// op_c15: combine branch shapes
func.func @f(%a: tensor<1x100x8x64xf32>, %b: tensor<1x100x8x32xf32>, %g: tensor<1x100x8x3xf32>) {
  // expected-error @+1 {{expects the selected output of shape [B, T, HQ, Dv] = [1, 100, 8, 64], found [1, 100, 8, 32]}}
  %o = nsa.combine %a, %b, %a, %g : (tensor<1x100x8x64xf32>, tensor<1x100x8x32xf32>, tensor<1x100x8x64xf32>, tensor<1x100x8x3xf32>) -> tensor<1x100x8x64xf32>
  return
}

// -----

// op_c15: combine branch types
func.func @f(%a: tensor<1x100x8x64xf32>, %b: tensor<1x100x8x64xbf16>, %g: tensor<1x100x8x3xf32>) {
  // expected-error @+1 {{expects the window output element type 'f32', found 'bf16'}}
  %o = nsa.combine %a, %a, %b, %g : (tensor<1x100x8x64xf32>, tensor<1x100x8x64xf32>, tensor<1x100x8x64xbf16>, tensor<1x100x8x3xf32>) -> tensor<1x100x8x64xf32>
  return
}

// -----

// op_c16: the layer gradient's grad is [B, T, HQ, Dv]
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8x64xbf16>) {
  // expected-error @+1 {{expects the output of shape [B, T, HQ, Dv] = [1, 64, 8, 32], found [1, 64, 8, 64]}}
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8x64xbf16>) -> (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}

// -----

// op_c17: the layer gradient's results have their inputs' types
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8x32xbf16>) {
  // expected-error @+1 {{expects key_grad element type 'bf16', found 'f32'}}
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8x32xbf16>) -> (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xf32>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}

// -----

// op_c17: cmp_weights_grad exactly with cmp_weights
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8x32xbf16>, %w: tensor<2x2x16xf32>) {
  // expected-error @+1 {{expects cmp_weights_grad exactly when cmp_weights is given}}
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do cmp_weights(%w) {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, pool = linear, backbone = <initial = 1>>} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8x32xbf16>, tensor<2x2x16xf32>) -> (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}

// -----

// op_c16: combine_grad's grad agrees with the branch outputs
func.func @f(%o: tensor<1x64x8x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8x32xf32>) {
  // expected-error @+1 {{expects grad element type 'bf16', found 'f32'}}
  %a, %b, %c, %d = nsa.combine_grad %o, %o, %o, %g, %do : (tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8x32xf32>) -> (tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}

// -----

// op_c16: a grad of another rank is named, not refused silently
func.func @f(%o: tensor<1x64x8x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8xbf16>) {
  // expected-error @+1 {{expects grad to be a rank-4 tensor shaped as the compressed output, found rank 3}}
  %a, %b, %c, %d = nsa.combine_grad %o, %o, %o, %g, %do : (tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8xbf16>) -> (tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}

// -----

// op_c16: the same for an attention gradient op
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %o: tensor<1x64x8x32xbf16>, %lse: tensor<1x64x8xf32>, %do: tensor<1x64x8xbf16>) {
  // expected-error @+1 {{to be a rank-4 tensor shaped as}}
  %dq, %dk, %dv = nsa.window_attention_grad %q, %k, %v, %o, %lse, %do {window = 16, scale = 0.125 : f32} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8xbf16>) -> (tensor<1x64x8x64xf32>, tensor<1x64x2x64xf32>, tensor<1x64x2x32xf32>)
  return
}

// -----

// op_c17: attention gradients are f32
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %o: tensor<1x64x8x32xbf16>, %lse: tensor<1x64x8xf32>) {
  // expected-error @+1 {{expects query_grad element type 'f32', found 'bf16'}}
  %dq, %dk, %dv = nsa.window_attention_grad %q, %k, %v, %o, %lse, %o {window = 16, scale = 0.125 : f32} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8x32xbf16>) -> (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xf32>, tensor<1x64x2x32xf32>)
  return
}

// -----

// op_c17: key and value gradients have the key and value shapes
func.func @f(%q: tensor<1x64x8x64xbf16>, %kc: tensor<1x3x2x64xbf16>, %vc: tensor<1x3x2x32xbf16>, %o: tensor<1x64x8x32xbf16>, %lse: tensor<1x64x8xf32>) {
  // expected-error @+1 {{expects key_grad of shape key = [1, 3, 2, 64], found [1, 64, 2, 64]}}
  %dq, %dk, %dv = nsa.compressed_attention_grad %q, %kc, %vc, %o, %lse, %o {block = 32, stride = 16, scale = 0.125 : f32} : (tensor<1x64x8x64xbf16>, tensor<1x3x2x64xbf16>, tensor<1x3x2x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8x32xbf16>) -> (tensor<1x64x8x64xf32>, tensor<1x64x2x64xf32>, tensor<1x3x2x32xf32>)
  return
}

// -----

// op_c9: the lse of a gradient op is [B, T, HQ] f32
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %idx: tensor<1x64x2x4xi32>, %o: tensor<1x64x8x32xbf16>, %lse: tensor<1x64x2xf32>) {
  // expected-error @+1 {{expects lse of shape [B, T, HQ] = [1, 64, 8], found [1, 64, 2]}}
  %dq, %dk, %dv = nsa.selected_attention_grad %q, %k, %v, %idx, %o, %lse, %o {block = 16, scale = 0.125 : f32} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x2x4xi32>, tensor<1x64x8x32xbf16>, tensor<1x64x2xf32>, tensor<1x64x8x32xbf16>) -> (tensor<1x64x8x64xf32>, tensor<1x64x2x64xf32>, tensor<1x64x2x32xf32>)
  return
}

// -----

// op_c16: compress_grad's grad has the compressed rows of its input
func.func @f(%dkc: tensor<1x4x2x64xf32>, %k: tensor<1x64x2x64xbf16>) {
  // expected-error @+1 {{expects grad of shape [B, Nc, H, D] = [1, 3, 2, 64], found [1, 4, 2, 64]}}
  %dk = nsa.compress_grad %dkc, %k {block = 32, stride = 16, pool = #nsa.pool<mean>} : (tensor<1x4x2x64xf32>, tensor<1x64x2x64xbf16>) -> tensor<1x64x2x64xf32>
  return
}

// -----

// op_c14: compress_grad's weights_grad exactly for the linear pool
func.func @f(%dkc: tensor<1x3x2x64xf32>, %k: tensor<1x64x2x64xbf16>, %w: tensor<2x32xf32>) {
  // expected-error @+1 {{expects weights_grad exactly for pool linear}}
  %dk = nsa.compress_grad %dkc, %k weights(%w) {block = 32, stride = 16, pool = #nsa.pool<linear>} : (tensor<1x3x2x64xf32>, tensor<1x64x2x64xbf16>, tensor<2x32xf32>) -> tensor<1x64x2x64xf32>
  return
}

// -----

// op_c18: the saved state is seven tensors
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>) {
  // expected-error @+1 {{expects the saved state to be 7 tensors (compressed output and lse, indices, selected output and lse, window output and lse), found 3}}
  %o, %s0, %s1, %s2 = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>) -> (tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x2x4xi32>)
  return
}

// -----

// op_c18: a saved branch output is [B, T, HQ, Dv]
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>) {
  // expected-error @+1 {{expects the saved window output of shape [B, T, HQ, Dv] = [1, 64, 8, 32], found [1, 64, 8, 64]}}
  %o, %s0, %s1, %s2, %s3, %s4, %s5, %s6 = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>) -> (tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x2x4xi32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8x64xbf16>, tensor<1x64x8xf32>)
  return
}

// -----

// op_c18: the saved indices have n = num_selected entries
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8x32xbf16>, %oc: tensor<1x64x8x32xbf16>, %lc: tensor<1x64x8xf32>, %idx: tensor<1x64x2x5xi32>, %os: tensor<1x64x8x32xbf16>, %ls: tensor<1x64x8xf32>, %ow: tensor<1x64x8x32xbf16>, %lw: tensor<1x64x8xf32>) {
  // expected-error @+1 {{expects the saved indices of shape [B, T, H, n] = [1, 64, 2, 4], found [1, 64, 2, 5]}}
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do saved(%oc, %lc, %idx, %os, %ls, %ow, %lw) {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x2x5xi32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>) -> (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}

// -----

// op_c18: a saved lse is f32
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8x32xbf16>, %oc: tensor<1x64x8x32xbf16>, %lc: tensor<1x64x8xf32>, %idx: tensor<1x64x2x4xi32>, %os: tensor<1x64x8x32xbf16>, %ls: tensor<1x64x8xbf16>, %ow: tensor<1x64x8x32xbf16>, %lw: tensor<1x64x8xf32>) {
  // expected-error @+1 {{expects the saved selected lse element type 'f32', found 'bf16'}}
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do saved(%oc, %lc, %idx, %os, %ls, %ow, %lw) {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x2x4xi32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>) -> (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}

// -----

// op_c18: the saved indices are i32
func.func @f(%q: tensor<1x64x8x64xbf16>, %k: tensor<1x64x2x64xbf16>, %v: tensor<1x64x2x32xbf16>, %g: tensor<1x64x8x3xbf16>, %do: tensor<1x64x8x32xbf16>, %oc: tensor<1x64x8x32xbf16>, %lc: tensor<1x64x8xf32>, %idx: tensor<1x64x2x4xi64>, %os: tensor<1x64x8x32xbf16>, %ls: tensor<1x64x8xf32>, %ow: tensor<1x64x8x32xbf16>, %lw: tensor<1x64x8xf32>) {
  // expected-error @+1 {{expects the saved indices element type 'i32', found 'i64'}}
  %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do saved(%oc, %lc, %idx, %os, %ls, %ow, %lw) {config = #nsa.config<cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4, window = 64, backbone = <initial = 1>>} : (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x2x4xi64>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>, tensor<1x64x8x32xbf16>, tensor<1x64x8xf32>) -> (tensor<1x64x8x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x32xbf16>, tensor<1x64x8x3xbf16>)
  return
}
