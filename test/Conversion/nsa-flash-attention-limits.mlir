// RUN: not nsa-opt %s --split-input-file --nsa-decompose --nsa-flash-attention="sm90=1" 2>&1 | FileCheck %s --check-prefix=DECODE
// RUN: not nsa-opt %s --split-input-file --nsa-flash-attention 2>&1 | FileCheck %s --check-prefix=DIRECT

// Bounds of nsa-flash-attention's code (docs/Spec.md section 13). The
// decoding kernels' block selection sorts each lane's share of the n best
// in registers, so its code grows as n squared: a step with more than 64
// selected blocks is left to the generic mapping with a remark instead of
// minutes of code generation (n = 1024 took 464 s to PTX).

#cfg = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 65, window = 64, backbone = <initial = 1, local = 1>>

// DECODE: remark: nsa-flash-attention: left to the generic mapping: decode: the block selection keeps at most 64 blocks on chip, found 65
func.func @decode(%q: tensor<2x3x4x32xbf16>, %k: tensor<2x300x2x32xbf16>, %v: tensor<2x300x2x16xbf16>,
                  %kc: tensor<2x17x2x32xbf16>, %vc: tensor<2x17x2x16xbf16>,
                  %g: tensor<2x3x4x3xbf16>, %lens: tensor<2xi32>) -> tensor<2x3x4x16xbf16> {
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g kv_lens(%lens) {config = #cfg}
     : (tensor<2x3x4x32xbf16>, tensor<2x300x2x32xbf16>, tensor<2x300x2x16xbf16>, tensor<2x17x2x32xbf16>,
        tensor<2x17x2x16xbf16>, tensor<2x3x4x3xbf16>, tensor<2xi32>) -> tensor<2x3x4x16xbf16>
  return %o : tensor<2x3x4x16xbf16>
}

// -----

// A branch op given to nsa-flash-attention directly (no nsa-decompose) is
// held to the same supported sizes.

// DIRECT: error: 'nsa.select_blocks' op num_selected = 2000 is above 1024
func.func @select(%q: tensor<1x100x8x64xbf16>, %kc: tensor<1x5x2x64xbf16>, %lse: tensor<1x100x8xf32>) -> tensor<1x100x2x2000xi32> {
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 2000, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>}
      : (tensor<1x100x8x64xbf16>, tensor<1x5x2x64xbf16>, tensor<1x100x8xf32>) -> tensor<1x100x2x2000xi32>
  return %idx : tensor<1x100x2x2000xi32>
}
