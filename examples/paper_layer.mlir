// The NSA layer of the paper (Yuan et al., 2025, section 4.1): 64 query
// heads in 4 GQA groups, d_qk = 192, d_v = 128, compression l = 32, d = 16,
// selection l' = 64, n = 16 (1 initial + 2 local blocks always on), window
// w = 512, mean pooling, default scale 1/sqrt(192). Any sequence length.
//
// `scripts/demo.sh` compiles this file through every stage the project has.

#paper = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64,
                     num_selected = 16, window = 512,
                     backbone = <initial = 1, local = 2>>

func.func @nsa_layer(%q: tensor<1x?x64x192xbf16>, %k: tensor<1x?x4x192xbf16>,
                     %v: tensor<1x?x4x128xbf16>, %gates: tensor<1x?x64x3xbf16>)
    -> tensor<1x?x64x128xbf16> {
  %o = nsa.sparse_attention %q, %k, %v, %gates {config = #paper}
       : (tensor<1x?x64x192xbf16>, tensor<1x?x4x192xbf16>,
          tensor<1x?x4x128xbf16>, tensor<1x?x64x3xbf16>)
       -> tensor<1x?x64x128xbf16>
  return %o : tensor<1x?x64x128xbf16>
}
