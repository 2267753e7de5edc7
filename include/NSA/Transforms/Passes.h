//===- Passes.h - nsa transformation passes ----------------------*- C++
//-*-===//
//
// Declarations of the nsa passes (generated from Passes.td) and of the
// pattern sets they drive, for reuse in other pipelines.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_TRANSFORMS_PASSES_H
#define NSA_TRANSFORMS_PASSES_H

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

namespace mlir {
class RewritePatternSet;
namespace affine {
class AffineDialect;
} // namespace affine
namespace arith {
class ArithDialect;
} // namespace arith
namespace bufferization {
class BufferizationDialect;
} // namespace bufferization
namespace func {
class FuncOp;
} // namespace func
namespace gpu {
class GPUDialect;
} // namespace gpu
namespace linalg {
class LinalgDialect;
} // namespace linalg
namespace nvgpu {
class NVGPUDialect;
} // namespace nvgpu
namespace LLVM {
class LLVMDialect;
} // namespace LLVM
namespace NVVM {
class NVVMDialect;
} // namespace NVVM
namespace math {
class MathDialect;
} // namespace math
namespace memref {
class MemRefDialect;
} // namespace memref
namespace scf {
class SCFDialect;
} // namespace scf
namespace tensor {
class TensorDialect;
} // namespace tensor
namespace vector {
class VectorDialect;
} // namespace vector

namespace nsa {

#define GEN_PASS_DECL
#include "NSA/Transforms/Passes.h.inc"

/// Patterns that rewrite `nsa.sparse_attention` into the branch ops.
void populateDecomposePatterns(RewritePatternSet &patterns);

/// Patterns that tile every nsa branch op (see `nsa-tile`).
void populateTilePatterns(RewritePatternSet &patterns, int64_t queryTile,
                          int64_t kvTile, int64_t queryRows = 64);

/// The `nsa.select_blocks` part of populateTilePatterns.
void populateTileSelectBlocksPattern(RewritePatternSet &patterns,
                                     int64_t queryTile, int64_t kvTile,
                                     int64_t queryRows);

/// The gradient-op part of populateTilePatterns (lib/Transforms/
/// TileGradients.cpp).
void populateTileGradientPatterns(RewritePatternSet &patterns,
                                  int64_t queryTile, int64_t kvTile,
                                  int64_t queryRows);

/// The front that nsa-to-cpu and nsa-to-ptx share, after nsa-decompose:
/// `nsa-tile{query-tile, kv-tile, query-rows}`, canonicalize, CSE.
void buildNSATilePipeline(OpPassManager &pm, int64_t queryTile, int64_t kvTile,
                          int64_t queryRows = 64);

/// One-shot bufferization of tiled nsa functions as both pipelines need it:
/// function boundaries included, identity layouts at them; then CSE and
/// canonicalization, which drop the self-copies of in-place slice updates.
void buildNSABufferizePipeline(OpPassManager &pm);

/// Checks the `op=threads` entries of nsa-map-to-gpu's kernel-block-sizes
/// (threads in 32..1024, a multiple of 32) and calls `each` for every one;
/// `error` reports the first bad entry.
LogicalResult
parseKernelBlockSizes(ArrayRef<std::string> entries,
                      function_ref<void(StringRef op, int64_t threads)> each,
                      function_ref<LogicalResult(const Twine &)> error);

/// The sizes nsa's lowering supports (docs/Spec.md section 13): legal NSA
/// beyond them is refused with a diagnostic before anything is built.
constexpr int64_t kMaxSelected = 1024;    ///< n
constexpr int64_t kMaxBlockTokens = 4096; ///< l, d, l'
constexpr int64_t kMaxHeads = 1024;       ///< HQ, H
constexpr int64_t kMaxHeadDim = 1024;     ///< Dqk, Dv

/// Checks the sizes of every nsa op in `root` (its config or size
/// attributes, the heads, head dims and tokens of its static shapes)
/// against the bounds above; the first op outside them gets the error.
LogicalResult checkSupportedSizes(Operation *root);

#define GEN_PASS_REGISTRATION
#include "NSA/Transforms/Passes.h.inc"

} // namespace nsa
} // namespace mlir

#endif // NSA_TRANSFORMS_PASSES_H
