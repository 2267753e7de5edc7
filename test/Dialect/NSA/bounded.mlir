// RUN: timeout 60 nsa-opt %s --split-input-file --verify-diagnostics | FileCheck %s

// Configs whose verification used to exhaust memory or time (issue 13): the
// forced-block bound is computed in closed form (docs/Spec.md 5.4), so each
// verifies at once, whatever the sizes.

// 2^31 - 1 initial blocks: the bound is 2^31 + 1, not a list of 2^31.
func.func @wide(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16> {
  // expected-error @+1 {{num_selected (n = 4) must be at least the number of forced blocks (2147483649)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 2147483647, local = 2>>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return %o : tensor<1x128x8x32xbf16>
}

// -----

// max_tokens = 2^62.
// CHECK-LABEL: func.func @long
func.func @long(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16> {
  // CHECK: max_tokens = 4611686018427387904
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>, max_tokens = 4611686018427387904>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return %o : tensor<1x128x8x32xbf16>
}

// -----

// A static T of 2^40 tokens.
// CHECK-LABEL: func.func @select
func.func @select(%q: tensor<1x1099511627776x16x64xbf16>, %kc: tensor<1x68719476735x1x64xbf16>, %lse: tensor<1x1099511627776x16xf32>) -> tensor<1x1099511627776x1x16xi32> {
  // CHECK: nsa.select_blocks
  %i = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>} : (tensor<1x1099511627776x16x64xbf16>, tensor<1x68719476735x1x64xbf16>, tensor<1x1099511627776x16xf32>) -> tensor<1x1099511627776x1x16xi32>
  return %i : tensor<1x1099511627776x1x16xi32>
}

// -----

// Hubs with max_tokens = 2^62: 2^36 hub blocks at the end, counted, not
// listed.
func.func @hubs(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16> {
  // expected-error @+1 {{num_selected (n = 4) must be at least the number of forced blocks (68719476738)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2, hub_stride = 1048576>, max_tokens = 4611686018427387904>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return %o : tensor<1x128x8x32xbf16>
}

// -----

// max_hops at max_tokens = 2^62: the hop bound's work grows with the square
// of the blocks, so it is refused with a reason, not attempted.
func.func @hops(%q: tensor<1x128x8x64xbf16>, %k: tensor<1x128x2x64xbf16>, %v: tensor<1x128x2x32xbf16>, %g: tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16> {
  // expected-error @+1 {{max_hops is checked for at most 32768 selection blocks, found 72057594037927936 at max_tokens = 4611686018427387904 (l' = 64)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 4, window = 64, backbone = <initial = 1, local = 2>, max_tokens = 4611686018427387904, max_hops = 3>} : (tensor<1x128x8x64xbf16>, tensor<1x128x2x64xbf16>, tensor<1x128x2x32xbf16>, tensor<1x128x8x3xbf16>) -> tensor<1x128x8x32xbf16>
  return %o : tensor<1x128x8x32xbf16>
}
