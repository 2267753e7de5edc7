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
    The set `F(t)` of selection blocks that `nsa.select_blocks` includes for
    query token `t` regardless of their scores (Spec section "Forced
    blocks"). With `c = floor(t / l')` the block that holds `t`:

    * `initial = I`: blocks `0 .. I-1` (those with index `<= c`);
    * `local = L`: blocks `c-L+1 .. c` (those with index `>= 0`).

    The paper's configuration is `initial = 1, local = 2`. The remaining
    `n - |F(t)|` slots are filled by score. Parameters that are zero are
    omitted when printing.

    Example: `#nsa.backbone<initial = 1, local = 2>`.
  }];
  let parameters = (ins
    DefaultValuedParameter<"int64_t", "0",
      "number of leading blocks always selected">:$initial,
    DefaultValuedParameter<"int64_t", "0",
      "number of blocks ending at the query's block always selected">:$local
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
    * `backbone`: the always-on selection blocks.

    Constraints `config_c1` .. `config_c6` of docs/Spec.md apply.

    Example (the paper's layer):

    ```mlir
    #nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64,
                num_selected = 16, window = 512,
                backbone = <initial = 1, local = 2>>
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
    "::mlir::nsa::BackboneAttr":$backbone
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The softmax scale: the explicit one, or 1/sqrt(qkHeadDim).
    double getScaleOr(int64_t qkHeadDim) const;
  }];
}

#endif // NSA_DIALECT_NSAATTRS_TD
