// Upstream's mlir-opt runs nsa through libNSAPlugin (lib/Plugin): the
// dialect plugin parses and prints nsa ops, the pass plugin runs a pass, the
// named pipelines and the GPU lowering to PTX text (nsa-to-ptx, tensor-core
// kernels). Plugin passes are named in --pass-pipeline: mlir-opt creates
// its per-pass flags before it loads plugins.
//
// RUN: %mlir_opt --load-dialect-plugin=%nsa_plugin --load-pass-plugin=%nsa_plugin %s \
// RUN:   | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: %mlir_opt --load-dialect-plugin=%nsa_plugin --load-pass-plugin=%nsa_plugin %s \
// RUN:   --pass-pipeline='builtin.module(nsa-decompose, canonicalize)' \
// RUN:   | FileCheck %s --check-prefix=DECOMPOSE
// RUN: %mlir_opt --load-dialect-plugin=%nsa_plugin --load-pass-plugin=%nsa_plugin %s \
// RUN:   --pass-pipeline='builtin.module(nsa-to-cpu{query-tile=8 kv-tile=16})' \
// RUN:   | FileCheck %s --check-prefix=CPU --implicit-check-not=nsa.
// RUN: %mlir_opt --load-dialect-plugin=%nsa_plugin --load-pass-plugin=%nsa_plugin %s \
// RUN:   --pass-pipeline='builtin.module(nsa-to-ptx{format=isa})' 2>&1 \
// RUN:   | FileCheck %s --check-prefix=PTX --implicit-check-not=remark
// RUN: %mlir_opt --load-pass-plugin=%nsa_plugin --help | FileCheck %s --check-prefix=HELP

// The textual config without `backbone` is the paper's <initial = 1, local = 2>,
// printed without it.
// ROUNDTRIP: nsa.sparse_attention
// ROUNDTRIP-SAME: #nsa.config<cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 3, window = 16>

// DECOMPOSE-DAG: nsa.compress
// DECOMPOSE-DAG: nsa.select_blocks
// DECOMPOSE-DAG: nsa.window_attention

// CPU-LABEL: llvm.func @layer
// CPU: llvm.intr.exp

// PTX: gpu.binary
// PTX-SAME: .target sm_90a
// PTX: mma.sync.aligned

// HELP-DAG: --nsa-decompose
// HELP-DAG: --nsa-flash-attention
// HELP-DAG: --nsa-to-cpu
// HELP-DAG: --nsa-to-ptx

func.func @layer(%q: tensor<1x?x4x16xbf16>, %k: tensor<1x?x2x16xbf16>, %v: tensor<1x?x2x16xbf16>,
                 %g: tensor<1x?x4x3xbf16>) -> tensor<1x?x4x16xbf16> {
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<cmp_block = 8, cmp_stride = 4,
         slc_block = 16, num_selected = 3, window = 16>}
     : (tensor<1x?x4x16xbf16>, tensor<1x?x2x16xbf16>, tensor<1x?x2x16xbf16>, tensor<1x?x4x3xbf16>)
     -> tensor<1x?x4x16xbf16>
  return %o : tensor<1x?x4x16xbf16>
}
