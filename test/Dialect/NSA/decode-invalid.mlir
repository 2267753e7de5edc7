// RUN: nsa-opt %s -split-input-file -verify-diagnostics

// One case per diagnostic of the decoding ops and of kv_lens (docs/Spec.md
// section 12); the titles name the constraint ids.

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c11: Nc(Lmax) compressed rows
func.func @f(%q: tensor<4x1x64x192xbf16>, %k: tensor<4x1024x4x192xbf16>, %v: tensor<4x1024x4x128xbf16>, %kc: tensor<4x62x4x192xbf16>, %vc: tensor<4x62x4x128xbf16>, %g: tensor<4x1x64x3xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{expects the compressed key cache of shape [B, Nc(Lmax), H, Dqk] = [4, 63, 4, 192], found [4, 62, 4, 192]}}
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g kv_lens(%lens) {config = #cfg} : (tensor<4x1x64x192xbf16>, tensor<4x1024x4x192xbf16>, tensor<4x1024x4x128xbf16>, tensor<4x62x4x192xbf16>, tensor<4x62x4x128xbf16>, tensor<4x1x64x3xbf16>, tensor<4xi32>) -> tensor<4x1x64x128xbf16>
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c19: the cache holds the query tokens
func.func @f(%q: tensor<4x8x64x192xbf16>, %k: tensor<4x4x4x192xbf16>, %v: tensor<4x4x4x128xbf16>, %kc: tensor<4x0x4x192xbf16>, %vc: tensor<4x0x4x128xbf16>, %g: tensor<4x8x64x3xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{expects the key cache to hold at least the T = 8 query tokens, found Lmax = 4}}
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g kv_lens(%lens) {config = #cfg} : (tensor<4x8x64x192xbf16>, tensor<4x4x4x192xbf16>, tensor<4x4x4x128xbf16>, tensor<4x0x4x192xbf16>, tensor<4x0x4x128xbf16>, tensor<4x8x64x3xbf16>, tensor<4xi32>) -> tensor<4x8x64x128xbf16>
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c19: kv_lens [B] i32
func.func @f(%q: tensor<4x1x64x192xbf16>, %k: tensor<4x1024x4x192xbf16>, %v: tensor<4x1024x4x128xbf16>, %kc: tensor<4x63x4x192xbf16>, %vc: tensor<4x63x4x128xbf16>, %g: tensor<4x1x64x3xbf16>, %lens: tensor<3xi32>) {
  // expected-error @+1 {{expects kv_lens of shape [B] = [4], found [3]}}
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g kv_lens(%lens) {config = #cfg} : (tensor<4x1x64x192xbf16>, tensor<4x1024x4x192xbf16>, tensor<4x1024x4x128xbf16>, tensor<4x63x4x192xbf16>, tensor<4x63x4x128xbf16>, tensor<4x1x64x3xbf16>, tensor<3xi32>) -> tensor<4x1x64x128xbf16>
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c19: kv_lens i32
func.func @f(%q: tensor<4x1x64x192xbf16>, %k: tensor<4x1024x4x192xbf16>, %v: tensor<4x1024x4x128xbf16>, %kc: tensor<4x63x4x192xbf16>, %vc: tensor<4x63x4x128xbf16>, %g: tensor<4x1x64x3xbf16>, %lens: tensor<4xi64>) {
  // expected-error @+1 {{expects kv_lens element type 'i32', found 'i64'}}
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g kv_lens(%lens) {config = #cfg} : (tensor<4x1x64x192xbf16>, tensor<4x1024x4x192xbf16>, tensor<4x1024x4x128xbf16>, tensor<4x63x4x192xbf16>, tensor<4x63x4x128xbf16>, tensor<4x1x64x3xbf16>, tensor<4xi64>) -> tensor<4x1x64x128xbf16>
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c6: compressed cache head dim
func.func @f(%q: tensor<4x1x64x192xbf16>, %k: tensor<4x1024x4x192xbf16>, %v: tensor<4x1024x4x128xbf16>, %kc: tensor<4x63x4x128xbf16>, %vc: tensor<4x63x4x128xbf16>, %g: tensor<4x1x64x3xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{expects the compressed key cache of shape [B, Nc(Lmax), H, Dqk] = [4, 63, 4, 192], found [4, 63, 4, 128]}}
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g kv_lens(%lens) {config = #cfg} : (tensor<4x1x64x192xbf16>, tensor<4x1024x4x192xbf16>, tensor<4x1024x4x128xbf16>, tensor<4x63x4x128xbf16>, tensor<4x63x4x128xbf16>, tensor<4x1x64x3xbf16>, tensor<4xi32>) -> tensor<4x1x64x128xbf16>
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c19: kv_lens and cu_seqlens
func.func @f(%q: tensor<1x3x8x64xf32>, %k: tensor<1x100x2x64xf32>, %v: tensor<1x100x2x32xf32>, %cu: tensor<2xi32>, %lens: tensor<1xi32>) {
  // expected-error @+1 {{takes kv_lens (decoding) or cu_seqlens (packed), not both}}
  %ow, %lw = nsa.window_attention %q, %k, %v cu_seqlens(%cu) kv_lens(%lens) {window = 64, scale = 0.125 : f32} : (tensor<1x3x8x64xf32>, tensor<1x100x2x64xf32>, tensor<1x100x2x32xf32>, tensor<2xi32>, tensor<1xi32>) -> (tensor<1x3x8x32xf32>, tensor<1x3x8xf32>)
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c3: without kv_lens the keys are the query's tokens
func.func @f(%q: tensor<1x3x8x64xf32>, %k: tensor<1x100x2x64xf32>, %v: tensor<1x100x2x32xf32>) {
  // expected-error @+1 {{expects key of shape [B, T, H, Dqk] = [1, 3, 2, 64], found [1, 100, 2, 64]}}
  %ow, %lw = nsa.window_attention %q, %k, %v {window = 64, scale = 0.125 : f32} : (tensor<1x3x8x64xf32>, tensor<1x100x2x64xf32>, tensor<1x100x2x32xf32>) -> (tensor<1x3x8x32xf32>, tensor<1x3x8xf32>)
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c11: compress_append's compressed cache has Nc(Lmax) rows
func.func @f(%k: tensor<4x1024x4x192xbf16>, %kc: tensor<4x64x4x192xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{expects the compressed cache of shape [B, Nc(Lmax), H, D] = [4, 63, 4, 192], found [4, 64, 4, 192]}}
  %r = nsa.compress_append %k, %kc kv_lens(%lens) {block = 32, stride = 16, pool = #nsa.pool<mean>, appended = 1} : (tensor<4x1024x4x192xbf16>, tensor<4x64x4x192xbf16>, tensor<4xi32>) -> tensor<4x64x4x192xbf16>
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c20: compress_append's result is the cache's type
func.func @f(%k: tensor<4x1024x4x192xbf16>, %kc: tensor<4x63x4x192xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{expects the result to have the compressed cache's type 'tensor<4x63x4x192xbf16>', found 'tensor<4x?x4x192xbf16>'}}
  %r = nsa.compress_append %k, %kc kv_lens(%lens) {block = 32, stride = 16, pool = #nsa.pool<mean>, appended = 1} : (tensor<4x1024x4x192xbf16>, tensor<4x63x4x192xbf16>, tensor<4xi32>) -> tensor<4x?x4x192xbf16>
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// op_c14: compress_append's weights
func.func @f(%k: tensor<4x1024x4x192xbf16>, %kc: tensor<4x63x4x192xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{pool linear requires weights}}
  %r = nsa.compress_append %k, %kc kv_lens(%lens) {block = 32, stride = 16, pool = #nsa.pool<linear>, appended = 1} : (tensor<4x1024x4x192xbf16>, tensor<4x63x4x192xbf16>, tensor<4xi32>) -> tensor<4x63x4x192xbf16>
  return
}
// -----

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>
// appended > 0
func.func @f(%k: tensor<4x1024x4x192xbf16>, %kc: tensor<4x63x4x192xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{attribute 'appended' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  %r = nsa.compress_append %k, %kc kv_lens(%lens) {block = 32, stride = 16, pool = #nsa.pool<mean>, appended = 0} : (tensor<4x1024x4x192xbf16>, tensor<4x63x4x192xbf16>, tensor<4xi32>) -> tensor<4x63x4x192xbf16>
  return
}

// -----

// op_c1: compress_append's compressed cache is rank 4
func.func @f(%k: tensor<4x1024x4x192xbf16>, %kc: tensor<63xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{expects the compressed cache to be a rank-4 tensor [B, Nc(Lmax), H, D], found 'tensor<63xbf16>'}}
  %r = nsa.compress_append %k, %kc kv_lens(%lens) {block = 32, stride = 16, pool = #nsa.pool<mean>, appended = 1} : (tensor<4x1024x4x192xbf16>, tensor<63xbf16>, tensor<4xi32>) -> tensor<63xbf16>
  return
}

// -----

// op_c1: the decode op's compressed cache is rank 4
func.func @f(%q: tensor<4x1x64x192xbf16>, %k: tensor<4x1024x4x192xbf16>, %v: tensor<4x1024x4x128xbf16>, %kc: tensor<63xbf16>, %vc: tensor<4x63x4x128xbf16>, %g: tensor<4x1x64x3xbf16>, %lens: tensor<4xi32>) {
  // expected-error @+1 {{expects the compressed key cache of shape [B, Nc(Lmax), H, Dqk] = [4, 63, 4, 192], found [63]}}
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g kv_lens(%lens) {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>} : (tensor<4x1x64x192xbf16>, tensor<4x1024x4x192xbf16>, tensor<4x1024x4x128xbf16>, tensor<63xbf16>, tensor<4x63x4x128xbf16>, tensor<4x1x64x3xbf16>, tensor<4xi32>) -> tensor<4x1x64x128xbf16>
  return
}
