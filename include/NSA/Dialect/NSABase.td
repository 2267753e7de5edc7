//===- NSABase.td - nsa dialect definition ------------------*- tablegen -*-===//
//
// The nsa dialect: Native Sparse Attention (NSA, DeepSeek 2025) as MLIR ops
// on tensors. This file defines the dialect itself; attributes live in
// NSAAttrs.td and operations in NSAOps.td.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_DIALECT_NSABASE_TD
#define NSA_DIALECT_NSABASE_TD

include "mlir/IR/OpBase.td"

def NSA_Dialect : Dialect {
  let name = "nsa";
  let cppNamespace = "::mlir::nsa";
  let summary = "Native Sparse Attention: compression, selection, window";
  let description = [{
    The `nsa` dialect expresses Native Sparse Attention (Yuan et al., DeepSeek
    2025) at the level of whole layers and of its three branches. Tensors use
    the layout `[batch, tokens, heads, head_dim]`; the batch and token
    dimensions may be dynamic. Query heads are grouped (GQA): the `G = HQ / H`
    query heads `h * G .. h * G + G - 1` share KV head `h`.

    `nsa.sparse_attention` is one NSA layer. `nsa-decompose` rewrites it into
    the branch ops `nsa.compress`, `nsa.compressed_attention`,
    `nsa.select_blocks`, `nsa.selected_attention`, `nsa.window_attention` and
    `nsa.combine`, whose exact semantics are stated in `docs/Spec.md`. Every
    verifier check cites the constraint id of that specification.
  }];
  let useDefaultAttributePrinterParser = 1;
}

class NSA_Op<string mnemonic, list<Trait> traits = []>
    : Op<NSA_Dialect, mnemonic, traits>;

#endif // NSA_DIALECT_NSABASE_TD
