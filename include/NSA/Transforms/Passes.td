//===- Passes.td - nsa transformation passes ----------------*- tablegen -*-===//
//
// The passes that take `nsa` ops from one layer down to tiled loops. One
// pass per file in lib/Transforms/, named after its def here.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_TRANSFORMS_PASSES_TD
#define NSA_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def NSADecompose : Pass<"nsa-decompose"> {
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
  }];
  let dependentDialects = ["::mlir::tensor::TensorDialect"];
}

#endif // NSA_TRANSFORMS_PASSES_TD
