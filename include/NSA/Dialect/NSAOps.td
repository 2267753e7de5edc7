//===- NSAOps.td - nsa operations ---------------------------*- tablegen -*-===//
//
// The operations of the nsa dialect: one whole NSA layer, its decoding step
// over a KV cache and the branch ops that `nsa-decompose` rewrites them into
// (plus the compressed cache's append and the gradients). The math of each op is stated
// exactly in docs/Spec.md; the descriptions here summarise it.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_DIALECT_NSAOPS_TD
#define NSA_DIALECT_NSAOPS_TD

include "NSA/Dialect/NSAAttrs.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/CommonAttrConstraints.td"

def NSA_PositiveI64Attr : ConfinedAttr<I64Attr, [IntPositive]>;

//===----------------------------------------------------------------------===//
// nsa.sparse_attention
//===----------------------------------------------------------------------===//

def NSA_SparseAttentionOp : NSA_Op<"sparse_attention", [Pure,
    AttrSizedOperandSegments]> {
  let summary = "one Native Sparse Attention layer";
  let description = [{
    Computes, for every query token `t` and query head `hq` (KV head
    `h = hq / G`, `G = HQ / H`):

    ```
    o[t, hq] = sigmoid(g[t, hq, 0]) * o_cmp[t, hq]
             + sigmoid(g[t, hq, 1]) * o_slc[t, hq]
             + sigmoid(g[t, hq, 2]) * o_win[t, hq]
    ```

    where `o_cmp` attends over the compressed keys/values whose block ends at
    or before `t`, `o_slc` over the top-`n` selection blocks chosen from the
    compression scores summed over the `G` heads of the group, and `o_win`
    over the last `w` tokens (docs/Spec.md, section "sparse_attention").

    Operands: `query [B, T, HQ, Dqk]`, `key [B, T, H, Dqk]`,
    `value [B, T, H, Dv]` (all f16, bf16 or f32), `gates [B, T, HQ, 3]`
    (gate logits; element type of `query` or f32), optional
    `cmp_weights [2, H, l]` f32 (the learned phi's key and value weights,
    present exactly when `config.pool` is `linear`) and optional
    `cu_seqlens [S + 1]` i32 (packed variable-length sequences; then `B = 1`).
    Result: `[B, T, HQ, Dv]` with the element type of `query`.

    Training: the op may also return the state its gradient needs (the
    "saved state", docs/Spec.md section 9.1), seven results after `result`
    in this order: the compressed branch's output and lse, the selected
    indices, the selected branch's output and lse, the window branch's
    output and lse (outputs `[B, T, HQ, Dv]` with the query's element type,
    lse `[B, T, HQ]` f32, indices `[B, T, H, n]` i32). Passed to
    `nsa.sparse_attention_grad` as `saved(...)`, they spare it the forward
    recomputation.

    Example:

    ```mlir
    %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<
           cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16,
           window = 512, backbone = <initial = 1, local = 2>>}
         : (tensor<1x?x64x192xbf16>, tensor<1x?x4x192xbf16>,
            tensor<1x?x4x128xbf16>, tensor<1x?x64x3xbf16>)
         -> tensor<1x?x64x128xbf16>
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$value,
    AnyRankedTensor:$gates,
    Optional<AnyRankedTensor>:$cmp_weights,
    Optional<AnyRankedTensor>:$cu_seqlens,
    NSA_ConfigAttr:$config
  );
  let results = (outs AnyRankedTensor:$result,
                      Variadic<AnyRankedTensor>:$saved);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $gates
    (`cmp_weights` `(` $cmp_weights^ `)`)?
    (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// nsa.sparse_attention_decode
//===----------------------------------------------------------------------===//

def NSA_SparseAttentionDecodeOp : NSA_Op<"sparse_attention_decode", [Pure]> {
  let summary = "one NSA layer for the newest tokens of sequences in a KV cache";
  let description = [{
    A decoding step (docs/Spec.md section 12). Batch row `b` holds
    `L_b = kv_lens[b]` tokens in the caches, this step's `Tq` new ones
    included; query row `j` is the token at position `L_b - Tq + j`, and
    output row `(b, j)` equals row `L_b - Tq + j` of `nsa.sparse_attention`
    applied to the first `L_b` tokens of sequence `b`.

    Operands: `query [B, Tq, HQ, Dqk]`, `key_cache [B, Lmax, H, Dqk]`,
    `value_cache [B, Lmax, H, Dv]` (rows `0 .. L_b - 1` valid), the
    compressed caches `cmp_key_cache [B, Nc(Lmax), H, Dqk]` and
    `cmp_value_cache [B, Nc(Lmax), H, Dv]` (rows `0 .. Nc(L_b) - 1` valid,
    as `nsa.compress_append` keeps them), `gates [B, Tq, HQ, 3]` and
    `kv_lens [B]` i32. Result: `[B, Tq, HQ, Dv]`. The config is the
    forward's; its `pool` is the compressed cache's business, so the op
    takes no phi weights. The runtime checks `Tq <= L_b <= Lmax` before any
    launch.

    Example:

    ```mlir
    %o = nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g
        kv_lens(%lens) {config = #cfg}
        : (tensor<4x1x64x192xbf16>, tensor<4x65536x4x192xbf16>,
           tensor<4x65536x4x128xbf16>, tensor<4x4095x4x192xbf16>,
           tensor<4x4095x4x128xbf16>, tensor<4x1x64x3xbf16>, tensor<4xi32>)
        -> tensor<4x1x64x128xbf16>
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key_cache,
    AnyRankedTensor:$value_cache,
    AnyRankedTensor:$cmp_key_cache,
    AnyRankedTensor:$cmp_value_cache,
    AnyRankedTensor:$gates,
    AnyRankedTensor:$kv_lens,
    NSA_ConfigAttr:$config
  );
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $query `,` $key_cache `,` $value_cache `,` $cmp_key_cache `,`
    $cmp_value_cache `,` $gates `kv_lens` `(` $kv_lens `)`
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// nsa.compress
//===----------------------------------------------------------------------===//

def NSA_CompressOp : NSA_Op<"compress", [Pure, AttrSizedOperandSegments]> {
  let summary = "pool keys or values into compressed blocks (phi)";
  let description = [{
    Pools blocks of `block` [l] tokens taken every `stride` [d] tokens:
    compressed block `i` covers tokens `[i*d, i*d + l)` and exists when
    `i*d + l <= T`, so there are `Nc(T) = T < l ? 0 : (T - l) / d + 1` of
    them. `pool` selects phi (`#nsa.pool<mean>` or `#nsa.pool<linear>`, the
    latter with `weights [H, l]` f32).

    Input `[B, T, H, D]`; result `[B, Nc(T), H, D]` of the same element type.
    With `cu_seqlens` (packed, `B = 1`) each sequence is compressed on its
    own, sequence `s` starting at row `sum_{s' < s} Nc(L_s')`; the result has
    `floor(T / d)` rows and rows past the last block are zero.

    Example:

    ```mlir
    %kc = nsa.compress %k {block = 32, stride = 16, pool = #nsa.pool<mean>}
        : (tensor<2x1000x4x192xbf16>) -> tensor<2x61x4x192xbf16>
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$input,
    Optional<AnyRankedTensor>:$weights,
    Optional<AnyRankedTensor>:$cu_seqlens,
    NSA_PositiveI64Attr:$block,
    NSA_PositiveI64Attr:$stride,
    NSA_PoolKindAttr:$pool
  );
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input (`weights` `(` $weights^ `)`)? (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Number of rows of the result for `seqLen` tokens (dynamic stays
    /// dynamic).
    int64_t getNumRows(int64_t seqLen);
  }];
}

//===----------------------------------------------------------------------===//
// nsa.compress_append
//===----------------------------------------------------------------------===//

def NSA_CompressAppendOp : NSA_Op<"compress_append", [Pure]> {
  let summary = "compress the blocks a decoding step completes";
  let description = [{
    Keeps a compressed cache up to date as tokens are appended
    (docs/Spec.md section 12). Batch row `b` of `input [B, Lmax, H, D]`
    holds `L_b = kv_lens[b]` tokens after this step's `appended` ones.
    Compressed blocks `Nc(L_b - appended) .. Nc(L_b) - 1` are the ones
    that became complete: the result is `compressed [B, Nc(Lmax), H, D]`
    with exactly those rows pooled from `input` as `nsa.compress` pools
    them, and every other row unchanged. Block `i` reads tokens
    `[i*d, i*d + l)` only, so the cache is never compressed again.

    Example (one token per step; a block completes every `d` steps):

    ```mlir
    %kc2 = nsa.compress_append %k, %kc kv_lens(%lens)
        {block = 32, stride = 16, pool = #nsa.pool<mean>, appended = 1}
        : (tensor<4x65536x4x192xbf16>, tensor<4x4095x4x192xbf16>,
           tensor<4xi32>) -> tensor<4x4095x4x192xbf16>
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$input,
    AnyRankedTensor:$compressed,
    AnyRankedTensor:$kv_lens,
    Optional<AnyRankedTensor>:$weights,
    NSA_PositiveI64Attr:$block,
    NSA_PositiveI64Attr:$stride,
    NSA_PoolKindAttr:$pool,
    NSA_PositiveI64Attr:$appended
  );
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input `,` $compressed `kv_lens` `(` $kv_lens `)`
    (`weights` `(` $weights^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// nsa.compressed_attention
//===----------------------------------------------------------------------===//

def NSA_CompressedAttentionOp : NSA_Op<"compressed_attention", [Pure,
    AttrSizedOperandSegments]> {
  let summary = "attention over the compressed blocks visible to each token";
  let description = [{
    For token `t` (position within its sequence) and query head `hq`, attends
    over the compressed keys/values `i` of KV head `hq / G` whose block ends
    at or before `t`: `i*d + l - 1 <= t`. Returns the output and the
    natural-log log-sum-exp of the scaled scores. A token that sees no
    compressed block yet (`t < l - 1`) gets output 0 and lse `-inf`.

    Operands: `query [B, T, HQ, Dqk]`, `key [B, Nc, H, Dqk]`,
    `value [B, Nc, H, Dv]` (from `nsa.compress`), optional `cu_seqlens`.
    Results: `[B, T, HQ, Dv]` (element type of `query`) and `[B, T, HQ]` f32.

    Decoding (docs/Spec.md section 12): with `kv_lens [B]` i32 the `T`
    query rows are the last `T` of `kv_lens[b]` tokens, row `j` at position
    `kv_lens[b] - T + j`, and `key`/`value` are a compressed cache of any
    number of rows of which the first `Nc(kv_lens[b])` are valid.

    Example:

    ```mlir
    %o, %lse = nsa.compressed_attention %q, %kc, %vc
        {block = 32, stride = 16, scale = 0.125 : f32}
        : (tensor<1x100x8x64xf32>, tensor<1x5x2x64xf32>, tensor<1x5x2x64xf32>)
        -> (tensor<1x100x8x64xf32>, tensor<1x100x8xf32>)
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$value,
    Optional<AnyRankedTensor>:$cu_seqlens,
    Optional<AnyRankedTensor>:$kv_lens,
    NSA_PositiveI64Attr:$block,
    NSA_PositiveI64Attr:$stride,
    F32Attr:$scale
  );
  let results = (outs AnyRankedTensor:$output, AnyRankedTensor:$lse);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    (`kv_lens` `(` $kv_lens^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// nsa.select_blocks
//===----------------------------------------------------------------------===//

def NSA_SelectBlocksOp : NSA_Op<"select_blocks", [Pure,
    AttrSizedOperandSegments]> {
  let summary = "top-n selection blocks per token and KV head";
  let description = [{
    Recomputes the compression attention probabilities
    `p_cmp[t, hq, i] = exp(scale * q[t, hq] . kc[i, h] - lse[t, hq])` over
    the visible compressed blocks, maps them onto selection blocks of `l'`
    tokens with overlap weights (paper Eq. 9:
    `p_slc[j] = sum_i w(i, j) p_cmp[i]`, `w(i, j)` the number of stride-`d`
    sub-blocks shared by compressed block `i` and selection block `j`), sums
    over the `G` query heads of KV head `h` (Eq. 10), and returns the chosen
    blocks: the forced blocks of `backbone` plus the highest-scoring causal
    blocks (`j <= t / l'`; ties go to the lower index) up to `n`, in
    increasing order, padded with `-1`.

    Operands: `query [B, T, HQ, Dqk]`, compressed `key [B, Nc, H, Dqk]`,
    `lse [B, T, HQ]` f32 (from `nsa.compressed_attention`), optional
    `cu_seqlens`. Result: `[B, T, H, n]` i32.

    Decoding (docs/Spec.md section 12): with `kv_lens [B]` i32 the `T`
    query rows are the last `T` of `kv_lens[b]` tokens, row `j` at position
    `kv_lens[b] - T + j`, and `key` is a compressed cache whose first
    `Nc(kv_lens[b])` rows are valid.

    `max_tokens` is the layer's declared maximum T (`#nsa.config`; 0: none):
    `n` must cover the forced blocks of every query up to it, as the config
    requires; past it a query keeps its local blocks, then the
    lowest-indexed other forced blocks, `n` in all (docs/Spec.md 5.4).
    Without it the bound is the static `T` (none with a dynamic `T` or
    `kv_lens`).

    Example:

    ```mlir
    %idx = nsa.select_blocks %q, %kc, %lse
        {cmp_block = 32, cmp_stride = 16, slc_block = 64, num_selected = 16,
         scale = 0.0721 : f32, backbone = #nsa.backbone<initial = 1, local = 2>}
        : (tensor<1x?x64x192xbf16>, tensor<1x?x4x192xbf16>, tensor<1x?x64xf32>)
        -> tensor<1x?x4x16xi32>
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$lse,
    Optional<AnyRankedTensor>:$cu_seqlens,
    Optional<AnyRankedTensor>:$kv_lens,
    NSA_PositiveI64Attr:$cmp_block,
    NSA_PositiveI64Attr:$cmp_stride,
    NSA_PositiveI64Attr:$slc_block,
    NSA_PositiveI64Attr:$num_selected,
    F32Attr:$scale,
    NSA_BackboneAttr:$backbone,
    DefaultValuedAttr<I64Attr, "0">:$max_tokens
  );
  let results = (outs AnyRankedTensor:$indices);
  let assemblyFormat = [{
    $query `,` $key `,` $lse (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    (`kv_lens` `(` $kv_lens^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// nsa.selected_attention
//===----------------------------------------------------------------------===//

def NSA_SelectedAttentionOp : NSA_Op<"selected_attention", [Pure,
    AttrSizedOperandSegments]> {
  let summary = "attention over the selected blocks at full resolution";
  let description = [{
    For token `t` and query head `hq` of KV head `h`, attends over the keys
    `s` of the selection blocks `j` listed in `indices[t, h]` (entries `-1`
    are ignored, duplicates count once): `j*l' <= s < (j+1)*l'`, `s <= t`
    (causal inside the current block) and `s < T`. Returns the output and the
    log-sum-exp (`-inf` and output 0 where no key is visible).

    Operands: `query [B, T, HQ, Dqk]`, `key [B, T, H, Dqk]`,
    `value [B, T, H, Dv]`, `indices [B, T, H, n]` i32, optional `cu_seqlens`.
    Results: `[B, T, HQ, Dv]` and `[B, T, HQ]` f32.

    Decoding (docs/Spec.md section 12): with `kv_lens [B]` i32 the `T`
    query rows are the last `T` of `kv_lens[b]` tokens, row `j` at position
    `kv_lens[b] - T + j`, and `key`/`value` are caches `[B, Lmax, H, D]`
    whose first `kv_lens[b]` rows are valid; `indices` are `[B, T, H, n]`.

    Example:

    ```mlir
    %o, %lse = nsa.selected_attention %q, %k, %v, %idx
        {block = 64, scale = 0.0721 : f32}
        : (tensor<1x?x64x192xbf16>, tensor<1x?x4x192xbf16>,
           tensor<1x?x4x128xbf16>, tensor<1x?x4x16xi32>)
        -> (tensor<1x?x64x128xbf16>, tensor<1x?x64xf32>)
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$value,
    AnyRankedTensor:$indices,
    Optional<AnyRankedTensor>:$cu_seqlens,
    Optional<AnyRankedTensor>:$kv_lens,
    NSA_PositiveI64Attr:$block,
    F32Attr:$scale
  );
  let results = (outs AnyRankedTensor:$output, AnyRankedTensor:$lse);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $indices
    (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    (`kv_lens` `(` $kv_lens^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// nsa.window_attention
//===----------------------------------------------------------------------===//

def NSA_WindowAttentionOp : NSA_Op<"window_attention", [Pure,
    AttrSizedOperandSegments]> {
  let summary = "causal sliding-window attention";
  let description = [{
    For token `t` and query head `hq`, attends over the keys `s` of KV head
    `hq / G` with `t - w < s <= t`. Returns the output and the log-sum-exp.

    Operands: `query [B, T, HQ, Dqk]`, `key [B, T, H, Dqk]`,
    `value [B, T, H, Dv]`, optional `cu_seqlens`.
    Results: `[B, T, HQ, Dv]` and `[B, T, HQ]` f32.

    Decoding (docs/Spec.md section 12): with `kv_lens [B]` i32 the `T`
    query rows are the last `T` of `kv_lens[b]` tokens, row `j` at position
    `kv_lens[b] - T + j`, and `key`/`value` are caches `[B, Lmax, H, D]`
    whose first `kv_lens[b]` rows are valid.

    Example:

    ```mlir
    %o, %lse = nsa.window_attention %q, %k, %v {window = 512, scale = 0.0721 : f32}
        : (tensor<1x?x64x192xbf16>, tensor<1x?x4x192xbf16>,
           tensor<1x?x4x128xbf16>)
        -> (tensor<1x?x64x128xbf16>, tensor<1x?x64xf32>)
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$value,
    Optional<AnyRankedTensor>:$cu_seqlens,
    Optional<AnyRankedTensor>:$kv_lens,
    NSA_PositiveI64Attr:$window,
    F32Attr:$scale
  );
  let results = (outs AnyRankedTensor:$output, AnyRankedTensor:$lse);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    (`kv_lens` `(` $kv_lens^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// nsa.combine
//===----------------------------------------------------------------------===//

def NSA_CombineOp : NSA_Op<"combine", [Pure]> {
  let summary = "gate and sum the three branch outputs";
  let description = [{
    `o[b, t, hq] = sigmoid(g[b, t, hq, 0]) * cmp[b, t, hq]
                 + sigmoid(g[b, t, hq, 1]) * slc[b, t, hq]
                 + sigmoid(g[b, t, hq, 2]) * win[b, t, hq]`,
    evaluated in f32 and rounded once to the result type.

    Operands: three `[B, T, HQ, Dv]` branch outputs of one element type and
    `gates [B, T, HQ, 3]` (logits; that element type or f32).

    Example:

    ```mlir
    %o = nsa.combine %oc, %os, %ow, %g
        : (tensor<1x?x64x128xbf16>, tensor<1x?x64x128xbf16>,
           tensor<1x?x64x128xbf16>, tensor<1x?x64x3xbf16>)
        -> tensor<1x?x64x128xbf16>
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$compressed,
    AnyRankedTensor:$selected,
    AnyRankedTensor:$window,
    AnyRankedTensor:$gates
  );
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $compressed `,` $selected `,` $window `,` $gates
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Gradients (docs/Spec.md section 9)
//===----------------------------------------------------------------------===//

def NSA_SparseAttentionGradOp : NSA_Op<"sparse_attention_grad", [Pure,
    AttrSizedOperandSegments]> {
  let summary = "gradients of one Native Sparse Attention layer";
  let description = [{
    The gradients of `sum(o * grad)`, `o = nsa.sparse_attention(...)` with
    the same operands and `config`, with respect to `query`, `key`, `value`,
    the gate logits and (for `linear` phi) `cmp_weights` (docs/Spec.md,
    section 9). The selected blocks are those the forward pass chooses and
    are held fixed: no gradient flows through the block scores or the top-n.

    Without `saved(...)` the op recomputes the forward pass it needs;
    `nsa-decompose` rewrites it into the forward branch ops followed by
    `nsa.combine_grad`, the three attention gradient ops and
    `nsa.compress_grad`, so that a function that holds both
    `nsa.sparse_attention` and its gradient shares the forward branches
    after CSE. With `saved(...)`, the seven saved-state results of the
    forward `nsa.sparse_attention` (docs/Spec.md section 9.1), only the
    compression of keys and values is recomputed.

    Operands: those of `nsa.sparse_attention` plus `grad [B, T, HQ, Dv]`
    (the gradient of the output, the query's element type). Results:
    `query_grad`, `key_grad`, `value_grad` with the shapes and element type
    of `query`, `key` and `value`, `gates_grad` with the shape and type of
    `gates`, and `cmp_weights_grad [2, H, l]` f32, present exactly when
    `config.pool` is `linear`. Gradients are summed over the branches in
    f32 and rounded once.

    Example:

    ```mlir
    %dq, %dk, %dv, %dg = nsa.sparse_attention_grad %q, %k, %v, %g, %do
        {config = #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64,
                              num_selected = 16, window = 512>}
        : (tensor<1x?x64x192xbf16>, tensor<1x?x4x192xbf16>,
           tensor<1x?x4x128xbf16>, tensor<1x?x64x3xbf16>,
           tensor<1x?x64x128xbf16>)
        -> (tensor<1x?x64x192xbf16>, tensor<1x?x4x192xbf16>,
            tensor<1x?x4x128xbf16>, tensor<1x?x64x3xbf16>)
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$value,
    AnyRankedTensor:$gates,
    AnyRankedTensor:$grad,
    Optional<AnyRankedTensor>:$cmp_weights,
    Optional<AnyRankedTensor>:$cu_seqlens,
    Variadic<AnyRankedTensor>:$saved,
    NSA_ConfigAttr:$config
  );
  let results = (outs AnyRankedTensor:$query_grad, AnyRankedTensor:$key_grad,
                      AnyRankedTensor:$value_grad, AnyRankedTensor:$gates_grad,
                      Optional<AnyRankedTensor>:$cmp_weights_grad);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $gates `,` $grad
    (`cmp_weights` `(` $cmp_weights^ `)`)?
    (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    (`saved` `(` $saved^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def NSA_CombineGradOp : NSA_Op<"combine_grad", [Pure]> {
  let summary = "gradients of nsa.combine";
  let description = [{
    For `o = nsa.combine(cmp, slc, win, gates)` and the gradient `grad` of
    `o`: the gradient of each branch output, `sigmoid(g_b) * grad`, and of
    the gate logits, `sigmoid'(g_b) * (o_b . grad)` (the dot over `Dv`),
    evaluated in f32 and rounded once to the result types.

    Operands: the three branch outputs `[B, T, HQ, Dv]`, `gates
    [B, T, HQ, 3]` and `grad [B, T, HQ, Dv]` (the branch outputs' element
    type). Results: the three branch gradients (shape and type of the
    branch outputs) and `gates_grad` (shape and type of `gates`).

    Example:

    ```mlir
    %dc, %ds, %dw, %dg = nsa.combine_grad %oc, %os, %ow, %g, %do
        : (tensor<1x?x64x128xbf16>, tensor<1x?x64x128xbf16>,
           tensor<1x?x64x128xbf16>, tensor<1x?x64x3xbf16>,
           tensor<1x?x64x128xbf16>)
        -> (tensor<1x?x64x128xbf16>, tensor<1x?x64x128xbf16>,
            tensor<1x?x64x128xbf16>, tensor<1x?x64x3xbf16>)
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$compressed,
    AnyRankedTensor:$selected,
    AnyRankedTensor:$window,
    AnyRankedTensor:$gates,
    AnyRankedTensor:$grad
  );
  let results = (outs AnyRankedTensor:$compressed_grad,
                      AnyRankedTensor:$selected_grad,
                      AnyRankedTensor:$window_grad,
                      AnyRankedTensor:$gates_grad);
  let assemblyFormat = [{
    $compressed `,` $selected `,` $window `,` $gates `,` $grad
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

class NSA_AttentionGradOp<string mnemonic, string branch, string keyRows,
                          string extraOperand>
    : NSA_Op<mnemonic, [Pure]> {
  let summary = "gradients of nsa." # branch;
  let description = [{
    Standard attention backward for the key set of `nsa.}] # branch # [{`
    (the same attributes), given its `output` and `lse` and the gradient
    `grad` of the output: with `P = exp(scale * q k^T - lse)` over the
    visible keys and `D = rowsum(grad * output)`,

    ```
    dv = P^T grad        dP = grad v^T        dS = P * (dP - D)
    dq = scale * dS k    dk = scale * dS^T q
    ```

    summed over the `G` query heads of each KV head. Rows with no visible
    key (lse `-inf`) contribute nothing.

    Operands: those of the forward op, then `output [B, T, HQ, Dv]` (the
    query's element type), `lse [B, T, HQ]` f32 and `grad [B, T, HQ, Dv]`
    (the query's element type), then `cu_seqlens`. Results, all f32:
    `query_grad [B, T, HQ, Dqk]`, `key_grad` and `value_grad` with the shapes
    of `key` and `value` (}] # keyRows # [{ rows).
  }];
  let results = (outs AnyRankedTensor:$query_grad, AnyRankedTensor:$key_grad,
                      AnyRankedTensor:$value_grad);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` }] # extraOperand # [{ $output `,` $lse `,`
    $grad (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def NSA_CompressedAttentionGradOp : NSA_AttentionGradOp<
    "compressed_attention_grad", "compressed_attention", "`Nc`", ""> {
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$value,
    AnyRankedTensor:$output,
    AnyRankedTensor:$lse,
    AnyRankedTensor:$grad,
    Optional<AnyRankedTensor>:$cu_seqlens,
    NSA_PositiveI64Attr:$block,
    NSA_PositiveI64Attr:$stride,
    F32Attr:$scale
  );
}

def NSA_SelectedAttentionGradOp : NSA_AttentionGradOp<
    "selected_attention_grad", "selected_attention", "`T`",
    "$indices `,`"> {
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$value,
    AnyRankedTensor:$indices,
    AnyRankedTensor:$output,
    AnyRankedTensor:$lse,
    AnyRankedTensor:$grad,
    Optional<AnyRankedTensor>:$cu_seqlens,
    NSA_PositiveI64Attr:$block,
    F32Attr:$scale
  );
}

def NSA_WindowAttentionGradOp : NSA_AttentionGradOp<
    "window_attention_grad", "window_attention", "`T`", ""> {
  let arguments = (ins
    AnyRankedTensor:$query,
    AnyRankedTensor:$key,
    AnyRankedTensor:$value,
    AnyRankedTensor:$output,
    AnyRankedTensor:$lse,
    AnyRankedTensor:$grad,
    Optional<AnyRankedTensor>:$cu_seqlens,
    NSA_PositiveI64Attr:$window,
    F32Attr:$scale
  );
}

def NSA_CompressGradOp : NSA_Op<"compress_grad", [Pure,
    AttrSizedOperandSegments]> {
  let summary = "gradients of nsa.compress";
  let description = [{
    For `xc = nsa.compress(input)` with the same attributes and the gradient
    `grad` of `xc`: the gradient of `input`,
    `dx[t] = sum_i w[t - i*d] * grad[i]` over the compressed blocks `i` that
    cover token `t` (`w` the pool weights, `1/l` for `mean`), and for
    `linear` the gradient of the weights,
    `dw[h, j] = sum_i input[i*d + j, h] . grad[i, h]`, summed over the batch
    and the sequences.

    Operands: `grad [B, Nc, H, D]` (f32 or the input's element type),
    `input [B, T, H, D]`, optional `weights [H, l]` f32 (exactly for
    `linear`) and optional `cu_seqlens`. Results: `input_grad [B, T, H, D]`
    f32 and, for `linear`, `weights_grad [H, l]` f32.

    Example:

    ```mlir
    %dk = nsa.compress_grad %dkc, %k {block = 32, stride = 16,
                                      pool = #nsa.pool<mean>}
        : (tensor<2x61x4x192xf32>, tensor<2x1000x4x192xbf16>)
        -> tensor<2x1000x4x192xf32>
    ```
  }];
  let arguments = (ins
    AnyRankedTensor:$grad,
    AnyRankedTensor:$input,
    Optional<AnyRankedTensor>:$weights,
    Optional<AnyRankedTensor>:$cu_seqlens,
    NSA_PositiveI64Attr:$block,
    NSA_PositiveI64Attr:$stride,
    NSA_PoolKindAttr:$pool
  );
  let results = (outs AnyRankedTensor:$input_grad,
                      Optional<AnyRankedTensor>:$weights_grad);
  let assemblyFormat = [{
    $grad `,` $input (`weights` `(` $weights^ `)`)?
    (`cu_seqlens` `(` $cu_seqlens^ `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

#endif // NSA_DIALECT_NSAOPS_TD
