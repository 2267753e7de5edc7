//===- NSAAttrs.td - nsa attributes -------------------------*- tablegen -*-===//
//
// Typed attributes of the nsa dialect: the pooling function of the
// compression branch, the always-on block set of the selection branch and the
// configuration of a whole NSA layer.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_DIALECT_NSAATTRS_TD
#define NSA_DIALECT_NSAATTRS_TD

include "NSA/Dialect/NSABase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def NSA_PoolKind : I32EnumAttr<"PoolKind", "compression pooling function phi", [
    I32EnumAttrCase<"Mean", 0, "mean">,
    I32EnumAttrCase<"Linear", 1, "linear">
  ]> {
  let cppNamespace = "::mlir::nsa";
  let genSpecializedAttr = 0;
}

def NSA_PoolKindAttr : EnumAttr<NSA_Dialect, NSA_PoolKind, "pool"> {
  let assemblyFormat = "`<` $value `>`";
  let summary = "compression pooling function phi";
  let description = [{
    How `nsa.compress` pools the `l` tokens of one compressed block into one
    key or value:

    * `mean`: `x~[i] = 1/l * sum_{j<l} x[i*d + j]`.
    * `linear`: learned per-head intra-block position weights `W[h, j]`
      (f32): `x~[i, h] = sum_{j<l} W[h, j] * x[i*d + j, h]`.

    Example: `#nsa.pool<mean>`.
  }];
}

def NSA_BackboneAttr : AttrDef<NSA_Dialect, "Backbone"> {
  let mnemonic = "backbone";
  let summary = "always-on selection blocks";
  let description = [{
    The set `F(c)` of selection blocks that `nsa.select_blocks` includes for
    every query token whose own selection block is `c`, regardless of
    scores (Spec 5.4). Block `j <= c` is forced when any pattern holds:

    * `initial = I`: `j < I` (the first blocks);
    * `local = L`: `c - j < L` (the query's block and the `L - 1` before);
    * `log_levels = K`: `c - j = 2^i` for some `0 <= i < K` (log-spaced,
      1, 2, 4, ... blocks back);
    * `hub_stride = S`: `j % S == 0` (strided hub blocks; their number grows
      with the sequence, so a config using them must declare `max_tokens`);
    * `blocks = [3, 13]`: an explicit, increasing list of blocks.

    The paper's configuration is `initial = 1, local = 2`. The remaining
    `n - |F(c)|` slots are filled by score. Zero parameters are omitted when
    printing. `nsa-analyze-reach` computes the hop bound these patterns give
    (Spec section 11).

    Example: `#nsa.backbone<initial = 1, local = 2, log_levels = 8>`.
  }];
  let parameters = (ins
    DefaultValuedParameter<"int64_t", "0",
      "number of leading blocks always selected">:$initial,
    DefaultValuedParameter<"int64_t", "0",
      "number of blocks ending at the query's block always selected">:$local,
    DefaultValuedParameter<"int64_t", "0",
      "log-spaced blocks 2^i back, i < log_levels">:$log_levels,
    DefaultValuedParameter<"int64_t", "0",
      "every hub_stride-th block (0: none)">:$hub_stride,
    OptionalParameter<"::mlir::DenseI64ArrayAttr",
      "explicit blocks, increasing">:$blocks
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The dependency-free form shared with the reference and the runtime.
    ::mlir::nsa::spec::Backbone getSpec() const;
  }];
}

def NSA_ConfigAttr : AttrDef<NSA_Dialect, "Config"> {
  let mnemonic = "config";
  let summary = "configuration of one NSA layer";
  let description = [{
    The hyperparameters of an NSA layer (paper notation in brackets):

    * `cmp_block` [l]: tokens per compressed block;
    * `cmp_stride` [d]: stride between compressed blocks;
    * `slc_block` [l']: tokens per selection block;
    * `num_selected` [n]: selection blocks attended per query token,
      forced blocks included;
    * `window` [w]: sliding-window size; token `t` sees `t-w+1 .. t`;
    * `scale`: softmax scale; absent means `1/sqrt(Dqk)`;
    * `pool`: the compression function phi (`#nsa.pool<mean>` if absent);
    * `backbone`: the always-on selection blocks; absent means the paper's
      `<initial = 1, local = 2>`, as in C (`nsaPaperLayerDesc`) and Python
      (`NSAConfig`); `backbone = <>` forces none;
    * `max_tokens`: the longest sequence the layer is used with (0: not
      declared); needed with hub blocks, and by `max_hops`;
    * `max_hops`: the most layers information may need to reach any later
      token through the backbone and the window at `max_tokens` (0: not
      declared); the verifier computes the exact bound and rejects configs
      that exceed it.

    Constraints `config_c1` .. `config_c9` of docs/Spec.md apply.

    Example (the paper's layer):

    ```mlir
    #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64,
                num_selected = 16, window = 512>
    ```
  }];
  let parameters = (ins
    "int64_t":$cmp_block,
    "int64_t":$cmp_stride,
    "int64_t":$slc_block,
    "int64_t":$num_selected,
    "int64_t":$window,
    OptionalParameter<"::mlir::FloatAttr", "softmax scale">:$scale,
    DefaultValuedParameter<"::mlir::nsa::PoolKind", "::mlir::nsa::PoolKind::Mean",
      "compression pooling function">:$pool,
    DefaultValuedParameter<"::mlir::nsa::BackboneAttr",
      "::mlir::nsa::BackboneAttr::get($_ctxt, 1, 2, 0, 0, "
      "::mlir::DenseI64ArrayAttr())",
      "always-on blocks (the paper's <initial = 1, local = 2> if absent)">:$backbone,
    DefaultValuedParameter<"int64_t", "0", "declared maximum T">:$max_tokens,
    DefaultValuedParameter<"int64_t", "0", "declared hop bound">:$max_hops
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The softmax scale: the explicit one, or 1/sqrt(qkHeadDim).
    double getScaleOr(int64_t qkHeadDim) const;
  }];
}

def NSA_ReachAttr : AttrDef<NSA_Dialect, "Reach"> {
  let mnemonic = "reach";
  let summary = "the hop bound and per-query cost of a layer's backbone";
  let description = [{
    Written by `nsa-analyze-reach` on each `nsa.sparse_attention` as the
    discardable attribute `nsa.reach`: at sequence length `seq_len`, the
    exact worst-case number of layers (`hops`; -1 when some later token is
    unreachable) for information at any token to reach any later token
    through the forced blocks and the window only, the most forced blocks of
    any query, and the keys a query reads through them and the window
    (Spec section 11).

    Example:
    `#nsa.reach<seq_len = 65536, hops = 129, forced_blocks = 3, backbone_keys = 704>`
  }];
  let parameters = (ins
    "int64_t":$seq_len,
    "int64_t":$hops,
    "int64_t":$forced_blocks,
    "int64_t":$backbone_keys
  );
  let assemblyFormat = "`<` struct(params) `>`";
}

#endif // NSA_DIALECT_NSAATTRS_TD
