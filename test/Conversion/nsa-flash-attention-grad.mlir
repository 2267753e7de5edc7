// RUN: nsa-opt %s --nsa-flash-attention --split-input-file --verify-diagnostics | FileCheck %s
// RUN: nsa-opt %s --nsa-flash-attention="ops=compressed" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=ONLY
// RUN: nsa-opt %s --nsa-flash-attention --split-input-file 2>/dev/null | FileCheck %s --check-prefix=TURNS
// RUN: nsa-opt %s --nsa-flash-attention="grad-deterministic=0" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=ANYORDER
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=WGMMA
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1 grad-wgmma=0" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=NOWGMMA
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1 grad-tma=0" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=NOTMA
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1 grad-key-tile=48" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=KEYS48
// RUN: nsa-opt %s --nsa-flash-attention="grad-fuse-sum=0" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=NOSUM
// RUN: nsa-opt %s --nsa-flash-attention="sm90=1 grad-selected-rows=16" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=SLC16
// RUN: nsa-opt %s --nsa-flash-attention="grad-selected-rows=32" --split-input-file 2>&1 >/dev/null | FileCheck %s --check-prefix=ROWS32
// RUN: nsa-opt %s --nsa-flash-attention="grad-fuse-delta=0" --split-input-file 2>/dev/null | FileCheck %s --check-prefix=NODELTA
// RUN: not nsa-opt %s --nsa-flash-attention="grad-key-tile=40" --split-input-file 2>&1 | FileCheck %s --check-prefix=BADTILE

// The gradients of window and compressed attention become three launches:
// D and lse2 per row, then dq (query-major), then dk and dv (key-major),
// mma.sync in both, no atomics.
// CHECK-LABEL: func.func @window_grad
// CHECK: %[[DELTA:.*]] = memref.alloc({{.*}}) : memref<2x?x8xf32>
// CHECK: %[[LSE2:.*]] = memref.alloc({{.*}}) : memref<2x?x8xf32>
// CHECK: gpu.launch {{.*}} function(@window_grad_window_attention_grad_flash_0_delta)
// CHECK: memref.store %{{.*}}, %[[LSE2]]
// CHECK: vector.reduction <add>
// CHECK: memref.store %{{.*}}, %[[DELTA]]
// The dq kernel: Q and dO by cp.async, each row's lse2 and D, then the key
// tiles; S, dP, dS, dQ += dS K (K transposed).
// CHECK: gpu.launch {{.*}} function(@window_grad_window_attention_grad_flash_0_dq)
// CHECK: nvgpu.device_async_copy
// CHECK: memref.load %[[LSE2]]
// CHECK: memref.load %[[DELTA]]
// CHECK: scf.for
// CHECK: nvgpu.ldmatrix {{.*}} {numTiles = 4 : i32, transpose = false}
// CHECK: nvvm.mma.sync
// CHECK: scf.if
// CHECK: ex2.approx.ftz.f32
// CHECK: nvgpu.ldmatrix {{.*}} {numTiles = 4 : i32, transpose = true}
// CHECK: nvvm.mma.sync
// CHECK: gpu.barrier
// CHECK: vector.store {{.*}} : memref<2x?x8x64xf32>, vector<2xf32>
// The dk, dv kernel: the rows' lse2 and D staged 4 bytes a row with Q and
// dO; dV += P^T dO and dK += dS^T Q read both transposed.
// CHECK: gpu.launch {{.*}} function(@window_grad_window_attention_grad_flash_0_dkv)
// CHECK: scf.for
// CHECK: nvgpu.device_async_copy {{.*}} : memref<2x?x8xf32> to memref<32xf32, #gpu.address_space<workgroup>>
// CHECK: scf.if
// CHECK: ex2.approx.ftz.f32
// CHECK: nvgpu.ldmatrix {{.*}} {numTiles = 4 : i32, transpose = true}
// CHECK: vector.store {{.*}} : memref<2x?x2x64xf32>, vector<2xf32>
// CHECK: vector.store {{.*}} : memref<2x?x2x32xf32>, vector<2xf32>
// CHECK-NOT: nsa.window_attention_grad
// CHECK: return
// With sm90 the dq kernel stays on mma.sync where Dv is not a multiple of
// 64.
// WGMMA-LABEL: func.func @window_grad
// WGMMA: function(@window_grad_window_attention_grad_flash_0_dq)
// WGMMA-NOT: wgmma
// WGMMA: nvvm.mma.sync
// WGMMA: function(@window_grad_window_attention_grad_flash_0_dkv)
// BADTILE: nsa-flash-attention: grad-key-tile must be 0 or a multiple of 16 in 16..128, found 40
// ONLY-LABEL: func.func @window_grad
// ONLY: nsa.window_attention_grad
// ONLY-NOT: gpu.launch
func.func @window_grad(%q: tensor<2x?x8x64xbf16>, %k: tensor<2x?x2x64xbf16>,
                       %v: tensor<2x?x2x32xbf16>, %o: tensor<2x?x8x32xbf16>,
                       %lse: tensor<2x?x8xf32>, %g: tensor<2x?x8x32xbf16>)
    -> (tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>) {
  %dq, %dk, %dv = nsa.window_attention_grad %q, %k, %v, %o, %lse, %g
      {window = 100, scale = 0.125 : f32}
      : (tensor<2x?x8x64xbf16>, tensor<2x?x2x64xbf16>, tensor<2x?x2x32xbf16>,
         tensor<2x?x8x32xbf16>, tensor<2x?x8xf32>, tensor<2x?x8x32xbf16>)
      -> (tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>)
  return %dq, %dk, %dv : tensor<2x?x8x64xf32>, tensor<2x?x2x64xf32>, tensor<2x?x2x32xf32>
}

// -----

// Packed sequences: dq, dk and dv are zeroed first (rows outside every
// sequence, and compressed rows past the last one's, are not written);
// the kernels find their sequence (and its first compressed row) in
// cu_seqlens.
// CHECK-LABEL: func.func @compressed_grad_packed
// CHECK-COUNT-3: linalg.fill
// CHECK: gpu.launch {{.*}} function(@compressed_grad_packed_compressed_attention_grad_flash_0_delta)
// CHECK: gpu.launch {{.*}} function(@compressed_grad_packed_compressed_attention_grad_flash_0_dq)
// CHECK: gpu.launch {{.*}} function(@compressed_grad_packed_compressed_attention_grad_flash_0_dkv)
// With sm90 the kernels of Dqk 192, Dv 128 are wgmma kernels. dq: Q and
// dO copied into the swizzled layout (from the aligned base), visible to
// wgmma after the proxy fence; the key tiles by TMA (tensor maps of 32-key
// boxes made on the host; 3 boxes of K and 2 of V, 20480 bytes, on the
// stage's mbarrier, waited for by parity); S and dP of 32-key tiles by
// m64n32k16 chains from shared memory, dS in registers, dQ += dS K by
// m64n192k16 (two k16 steps) with K transposed. dk, dv: K and V resident,
// 32 query rows a step (2 tokens of the group's 16 heads: TMA boxes of 2 x
// 16 rows, their lse2 and D by cp.async); S^T and dP^T by m64n32k16, dK +=
// dS^T Q and dV += P^T dO (two k16 steps each) with Q and dO transposed.
// WGMMA-LABEL: func.func @compressed_grad_packed
// WGMMA-COUNT-2: nvgpu.tma.create.descriptor {{.*}} -> <tensor = memref<1x32x1x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b
// WGMMA: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dq)
// WGMMA: memref.extract_aligned_pointer_as_index
// WGMMA-COUNT-2: nvgpu.mbarrier.init
// WGMMA: nvgpu.device_async_copy
// WGMMA: nvgpu.mbarrier.arrive.expect_tx {{.*}}, %c20480
// WGMMA-COUNT-5: nvgpu.tma.async.load
// WGMMA: fence.proxy.async.shared::cta
// WGMMA: scf.for
// WGMMA: nvgpu.mbarrier.arrive.expect_tx {{.*}}, %c20480
// WGMMA-COUNT-5: nvgpu.tma.async.load
// WGMMA: nvgpu.mbarrier.try_wait.parity
// WGMMA-COUNT-20: wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16
// WGMMA: wgmma.commit_group.sync.aligned
// WGMMA: wgmma.wait_group.sync.aligned 0
// WGMMA: ex2.approx.ftz.f32
// WGMMA-COUNT-2: wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {{.*}}p, 1, 1, 1;
// WGMMA-NOT: nvvm.mma.sync
// WGMMA: vector.store {{.*}} : memref<1x?x16x192xf32>, vector<2xf32>
// WGMMA-COUNT-2: nvgpu.tma.create.descriptor {{.*}} -> <tensor = memref<1x2x16x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b
// WGMMA: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dkv)
// WGMMA-NOT: nvvm.mma.sync
// WGMMA: nvgpu.mbarrier.arrive.expect_tx {{.*}}, %c20480
// WGMMA-COUNT-5: nvgpu.tma.async.load
// WGMMA: nvgpu.device_async_copy {{.*}} : memref<1x?x16xf32> to memref<32xf32, #gpu.address_space<workgroup>>
// WGMMA: scf.for
// WGMMA: nvgpu.mbarrier.arrive.expect_tx {{.*}}, %c20480
// WGMMA: nvgpu.mbarrier.try_wait.parity
// WGMMA-COUNT-20: wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16
// WGMMA: ex2.approx.ftz.f32
// WGMMA-COUNT-2: wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {{.*}}p, 1, 1, 1;
// WGMMA-COUNT-2: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}p, 1, 1, 1;
// WGMMA-NOT: nvvm.mma.sync
// WGMMA: memref.atomic_rmw addf
// Without grad-tma every thread copies the key tiles by cp.async.
// NOTMA-LABEL: func.func @compressed_grad_packed
// NOTMA-NOT: nvgpu.tma
// NOTMA-NOT: nvgpu.mbarrier
// NOTMA: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dq)
// NOTMA-NOT: nvgpu.tma
// NOTMA-NOT: nvgpu.mbarrier
// NOTMA: wgmma.mma_async.sync.aligned.m64n192k16
// NOTMA-NOT: nvgpu.tma
// NOTMA: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dkv)
// NOWGMMA-LABEL: func.func @compressed_grad_packed
// NOWGMMA: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dq)
// NOWGMMA-NOT: wgmma
// NOWGMMA: nvvm.mma.sync
// NOWGMMA: return
// grad-key-tile=48: S and dP by m64n48k16, dQ in 3 k16 steps.
// KEYS48-LABEL: func.func @compressed_grad_packed
// KEYS48: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dq)
// KEYS48-COUNT-20: wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16
// KEYS48-COUNT-3: wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16
// KEYS48-NOT: wgmma.mma_async
// KEYS48: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dkv)
// ONLY-LABEL: func.func @compressed_grad_packed
// ONLY: _flash_0_dkv
// The chunks of a key block add into dk, dv in turn: each waits (backing
// off) until the turn counter reads its chunk, adds, then passes the turn;
// with grad-deterministic=0 they add as they finish.
// TURNS-LABEL: func.func @compressed_grad_packed
// TURNS: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dkv)
// TURNS: memref.atomic_rmw addi %c0_i32
// TURNS: nanosleep.u32 256;
// TURNS: memref.atomic_rmw addf
// TURNS: memref.atomic_rmw addi %c1_i32
// ANYORDER-LABEL: func.func @compressed_grad_packed
// ANYORDER: function(@compressed_grad_packed_compressed_attention_grad_flash_0_dkv)
// ANYORDER-NOT: nanosleep
// ANYORDER-NOT: atomic_rmw addi
// ANYORDER: memref.atomic_rmw addf
// ANYORDER-NOT: atomic_rmw addi
// ANYORDER: return
func.func @compressed_grad_packed(%q: tensor<1x?x16x192xbf16>,
    %k: tensor<1x?x1x192xbf16>, %v: tensor<1x?x1x128xbf16>,
    %o: tensor<1x?x16x128xbf16>, %lse: tensor<1x?x16xf32>,
    %g: tensor<1x?x16x128xbf16>, %cu: tensor<3xi32>)
    -> (tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>) {
  %dq, %dk, %dv = nsa.compressed_attention_grad %q, %k, %v, %o, %lse, %g
      cu_seqlens(%cu) {block = 32, stride = 16, scale = 0.07 : f32}
      : (tensor<1x?x16x192xbf16>, tensor<1x?x1x192xbf16>, tensor<1x?x1x128xbf16>,
         tensor<1x?x16x128xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x128xbf16>,
         tensor<3xi32>)
      -> (tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>)
  return %dq, %dk, %dv : tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>
}

// -----

// Selected attention's dq on sm_90a takes the transposed products: the 64
// keys of a chosen block (by TMA: 64-key boxes, 3 of K and 2 of V, 40960
// bytes) as M and the block's 32 rows (two tokens' 16 heads, a block for
// every two tokens) as N. S^T = K Q^T
// (12 k16 steps over d_qk 192) and dP^T = V dO^T (8 over d_v 128) from
// shared memory; dS^T, rounded to bf16, through shared memory (fenced for
// the async proxy) as the B of dq^T += K^T dS^T, K read transposed
// (imm-trans-a 1): 3 m-tiles of d_qk, 4 k16 steps each.
// WGMMA-LABEL: func.func @selected_grad
// WGMMA-COUNT-2: nvgpu.tma.create.descriptor {{.*}} -> <tensor = memref<1x64x1x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b
// WGMMA: %[[C2:.*]] = arith.constant 2 : index
// WGMMA: %[[PAIRS:.*]] = arith.divsi %{{.*}}, %[[C2]] : index
// WGMMA: gpu.launch blocks({{.*}}) in (%{{.*}} = %[[PAIRS]], {{.*}} function(@selected_grad_selected_attention_grad_flash_0_dq)
// WGMMA-NOT: nvvm.mma.sync
// WGMMA: nvgpu.device_async_copy
// WGMMA: nvgpu.mbarrier.arrive.expect_tx {{.*}}, %c40960
// WGMMA-COUNT-5: nvgpu.tma.async.load
// WGMMA: nvgpu.mbarrier.try_wait.parity
// WGMMA: wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{.*}}p, 1, 1, 0, 0;
// WGMMA-COUNT-11: wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{.*}}, da, {{.*}}p, 1, 1, 0, 0;
// WGMMA: wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{.*}}p, 1, 1, 0, 0;
// WGMMA-COUNT-7: wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{.*}}, da, {{.*}}p, 1, 1, 0, 0;
// WGMMA: wgmma.wait_group.sync.aligned 0
// WGMMA: ex2.approx.ftz.f32
// WGMMA-COUNT-16: memref.store {{.*}} : memref<2048xbf16, #gpu.address_space<workgroup>>
// WGMMA: fence.proxy.async.shared::cta
// WGMMA-NEXT: gpu.barrier
// WGMMA-COUNT-12: wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{.*}}p, 1, 1, 1, 0;
// WGMMA-NOT: wgmma.mma_async
// WGMMA: wgmma.wait_group.sync.aligned 0
// WGMMA-NOT: nvvm.mma.sync
// WGMMA: memref.store {{.*}} : memref<1x?x16x192xf32>
// With grad-selected-rows=16, a block a token: N = 16.
// SLC16-LABEL: func.func @selected_grad
// SLC16: function(@selected_grad_selected_attention_grad_flash_0_dq)
// SLC16-NOT: m64n32k16
// SLC16-COUNT-12: wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16
// SLC16-COUNT-8: memref.store {{.*}} : memref<1024xbf16, #gpu.address_space<workgroup>>
// SLC16: function(@selected_grad_selected_attention_grad_flash_0_dkv)
// Without wgmma the kernel takes 16 rows only.
// ROWS32: remark: nsa-flash-attention: left to the generic mapping: selected attention's dq takes 16 rows a block, or 32 with wgmma, found 32
// The selected dk, dv kernel walks a queue of tokens: a TMA box a token
// (its 16 heads), 2 tokens a step, 10 boxes on one mbarrier (20480
// bytes), the ring's fills carried across the walks of the queue.
// WGMMA-COUNT-2: nvgpu.tma.create.descriptor {{.*}} -> <tensor = memref<1x1x16x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b
// WGMMA: function(@selected_grad_selected_attention_grad_flash_0_dkv)
// WGMMA: nvgpu.mbarrier.arrive.expect_tx {{.*}}, %c20480
// WGMMA-COUNT-10: nvgpu.tma.async.load
// WGMMA-NOT: nvgpu.tma.async.load
// WGMMA: scf.for {{.*}} iter_args
// WGMMA: nvgpu.mbarrier.arrive.expect_tx {{.*}}, %c20480
// WGMMA-COUNT-10: nvgpu.tma.async.load
// WGMMA: nvgpu.mbarrier.try_wait.parity
// WGMMA: return
// NOWGMMA-LABEL: func.func @selected_grad
// NOWGMMA: function(@selected_grad_selected_attention_grad_flash_0_dq)
// NOWGMMA-NOT: wgmma
// NOWGMMA: nvvm.mma.sync
// NOWGMMA: function(@selected_grad_selected_attention_grad_flash_0_dkv)
func.func @selected_grad(%q: tensor<1x?x16x192xbf16>, %k: tensor<1x?x1x192xbf16>,
    %v: tensor<1x?x1x128xbf16>, %idx: tensor<1x?x1x16xi32>,
    %o: tensor<1x?x16x128xbf16>, %lse: tensor<1x?x16xf32>,
    %g: tensor<1x?x16x128xbf16>)
    -> (tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>) {
  %dq, %dk, %dv = nsa.selected_attention_grad %q, %k, %v, %idx, %o, %lse, %g
      {block = 64, scale = 0.07 : f32}
      : (tensor<1x?x16x192xbf16>, tensor<1x?x1x192xbf16>, tensor<1x?x1x128xbf16>,
         tensor<1x?x1x16xi32>, tensor<1x?x16x128xbf16>, tensor<1x?x16xf32>,
         tensor<1x?x16x128xbf16>)
      -> (tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>)
  return %dq, %dk, %dv : tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>
}

// -----

// The gating's gradient: one launch, 8 elements of a row a thread; each
// branch's do_b = sigmoid(g_b) do stored as 8 bf16, its gate term the
// row's dot product o_b . do summed by xor shuffles over the row's Dv / 8
// = 4 lanes (offsets 2, 1), stored by the row's first lane.
// CHECK-LABEL: func.func @combine_grad
// CHECK: gpu.launch {{.*}} function(@combine_grad_combine_grad_flash_0)
// CHECK: vector.load {{.*}} : memref<2x?x8x32xbf16>, vector<8xbf16>
// CHECK: math.exp
// CHECK: vector.store {{.*}} : memref<2x?x8x32xbf16>, vector<8xbf16>
// CHECK: vector.reduction <add>
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: memref.store {{.*}} : memref<2x?x8x3xbf16>
// CHECK-NOT: nsa.combine_grad
// CHECK: return
func.func @combine_grad(%oc: tensor<2x?x8x32xbf16>, %os: tensor<2x?x8x32xbf16>,
                        %ow: tensor<2x?x8x32xbf16>, %g: tensor<2x?x8x3xbf16>,
                        %do: tensor<2x?x8x32xbf16>)
    -> (tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>,
        tensor<2x?x8x3xbf16>) {
  %dc, %ds, %dw, %dg = nsa.combine_grad %oc, %os, %ow, %g, %do
      : (tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>,
         tensor<2x?x8x3xbf16>, tensor<2x?x8x32xbf16>)
      -> (tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>,
          tensor<2x?x8x3xbf16>)
  return %dc, %ds, %dw, %dg : tensor<2x?x8x32xbf16>, tensor<2x?x8x32xbf16>,
      tensor<2x?x8x32xbf16>, tensor<2x?x8x3xbf16>
}

// -----

// Shapes the gradient kernels do not take stay for nsa-tile, with a remark.
func.func @left(%q: tensor<1x?x32x64xbf16>, %k: tensor<1x?x1x64xbf16>,
                %v: tensor<1x?x1x64xbf16>, %o: tensor<1x?x32x64xbf16>,
                %lse: tensor<1x?x32xf32>, %g: tensor<1x?x32x64xbf16>,
                %qf: tensor<1x?x4x64xf32>, %kf: tensor<1x?x1x64xf32>,
                %vf: tensor<1x?x1x64xf32>, %of: tensor<1x?x4x64xf32>,
                %lsef: tensor<1x?x4xf32>, %gf: tensor<1x?x4x64xf32>,
                %o24: tensor<1x?x4x24xbf16>, %g3: tensor<1x?x4x3xbf16>)
    -> (tensor<1x?x32x64xf32>, tensor<1x?x4x64xf32>) {
  // expected-remark @below {{left to the generic mapping: the group size must divide 16, found 32}}
  %dq, %dk, %dv = nsa.window_attention_grad %q, %k, %v, %o, %lse, %g
      {window = 64, scale = 0.125 : f32}
      : (tensor<1x?x32x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
         tensor<1x?x32x64xbf16>, tensor<1x?x32xf32>, tensor<1x?x32x64xbf16>)
      -> (tensor<1x?x32x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>)
  // expected-remark @below {{left to the generic mapping: the flash kernels take bf16}}
  %dq2, %dk2, %dv2 = nsa.window_attention_grad %qf, %kf, %vf, %of, %lsef, %gf
      {window = 64, scale = 0.125 : f32}
      : (tensor<1x?x4x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>,
         tensor<1x?x4x64xf32>, tensor<1x?x4xf32>, tensor<1x?x4x64xf32>)
      -> (tensor<1x?x4x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>)
  // expected-remark @below {{left to the generic mapping: combine_grad takes bf16 with static heads and Dv / 8 a power of two of at most 32}}
  %c0, %c1, %c2, %c3 = nsa.combine_grad %o24, %o24, %o24, %g3, %o24
      : (tensor<1x?x4x24xbf16>, tensor<1x?x4x24xbf16>, tensor<1x?x4x24xbf16>,
         tensor<1x?x4x3xbf16>, tensor<1x?x4x24xbf16>)
      -> (tensor<1x?x4x24xbf16>, tensor<1x?x4x24xbf16>, tensor<1x?x4x24xbf16>,
          tensor<1x?x4x3xbf16>)
  return %dq, %dq2 : tensor<1x?x32x64xf32>, tensor<1x?x4x64xf32>
}

// -----

// nsa-decompose's sum of the branches' dq (f32, added in order, rounded
// once to bf16) is the epilogue of the last gradient's dq kernel: it reads
// the compressed and window dq where it stores its own, adds them in the
// generic's order (compressed + selected + window) and stores bf16. The
// selected gradient has no f32 dq of its own and the generic is gone. The
// earlier gradients, whose sums would need a later term, store theirs.
// CHECK-LABEL: func.func @dq_sum
// CHECK: %[[CQ:.*]] = bufferization.to_tensor %{{.*}} : memref<1x?x16x192xf32> to tensor<1x?x16x192xf32>
// CHECK: %[[WQ:.*]] = bufferization.to_tensor %{{.*}} : memref<1x?x16x192xf32> to tensor<1x?x16x192xf32>
// CHECK: %[[CQB:.*]] = bufferization.to_buffer %[[CQ]]
// CHECK: %[[WQB:.*]] = bufferization.to_buffer %[[WQ]]
// CHECK-NOT: memref.alloc({{.*}}) : memref<1x?x16x192xf32>
// CHECK: %[[SUM:.*]] = memref.alloc({{.*}}) : memref<1x?x16x192xbf16>
// CHECK-NOT: memref.alloc({{.*}}) : memref<1x?x16x192xf32>
// CHECK: function(@dq_sum_selected_attention_grad_flash_2_dq)
// The other terms' loads of 12 stores come before the stores.
// CHECK: %[[C:.*]] = vector.load %[[CQB]]{{.*}} : memref<1x?x16x192xf32>, vector<2xf32>
// CHECK-COUNT-11: vector.load %[[CQB]]
// CHECK-NEXT: %[[W:.*]] = vector.load %[[WQB]]
// CHECK-COUNT-11: vector.load %[[WQB]]
// CHECK-NEXT: %[[CS:.*]] = arith.addf %[[C]], %{{.*}} : vector<2xf32>
// CHECK-NEXT: %[[CSW:.*]] = arith.addf %[[CS]], %[[W]] : vector<2xf32>
// CHECK-NEXT: %[[R:.*]] = arith.truncf %[[CSW]] : vector<2xf32> to vector<2xbf16>
// CHECK-NEXT: vector.store %[[R]], %[[SUM]]
// CHECK-NOT: linalg.generic
// CHECK: %[[OUT:.*]] = bufferization.to_tensor %[[SUM]]
// CHECK-NOT: linalg.generic
// CHECK: return %[[OUT]]
// With sm90 the selected dq kernel (wgmma) stores elements: the same sum.
// WGMMA-LABEL: func.func @dq_sum
// WGMMA: %[[SUM:.*]] = memref.alloc({{.*}}) : memref<1x?x16x192xbf16>
// WGMMA: function(@dq_sum_selected_attention_grad_flash_2_dq)
// WGMMA: wgmma.wait_group.sync.aligned 0
// WGMMA: %[[C:.*]] = memref.load {{.*}} : memref<1x?x16x192xf32>
// WGMMA-COUNT-5: memref.load {{.*}} : memref<1x?x16x192xf32>
// WGMMA-NEXT: %[[W:.*]] = memref.load {{.*}} : memref<1x?x16x192xf32>
// WGMMA-COUNT-5: memref.load {{.*}} : memref<1x?x16x192xf32>
// WGMMA-NEXT: %[[CS:.*]] = arith.addf %[[C]], %{{.*}} : f32
// WGMMA-NEXT: %[[CSW:.*]] = arith.addf %[[CS]], %[[W]] : f32
// WGMMA-NEXT: %[[R:.*]] = arith.truncf %[[CSW]] : f32 to bf16
// WGMMA-NEXT: memref.store %[[R]], %[[SUM]]
// WGMMA-NOT: linalg.generic
// WGMMA: return
// NOSUM-LABEL: func.func @dq_sum
// NOSUM: function(@dq_sum_selected_attention_grad_flash_2_dq)
// NOSUM-NOT: memref<1x?x16x192xbf16>, vector<2xbf16>
// NOSUM: linalg.generic
// NOSUM: arith.truncf {{.*}} : f32 to bf16
#id = affine_map<(a, b, c, d) -> (a, b, c, d)>
func.func @dq_sum(%q: tensor<1x?x16x192xbf16>, %k: tensor<1x?x1x192xbf16>,
    %v: tensor<1x?x1x128xbf16>, %kc: tensor<1x?x1x192xbf16>,
    %vc: tensor<1x?x1x128xbf16>, %idx: tensor<1x?x1x16xi32>,
    %o: tensor<1x?x16x128xbf16>, %lse: tensor<1x?x16xf32>,
    %g: tensor<1x?x16x128xbf16>) -> tensor<1x?x16x192xbf16> {
  %cq, %ck, %cv = nsa.compressed_attention_grad %q, %kc, %vc, %o, %lse, %g
      {block = 32, stride = 16, scale = 0.07 : f32}
      : (tensor<1x?x16x192xbf16>, tensor<1x?x1x192xbf16>, tensor<1x?x1x128xbf16>,
         tensor<1x?x16x128xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x128xbf16>)
      -> (tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>)
  %wq, %wk, %wv = nsa.window_attention_grad %q, %k, %v, %o, %lse, %g
      {window = 512, scale = 0.07 : f32}
      : (tensor<1x?x16x192xbf16>, tensor<1x?x1x192xbf16>, tensor<1x?x1x128xbf16>,
         tensor<1x?x16x128xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x128xbf16>)
      -> (tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>)
  %sq, %sk, %sv = nsa.selected_attention_grad %q, %k, %v, %idx, %o, %lse, %g
      {block = 64, scale = 0.07 : f32}
      : (tensor<1x?x16x192xbf16>, tensor<1x?x1x192xbf16>, tensor<1x?x1x128xbf16>,
         tensor<1x?x1x16xi32>, tensor<1x?x16x128xbf16>, tensor<1x?x16xf32>,
         tensor<1x?x16x128xbf16>)
      -> (tensor<1x?x16x192xf32>, tensor<1x?x1x192xf32>, tensor<1x?x1x128xf32>)
  %c1 = arith.constant 1 : index
  %t = tensor.dim %q, %c1 : tensor<1x?x16x192xbf16>
  %init = tensor.empty(%t) : tensor<1x?x16x192xbf16>
  %sum = linalg.generic {indexing_maps = [#id, #id, #id, #id],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%cq, %sq, %wq : tensor<1x?x16x192xf32>, tensor<1x?x16x192xf32>,
                          tensor<1x?x16x192xf32>)
      outs(%init : tensor<1x?x16x192xbf16>) {
  ^bb0(%a: f32, %b: f32, %c: f32, %out: bf16):
    %0 = arith.addf %a, %b : f32
    %1 = arith.addf %0, %c : f32
    %2 = arith.truncf %1 : f32 to bf16
    linalg.yield %2 : bf16
  } -> tensor<1x?x16x192xbf16>
  return %sum : tensor<1x?x16x192xbf16>
}

// -----

// Packed sequences: the sum's rows outside every sequence are zero (every
// term's are), so the fused sum is filled with zero first. A term that is
// not a zero-filled dq of the pass (here an argument) keeps the generic.
// CHECK-LABEL: func.func @dq_sum_packed
// CHECK: %[[SUM:.*]] = memref.alloc({{.*}}) : memref<1x?x16x64xbf16>
// CHECK: %[[ZERO:.*]] = arith.constant 0.000000e+00 : bf16
// CHECK: linalg.fill ins(%[[ZERO]] : bf16) outs(%[[SUM]] : memref<1x?x16x64xbf16>)
// CHECK: function(@dq_sum_packed_window_attention_grad_flash_1_dq)
// CHECK: arith.truncf {{.*}} : vector<2xf32> to vector<2xbf16>
// CHECK-NOT: linalg.generic
// CHECK: return
// CHECK-LABEL: func.func @dq_sum_other
// CHECK: function(@dq_sum_other_window_attention_grad_flash_1_dq)
// CHECK-NOT: memref<1x?x16x64xbf16>, vector<2xbf16>
// CHECK: linalg.generic
// CHECK: return
#id = affine_map<(a, b, c, d) -> (a, b, c, d)>
func.func @dq_sum_packed(%q: tensor<1x?x16x64xbf16>, %k: tensor<1x?x1x64xbf16>,
    %v: tensor<1x?x1x64xbf16>, %o: tensor<1x?x16x64xbf16>,
    %lse: tensor<1x?x16xf32>, %g: tensor<1x?x16x64xbf16>, %cu: tensor<3xi32>)
    -> tensor<1x?x16x64xbf16> {
  %cq, %ck, %cv = nsa.compressed_attention_grad %q, %k, %v, %o, %lse, %g
      cu_seqlens(%cu) {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
         tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x64xbf16>,
         tensor<3xi32>)
      -> (tensor<1x?x16x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>)
  %wq, %wk, %wv = nsa.window_attention_grad %q, %k, %v, %o, %lse, %g
      cu_seqlens(%cu) {window = 128, scale = 0.125 : f32}
      : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
         tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x64xbf16>,
         tensor<3xi32>)
      -> (tensor<1x?x16x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>)
  %c1 = arith.constant 1 : index
  %t = tensor.dim %q, %c1 : tensor<1x?x16x64xbf16>
  %init = tensor.empty(%t) : tensor<1x?x16x64xbf16>
  %sum = linalg.generic {indexing_maps = [#id, #id, #id],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%cq, %wq : tensor<1x?x16x64xf32>, tensor<1x?x16x64xf32>)
      outs(%init : tensor<1x?x16x64xbf16>) {
  ^bb0(%a: f32, %b: f32, %out: bf16):
    %0 = arith.addf %a, %b : f32
    %1 = arith.truncf %0 : f32 to bf16
    linalg.yield %1 : bf16
  } -> tensor<1x?x16x64xbf16>
  return %sum : tensor<1x?x16x64xbf16>
}
func.func @dq_sum_other(%q: tensor<1x?x16x64xbf16>, %k: tensor<1x?x1x64xbf16>,
    %v: tensor<1x?x1x64xbf16>, %o: tensor<1x?x16x64xbf16>,
    %lse: tensor<1x?x16xf32>, %g: tensor<1x?x16x64xbf16>, %cu: tensor<3xi32>,
    %other: tensor<1x?x16x64xf32>) -> tensor<1x?x16x64xbf16> {
  %cq, %ck, %cv = nsa.compressed_attention_grad %q, %k, %v, %o, %lse, %g
      cu_seqlens(%cu) {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
         tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x64xbf16>,
         tensor<3xi32>)
      -> (tensor<1x?x16x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>)
  %wq, %wk, %wv = nsa.window_attention_grad %q, %k, %v, %o, %lse, %g
      cu_seqlens(%cu) {window = 128, scale = 0.125 : f32}
      : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
         tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x64xbf16>,
         tensor<3xi32>)
      -> (tensor<1x?x16x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>)
  %c1 = arith.constant 1 : index
  %t = tensor.dim %q, %c1 : tensor<1x?x16x64xbf16>
  %init = tensor.empty(%t) : tensor<1x?x16x64xbf16>
  %sum = linalg.generic {indexing_maps = [#id, #id, #id, #id],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%cq, %other, %wq : tensor<1x?x16x64xf32>, tensor<1x?x16x64xf32>,
                             tensor<1x?x16x64xf32>)
      outs(%init : tensor<1x?x16x64xbf16>) {
  ^bb0(%a: f32, %b: f32, %c: f32, %out: bf16):
    %0 = arith.addf %a, %b : f32
    %1 = arith.addf %0, %c : f32
    %2 = arith.truncf %1 : f32 to bf16
    linalg.yield %2 : bf16
  } -> tensor<1x?x16x64xbf16>
  return %sum : tensor<1x?x16x64xbf16>
}

// -----

// The combine_grad kernel writes the rows' D = rowsum(do_b o_b) of the
// window gradient, which takes the window's do_b and output (do_b rounded
// to bf16 as stored, a second row sum by xor shuffles); that gradient's
// first launch then writes lse2 alone. The compressed gradient takes
// another output, so it computes its D itself.
// CHECK-LABEL: func.func @delta_from_combine
// CHECK: %[[D:.*]] = memref.alloc({{.*}}) : memref<1x?x16xf32>
// CHECK: function(@delta_from_combine_combine_grad_flash_0)
// CHECK: arith.truncf {{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK: arith.extf {{.*}} : vector<8xbf16> to vector<8xf32>
// CHECK: gpu.shuffle  xor
// CHECK: memref.store %{{.*}}, %[[D]]
// CHECK: function(@delta_from_combine_window_attention_grad_flash_1_delta)
// CHECK-NOT: vector.reduction
// CHECK: function(@delta_from_combine_window_attention_grad_flash_1_dq)
// CHECK: memref.load %[[D]]
// CHECK: function(@delta_from_combine_compressed_attention_grad_flash_2_delta)
// CHECK: vector.reduction <add>
// CHECK: return
// NODELTA-LABEL: func.func @delta_from_combine
// NODELTA: function(@delta_from_combine_window_attention_grad_flash_1_delta)
// NODELTA: vector.reduction <add>
func.func @delta_from_combine(%oc: tensor<1x?x16x64xbf16>,
    %os: tensor<1x?x16x64xbf16>, %ow: tensor<1x?x16x64xbf16>,
    %gates: tensor<1x?x16x3xbf16>, %do: tensor<1x?x16x64xbf16>,
    %q: tensor<1x?x16x64xbf16>, %k: tensor<1x?x1x64xbf16>,
    %v: tensor<1x?x1x64xbf16>, %lse: tensor<1x?x16xf32>)
    -> (tensor<1x?x16x64xf32>, tensor<1x?x16x64xf32>) {
  %gc, %gs, %gw, %gg = nsa.combine_grad %oc, %os, %ow, %gates, %do
      : (tensor<1x?x16x64xbf16>, tensor<1x?x16x64xbf16>, tensor<1x?x16x64xbf16>,
         tensor<1x?x16x3xbf16>, tensor<1x?x16x64xbf16>)
      -> (tensor<1x?x16x64xbf16>, tensor<1x?x16x64xbf16>, tensor<1x?x16x64xbf16>,
          tensor<1x?x16x3xbf16>)
  %wq, %wk, %wv = nsa.window_attention_grad %q, %k, %v, %ow, %lse, %gw
      {window = 128, scale = 0.125 : f32}
      : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
         tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x64xbf16>)
      -> (tensor<1x?x16x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>)
  %cq, %ck, %cv = nsa.compressed_attention_grad %q, %k, %v, %ow, %lse, %gc
      {block = 32, stride = 16, scale = 0.125 : f32}
      : (tensor<1x?x16x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>,
         tensor<1x?x16x64xbf16>, tensor<1x?x16xf32>, tensor<1x?x16x64xbf16>)
      -> (tensor<1x?x16x64xf32>, tensor<1x?x1x64xf32>, tensor<1x?x1x64xf32>)
  return %wq, %cq : tensor<1x?x16x64xf32>, tensor<1x?x16x64xf32>
}
