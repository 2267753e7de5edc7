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

// -----

// 2^29 + 1 local blocks with max_hops (found by scripts/fuzz.sh): the hop
// bound lists only the offsets below the block count (it listed 2^29).
// CHECK-LABEL: func.func @many_local
func.func @many_local(%q: tensor<2x65x8x16xf32>, %k: tensor<2x65x2x16xf32>, %v: tensor<2x65x2x8xf32>, %g: tensor<2x65x8x3xf32>) -> tensor<2x65x8x8xf32> {
  // CHECK: local = 536870913
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 6, window = 16, backbone = <initial = 8, local = 536870913, log_levels = 40, hub_stride = 20, blocks = [56]>, max_tokens = 62, max_hops = 36>} : (tensor<2x65x8x16xf32>, tensor<2x65x2x16xf32>, tensor<2x65x2x8xf32>, tensor<2x65x8x3xf32>) -> tensor<2x65x8x8xf32>
  return %o : tensor<2x65x8x8xf32>
}

// -----

// A selection block of 2^57 tokens and a window of 17 (found by
// scripts/fuzz.sh): with one block the search ends with the sequence.
// CHECK-LABEL: func.func @huge_block
func.func @huge_block(%q: tensor<1x?x4x16xbf16>, %k: tensor<1x?x1x16xbf16>, %v: tensor<1x?x1x16xbf16>, %g: tensor<1x?x4x3xbf16>) -> tensor<1x?x4x16xbf16> {
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 144115188075855871, cmp_stride = 144115188075855871, slc_block = 144115188075855871, num_selected = 144115188075855872, window = 17, backbone = <initial = 0, local = 0>, max_tokens = 15, max_hops = 1>} : (tensor<1x?x4x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x4x3xbf16>) -> tensor<1x?x4x16xbf16>
  return %o : tensor<1x?x4x16xbf16>
}

// -----

// Two blocks of 2^40 tokens and a window of 17: the search would take
// 2^36 hops, so max_hops is refused with a reason (at once: without the
// own block forced, the window alone fills a block, 16 tokens a hop; the
// 1M-input fuzz run found this input at 2.5 s in its instrumented build).
func.func @slow_window(%q: tensor<1x?x4x16xbf16>, %k: tensor<1x?x1x16xbf16>, %v: tensor<1x?x1x16xbf16>, %g: tensor<1x?x4x3xbf16>) -> tensor<1x?x4x16xbf16> {
  // expected-error @+1 {{max_hops: the hop bound at max_tokens = 2199023255552 (l' = 1099511627776, w = 17) is not computed: it takes more than 16777216 search steps (or T is above 2^60); declare a smaller max_tokens or drop max_hops}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 16, cmp_stride = 16, slc_block = 1099511627776, num_selected = 4, window = 17, backbone = <initial = 0, local = 0>, max_tokens = 2199023255552, max_hops = 100>} : (tensor<1x?x4x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x4x3xbf16>) -> tensor<1x?x4x16xbf16>
  return %o : tensor<1x?x4x16xbf16>
}

// -----

// Hubs with 30 log levels and explicit blocks up to max_tokens ~ 2^63
// (found by scripts/fuzz.sh: 1 s here, 14 s under the fuzzer's sanitizer):
// the forced-block scan's budget shrinks with the cost of each step.
func.func @hub_scan(%q: tensor<2x40x18x48xf32>, %k: tensor<2x40x2x48xf32>, %v: tensor<2x40x2x16xf32>, %g: tensor<2x40x18x3xf32>) -> tensor<2x40x18x16xf32> {
  // expected-error @+1 {{num_selected (n = 6) must be at least the number of forced blocks (14185212664269676)}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 6, window = 16, backbone = <initial = 17592186044416, local = 1, log_levels = 30, hub_stride = 37, blocks = [15, 34]>, max_tokens = 8387231323117468721, max_hops = 40>} : (tensor<2x40x18x48xf32>, tensor<2x40x2x48xf32>, tensor<2x40x2x16xf32>, tensor<2x40x18x3xf32>) -> tensor<2x40x18x16xf32>
  return %o : tensor<2x40x18x16xf32>
}

// -----

// l' = max_tokens = 2^62 + 1 with max_hops (found by scripts/fuzz.sh): the
// block count overflowed ((T + l' - 1) / l' < 0) and a vector of that size
// threw; now the count is exact and the hop bound refused.
func.func @overflow(%q: tensor<1x?x4x16xbf16>, %k: tensor<1x?x1x16xbf16>, %v: tensor<1x?x1x16xbf16>, %g: tensor<1x?x4x3xbf16>) -> tensor<1x?x4x16xbf16> {
  // expected-error @+1 {{max_hops: the hop bound at max_tokens = 4611686018427387905 (l' = 4611686018427387905, w = 4611686018427387905) is not computed}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 4611686018427387905, cmp_stride = 4611686018427387905, slc_block = 4611686018427387905, num_selected = 4611686018427387905, window = 4611686018427387905, backbone = <initial = 28, local = 0, blocks = [4611686018427387905]>, max_tokens = 4611686018427387905, max_hops = 22>} : (tensor<1x?x4x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x1x16xbf16>, tensor<1x?x4x3xbf16>) -> tensor<1x?x4x16xbf16>
  return %o : tensor<1x?x4x16xbf16>
}

// -----

// A window of 2^35 with max_hops at 16384 blocks (found by scripts/fuzz.sh):
// every active block updated every later one each hop, listing 2^28
// updates (6 GB). A window as long as the sequence is one hop; one hop's
// updates are merged per block.
// CHECK-LABEL: func.func @long_window
func.func @long_window(%q: tensor<1x65x8x16xf32>, %k: tensor<1x65x2x16xf32>, %v: tensor<1x65x2x8xf32>, %g: tensor<1x65x8x3xf32>) -> tensor<1x65x8x8xf32> {
  // CHECK: window = 34359738368
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 37, window = 34359738368, backbone = <initial = 1, local = 21, log_levels = 8, blocks = [42]>, max_tokens = 262143, max_hops = 8>} : (tensor<1x65x8x16xf32>, tensor<1x65x2x16xf32>, tensor<1x65x2x8xf32>, tensor<1x65x8x3xf32>) -> tensor<1x65x8x8xf32>
  return %o : tensor<1x65x8x8xf32>
}

// -----

// Hubs every block with max_hops at 16384 blocks (found by scripts/fuzz.sh):
// the last step of the hop bound was a double loop over source and target
// blocks (0.34 s here, 32 s under the fuzzer's coverage build); it now
// takes one range query per attractor that lowers the bound.
// CHECK-LABEL: func.func @hubs_everywhere
func.func @hubs_everywhere(%q: tensor<2x1x8x16xf32>, %k: tensor<2x1x2x16xf32>, %v: tensor<2x1x2x8xf32>, %g: tensor<2x1x8x3xf32>) -> tensor<2x1x8x8xf32> {
  // CHECK: hub_stride = 1
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 140737488355327, window = 16, backbone = <initial = 1, local = 65, log_levels = 1, hub_stride = 1, blocks = [48, 59, 262145]>, max_tokens = 262144, max_hops = 8>} : (tensor<2x1x8x16xf32>, tensor<2x1x2x16xf32>, tensor<2x1x2x8xf32>, tensor<2x1x8x3xf32>) -> tensor<2x1x8x8xf32>
  return %o : tensor<2x1x8x8xf32>
}
