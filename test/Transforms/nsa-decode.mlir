// RUN: nsa-opt %s --nsa-decompose | FileCheck %s --check-prefix=DEC --implicit-check-not=nsa.sparse_attention_decode
// RUN: nsa-opt %s --nsa-decompose --nsa-tile --canonicalize --cse | FileCheck %s --check-prefix=TILE --implicit-check-not=nsa.

// Decoding (docs/Spec.md section 12). nsa-decompose turns the decode step
// into the branch ops over the caches, each with kv_lens, and the given
// compressed caches; no compression is rebuilt. nsa-tile then places the
// T = 3 queries of batch row b at positions kv_lens[b] - 3 .. and writes
// only the rows of the step's complete blocks into the compressed cache.

#cfg = #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 3, window = 16, backbone = <initial = 1, local = 1>>

// DEC-LABEL: func.func @decode
// DEC-SAME: (%[[Q:.+]]: tensor<2x3x4x16xbf16>, %[[K:.+]]: tensor<2x100x2x16xbf16>, %[[V:.+]]: tensor<2x100x2x8xbf16>, %[[KC:.+]]: tensor<2x24x2x16xbf16>, %[[VC:.+]]: tensor<2x24x2x8xbf16>, %[[G:.+]]: tensor<2x3x4x3xbf16>, %[[LENS:.+]]: tensor<2xi32>)
// DEC-NOT: nsa.compress
// DEC: %[[OC:.+]], %[[LC:.+]] = nsa.compressed_attention %[[Q]], %[[KC]], %[[VC]] kv_lens(%[[LENS]]) {block = 8 : i64, scale = 2.500000e-01 : f32, stride = 4 : i64}
// DEC: %[[IDX:.+]] = nsa.select_blocks %[[Q]], %[[KC]], %[[LC]] kv_lens(%[[LENS]]) {{.+}} -> tensor<2x3x2x3xi32>
// DEC: %[[OS:.+]], %{{.+}} = nsa.selected_attention %[[Q]], %[[K]], %[[V]], %[[IDX]] kv_lens(%[[LENS]])
// DEC: %[[OW:.+]], %{{.+}} = nsa.window_attention %[[Q]], %[[K]], %[[V]] kv_lens(%[[LENS]])
// DEC: %[[O:.+]] = nsa.combine %[[OC]], %[[OS]], %[[OW]], %[[G]]
// DEC: return %[[O]]

// Compressed and window attention: one tile of the 3 query rows at row 0 of
// batch row b, positions from kv_lens[b] - 3; keys of the cache up to
// kv_lens[b].
// TILE-LABEL: func.func @decode
// TILE: scf.forall (%[[B:.+]], %[[H:.+]]) in (2, 2)
// TILE: %[[LEN32:.+]] = tensor.extract %{{.+}}[%[[B]]] : tensor<2xi32>
// TILE: %[[LEN:.+]] = arith.index_cast %[[LEN32]] : i32 to index
// TILE: %[[T0:.+]] = arith.subi %[[LEN]], %c3 : index
// TILE: tensor.extract_slice %{{.+}}[%[[B]], 0, %{{.+}}, 0] [1, 3, 2, 16]
// TILE: tensor.parallel_insert_slice %{{.+}} into %{{.+}}[%[[B]], 0, %{{.+}}, 0] [1, 3, 2, 8]
// Selection: the same rows and positions.
// TILE: scf.forall (%[[SB:.+]], %[[SH:.+]]) in (2, 2)
// TILE: tensor.extract %{{.+}}[%[[SB]]] : tensor<2xi32>
// TILE: tensor.parallel_insert_slice %{{.+}} into %{{.+}}[%[[SB]], 0, %[[SH]], 0] [1, 3, 1, 3]
// Selected attention: one query row a forall iteration, keys from the cache
// (the values' [2, 100, 2, 8]).
// TILE: scf.forall (%{{.+}}, %{{.+}}, %{{.+}}) in (2, 2, 3)
// TILE: tensor.extract_slice %{{.+}} : tensor<2x100x2x8xbf16> to tensor<?x1x8xbf16>
// TILE: scf.forall (%{{.+}}, %{{.+}}) in (2, 2)
// TILE: linalg.generic
func.func @decode(%q: tensor<2x3x4x16xbf16>, %k: tensor<2x100x2x16xbf16>, %v: tensor<2x100x2x8xbf16>,
                  %kc: tensor<2x24x2x16xbf16>, %vc: tensor<2x24x2x8xbf16>,
                  %g: tensor<2x3x4x3xbf16>, %lens: tensor<2xi32>) -> tensor<2x3x4x8xbf16> {
  %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g kv_lens(%lens) {config = #cfg}
     : (tensor<2x3x4x16xbf16>, tensor<2x100x2x16xbf16>, tensor<2x100x2x8xbf16>, tensor<2x24x2x16xbf16>,
        tensor<2x24x2x8xbf16>, tensor<2x3x4x3xbf16>, tensor<2xi32>) -> tensor<2x3x4x8xbf16>
  return %o : tensor<2x3x4x8xbf16>
}

// compress_append: three new tokens complete at most ceil(3 / 4) = 1 block,
// so one slot per (batch row, KV head). The forall's shared out is the
// cache itself: rows it does not insert keep their values. The new block
// is i = Nc(max(L - 3, 0)) and is written (one row) only when i < Nc(L).
// TILE-LABEL: func.func @append
// TILE-SAME: (%{{.+}}: tensor<2x100x2x16xbf16>, %[[CACHE:.+]]: tensor<2x24x2x16xbf16>, %[[LENS:.+]]: tensor<2xi32>)
// TILE: scf.forall (%[[B:.+]], %[[H:.+]]) in (2, 2) shared_outs(%[[OUT:.+]] = %[[CACHE]])
// TILE: %[[LEN32:.+]] = tensor.extract %[[LENS]][%[[B]]]
// TILE: %[[LEN:.+]] = arith.index_cast %[[LEN32]]
// TILE: %[[BEFORE:.+]] = arith.subi %[[LEN]], %c3
// TILE: arith.maxsi %[[BEFORE]], %c0
// TILE: %[[I:.+]] = arith.select %{{.+}}, %c0, %{{.+}} : index
// TILE: %[[NC:.+]] = arith.select %{{.+}}, %c0, %{{.+}} : index
// TILE: %[[LIVE:.+]] = arith.cmpi slt, %[[I]], %[[NC]] : index
// TILE: %[[ROWS:.+]] = arith.select %[[LIVE]], %c1, %c0 : index
// TILE: linalg.generic
// TILE: tensor.parallel_insert_slice %{{.+}} into %[[OUT]][%[[B]], %{{.+}}, %[[H]], 0] [1, %[[ROWS]], 1, 16]
func.func @append(%k: tensor<2x100x2x16xbf16>, %kc: tensor<2x24x2x16xbf16>, %lens: tensor<2xi32>) -> tensor<2x24x2x16xbf16> {
  %r = nsa.compress_append %k, %kc kv_lens(%lens) {block = 8, stride = 4, pool = #nsa.pool<mean>, appended = 3}
     : (tensor<2x100x2x16xbf16>, tensor<2x24x2x16xbf16>, tensor<2xi32>) -> tensor<2x24x2x16xbf16>
  return %r : tensor<2x24x2x16xbf16>
}
