// RUN: nsa-opt %s --nsa-tile="query-tile=16 kv-tile=32" --split-input-file | FileCheck %s --implicit-check-not=nsa.
// RUN: not nsa-opt %s --nsa-tile="query-tile=-1" --split-input-file 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not nsa-opt %s --nsa-tile="query-tile=0 query-rows=0" --split-input-file 2>&1 | FileCheck %s --check-prefix=BADROWS
// RUN: nsa-opt %s --nsa-tile="query-tile=0 query-rows=32 kv-tile=32" --split-input-file | FileCheck %s --check-prefix=TILEROWS

// BAD: nsa-tile: query-tile must be non-negative and kv-tile positive, found -1 and 64
// BADROWS: nsa-tile: query-rows must be positive, found 0
// With query-tile 0, a tile has query-rows (token, head) rows: 8 tokens x 4
// heads for the window branch below.
// TILEROWS-LABEL: func.func @window
// TILEROWS: tensor.collapse_shape %{{.+}} {{\[\[}}0, 1], [2]] : tensor<8x4x72xbf16> into tensor<32x72xbf16>

// Window attention: a forall over (batch, KV head, query tile) whose tile is
// 16 tokens x G = 4 heads = 64 rows; a loop over only the key tiles the
// window reaches; online softmax; output and lse inserted per tile. A tile
// holds the rows that exist and zeros after them (only those are filled).
// Tiles whose rows are a multiple of 128 bytes get 16 bytes more per row
// (here 64 + 8 bf16), against shared-memory bank conflicts on the GPU.

// CHECK-LABEL: func.func @window
// CHECK: %[[OUT:.+]]:2 = scf.forall (%[[B:.+]], %[[H:.+]], %[[QT:.+]]) in (%{{.+}}, 2, %{{.+}}) shared_outs(%[[O:.+]] = %{{.+}}, %[[L:.+]] = %{{.+}}) -> (tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>)
// CHECK: %[[Q:.+]] = tensor.extract_slice %{{.+}}[%[[B]], %{{.+}}, %{{.+}}, 0] [1, %{{.+}}, 4, 64] [1, 1, 1, 1] : tensor<2x?x8x64xbf16> to tensor<?x4x64xbf16>
// CHECK: %[[ROWS:.+]] = tensor.insert_slice %[[Q]] into %{{.+}}[0, 0, 0] [%[[N:.+]], 4, 64] [1, 1, 1] : tensor<?x4x64xbf16> into tensor<16x4x72xbf16>
// CHECK: %[[REST:.+]] = tensor.extract_slice %[[ROWS]][%[[N]], 0, 0]
// CHECK: %[[ZEROS:.+]] = linalg.fill ins(%{{.+}} : bf16) outs(%[[REST]] : tensor<?x4x64xbf16>)
// CHECK: tensor.insert_slice %[[ZEROS]] into %[[ROWS]][%[[N]], 0, 0]
// CHECK: tensor.collapse_shape %{{.+}} {{\[\[}}0, 1], [2]] : tensor<16x4x72xbf16> into tensor<64x72xbf16>
// CHECK: tensor.extract_slice %{{.+}}[0, 0] [64, 64] [1, 1] : tensor<64x72xbf16> to tensor<64x64xbf16>
// CHECK: %[[STATE:.+]]:3 = scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%[[MAX:.+]] = %{{.+}}, %[[SUM:.+]] = %{{.+}}, %[[ACC:.+]] = %{{.+}}) -> (tensor<64xf32>, tensor<64xf32>, tensor<64x32xf32>)
// CHECK: tensor.extract_slice %{{.+}}[%[[B]], %{{.+}}, %[[H]], 0] [1, %{{.+}}, 1, 64]
// CHECK: linalg.generic {{.+}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%{{.+}}, %{{.+}} : tensor<64x64xbf16>, tensor<32x64xbf16>) outs(%{{.+}} : tensor<64x32xf32>)
// CHECK: linalg.index 0
// CHECK: arith.cmpi sle
// CHECK: math.exp
// CHECK: arith.truncf %{{.+}} : f32 to bf16
// CHECK: linalg.generic {{.+}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%{{.+}}, %{{.+}} : tensor<64x32xbf16>, tensor<32x32xbf16>) outs(%{{.+}} : tensor<64x32xf32>)
// CHECK: scf.yield
// CHECK: math.log
// CHECK: tensor.expand_shape %{{.+}} {{\[\[}}0, 1], [2]] output_shape [16, 4, 32] : tensor<64x32xbf16> into tensor<16x4x32xbf16>
// CHECK: scf.forall.in_parallel
// CHECK-NEXT: tensor.parallel_insert_slice %{{.+}} into %[[O]][%[[B]], %{{.+}}, %{{.+}}, 0] [1, %{{.+}}, 4, 32] [1, 1, 1, 1] : tensor<?x4x32xbf16> into tensor<2x?x8x32xbf16>
// CHECK-NEXT: tensor.parallel_insert_slice %{{.+}} into %[[L]][%[[B]], %{{.+}}, %{{.+}}] [1, %{{.+}}, 4] [1, 1, 1] : tensor<?x4xf32> into tensor<2x?x8xf32>
// CHECK: return %[[OUT]]#0, %[[OUT]]#1
func.func @window(%q: tensor<2x?x8x64xbf16>, %k: tensor<2x?x2x64xbf16>, %v: tensor<2x?x2x32xbf16>)
    -> (tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>) {
  %o, %lse = nsa.window_attention %q, %k, %v {window = 128, scale = 0.125 : f32}
      : (tensor<2x?x8x64xbf16>, tensor<2x?x2x64xbf16>, tensor<2x?x2x32xbf16>)
      -> (tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>)
  return %o, %lse : tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>
}

// -----

// Selected attention: one token x G heads per iteration; a loop over the n
// index slots skips -1 and blocks past the token's, searches the earlier
// slots for the others (a repeated block counts once) and gathers l' = 64
// keys.

// CHECK-LABEL: func.func @selected
// CHECK: scf.forall (%{{.+}}, %{{.+}}, %{{.+}}) in (%{{.+}}, 2, %{{.+}})
// CHECK: tensor.collapse_shape %{{.+}} : tensor<1x4x68xf32> into tensor<4x68xf32>
// CHECK: scf.for %[[SLOT:.+]] = %{{.+}} to %{{.+}} step %{{.+}} iter_args({{.+}}) -> (tensor<4xf32>, tensor<4xf32>, tensor<4x32xf32>)
// CHECK: %[[J:.+]] = arith.index_cast %{{.+}} : i32 to index
// CHECK: arith.cmpi sge, %{{.+}}, %c0
// CHECK: arith.cmpi sle
// CHECK: %[[ACTIVE:.+]] = scf.if %{{.+}} -> (i1) {
// CHECK: scf.for %{{.+}} = %{{.+}} to %[[SLOT]]
// CHECK: arith.cmpi eq
// CHECK: scf.if %[[ACTIVE]]
// CHECK: tensor.insert_slice %{{.+}} into %{{.+}}[0, 0, 0] [%{{.+}}, 1, 64] [1, 1, 1] : tensor<?x1x64xf32> into tensor<64x1x68xf32>
// CHECK: linalg.generic {{.+}} ins(%{{.+}}, %{{.+}} : tensor<4x64xf32>, tensor<64x64xf32>) outs(%{{.+}} : tensor<4x64xf32>)
// CHECK: } else {
// CHECK: scf.forall.in_parallel
func.func @selected(%q: tensor<1x?x8x64xf32>, %k: tensor<1x?x2x64xf32>, %v: tensor<1x?x2x32xf32>,
                    %idx: tensor<1x?x2x16xi32>) -> tensor<1x?x8x32xf32> {
  %o, %lse = nsa.selected_attention %q, %k, %v, %idx {block = 64, scale = 0.125 : f32}
      : (tensor<1x?x8x64xf32>, tensor<1x?x2x64xf32>, tensor<1x?x2x32xf32>, tensor<1x?x2x16xi32>)
      -> (tensor<1x?x8x32xf32>, tensor<1x?x8xf32>)
  return %o : tensor<1x?x8x32xf32>
}

// -----

// Compressed attention over packed sequences: the forall numbers every
// sequence's query tiles in turn (T / 16 + S of them, sequence s's from
// cu[s] / 16 + s), each iteration finds its sequence by halving [0, S),
// takes its offsets from cu_seqlens and sums the compressed rows of earlier
// sequences.

// CHECK-LABEL: func.func @compressed_packed
// CHECK-SAME: %[[CU:[^:]+]]: tensor<?xi32>
// CHECK: %[[S:.+]] = arith.subi %{{.+}}, %c1 : index
// CHECK: %[[T16:.+]] = arith.divsi %{{.+}}, %c16 : index
// CHECK: %[[TILES:.+]] = arith.addi %[[T16]], %[[S]] : index
// CHECK: %[[NONE:.+]] = arith.cmpi slt, %[[S]], %c1 : index
// CHECK: %[[GRID:.+]] = arith.select %[[NONE]], %c0, %[[TILES]] : index
// CHECK: scf.forall (%{{.+}}, %{{.+}}, %[[F:.+]]) in (1, 1, %[[GRID]])
// CHECK: %[[FOUND:.+]]:2 = scf.for %{{.+}} = %c0 to %c31 step %c1 iter_args(%[[LO:.+]] = %c0, %[[HI:.+]] = %{{.+}})
// CHECK: %[[MID:.+]] = arith.divsi %{{.+}}, %c2 : index
// CHECK: tensor.extract %[[CU]][%[[MID]]] : tensor<?xi32>
// CHECK: arith.cmpi sle, %{{.+}}, %[[F]] : index
// CHECK: tensor.extract %[[CU]][%[[FOUND]]#0] : tensor<?xi32>
// CHECK: scf.for %{{.+}} = %{{.+}} to %[[FOUND]]#0 step %{{.+}} iter_args
// CHECK: scf.for {{.+}} -> (tensor<64xf32>, tensor<64xf32>, tensor<64x64xf32>)
// CHECK: arith.cmpi sle
func.func @compressed_packed(%q: tensor<1x?x4x64xf32>, %kc: tensor<1x?x1x64xf32>, %vc: tensor<1x?x1x64xf32>,
                             %cu: tensor<?xi32>) -> tensor<1x?x4x64xf32> {
  %o, %lse = nsa.compressed_attention %q, %kc, %vc cu_seqlens(%cu) {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<1x?x4x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>, tensor<?xi32>)
      -> (tensor<1x?x4x64xf32>, tensor<1x?x4xf32>)
  return %o : tensor<1x?x4x64xf32>
}

// -----

// Block selection: per tile of 16 tokens (query-tile), chunks of 8
// selection blocks (kv-tile * d / l' = 32 * 16 / 64); each chunk scores the
// 8 * 64 / 16 + 2 = 34 compressed blocks that overlap it in one contraction
// for the tile's 16 tokens x 4 heads (the key tile has 40 rows, a multiple
// of 8 for tensor cores), sums each token's heads, gathers them into the 8
// selection blocks with the Eq. 9 weights (each block from at most
// (64 + 32) / 16 + 1 = 7 compressed ones), forces the backbone (+inf),
// ranks each token's 16 kept and 8 new candidates and keeps the 16 first,
// in place; the kept blocks are then sorted by rank too. Every tile has a
// static size and every per-element step is a parallel linalg.generic: the
// chunk loop is the only loop.

// CHECK-LABEL: func.func @select
// CHECK: scf.forall
// CHECK: scf.for {{.+}} iter_args(%[[BS:.+]] = %{{.+}}, %[[BB:.+]] = %{{.+}}) -> (tensor<16x16xf32>, tensor<16x16xi32>)
// CHECK: linalg.generic {{.+}} ins(%{{.+}}, %{{.+}} : tensor<64x64xf32>, tensor<40x64xf32>) outs(%{{.+}} : tensor<64x40xf32>)
// CHECK: linalg.generic {{.+}}iterator_types = ["parallel", "parallel", "reduction"]{{.+}} ins(%{{.+}}, %{{.+}} : tensor<64x40xf32>, tensor<16x4xf32>) outs(%{{.+}} : tensor<16x40xf32>)
// CHECK: math.exp
// CHECK: linalg.generic {{.+}} ins(%{{.+}} : tensor<7xi1>) outs(%{{.+}} : tensor<16x8xf32>)
// CHECK: arith.floordivsi
// CHECK: linalg.generic {{.+}}iterator_types = ["parallel", "parallel"]{{.+}} outs(%{{.+}} : tensor<16x8xf32>)
// CHECK: arith.ori
// CHECK: linalg.generic {{.+}} ins(%{{.+}} : tensor<24xi1>) outs(%{{.+}} : tensor<16x24xi32>)
// CHECK: arith.cmpf ogt
// CHECK: %[[NS:.+]] = linalg.generic {{.+}} ins(%{{.+}} : tensor<24xi1>) outs(%{{.+}} : tensor<16x16xf32>)
// CHECK: %[[NB:.+]] = linalg.generic {{.+}} ins(%{{.+}} : tensor<24xi1>) outs(%{{.+}} : tensor<16x16xi32>)
// CHECK: linalg.copy ins(%[[NS]] : tensor<16x16xf32>) outs(%[[BS]] : tensor<16x16xf32>)
// CHECK: linalg.copy ins(%[[NB]] : tensor<16x16xi32>) outs(%[[BB]] : tensor<16x16xi32>)
// CHECK: linalg.generic {{.+}} ins(%{{.+}} : tensor<16xi1>) outs(%{{.+}} : tensor<16x16xi32>)
// CHECK: linalg.generic {{.+}} ins(%{{.+}} : tensor<16xi1>) outs(%{{.+}} : tensor<16x16xi32>)
// CHECK-NOT: scf.for %
// CHECK: tensor.parallel_insert_slice %{{.+}} into %{{.+}}[%{{.+}}, %{{.+}}, %{{.+}}, 0] [1, %{{.+}}, 1, 16] [1, 1, 1, 1] : tensor<?x16xi32> into tensor<1x?x2x16xi32>
func.func @select(%q: tensor<1x?x8x64xf32>, %kc: tensor<1x?x2x64xf32>, %lse: tensor<1x?x8xf32>)
    -> tensor<1x?x2x16xi32> {
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16,
      scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>}
      : (tensor<1x?x8x64xf32>, tensor<1x?x2x64xf32>, tensor<1x?x8xf32>) -> tensor<1x?x2x16xi32>
  return %idx : tensor<1x?x2x16xi32>
}

// -----

// Compression: per (batch, KV head, tile of compressed rows) a strided
// pooling generic (x[i*d + j]); with kv-tile = 32 tokens a tile is one
// compressed row reading 32 tokens.

// CHECK-DAG: #[[STRIDED:.+]] = affine_map<(d0, d1, d2) -> (d0 * 16 + d2, d1)>
// CHECK-LABEL: func.func @compress
// CHECK: linalg.fill
// CHECK: scf.forall (%{{.+}}, %{{.+}}, %{{.+}}) in (%{{.+}}, 2, %{{.+}}) shared_outs
// CHECK: tensor.collapse_shape %{{.+}} : tensor<32x1x72xbf16> into tensor<32x72xbf16>
// CHECK: %[[MEAN:.+]] = linalg.fill ins(%{{.+}} : f32) outs(%{{.+}} : tensor<32xf32>)
// CHECK: linalg.generic {indexing_maps = [#[[STRIDED]], {{.+}}], iterator_types = ["parallel", "parallel", "reduction"]} ins(%{{.+}}, %[[MEAN]] : tensor<32x64xbf16>, tensor<32xf32>) outs(%{{.+}} : tensor<1x64xf32>)
// CHECK: arith.truncf
// CHECK: tensor.parallel_insert_slice %{{.+}} into %{{.+}} [1, %{{.+}}, 1, 64] [1, 1, 1, 1] : tensor<?x1x64xbf16> into tensor<2x61x2x64xbf16>
func.func @compress(%k: tensor<2x1000x2x64xbf16>) -> tensor<2x61x2x64xbf16> {
  %kc = nsa.compress %k {block = 32, stride = 16, pool = #nsa.pool<mean>}
      : (tensor<2x1000x2x64xbf16>) -> tensor<2x61x2x64xbf16>
  return %kc : tensor<2x61x2x64xbf16>
}

// -----

// Gating: one elementwise generic reading the three gate channels.

// CHECK-LABEL: func.func @combine
// CHECK: linalg.generic {indexing_maps = [#{{.+}}, #{{.+}}, #{{.+}}, #{{.+}}, #{{.+}}, #{{.+}}, #{{.+}}], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
// CHECK-COUNT-3: math.exp
func.func @combine(%a: tensor<1x?x8x32xf32>, %g: tensor<1x?x8x3xf32>) -> tensor<1x?x8x32xf32> {
  %o = nsa.combine %a, %a, %a, %g : (tensor<1x?x8x32xf32>, tensor<1x?x8x32xf32>, tensor<1x?x8x32xf32>, tensor<1x?x8x3xf32>) -> tensor<1x?x8x32xf32>
  return %o : tensor<1x?x8x32xf32>
}
