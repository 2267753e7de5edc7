// REQUIRES: ptxas
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa" | %python %S/ptxas-report.py %ptxas sm_90a | FileCheck %s
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa" | FileCheck %s --check-prefix=PTX
// RUN: nsa-gen-layer --prefix=small --q-heads=4 --kv-heads=1 --qk-dim=64 --v-dim=64 --cmp-block=16 --cmp-stride=8 --slc-block=32 --num-selected=4 --window=64 | nsa-opt --nsa-to-ptx="format=isa" | %python %S/ptxas-report.py %ptxas sm_90a | FileCheck %s --check-prefix=NOSPILL
// RUN: nsa-gen-layer --prefix=g1d128 --q-heads=2 --kv-heads=2 --qk-dim=128 --v-dim=128 | nsa-opt --nsa-to-ptx="format=isa" | %python %S/ptxas-report.py %ptxas sm_90a | FileCheck %s --check-prefix=NOSPILL
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa attention-strategy=flash-sm80" | %python %S/ptxas-report.py %ptxas sm_90a | FileCheck %s --check-prefix=SM80
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa attention-strategy=flash-sm80" | FileCheck %s --check-prefix=SM80PTX
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa attention-strategy=generic" | %python %S/ptxas-report.py %ptxas sm_90a | FileCheck %s --check-prefix=GENERIC

// The paper's layer (examples/paper_layer.mlir) through nsa-to-ptx with its
// defaults (sm_90a, strategy flash = flash-sm90): ptxas assembles all six
// kernels, all of the flash strategy, and none spills (the combine is the
// window kernel's epilogue). Compressed and window
// attention and block selection run on wgmma (S from shared-memory Q and K,
// P V with P in registers and V transposed), their key tiles loaded by TMA
// (tensor maps made on the host) on mbarriers, Q by cp.async behind a proxy
// fence; selected attention stays on mma.sync with ldmatrix fragments
// (transposed for the values).

// CHECK-LABEL: Function properties for nsa_layer_compress_flash_0
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_compress_flash_1
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_compressed_attention_flash_2
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_select_blocks_flash_3
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_selected_attention_flash_4
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-LABEL: Function properties for nsa_layer_window_attention_flash_5
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-NOT: warning
// CHECK-NOT: combine

// The GPU tests' smaller layers spill nothing either: with Dqk = Dv = 64
// compressed attention leaves room for two blocks an SM (128 registers) and
// keeps 64-key tiles; G = 2's block-major merge (16 slots) fits too.
// NOSPILL-NOT: {{[1-9][0-9]*}} bytes spill stores
// NOSPILL: Function properties for {{.*}}compressed_attention_flash_2
// NOSPILL-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// NOSPILL-NOT: {{[1-9][0-9]*}} bytes spill stores

// With attention-strategy=flash-sm80 (mma.sync everywhere) the kernels of
// compressed and window attention run at ptxas's cap of 255 registers (Q
// fragments, O accumulators and scores of a 16-row strip) and spill a few
// words, under 40 bytes: bounded here so that growth fails the test.
// SM80-LABEL: Function properties for nsa_layer_compressed_attention_flash_2
// SM80-NEXT: {{[0-9]+}} bytes stack frame, {{[0-9]|[1-3][0-9]}} bytes spill stores
// SM80-LABEL: Function properties for nsa_layer_select_blocks_flash_3
// SM80-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// SM80-LABEL: Function properties for nsa_layer_window_attention_flash_5
// SM80-NEXT: {{[0-9]+}} bytes stack frame, {{[0-9]|[1-3][0-9]}} bytes spill stores
// SM80PTX-NOT: wgmma
// SM80PTX: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// SM80PTX-NOT: wgmma

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
// PTX-DAG: ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
// PTX-DAG: fence.proxy.async.shared::cta;
// PTX-DAG: wgmma.fence.sync.aligned;
// Compressed attention (two warpgroups, 128-key tiles) adds Q's offset per
// k16 step inside the wgmma, so that one descriptor, not one per step,
// lives across the key-tile loop; P is rounded to bf16 pairs at once.
// PTX-DAG: add.s64 da, %rd{{[0-9]+}}, {{[0-9]+}};
// PTX-DAG: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%{{[rf][0-9]+}}, {{.*}}}, %rd{{[0-9]+}}, %rd{{[0-9]+}}, p, 1, 1, 0, 0;
// PTX-DAG: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%{{[rf][0-9]+}}, {{.*}}}, da, %rd{{[0-9]+}}, p, 1, 1, 0, 0;
// PTX-DAG: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%{{[rf][0-9]+}}, {{.*}}}, {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}, %rd{{[0-9]+}}, p, 1, 1, 1;
// PTX-DAG: cvt.rn.bf16x2.f32
// PTX-DAG: wgmma.commit_group.sync.aligned;
// PTX-DAG: wgmma.wait_group.sync.aligned 0;
// PTX-DAG: cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX-DAG: mbarrier.try_wait.parity.shared.b64
// PTX-DAG: llvm.call @mgpuTensorMapEncodeTiledMemref(
