//===- Passes.td - nsa transformation passes ----------------*- tablegen -*-===//
//
// The passes that take `nsa` ops from one layer down to tiled loops. One
// pass per file in lib/Transforms/, named after its def here.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_TRANSFORMS_PASSES_TD
#define NSA_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def Decompose : Pass<"nsa-decompose"> {
  let summary = "Rewrite nsa.sparse_attention into the branch ops";
  let description = [{
    Replaces each `nsa.sparse_attention` by its three branches and their
    combination, exactly as docs/Spec.md defines the layer:

    ```
    kc, vc       = nsa.compress(k), nsa.compress(v)        (phi of the config)
    o_cmp, lse   = nsa.compressed_attention(q, kc, vc)
    idx          = nsa.select_blocks(q, kc, lse)           (Eq. 9, 10, top-n)
    o_slc        = nsa.selected_attention(q, k, v, idx)
    o_win        = nsa.window_attention(q, k, v)
    o            = nsa.combine(o_cmp, o_slc, o_win, gates)
    ```

    The default softmax scale `1/sqrt(Dqk)` is made explicit on every branch.
    With the learned (`linear`) phi, `cmp_weights [2, H, l]` is split into
    the key and value weights with `tensor.extract_slice`.

    Each `nsa.sparse_attention_decode` (a decoding step, Spec section 12)
    becomes the four attention branches over its caches, each with its
    `kv_lens`, on the compressed caches it is given (no `nsa.compress`),
    and `nsa.combine`.

    Each `nsa.sparse_attention_grad` becomes the same forward branches
    (shared with the layer's forward after CSE) and their gradients, the
    selected indices held fixed (Spec section 9):

    ```
    do_cmp, do_slc, do_win, dg = nsa.combine_grad(o_cmp, o_slc, o_win, gates, do)
    dq1, dkc, dvc = nsa.compressed_attention_grad(q, kc, vc, o_cmp, lse_cmp, do_cmp)
    dq2, dk2, dv2 = nsa.selected_attention_grad(q, k, v, idx, o_slc, lse_slc, do_slc)
    dq3, dk3, dv3 = nsa.window_attention_grad(q, k, v, o_win, lse_win, do_win)
    dk1, dwk      = nsa.compress_grad(dkc, k)          (dwk for linear phi)
    dv1, dwv      = nsa.compress_grad(dvc, v)
    dq, dk, dv    = dq1 + dq2 + dq3, dk1 + dk2 + dk3, dv1 + dv2 + dv3
    ```

    The branch gradients are f32; the sums are one elementwise
    `linalg.generic` each, rounded once to the input's element type, and the
    weight gradients are inserted into `[2, H, l]`.

    Training (docs/Spec.md section 9.1): an `nsa.sparse_attention` with the
    seven saved-state results returns `o_cmp, lse_cmp, idx, o_slc, lse_slc,
    o_win, lse_win` beside `o`, and an `nsa.sparse_attention_grad` with
    `saved(...)` takes them in place of the forward branches: only
    `kc, vc` are rebuilt.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::linalg::LinalgDialect",
                           "::mlir::tensor::TensorDialect"];
}

def Tile : Pass<"nsa-tile"> {
  let summary = "Tile the nsa branch ops into block-aligned, GQA-grouped loops";
  let description = [{
    Rewrites every branch op into an `scf.forall` over
    (sequence, KV head, query tile) whose iteration owns the `G` query heads
    of one KV head, so the rows of a tile are (token, head) pairs:

    * `nsa.compressed_attention`, `nsa.window_attention`: `query-tile`
      tokens x G heads per iteration, an `scf.for` over key tiles of
      `kv-tile` compressed blocks or tokens (only those the tile can see),
      online softmax with a running max and sum, the log-sum-exp as a
      second output;
    * `nsa.selected_attention`: one token x G heads per iteration (each
      token has its own blocks), an `scf.for` over its `n` index slots that
      gathers each selected block of `l'` keys;
    * `nsa.select_blocks`: `query-tile` tokens x G heads per iteration,
      walking the tile's causal selection blocks in chunks of
      `kv-tile * d / l'`; per chunk the compression probabilities of the
      overlapping compressed blocks are recomputed from the lse (one
      contraction for the tile) and summed into each token's block scores
      (Eq. 9, 10), the backbone's blocks forced, and the chunk merged into
      each token's running top-n;
    * `nsa.compress`: the compressed rows that read about `kv-tile` tokens
      of one sequence and KV head per iteration, a strided pooling
      `linalg.generic`;
    * `nsa.combine`: one elementwise `linalg.generic`;
    * `nsa.compress_append`: one iteration per (batch row, KV head, block
      the step may complete), whose shared out is the compressed cache, so
      only the rows of completed blocks are written.

    Tile contents are `linalg.generic` ops on tensors of static shapes:
    scores and `P V` stay contractions for the GPU mapping; masks use
    `linalg.index`. Tiles are zero-padded at sequence ends and masked, so
    any `T` works. Packed sequences (`cu_seqlens`) become one forall index
    per sequence. With `kv_lens` (decoding, Spec section 12) a batch row's
    query rows are the positions from `kv_lens[b] - T` on, and its keys the
    cache's first `kv_lens[b]` rows.
  }];
  let options = [
    Option<"queryTile", "query-tile", "int64_t", /*default=*/"16",
           "query tokens per tile (compressed and window branches, block "
           "selection); 0: query-rows / G">,
    Option<"queryRows", "query-rows", "int64_t", /*default=*/"64",
           "(token, head) rows per query tile when query-tile is 0">,
    Option<"kvTile", "kv-tile", "int64_t", /*default=*/"64",
           "tokens or compressed blocks per key tile">
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::linalg::LinalgDialect",
    "::mlir::math::MathDialect", "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect"
  ];
}

def AnalyzeReach : Pass<"nsa-analyze-reach"> {
  let summary = "Compute the hop bound and per-query cost of each layer's backbone";
  let description = [{
    For every `nsa.sparse_attention`, computes at a sequence length T the
    exact worst-case number of layers (hops) information needs to travel
    from any token to any later token using only the always-on blocks of
    the backbone and the sliding window (causally), together with the most
    forced blocks of any query and the keys it reads through them and the
    window. The result is emitted as a remark and attached as
    `nsa.reach = #nsa.reach<...>`. T is `seq-len` when given, else the
    config's `max_tokens`, else the op's static token count.

    The algorithm and its proof sketch are in docs/Spec.md, section 11.
  }];
  let options = [
    Option<"seqLen", "seq-len", "int64_t", /*default=*/"0",
           "sequence length to analyze (0: max_tokens or the static T)">
  ];
}

def MapToGPU : Pass<"nsa-map-to-gpu", "::mlir::func::FuncOp"> {
  let summary = "Map bufferized nsa tiles onto GPU thread blocks";
  let description = [{
    Runs on the bufferized output of `nsa-tile` (memrefs whose arguments
    live in device memory) and makes it a GPU program:

    * each `scf.forall` of tiles becomes a `gpu.launch` of one thread block
      per iteration (the last, largest forall dimension on grid x) of
      `block-size` threads, or of the threads `kernel-block-sizes` gives the
      op the forall computes (`select_blocks=256`: the name nsa-tile put on
      it, which also names the kernel);
    * the tile buffers it allocates (all of static shape) are placed in
      dynamic shared memory, each 16-byte aligned;
    * `linalg` ops, `linalg.fill` and `memref.copy` on tiles are
      distributed over the block's threads and followed by a barrier: a
      strided loop over their parallel iterations (each thread divides
      only before its loop, then steps its point with carries), the
      reductions sequential per thread, generics with several outputs in
      one pass; fills and copies store 16-byte vectors where the rows'
      size and alignment allow; a max or sum reduction with fewer output
      points than threads (the row statistics of a 16-row tile) gives each
      point 2 to 32 lanes of a warp, which fold strided steps and combine
      them with xor shuffles (sums then add in another order);
    * loops and branches that only update scalars or small tiles through
      `memref.store` run on thread 0, followed by a barrier;
    * outside the foralls, buffers become `gpu.alloc` (freed before
      returning), copies `gpu.memcpy`, and `linalg` ops their own launches.

    * tile contractions `C[m, n] += A[m, k] * B[n, k]` (or `B[k, n]`) in
      bf16 with f32 accumulation whose sizes are multiples of 16 x 8 x 16
      (the scores `Q K^T` and `P V` of the attention tiles) run on tensor
      cores: each warp takes a 16-row strip of up to 16 output tiles of
      16 x 8, keeps their accumulators in registers over K and issues
      `nvvm.mma.sync` (m16n8k16) on fragments that `nvgpu.ldmatrix` reads
      from shared memory (single loads where an operand is not a shared
      tile with 16-byte aligned rows); a zero fill of C just before is
      dropped and the accumulators start at zero.

    The other tile ops (softmax statistics, rescaling) run on CUDA cores,
    one element per thread, with their tiles in shared memory.
  }];
  let options = [
    Option<"blockSize", "block-size", "int64_t", /*default=*/"128",
           "threads per block">,
    ListOption<"kernelBlockSizes", "kernel-block-sizes", "std::string",
               "op=threads entries that override block-size for the "
               "kernels of an op">
  ];
  let dependentDialects = [
    "::mlir::gpu::GPUDialect", "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect", "::mlir::arith::ArithDialect",
    "::mlir::affine::AffineDialect", "::mlir::LLVM::LLVMDialect",
    "::mlir::NVVM::NVVMDialect", "::mlir::nvgpu::NVGPUDialect",
    "::mlir::vector::VectorDialect"
  ];
}

def FlashAttention : Pass<"nsa-flash-attention", "::mlir::func::FuncOp"> {
  let summary = "GPU strategy flash: attention branches as FlashAttention-2 kernels";
  let description = [{
    The `flash` GPU strategy of `nsa-to-ptx` (sm_80 and newer, bf16). Runs
    after `nsa-decompose` and before `nsa-tile`: each
    `nsa.window_attention`, `nsa.compressed_attention`,
    `nsa.select_blocks` and `nsa.selected_attention` named in `ops` whose
    shapes the strategy takes
    (static heads and dims, `Dqk` and `Dv` multiples of 16, `G` a divisor
    of 16, selection blocks a multiple of 16 keys) becomes one
    `gpu.launch` built by hand (lib/Conversion/NSAToGPU/FlashKernel.cpp) on
    the op's buffers (`bufferization.to_buffer` of its operands, its results
    `bufferization.to_tensor` of fresh buffers). The ops it does not take are
    left to `nsa-tile` and the generic mapping.

    One thread block owns `query-rows` (token, head) rows of one KV head
    (`16 * warps` rows; for selected attention 16 rows, the G heads of
    16 / G tokens) and walks its key tiles of `kv-tile` keys. Where those
    options are 0 (the default) the choice is made per kernel: 64 rows and
    64 keys, but compressed attention with `sm90` takes 128 rows (two
    warpgroups sharing each tile) and 128-key tiles (m64n128k16), which
    measured faster than 64 rows and keys or 96-key tiles
    (docs/Benchmarks.md).

    * key tiles are staged by `cp.async` (`nvgpu.device_async_copy`, rows
      past the end zero-filled) into a ring of `stages` shared-memory
      buffers, rows padded against bank conflicts;
    * each warp keeps its 16 query rows as `ldmatrix` fragments in
      registers, computes `S = Q K^T` with `mma.sync` m16n8k16 into
      registers, masks it with the branch's visibility rule as one key
      interval per row (window: `t - w < s <= t`; compressed:
      `i d + l - 1 <= t`; selected: `s <= t` within the row's own blocks),
      runs the online softmax on the accumulator fragments (quad shuffles,
      `ex2.approx`, the scale folded into log2 units), rounds `P` to bf16
      in registers as the A operand of `P V`, and rescales its `O`
      accumulators in registers;
    * selected attention walks the union of the distinct blocks its tokens
      chose (built in shared memory), its warps splitting each block's keys
      and merging their (max, sum, O) at the end;
    * the epilogue divides by the sum and writes O and the lse (0 and
      `-inf` for rows that saw no key).

    Block selection (`n <= 16`) walks the compressed keys the same way,
    one token per warp whose first G rows are its heads (for `G < 16` the
    rest are padding: zero Q rows whose probabilities are dropped, the cost
    per token of `G = 16`): `exp(s q.k - lse)` of the visible
    blocks (the compressed attention's lse, Spec 5.1) summed over the warp's
    rows (Eq. 10) by shuffles, Eq. 9's overlap weights applied to those
    column sums in shared memory (with the last `l/d - 1` columns carried
    to the next tile), forced blocks scored `+inf`, and each tile's
    selection blocks merged into the token's running top-n held in the
    warp's lanes (a rank among 32 entries: valid first, higher score, lower
    index); the result is written in increasing block order with `-1`
    padding (Spec 5.4). With wgmma and `Dqk > 128` its loop is pipelined:
    a ring stage is free once its S completes, so the ring is refilled
    `stages` tiles ahead, and the next tile's S runs on the tensor cores
    during this tile's scoring.

    Selected attention takes a second loop order, block-major
    (`selected-order`; by default for `G <= 4` on sm90 without
    `cu_seqlens`): per (batch, KV head, selected block) an inverted index
    of the (token, slot) entries that chose it (three launches: count,
    scan, place, by atomics), then one block per work item loads the
    block's K and V once by TMA and walks up to 8 chunks of 64 rows (the
    G heads of 64 / G entries, Q gathered by `cp.async` into one swizzled
    buffer, refilled for the next chunk once this chunk's S is done; three
    blocks an SM): S and P V by wgmma, a one-tile softmax masked at `s <= t`,
    each entry's (O, lse) written to its own partial row; a last launch
    merges every (token, query head)'s valid entries (Spec section 6:
    blocks past the token's own and repeated ones count nothing) weighted
    by `exp(lse)`. A token-major block reads each of its tokens' blocks
    for `G` rows only; here a block is read once per 8 chunks.

    `nsa.compress` becomes one launch without shared memory: each thread
    pools two neighbouring elements of one compressed row straight from
    device memory (mean or learned weights); in the packed layout the rows
    past the last sequence's are zero-filled first. `nsa.combine` becomes
    one launch in which each thread gates 8 elements (16-byte vectors) of
    one (token, head) row, the row's three sigmoids computed once; where
    its window input is a window attention this pass takes and nothing
    else reads, and its other inputs come earlier in the block, the
    combine is that kernel's epilogue instead: the window's O (in f32,
    never stored) gated with the other two branches' O as it is written,
    so the layer's output comes out of the window kernel. Its gradient
    `nsa.combine_grad` (taken with `combine`; Dv / 8 a power of two of at
    most 32) is one launch of the same shape
    (lib/Conversion/NSAToGPU/Gating.cpp): each thread writes its 8 elements
    of every branch's `sigmoid(g_b) do` and adds its part of `o_b . do`
    into the row's gate gradient by xor shuffles over the row's lanes.

    The attention gradients (`nsa.window_attention_grad`,
    `nsa.compressed_attention_grad`, `nsa.selected_attention_grad`, taken
    with their forward branch's name in `ops`) become three launches each
    (lib/Conversion/NSAToGPU/FlashGrad.cpp), no float atomics whose
    order varies: the same bits on every call. A
    thread per (token, head) row computes `D = rowsum(grad * output)` and
    the lse in log2 units; a query-major kernel recomputes `S` and `dP`
    per key tile (window and compressed attention: blocks of 64 rows as in
    the forward; selected attention: 16 rows, or with wgmma 32 for `G` a
    multiple of 16 (`grad-selected-rows`), whose warps split each chosen
    block's keys) and accumulates `dq`; a
    key-major kernel holds a key tile (selected attention: one selection
    block) and walks the query rows that see it, two tokens of `G` heads a
    step, accumulating `dk` and `dv`. Selected attention finds a block's
    tokens by scanning the index rows of the tokens after it into a queue
    in shared memory, in increasing token order. Where a compressed or
    selected key tile sees more than `grad-chunk-tokens` tokens, each
    chunk of them is a block of its own, and the chunks add their sums
    into `dk` and `dv` one after the other in a fixed order, each waiting
    for its turn on a counter (the chunk it waits for is launched before
    it).
    The kernels use `mma.sync`; with `sm90` and `grad-wgmma` (where `Dqk`
    and `Dv` are multiples of 64) every one of them uses the warpgroup
    instructions instead, its resident rows and a 2-stage `cp.async` ring
    of what it walks in the 128-byte-swizzled layout. The dq kernels of
    window and compressed attention hold 64 rows of Q and dO and walk key
    tiles of `grad-key-tile` keys: `S = Q K^T` and `dP = dO V^T` are chains
    of m64nNk16 from shared memory, and `dq += dS K` one of m64nDqkk16 with
    `dS` from registers and K read transposed. The dk, dv kernels take
    `S^T = K Q^T`, `dP^T = V dO^T` from shared memory and `dv += P^T dO`,
    `dk += dS^T Q` with A from registers. Selected attention's dq (16
    rows) takes the transposes, a chosen block's 64 keys as M: `S^T`,
    `dP^T` from shared memory, then `dq^T += K^T dS^T` with `dS^T` through
    shared memory and K read transposed. With `grad-tma` (on by default)
    the walked tiles come by TMA instead: tensor maps made on the host
    (dq: K and V, boxes of the tile's keys of one head; dk, dv: Q and dO,
    boxes of a step's tokens by the group's G heads, or for selected
    attention one token's, where G is a multiple of 8), thread 0 loading a
    stage of the 2-stage ring on its mbarrier, every thread waiting for its
    parity. The resident rows and the dk, dv steps' lse2 and D still come
    by `cp.async`.
    With `grad-fuse-sum` (on by default) the sum of the branches' query
    gradients that `nsa-decompose` builds (a `linalg.generic` adding the
    f32 dq of the three gradient ops in order and rounding once to dq's
    type) is the epilogue of the last of their dq kernels: it reads the
    other branches' dq where it stores its own, adds them in the generic's
    order and writes the rounded sum, so its own f32 dq is never stored and
    the generic is gone.

    A decoding step (docs/Spec.md section 12, docs/Decode.md; taken with
    `decode` in `ops`): the compressed, selected and window attention with
    `kv_lens` that `nsa-decompose` makes of `nsa.sparse_attention_decode`,
    their block selection and their `nsa.combine`, where nothing else reads
    their results, become two launches split over the keys
    (lib/Conversion/NSAToGPU/FlashDecode.cpp), so that a step at B = 1
    still fills the GPU. A split is a run of chunks of `decode-chunk-keys`
    keys, as many chunks a split as bring the blocks of every branch near
    `decode-target-blocks`; a block holds the 16 (token, head) rows of one
    token's G heads as `mma.sync` fragments and walks its chunks: each
    key's row and visibility computed where used, K and V staged by
    `cp.async` (the next chunk's K under this chunk's softmax and P V, its
    V under the next S), `S = Q K^T` a warp per 16 keys, the online softmax
    on 16 rows, `O += P V` with warps splitting Dv; the split's (max, sum,
    O) go to a workspace. Compressed chunks also write their Eq. 9 partials
    `sum_i w(i, j) exp2(s_i - m)` per row and selection block with the max
    they are relative to. The first launch walks the compressed and window
    splits; each block of the second chooses its token's blocks itself (the
    group's lse from the splits, the chunk partials staged by `cp.async`
    and summed over the rows (Eq. 10), forced blocks `+inf`, the n best by
    a radix select over a shared histogram), merges a share of the
    compressed and window splits, attends its selected split, and the last
    block of a row tile (a count between fences) merges the selected
    splits, rounds each branch to bf16 as the branch ops' results are, and
    gates them. On sm_90 with G <= 16, a step whose batch rows x row tiles x
    `decode-cluster-blocks` come to at most `decode-target-blocks / 2` is
    instead one launch in clusters of `decode-cluster-blocks` blocks, a
    cluster a row tile: the compressed splits, a cluster barrier, the
    selected splits (choosing as above) and the window splits, a second
    cluster barrier, then every block merges and gates its share of the
    rows (the host picks the path from B).
    `nsa.compress_append` of the step's keys and values becomes one launch
    that pools the completed blocks straight into the caches the results
    are materialized in (in place when the runtime passes the caches' own
    addresses; elsewhere it also copies the other rows).

    With `sm90` (sm_90a; `nsa-to-ptx` sets it for that chip) every
    attention and selection kernel whose `Dqk` and `Dv` are multiples of 64
    takes its key tiles by TMA: tensor maps made on the host
    (`nvgpu.tma.create.descriptor`: the tile's keys of one head by 64
    columns, 128-byte swizzle, zero past the end), one thread loading into a
    ring of `stages` buffers, each with an mbarrier, `stages - 1` tiles
    ahead (the `mma.sync` kernels read them with swizzled `ldmatrix`
    addresses). In kernels of two warpgroups no block barrier closes a
    tile: each warp counts itself out of the stage it read (an atomic add
    in shared memory) and the warp completing the count refills it,
    `stages` tiles ahead. With `overlap` (on by default) their attention
    loop keeps K and V on separate mbarriers and issues each tile's S
    together with the last tile's P V, the softmax running while P V is on
    the tensor cores; with `pingpong` the two warpgroups also take turns
    issuing (measured slower for Dqk = 128, so off by default). Window and compressed attention and block selection with
    64- or 128-row blocks (one or two warpgroups) and 64-key tiles (96 or
    128 for attention) also
    switch to the warpgroup instructions: Q stays in shared memory (copied
    by `cp.async` in the swizzled layout), `S = Q K^T` is a chain of
    `wgmma.mma_async` m64nNk16 (N the key tile, 64, or 128 for
    attention) reading both from shared memory and
    `O += P V` one of m64nDvk16 with `P` from registers and V read
    transposed from shared memory; the softmax between them is the same.
  }];
  let options = [
    Option<"sm90", "sm90", "bool", /*default=*/"false",
           "use the sm_90a instructions (TMA, wgmma) where the shapes allow">,
    ListOption<"ops", "ops", "std::string",
               "ops to take: compress, window, compressed, select "
               "(select_blocks), selected, combine, decode (a decoding "
               "step's branch ops and combine together; empty: all)">,
    Option<"queryRows", "query-rows", "int64_t", /*default=*/"0",
           "(token, head) rows per block for window and compressed "
           "attention (16, 32, 64 or 128: one warp per 16 rows; 0: chosen "
           "per kernel)">,
    Option<"kvTile", "kv-tile", "int64_t", /*default=*/"0",
           "keys per tile for window and compressed attention (16 to 128, "
           "a multiple of 16; wgmma takes 64, 96 or 128; 0: chosen per "
           "kernel; block selection keeps 64)">,
    Option<"selectRows", "select-rows", "int64_t", /*default=*/"0",
           "(token, head) rows per block for block selection (16 to 128, a "
           "multiple of 16; 0: 128 with sm90, else 64)">,
    Option<"selectedRows", "selected-rows", "int64_t", /*default=*/"0",
           "(token, head) rows per block for token-major selected attention "
           "(16 to 128, a multiple of 16; 16: the G heads of 16 / G tokens, "
           "whose warps split each block's keys; more: one warp per 16 "
           "rows, and with G a multiple of 16 a warp skips the blocks its "
           "token did not choose; 0: chosen per kernel)">,
    Option<"selectedOrder", "selected-order", "std::string",
           /*default=*/"\"auto\"",
           "selected attention's loop order: token, block (sm90, no "
           "cu_seqlens, Dqk and Dv multiples of 64) or auto (block for G "
           "<= 4)">,
    Option<"overlap", "overlap", "bool", /*default=*/"true",
           "wgmma window and compressed attention of two warpgroups with a "
           "2-stage ring: K and V on their own mbarriers, each iteration "
           "issuing this "
           "tile's S and the last tile's P V together, the softmax running "
           "while P V is in flight">,
    Option<"pingpong", "pingpong", "bool", /*default=*/"false",
           "with overlap: the two warpgroups take turns (named barriers) "
           "issuing their products, so one's softmax runs under the "
           "other's products">,
    Option<"fuseCombine", "fuse-combine", "bool", /*default=*/"true",
           "window attention takes the nsa.combine of its output as its "
           "epilogue (one kernel writes the layer's output; the window's O "
           "is never stored); off, the combine is a kernel of its own">,
    Option<"stages", "stages", "int64_t", /*default=*/"2",
           "shared-memory buffers of the key-tile ring (2 to 4; with 3 or "
           "more the wgmma attention kernels issue the next tile's S before "
           "this tile's softmax)">,
    Option<"gradChunkTokens", "grad-chunk-tokens", "int64_t",
           /*default=*/"4096",
           "compressed and selected attention gradients: tokens per dk, dv "
           "block of a key block (a multiple of 256; 0: one block walks "
           "all of a key block's tokens); the chunks add into dk and dv in "
           "chunk order">,
    Option<"gradWgmma", "grad-wgmma", "bool", /*default=*/"true",
           "with sm90, the dq kernels of the window and compressed "
           "attention gradients by wgmma (Dqk and Dv multiples of 64); off, "
           "by mma.sync">,
    Option<"gradTma", "grad-tma", "bool", /*default=*/"true",
           "with grad-wgmma, the gradient kernels' walked tiles (dq: K and "
           "V; dk, dv: Q and dO) by TMA into an mbarrier ring; off, by "
           "cp.async from every thread">,
    Option<"gradFuseSum", "grad-fuse-sum", "bool", /*default=*/"true",
           "the dq kernel of the last attention gradient whose query "
           "gradient nsa-decompose sums with the other branches' (a "
           "linalg.generic adding f32 tensors in order and rounding once) "
           "takes that sum as its epilogue: it reads the other terms, adds "
           "its own in the generic's order and writes the rounded sum; off, "
           "the generic stays">,
    Option<"gradFuseDelta", "grad-fuse-delta", "bool", /*default=*/"true",
           "the combine_grad kernel also writes each branch's rows' D = "
           "rowsum(do_b o_b) for the attention gradient that takes do_b "
           "with that branch's output, whose first launch then writes lse2 "
           "alone; off, that launch reads do_b and o_b again">,
    Option<"gradSelectedRows", "grad-selected-rows", "int64_t",
           /*default=*/"0",
           "(token, head) rows per block of the selected attention "
           "gradient's dq kernel (16, or 32 with grad-wgmma; 0: 32 where "
           "G is a multiple of 16 and the kernel takes wgmma, else 16)">,
    Option<"gradKeyTile", "grad-key-tile", "int64_t", /*default=*/"0",
           "keys per tile of the window and compressed attention gradients' "
           "dq kernels (16 to 128, a multiple of 16; 0: 32)">,
    Option<"decodeChunkKeys", "decode-chunk-keys", "int64_t",
           /*default=*/"128",
           "decoding steps: keys a block of the split-K kernels stages at "
           "once (64 or 128, a multiple of l')">,
    Option<"decodeTargetBlocks", "decode-target-blocks", "int64_t",
           /*default=*/"528",
           "decoding steps: the blocks a launch aims for; each split walks "
           "enough chunks that the splits of every branch over the batch's "
           "row tiles come near it (528: four blocks an SM of 132; faster "
           "at B = 64 than 264, docs/Benchmarks.md)">,
    Option<"decodeClusterBlocks", "decode-cluster-blocks", "int64_t",
           /*default=*/"16",
           "decoding steps on sm_90 with G <= 16: blocks of a cluster "
           "(2 to 16; 0: none) of the one-launch step taken where batch rows "
           "x row tiles x these blocks <= decode-target-blocks / 2, a "
           "cluster a row tile with cluster barriers between the branches; "
           "other steps take the two split-K launches">,
    Option<"decodeClusterSelect", "decode-cluster-select", "bool",
           /*default=*/"false",
           "decoding steps that take `_cluster`: every block of the cluster "
           "scores its share of the token's selection blocks after the "
           "compressed splits and the selected blocks take the n best of "
           "the blocks' lists through distributed shared memory (a second "
           "cluster barrier), instead of each selected block ranking all "
           "of them; correct, not faster back to back (docs/Decode.md)">,
    Option<"decodeClusterPush", "decode-cluster-push", "bool",
           /*default=*/"true",
           "decoding steps that take `_cluster` (without "
           "decode-cluster-select): the selected and window splits push "
           "their rows by st.async (PTX 8.1: features=+ptx81 or later) "
           "into the shared memory of the cluster's blocks that attend to "
           "no selected or window keys, which merge them, instead of a "
           "second cluster barrier and a merge through the global "
           "workspace (nsa-to-ptx turns it off below PTX 8.1)">,
    Option<"decodeTrace", "decode-trace", "bool", /*default=*/"false",
           "profiling: `_cluster`'s blocks of the first row tile print "
           "%globaltimer stamps of the step's phases (printf, a line "
           "\"NSA_TRACE rank stamps...\" a block; bench/trace.py reads them)">,
    Option<"gradDeterministic", "grad-deterministic", "bool",
           /*default=*/"true",
           "the chunks of a key block add into dk and dv one after the other "
           "in chunk order, each waiting for its turn (the same bits on "
           "every call); off, each adds as soon as it is done (f32 atomics "
           "in the order the chunks finish)">
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::bufferization::BufferizationDialect",
    "::mlir::gpu::GPUDialect", "::mlir::linalg::LinalgDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::math::MathDialect", "::mlir::memref::MemRefDialect",
    "::mlir::NVVM::NVVMDialect", "::mlir::nvgpu::NVGPUDialect",
    "::mlir::scf::SCFDialect", "::mlir::vector::VectorDialect"
  ];
}

def AsyncLaunches : Pass<"nsa-async-launches", "::mlir::func::FuncOp"> {
  let summary = "Enqueue a function's GPU work on one stream, waiting once";
  let description = [{
    Runs after `nsa-map-to-gpu`, before kernel outlining. In every block of
    host code, chains the GPU ops (`gpu.alloc`, `gpu.memcpy`,
    `gpu.memset`, `gpu.launch`, `gpu.dealloc`) on one `!gpu.async.token`:
    a synchronous `gpu.launch` becomes `gpu.launch async [%chain]`, the
    `gpu.wait async` that starts an op's own token is replaced by the
    chain, and a `gpu.wait` for the chain alone is dropped. The host waits
    for the chain (`gpu.wait [%chain]`) only before an op that may touch
    memory (other than a TMA descriptor, which reads only a memref's
    metadata), an op with regions and the block's terminator.

    Lowered by `gpu-to-llvm`, the chain is one stream per call: the kernels
    run back to back instead of each after a host round trip (a stream
    created, synchronized and destroyed per op), and buffers are allocated
    and freed in the stream's order. The function stays synchronous for its
    caller.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def KernelOccupancy : Pass<"nsa-kernel-occupancy", "::mlir::ModuleOp"> {
  let summary = "Tell ptxas how many thread blocks per SM to plan registers for";
  let description = [{
    Runs after kernel outlining. For every kernel that `gpu.launch_func`
    ops launch with constant block and shared-memory sizes, and that has no
    `nvvm.minctasm` yet, sets `nvvm.minctasm` (PTX `.minnctapersm`) to the
    number of its blocks that can be resident on one SM:

        min(shared memory per SM / (shared memory per block + 1 KiB),
            threads-per-sm / threads per block),  at least 1

    over all its launches (228 KiB of shared memory per SM, 1 KiB of it
    reserved per block, as on sm_90). Given only `.maxntid`, ptxas plans
    registers for two resident blocks whatever the shared memory allows:
    an attention tile that takes 140 KiB of shared memory gets 80 registers
    at 384 threads and spills, although only one such block fits. Kernels
    whose launches are not all constant get 1.
  }];
  let options = [
    Option<"threadsPerSM", "threads-per-sm", "int64_t", /*default=*/"512",
           "resident threads per SM to plan registers for (64 to 2048), "
           "where shared memory allows as many">
  ];
}

def VerifyDialects : Pass<"nsa-verify-dialects"> {
  let summary = "Check that only the allowed dialects remain";
  let description = [{
    The last pass of every nsa pipeline: fails, naming the first offending
    op, when an op of a dialect outside `allowed` remains. It states the
    contract of a pipeline (for example `nsa-to-cpu` leaves only `llvm` and
    `builtin`) and catches a lowering that silently stopped half way.
  }];
  let options = [
    ListOption<"allowed", "allowed", "std::string",
               "dialect namespaces that may remain (empty: any)">,
    ListOption<"forbidden", "forbidden", "std::string",
               "dialect namespaces that must not appear">
  ];
}

#endif // NSA_TRANSFORMS_PASSES_TD
