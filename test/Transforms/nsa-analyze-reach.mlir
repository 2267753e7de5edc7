// RUN: nsa-opt %s --nsa-analyze-reach --split-input-file -verify-diagnostics | FileCheck %s
// RUN: nsa-opt %s --nsa-analyze-reach="seq-len=1048576" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=MILLION
// RUN: not nsa-opt %s --nsa-analyze-reach="seq-len=1099511627776" --split-input-file 2>&1 | FileCheck %s --check-prefix=HUGE
// HUGE: nsa-analyze-reach: the hop bound is computed for at most 32768 selection blocks, found 17179869184 at T = 1099511627776

// The paper's backbone (1 initial + 2 local blocks, w = 512) at T = 64k: the
// reach grows linearly with distance.

// CHECK-LABEL: func.func @paper
// CHECK: nsa.reach = #nsa.reach<seq_len = 65536, hops = 129, forced_blocks = 3, backbone_keys = 704>
// MILLION: nsa.reach = #nsa.reach<seq_len = 1048576, hops = 2052, forced_blocks = 3, backbone_keys = 704>
func.func @paper(%q: tensor<1x65536x4x64xbf16>, %k: tensor<1x65536x1x64xbf16>,
                 %v: tensor<1x65536x1x64xbf16>, %g: tensor<1x65536x4x3xbf16>) -> tensor<1x65536x4x64xbf16> {
  // expected-remark @+1 {{nsa-analyze-reach: worst case 129 hops at T = 65536 (from the first token of block 1 to block 1023); 3 forced blocks, 704 backbone + window keys per query}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16,
         slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>}
       : (tensor<1x65536x4x64xbf16>, tensor<1x65536x1x64xbf16>, tensor<1x65536x1x64xbf16>,
          tensor<1x65536x4x3xbf16>) -> tensor<1x65536x4x64xbf16>
  return %o : tensor<1x65536x4x64xbf16>
}

// -----

// Log-spaced blocks make it logarithmic; the length comes from max_tokens.

// CHECK-LABEL: func.func @log_spaced
// CHECK: nsa.reach = #nsa.reach<seq_len = 65536, hops = 8, forced_blocks = 12, backbone_keys = 1280>
func.func @log_spaced(%q: tensor<1x?x4x64xbf16>, %k: tensor<1x?x1x64xbf16>,
                      %v: tensor<1x?x1x64xbf16>, %g: tensor<1x?x4x3xbf16>) -> tensor<1x?x4x64xbf16> {
  // expected-remark @+1 {{worst case 8 hops at T = 65536}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16,
         slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2, log_levels = 15>,
         max_tokens = 65536, max_hops = 8>}
       : (tensor<1x?x4x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
          tensor<1x?x4x3xbf16>) -> tensor<1x?x4x64xbf16>
  return %o : tensor<1x?x4x64xbf16>
}

// -----

func.func @no_length(%q: tensor<1x?x4x64xbf16>, %k: tensor<1x?x1x64xbf16>,
                     %v: tensor<1x?x1x64xbf16>, %g: tensor<1x?x4x3xbf16>) -> tensor<1x?x4x64xbf16> {
  // expected-error @+1 {{nsa-analyze-reach: no sequence length: pass seq-len, declare max_tokens or use a static T}}
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 32, cmp_stride = 16,
         slc_block = 64, num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>}
       : (tensor<1x?x4x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
          tensor<1x?x4x3xbf16>) -> tensor<1x?x4x64xbf16>
  return %o : tensor<1x?x4x64xbf16>
}
