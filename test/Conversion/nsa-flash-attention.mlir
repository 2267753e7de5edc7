// RUN: nsa-opt %s --nsa-flash-attention --split-input-file --verify-diagnostics | FileCheck %s
// RUN: nsa-opt %s --nsa-flash-attention="ops=window" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=ONLY
// RUN: not nsa-opt %s --nsa-flash-attention="ops=banana" --split-input-file 2>&1 | FileCheck %s --check-prefix=BADOP
// RUN: not nsa-opt %s --nsa-flash-attention="query-rows=24" --split-input-file 2>&1 | FileCheck %s --check-prefix=BADROWS
// RUN: not nsa-opt %s --nsa-flash-attention="select-rows=200" --split-input-file 2>&1 | FileCheck %s --check-prefix=BADSELECT
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=WGMMA
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1 overlap=0" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=NOOV
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1 pingpong=1" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=PP
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1 stages=3 query-rows=64 kv-tile=64" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=PIPE
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1 selected-order=token" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=TOKEN
// RUN: not nsa-opt %s --nsa-flash-attention="selected-order=sideways" --split-input-file 2>&1 | FileCheck %s --check-prefix=BADORDER
// RUN: nsa-opt %s --nsa-flash-attention="fuse-combine=0" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=NOFUSE
// RUN: nsa-opt %s --nsa-flash-attention="selected-rows=16" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=ROWS16
// RUN: nsa-opt %s --nsa-flash-attention="selected-rows=64" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=ROWS64

// With 3 stages the wgmma attention loop is pipelined: S of tile 0 before
// the loop (64 rows and 64-key tiles here, given as options); each
// iteration waits for its S (and the last P V), frees a
// stage, issues the next tile's S, runs the softmax and issues P V without
// waiting; the last wait follows the loop.
// PIPE-LABEL: func.func @compressed_packed
// PIPE: nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 3>
// PIPE: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 0, 0;
// PIPE: wgmma.commit_group.sync.aligned
// PIPE-NOT: wgmma.wait_group
// PIPE: scf.for
// PIPE-NEXT: wgmma.wait_group.sync.aligned 0;
// PIPE: gpu.barrier
// PIPE: nvgpu.tma.async.load
// PIPE: nvgpu.mbarrier.try_wait.parity
// PIPE: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 0, 0;
// PIPE: wgmma.commit_group.sync.aligned
// PIPE-NOT: wgmma.wait_group
// PIPE: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// PIPE: wgmma.commit_group.sync.aligned
// PIPE-NOT: wgmma.wait_group
// PIPE: scf.yield
// PIPE-NEXT: }
// PIPE-NEXT: wgmma.wait_group.sync.aligned 0;
// PIPE-LABEL: func.func @select

// With wgmma (sm_90a) the shapes it takes (64-row blocks, 64-key tiles,
// dims multiples of 64) get S = Q K^T from shared memory and P V with P in
// registers; the rest keeps mma.sync.
// WGMMA-LABEL: func.func @window
// WGMMA-NOT: wgmma
// WGMMA: nvvm.mma.sync
// WGMMA-LABEL: func.func @compressed_packed
// Two warpgroups (128 rows) for compressed attention with sm90; with Dqk =
// Dv = 64 two blocks fit an SM, so the tiles keep 64 keys (128 registers
// a thread). The K and V tiles come by TMA: tensor maps made on the host
// (64 keys of one head x 64 columns, 128-byte swizzle), a ring of
// mbarriers.
// WGMMA: %[[KMAP:.*]] = nvgpu.tma.create.descriptor %{{.*}} box[%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}] : memref<*xbf16> -> <tensor = memref<1x64x1x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b
// WGMMA: %[[VMAP:.*]] = nvgpu.tma.create.descriptor
// WGMMA: gpu.launch
// WGMMA: memref.extract_aligned_pointer_as_index
// K and V of a stage on their own mbarriers: both stages' keys and values
// before the loop; tile 0's S waited, its keys freed (the last warp out
// loads tile 2's).
// WGMMA: %[[KBARS:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 2>
// WGMMA: %[[VBARS:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 2>
// WGMMA: nvgpu.mbarrier.init %[[KBARS]]
// WGMMA: nvgpu.mbarrier.init %[[VBARS]]
// WGMMA: fence.mbarrier_init.release.cluster
// WGMMA: fence.proxy.async.shared::cta
// WGMMA: nvgpu.mbarrier.arrive.expect_tx %[[KBARS]][%{{.*}}], %c8192
// WGMMA: nvgpu.tma.async.load %[[KMAP]][{{.*}}], %[[KBARS]]
// WGMMA: nvgpu.mbarrier.arrive.expect_tx %[[VBARS]][%{{.*}}], %c8192
// WGMMA: nvgpu.tma.async.load %[[VMAP]][{{.*}}], %[[VBARS]]
// WGMMA: nvgpu.mbarrier.try_wait.parity %[[KBARS]]
// WGMMA: wgmma.fence.sync.aligned
// WGMMA: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 0, 0;
// WGMMA: wgmma.commit_group.sync.aligned
// WGMMA: wgmma.wait_group.sync.aligned 0
// WGMMA: memref.atomic_rmw addi
// WGMMA: nvgpu.tma.async.load %[[KMAP]]
// WGMMA-NOT: bar.arrive
// Each iteration issues this tile's S and the last tile's P V, waits for
// S alone and frees the keys, runs the softmax under P V, then waits for
// P V and frees the values. No block barrier in the loop, nothing in
// flight past it.
// WGMMA: scf.for
// WGMMA: nvgpu.mbarrier.try_wait.parity %[[KBARS]]
// WGMMA: nvgpu.mbarrier.try_wait.parity %[[VBARS]]
// WGMMA-NOT: bar.sync
// WGMMA: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 0, 0;
// WGMMA: wgmma.commit_group.sync.aligned
// WGMMA-NOT: wgmma.wait_group
// WGMMA: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// WGMMA: wgmma.commit_group.sync.aligned
// WGMMA-NOT: bar.arrive
// WGMMA: wgmma.wait_group.sync.aligned 1;
// WGMMA: nvvm.bar.warp.sync
// WGMMA: memref.atomic_rmw addi
// WGMMA: arith.remui %{{.*}}, %c8_i32
// WGMMA: nvgpu.tma.async.load %[[KMAP]]
// WGMMA: ex2.approx.ftz.f32
// WGMMA: wgmma.wait_group.sync.aligned 0;
// WGMMA: memref.atomic_rmw addi
// WGMMA: nvgpu.tma.async.load %[[VMAP]]
// WGMMA-NOT: gpu.barrier
// WGMMA: scf.yield
// WGMMA-NEXT: }
// After it the last tile's P V (the epilogue reads no shared memory).
// WGMMA-NOT: bar.sync
// WGMMA: nvgpu.mbarrier.try_wait.parity %[[VBARS]]
// WGMMA: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// WGMMA: wgmma.wait_group.sync.aligned 0
// WGMMA-NOT: gpu.barrier
// WGMMA: gpu.terminator
// Without overlap: one mbarrier a stage and the same loop as one warpgroup
// (S, softmax, P V), but no block barrier per tile: each warp counts
// itself out of its stage and the warp completing the count refills it
// with the tile two ahead; one barrier after the loop.
// NOOV-LABEL: func.func @compressed_packed
// NOOV: %[[BARS:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 2>
// NOOV-NOT: nvgpu.mbarrier.create
// NOOV: nvgpu.mbarrier.arrive.expect_tx %[[BARS]][%{{.*}}], %c16384
// NOOV: scf.for
// NOOV: nvgpu.mbarrier.try_wait.parity %[[BARS]]
// NOOV: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 0, 0;
// NOOV: wgmma.wait_group.sync.aligned 0
// NOOV: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// NOOV-NOT: gpu.barrier
// NOOV: nvvm.bar.warp.sync
// NOOV: memref.atomic_rmw addi
// NOOV: arith.remui %{{.*}}, %c8_i32
// NOOV-NOT: gpu.barrier
// NOOV: nvgpu.tma.async.load
// NOOV-NOT: gpu.barrier
// NOOV: scf.yield
// NOOV-NEXT: }
// NOOV-NEXT: gpu.barrier
// With turns (pingpong): warpgroup 1 hands warpgroup 0 the first turn;
// each iteration issues its products in its warpgroup's turn (named
// barrier 1 or 2) and hands the turn over; after the loop warpgroup 0
// takes the turn handed over last.
// PP-LABEL: func.func @compressed_packed
// PP: bar.arrive 1, 256;
// PP: scf.for
// PP: bar.sync 1, 256;
// PP: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 0, 0;
// PP: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// PP: bar.arrive 2, 256;
// PP: wgmma.wait_group.sync.aligned 1;
// PP: scf.yield
// PP-NEXT: }
// PP: bar.sync 1, 256;
// With the paper's dims (Dqk 192, Dv 128) a block of compressed attention
// takes more than half an SM's shared memory, and its tiles 128 keys: S by
// m64n128k16, Q's descriptor offset per k16 step added in the wgmma (the
// first step overwrites the accumulators: scale-d 0).
// WGMMA-LABEL: func.func @compressed_wide
// WGMMA: nvgpu.tma.create.descriptor {{.*}} -> <tensor = memref<1x128x1x64xbf16
// WGMMA: gpu.launch
// WGMMA-SAME: function(@compressed_wide_compressed_attention_flash_0)
// WGMMA: llvm.inline_asm has_side_effects "{\0A.reg .pred p;\0Asetp.ne.b32 p, $130, 0;\0Awgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, $128, $129, p, 1, 1, 0, 0;\0A}", {{.*}}, %c0_i32
// WGMMA-NEXT: llvm.extractvalue
// WGMMA: llvm.inline_asm has_side_effects "{\0A.reg .pred p;\0A.reg .b64 da;\0Aadd.s64 da, $128, 2;\0Asetp.ne.b32 p, $130, 0;\0Awgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, da, $129, p, 1, 1, 0, 0;\0A}", {{.*}}, %c1_i32
// PP-LABEL: func.func @select
// WGMMA-LABEL: func.func @select
// WGMMA: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 0, 0;
// With Dqk > 128 block selection is pipelined: both stages loaded and S of
// tile 0 issued before the loop; each iteration waits for its S, moving the
// accumulators out, counts its warp out of the stage (the last warp loads
// the tile two ahead into it), waits for the next tile and issues its S
// before this tile's scoring (the ballot of the running top-n); the last S
// is waited for after the loop.
// WGMMA-LABEL: func.func @select_deep(
// WGMMA: nvgpu.tma.async.load
// WGMMA: nvgpu.tma.async.load {{.*}}[%c1
// WGMMA: wgmma.commit_group.sync.aligned
// WGMMA: scf.for
// WGMMA: wgmma.wait_group.sync.aligned 0;\0Amov.b32 $0, $32;
// WGMMA-NOT: gpu.barrier
// WGMMA: memref.atomic_rmw addi
// WGMMA-NOT: gpu.barrier
// WGMMA: nvgpu.tma.async.load
// WGMMA: nvgpu.mbarrier.try_wait.parity
// WGMMA: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16
// WGMMA: wgmma.commit_group.sync.aligned
// WGMMA: nvvm.vote.sync ballot
// WGMMA: scf.yield
// WGMMA: wgmma.wait_group.sync.aligned 0;"
// Selected attention with G = 4 on sm90 is block-major: the counts
// zeroed, counted and scanned, the entries placed by atomics, one block per
// work item with the selected block's K and V by TMA and the entries' Q rows
// by cp.async, S and P V by wgmma; then the merge.
// WGMMA-LABEL: func.func @selected
// WGMMA: function(@selected_selected_attention_by_block_flash_0_zero)
// WGMMA: function(@selected_selected_attention_by_block_flash_0_count)
// WGMMA: memref.atomic_rmw addi
// WGMMA: function(@selected_selected_attention_by_block_flash_0_scan)
// WGMMA: function(@selected_selected_attention_by_block_flash_0_place)
// WGMMA: memref.atomic_rmw addi
// WGMMA: function(@selected_selected_attention_by_block_flash_0)
// The swizzled regions start 1024-aligned past the first 64 bytes of the
// dynamic shared memory, where ptxas may place the static mbarriers.
// WGMMA: %[[BASE:.+]] = memref.extract_aligned_pointer_as_index
// WGMMA-NEXT: arith.constant 1024
// WGMMA-NEXT: %[[SKIP:.+]] = arith.constant 64
// WGMMA-NEXT: arith.addi %[[BASE]], %[[SKIP]]
// WGMMA: nvgpu.tma.async.load
// WGMMA: nvgpu.device_async_copy
// WGMMA: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 0, 0;
// WGMMA: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// WGMMA: function(@selected_selected_attention_by_block_flash_0_merge)
// WGMMA-LABEL: func.func @combine
// With selected-order=token it stays one token-major mma.sync kernel.
// TOKEN-LABEL: func.func @selected
// TOKEN-NOT: wgmma
// TOKEN: nvvm.mma.sync
// TOKEN-LABEL: func.func @combine
// BADORDER: selected-order is auto, token or block, found 'sideways'

// BADOP: ops are compress, window, compressed, select, selected, combine and decode, found 'banana'
// BADROWS: query-rows, select-rows, selected-rows and kv-tile must be 0 or multiples of 16 in 16..128, stages 2..4; found 24, 0, 0, 0, 2
// BADSELECT: query-rows, select-rows, selected-rows and kv-tile must be 0 or multiples of 16 in 16..128, stages 2..4; found 0, 200, 0, 0, 2

// Window attention (G = 4, Dqk 64, Dv 32) becomes one launch on the op's
// buffers: cp.async key tiles, ldmatrix fragments, mma.sync products, the
// softmax statistics combined across the quad by shuffles, exponentials on
// the special-function unit.

// CHECK-LABEL: func.func @window
// CHECK-DAG: %[[Q:.+]] = bufferization.to_buffer %arg0 read_only
// CHECK-DAG: %[[K:.+]] = bufferization.to_buffer %arg1 read_only
// CHECK-DAG: %[[V:.+]] = bufferization.to_buffer %arg2 read_only
// CHECK-DAG: %[[O:.+]] = memref.alloc(%{{.+}}) : memref<1x?x8x32xbf16>
// CHECK-DAG: %[[L:.+]] = memref.alloc(%{{.+}}) : memref<1x?x8xf32>
// CHECK: gpu.launch
// CHECK-SAME: threads({{.*}}) in ({{%.+}} = %c128
// CHECK-SAME: dynamic_shared_memory_size
// CHECK-SAME: function(@window_window_attention_flash_0)
// CHECK: gpu.dynamic_shared_memory
// CHECK: nvgpu.device_async_copy %[[Q]]
// CHECK: nvgpu.ldmatrix
// CHECK: scf.for
// CHECK: nvgpu.device_async_copy %[[K]]
// CHECK: nvgpu.device_async_copy %[[V]]
// CHECK: nvgpu.device_async_wait
// CHECK: gpu.barrier
// CHECK: nvvm.mma.sync
// CHECK: scf.if
// CHECK: ex2.approx.ftz.f32
// CHECK: gpu.shuffle xor
// CHECK: nvgpu.ldmatrix {{.*}}transpose = true
// CHECK: nvvm.mma.sync
// CHECK: vector.store {{.*}}, %[[O]]
// CHECK: memref.store {{.*}}, %[[L]]
// CHECK: bufferization.to_tensor %[[O]] restrict writable
// CHECK: bufferization.to_tensor %[[L]] restrict writable
// CHECK-NOT: nsa.window_attention
// ONLY-LABEL: func.func @window
// ONLY: gpu.launch
func.func @window(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>, %v: tensor<1x?x2x32xbf16>) -> (tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>) {
  %o, %lse = nsa.window_attention %q, %k, %v {scale = 0.125 : f32, window = 100 : i64} : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>) -> (tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>)
  return %o, %lse : tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>
}

// -----

// Packed compressed attention: the sequence's compressed rows start after
// those of the earlier sequences (a loop over cu_seqlens in the kernel).

// CHECK-LABEL: func.func @compressed_packed
// CHECK: %[[CU:.+]] = bufferization.to_buffer %arg3 read_only
// CHECK: gpu.launch
// CHECK-SAME: function(@compressed_packed_compressed_attention_flash_0)
// CHECK: memref.load %[[CU]]
// CHECK: scf.for {{.*}} iter_args
// CHECK: nvvm.mma.sync
// CHECK-NOT: nsa.compressed_attention
// ONLY-LABEL: func.func @compressed_packed
// ONLY: nsa.compressed_attention
func.func @compressed_packed(%q: tensor<1x?x16x64xbf16>, %kc: tensor<1x?x1x64xbf16>, %vc: tensor<1x?x1x64xbf16>, %cu: tensor<?xi32>) -> (tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>) {
  %o, %lse = nsa.compressed_attention %q, %kc, %vc cu_seqlens(%cu) {block = 32, stride = 16, scale = 0.125 : f32} : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>, tensor<?xi32>) -> (tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>)
  return %o, %lse : tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>
}

// -----

// (compressed_wide's checks are with compressed_packed's.)
func.func @compressed_wide(%q: tensor<1x?x16x192xbf16>, %kc: tensor<1x?x1x192xbf16>, %vc: tensor<1x?x1x128xbf16>) -> (tensor<1x?x16x128xbf16>, tensor<1x?x16xf32>) {
  %o, %lse = nsa.compressed_attention %q, %kc, %vc {block = 32, stride = 16, scale = 0.0722 : f32} : (tensor<1x?x16x192xbf16>, tensor<1x?x1x192xbf16>, tensor<1x?x1x128xbf16>) -> (tensor<1x?x16x128xbf16>, tensor<1x?x16xf32>)
  return %o, %lse : tensor<1x?x16x128xbf16>, tensor<1x?x16xf32>
}

// -----

// Block selection with G = 16: one token per warp, the running top-n in
// the warp's lanes (ranked with index shuffles), written into indices.

// CHECK-LABEL: func.func @select
// CHECK: %[[IDX:.+]] = memref.alloc(%{{.+}}) : memref<1x?x1x16xi32>
// CHECK: gpu.launch
// CHECK-SAME: function(@select_select_blocks_flash_0)
// CHECK: scf.for
// CHECK: nvvm.mma.sync
// CHECK: gpu.shuffle xor
// CHECK: nvvm.bar.warp.sync
// CHECK: gpu.shuffle idx
// CHECK: memref.store {{.*}}, %[[IDX]]
// CHECK: bufferization.to_tensor %[[IDX]] restrict writable
// CHECK-NOT: nsa.select_blocks
func.func @select(%q: tensor<1x?x16x64xbf16>, %kc: tensor<1x?x1x64xbf16>, %lse: tensor<1x?x16xf32>) -> tensor<1x?x1x16xi32> {
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>} : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x16xf32>) -> tensor<1x?x1x16xi32>
  return %idx : tensor<1x?x1x16xi32>
}

// -----

func.func @select_deep(%q: tensor<1x?x16x192xbf16>, %kc: tensor<1x?x1x192xbf16>, %lse: tensor<1x?x16xf32>) -> tensor<1x?x1x16xi32> {
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, scale = 0.072 : f32, backbone = #nsa.backbone<initial = 1, local = 2>} : (tensor<1x?x16x192xbf16>, tensor<1x?x1x192xbf16>, tensor<1x?x16xf32>) -> tensor<1x?x1x16xi32>
  return %idx : tensor<1x?x1x16xi32>
}

// -----

// Block selection with G = 4: still one token per warp, its 16 rows the 4
// heads and 12 rows of padding (their Q rows zero-filled by cp.async, their
// probabilities dropped before the score sums).

// CHECK-LABEL: func.func @select_g4
// CHECK: gpu.launch
// CHECK-SAME: function(@select_g4_select_blocks_flash_0)
// CHECK: nvgpu.device_async_copy
// CHECK: scf.for
// CHECK: nvvm.mma.sync
// CHECK: gpu.shuffle xor
// CHECK-NOT: nsa.select_blocks
func.func @select_g4(%q: tensor<1x?x4x64xbf16>, %kc: tensor<1x?x1x64xbf16>, %lse: tensor<1x?x4xf32>) -> tensor<1x?x1x16xi32> {
  %idx = nsa.select_blocks %q, %kc, %lse {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16, scale = 0.125 : f32, backbone = #nsa.backbone<initial = 1, local = 2>} : (tensor<1x?x4x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x4xf32>) -> tensor<1x?x1x16xi32>
  return %idx : tensor<1x?x1x16xi32>
}

// -----

// Selected attention (G = 4): 16 rows per block, the union of its four
// tokens' blocks built in shared memory; four warps split each 64-key block
// and merge their statistics.

// CHECK-LABEL: func.func @selected
// CHECK: gpu.launch
// CHECK-SAME: function(@selected_selected_attention_flash_0)
// CHECK: memref.load %{{.+}}[%{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}] : memref<1x?x2x16xi32>
// CHECK: gpu.barrier
// CHECK: scf.for
// CHECK: nvvm.mma.sync
// CHECK: gpu.barrier
// CHECK: scf.if
// CHECK: memref.load %{{.+}} : memref<64x66xf32, #gpu.address_space<workgroup>>
// CHECK-NOT: nsa.selected_attention
func.func @selected(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>, %v: tensor<1x?x2x64xbf16>, %idx: tensor<1x?x2x16xi32>) -> (tensor<1x?x8x64xbf16>, tensor<1x?x8xf32>) {
  %o, %lse = nsa.selected_attention %q, %k, %v, %idx {block = 64, scale = 0.125 : f32} : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x16xi32>) -> (tensor<1x?x8x64xbf16>, tensor<1x?x8xf32>)
  return %o, %lse : tensor<1x?x8x64xbf16>, tensor<1x?x8xf32>
}

// -----

// Selected attention with G = 16: 32 rows, two tokens a block, whose two
// warps each split its blocks' keys. The union of the tokens' blocks
// carries, per block, the mask of the tokens that chose it; a warp attends
// only to its token's blocks and keeps its state through the others; the
// two warps of a token merge at the end.

// CHECK-LABEL: func.func @selected_g16
// CHECK: gpu.launch
// CHECK-SAME: threads(%{{.+}}, %{{.+}}, %{{.+}}) in (%{{.+}} = %c128,
// CHECK-SAME: function(@selected_g16_selected_attention_flash_0)
// CHECK: arith.shli
// CHECK: gpu.barrier
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%[[S0:[^ ]+]] = %{{[^,]+}}, %[[S1:[^ ]+]] = %{{[^,]+}},
// CHECK: %[[WHO:.+]] = arith.shrui
// CHECK: arith.andi %[[WHO]]
// CHECK: scf.if %{{.+}} -> (f32
// CHECK: nvvm.mma.sync
// CHECK: } else {
// CHECK: scf.yield %[[S0]], %[[S1]],
// CHECK-NEXT: }
// CHECK-NEXT: gpu.barrier
// CHECK: memref<64x66xf32
// CHECK-NOT: nsa.selected_attention
// With selected-rows=64, four tokens a block, one a warp: no merge.
// ROWS64-LABEL: func.func @selected_g16
// ROWS64: function(@selected_g16_selected_attention_flash_0)
// ROWS64: arith.shrui
// ROWS64-NOT: memref<64x66xf32
// ROWS64-LABEL: func.func @
// With selected-rows=16 a block is one token, whose four warps split each
// block's keys and merge.
// ROWS16-LABEL: func.func @selected_g16
// ROWS16: function(@selected_g16_selected_attention_flash_0)
// ROWS16-NOT: arith.shrui
// ROWS16: memref<64x66xf32
func.func @selected_g16(%q: tensor<1x?x16x64xbf16>, %k: tensor<1x?x1x64xbf16>, %v: tensor<1x?x1x64xbf16>, %idx: tensor<1x?x1x16xi32>) -> (tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>) {
  %o, %lse = nsa.selected_attention %q, %k, %v, %idx {block = 64, scale = 0.125 : f32} : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x16xi32>) -> (tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>)
  return %o, %lse : tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>
}

// -----

// Gating: one launch, 16-byte vectors of the three branch outputs.

// A combine whose window branch is a window attention nothing else reads
// is that kernel's epilogue: one launch, which reads the gates and the
// other two branches' O and writes the output; no combine kernel.
// CHECK-LABEL: func.func @window_combined
// CHECK-DAG: %[[C:.+]] = bufferization.to_buffer %arg3 read_only
// CHECK-DAG: %[[S:.+]] = bufferization.to_buffer %arg4 read_only
// CHECK-DAG: %[[G:.+]] = bufferization.to_buffer %arg5 read_only
// CHECK: gpu.launch
// CHECK-SAME: function(@window_combined_window_attention_flash_0)
// CHECK: math.exp
// CHECK: vector.load %[[C]]
// CHECK: vector.load %[[S]]
// CHECK-NOT: gpu.launch
// CHECK-NOT: nsa.combine
// CHECK: return
// With fuse-combine=0 the window kernel stores its O, and the combine is a
// kernel of its own that reads it.
// NOFUSE-LABEL: func.func @window_combined(
// NOFUSE: gpu.launch
// NOFUSE-SAME: function(@window_combined_window_attention_flash_0)
// NOFUSE-NOT: math.exp
// NOFUSE: gpu.launch
// NOFUSE-SAME: function(@window_combined_combine_flash_1)
// NOFUSE: math.exp
// NOFUSE: return
func.func @window_combined(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>, %v: tensor<1x?x2x32xbf16>, %c: tensor<1x?x8x32xbf16>, %s: tensor<1x?x8x32xbf16>, %g: tensor<1x?x8x3xbf16>) -> tensor<1x?x8x32xbf16> {
  %o, %lse = nsa.window_attention %q, %k, %v {scale = 0.125 : f32, window = 100 : i64} : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>) -> (tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>)
  %out = nsa.combine %c, %s, %o, %g : (tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8x3xbf16>) -> tensor<1x?x8x32xbf16>
  return %out : tensor<1x?x8x32xbf16>
}

// -----

// Where the output is materialized into a restrict writable memref (the
// layer functions' %out), the kernel writes it there: no buffer for it and
// no copy.
// CHECK-LABEL: func.func @window_combined_in_place
// CHECK-SAME: %[[DEST:[^:]+]]: memref<1x?x8x32xbf16>
// CHECK-NOT: memref.alloc{{.*}} : memref<1x?x8x32xbf16>
// CHECK: gpu.launch
// CHECK-SAME: function(@window_combined_in_place_window_attention_flash_0)
// CHECK: vector.store %{{.+}}, %[[DEST]]
// CHECK-NOT: materialize_in_destination
// CHECK-NOT: memref.copy
// CHECK: return
func.func @window_combined_in_place(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>, %v: tensor<1x?x2x32xbf16>, %c: tensor<1x?x8x32xbf16>, %s: tensor<1x?x8x32xbf16>, %g: tensor<1x?x8x3xbf16>, %dest: memref<1x?x8x32xbf16>) {
  %o, %lse = nsa.window_attention %q, %k, %v {scale = 0.125 : f32, window = 100 : i64} : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>) -> (tensor<1x?x8x32xbf16>, tensor<1x?x8xf32>)
  %out = nsa.combine %c, %s, %o, %g : (tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8x32xbf16>, tensor<1x?x8x3xbf16>) -> tensor<1x?x8x32xbf16>
  bufferization.materialize_in_destination %out in restrict writable %dest : (tensor<1x?x8x32xbf16>, memref<1x?x8x32xbf16>) -> ()
  return
}

// A destination without restrict is left to bufferization (a copy).
// CHECK-LABEL: func.func @combine_not_restrict
// CHECK: memref.alloc
// CHECK: gpu.launch
// CHECK: bufferization.materialize_in_destination
func.func @combine_not_restrict(%c: tensor<?x?x8x64xbf16>, %s: tensor<?x?x8x64xbf16>, %w: tensor<?x?x8x64xbf16>, %g: tensor<?x?x8x3xbf16>, %dest: memref<?x?x8x64xbf16>) {
  %o = nsa.combine %c, %s, %w, %g : (tensor<?x?x8x64xbf16>, tensor<?x?x8x64xbf16>, tensor<?x?x8x64xbf16>, tensor<?x?x8x3xbf16>) -> tensor<?x?x8x64xbf16>
  bufferization.materialize_in_destination %o in writable %dest : (tensor<?x?x8x64xbf16>, memref<?x?x8x64xbf16>) -> ()
  return
}

// -----

// CHECK-LABEL: func.func @combine
// CHECK: %[[OUT:.+]] = memref.alloc(%{{.+}}, %{{.+}}) : memref<?x?x8x64xbf16>
// CHECK: gpu.launch
// CHECK-SAME: function(@combine_combine_flash_0)
// CHECK: math.exp
// CHECK: vector.load {{.*}} : memref<?x?x8x64xbf16>, vector<8xbf16>
// CHECK: math.exp
// CHECK: vector.load {{.*}} : memref<?x?x8x64xbf16>, vector<8xbf16>
// CHECK: math.exp
// CHECK: vector.load {{.*}} : memref<?x?x8x64xbf16>, vector<8xbf16>
// CHECK: vector.store {{.*}}, %[[OUT]]
// CHECK-NOT: nsa.combine
func.func @combine(%c: tensor<?x?x8x64xbf16>, %s: tensor<?x?x8x64xbf16>, %w: tensor<?x?x8x64xbf16>, %g: tensor<?x?x8x3xbf16>) -> tensor<?x?x8x64xbf16> {
  %o = nsa.combine %c, %s, %w, %g : (tensor<?x?x8x64xbf16>, tensor<?x?x8x64xbf16>, tensor<?x?x8x64xbf16>, tensor<?x?x8x3xbf16>) -> tensor<?x?x8x64xbf16>
  return %o : tensor<?x?x8x64xbf16>
}

// -----

// Shapes the kernels do not take stay for nsa-tile, with a remark.

// CHECK-LABEL: func.func @unsupported
// CHECK: nsa.window_attention
// CHECK: nsa.window_attention
// CHECK: nsa.select_blocks
// CHECK: nsa.selected_attention
func.func @unsupported(%q: tensor<1x?x4x16xbf16>, %k: tensor<1x?x2x16xbf16>, %v: tensor<1x?x2x8xbf16>, %kc: tensor<1x?x2x16xbf16>, %lse: tensor<1x?x4xf32>, %q32: tensor<1x?x4x16xf32>, %k32: tensor<1x?x2x16xf32>, %v32: tensor<1x?x2x16xf32>, %idx: tensor<1x?x2x3xi32>, %q64: tensor<1x?x64x16xbf16>, %k64: tensor<1x?x2x16xbf16>) -> (tensor<1x?x4x8xbf16>, tensor<1x?x2x17xi32>, tensor<1x?x4x16xf32>) {
  // expected-remark @below {{left to the generic mapping: Dqk and Dv must be multiples of 16, found 16 and 8}}
  %o, %l = nsa.window_attention %q, %k, %v {scale = 0.25 : f32, window = 16 : i64} : (tensor<1x?x4x16xbf16>, tensor<1x?x2x16xbf16>, tensor<1x?x2x8xbf16>) -> (tensor<1x?x4x8xbf16>, tensor<1x?x4xf32>)
  // expected-remark @below {{left to the generic mapping: the group size must divide 16, found 32}}
  %o32, %l32 = nsa.window_attention %q64, %k64, %k64 {scale = 0.25 : f32, window = 16 : i64} : (tensor<1x?x64x16xbf16>, tensor<1x?x2x16xbf16>, tensor<1x?x2x16xbf16>) -> (tensor<1x?x64x16xbf16>, tensor<1x?x64xf32>)
  // expected-remark @below {{left to the generic mapping: block selection keeps at most 16 blocks, found 17}}
  %i = nsa.select_blocks %q, %kc, %lse {cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 17, scale = 0.25 : f32, backbone = #nsa.backbone<initial = 1, local = 1>} : (tensor<1x?x4x16xbf16>, tensor<1x?x2x16xbf16>, tensor<1x?x4xf32>) -> tensor<1x?x2x17xi32>
  // expected-remark @below {{left to the generic mapping: the flash kernels take bf16}}
  %o2, %l2 = nsa.selected_attention %q32, %k32, %v32, %idx {block = 16, scale = 0.25 : f32} : (tensor<1x?x4x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x2x3xi32>) -> (tensor<1x?x4x16xf32>, tensor<1x?x4xf32>)
  return %o, %i, %o2 : tensor<1x?x4x8xbf16>, tensor<1x?x2x17xi32>, tensor<1x?x4x16xf32>
}
