// REQUIRES: ptxas
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa" | %python %S/ptxas-report.py %ptxas sm_90a | FileCheck %s
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa" | FileCheck %s --check-prefix=PTX
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa attention-strategy=generic" | %python %S/ptxas-report.py %ptxas sm_90a | FileCheck %s --check-prefix=GENERIC

// The paper's layer (examples/paper_layer.mlir) through nsa-to-ptx with its
// defaults: ptxas assembles all seven kernels for sm_90a, all of the flash
// strategy. Those of compression (keys and values), block selection,
// selected attention and gating spill nothing. The flash kernels of
// compressed and window attention run at ptxas's cap of 255 registers (Q
// fragments, O accumulators and scores of a 16-row strip) and spill a few
// words, under 40 bytes: bounded here so that growth fails the test. The
// attention contractions are tensor-core mma.sync instructions on ldmatrix
// fragments (transposed for the values), with cp.async key tiles.

// CHECK-LABEL: Function properties for nsa_layer_compress_flash_0
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_compress_flash_1
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_compressed_attention_flash_2
// CHECK-NEXT: {{[0-9]+}} bytes stack frame, {{[0-9]|[1-3][0-9]}} bytes spill stores
// CHECK-LABEL: Function properties for nsa_layer_select_blocks_flash_3
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_selected_attention_flash_4
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_window_attention_flash_5
// CHECK-NEXT: {{[0-9]+}} bytes stack frame, {{[0-9]|[1-3][0-9]}} bytes spill stores
// CHECK-LABEL: Function properties for nsa_layer_combine_flash_6
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads

// With attention-strategy=generic all nine kernels of the generic mapping
// spill nothing (nsa-kernel-occupancy lets them use the registers one
// block may have).
// GENERIC-COUNT-9: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// GENERIC-NOT: bytes spill stores

// PTX-DAG: .target sm_90a
// PTX-DAG: .minnctapersm 2
// PTX-DAG: cp.async.cg.shared.global
// PTX-DAG: ldmatrix.sync.aligned.m8n8.x4.shared.b16
// PTX-DAG: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// PTX-DAG: ex2.approx.ftz.f32
// PTX-DAG: ld.global.v4.b32
// PTX-DAG: ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
