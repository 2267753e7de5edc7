// REQUIRES: ptxas
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa" | %python %S/ptxas-report.py %ptxas sm_90a | FileCheck %s
// RUN: nsa-opt %nsa_src_root/examples/paper_layer.mlir --nsa-to-ptx="format=isa" | FileCheck %s --check-prefix=PTX

// The paper's layer (examples/paper_layer.mlir) through nsa-to-ptx with its
// defaults: ptxas assembles all nine kernels (two zero fills, compression of
// keys and values, compressed attention, block selection, selected
// attention, window attention, gating) for sm_90a without spilling
// registers to local memory (nsa-kernel-occupancy lets it use the registers
// one block may have), and the attention tiles' contractions are tensor-core
// mma.sync instructions on fragments loaded by ldmatrix (transposed for the
// values).

// CHECK-COUNT-9: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK-NOT: bytes spill stores

// PTX: .target sm_90a
// PTX: .minnctapersm 1
// PTX: ldmatrix.sync.aligned.m8n8.x4.shared.b16
// PTX: ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
// PTX: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
