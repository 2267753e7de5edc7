//===- Pipelines.h - named nsa pipelines -------------------------*- C++ -*-===//
//
// The named pipelines of the project, each built by one function from a
// typed option struct and registered once with the pass registry.
//
//   nsa-to-cpu: nsa ops on tensors -> LLVM dialect for the host CPU
//               (run by mlir-runner or the ExecutionEngine).
//
//===----------------------------------------------------------------------===//

#ifndef NSA_PIPELINES_PIPELINES_H
#define NSA_PIPELINES_PIPELINES_H

#include "mlir/Pass/PassOptions.h"

namespace mlir {
class DialectRegistry;
class OpPassManager;
namespace nsa {

/// Inserts the nsa dialect, every dialect the nsa pipelines produce, and the
/// interface models their passes need (bufferization, deallocation,
/// LLVM IR translation) into `registry`.
void registerNSAPipelineDialects(DialectRegistry &registry);

struct NSAToCPUOptions : public PassPipelineOptions<NSAToCPUOptions> {
  Option<int64_t> queryTile{*this, "query-tile",
                            llvm::cl::desc("query tokens per tile"),
                            llvm::cl::init(16)};
  Option<int64_t> kvTile{*this, "kv-tile",
                         llvm::cl::desc("keys or compressed blocks per tile"),
                         llvm::cl::init(64)};
};

/// nsa.sparse_attention (or branch ops) on tensors -> LLVM dialect:
/// decompose, tile, bufferize, free buffers, lower loops, lower to LLVM, and
/// check that only the LLVM and builtin dialects remain.
void buildNSAToCPUPipeline(OpPassManager &pm, const NSAToCPUOptions &options);

/// Registers every nsa pipeline with the global pass registry.
void registerNSAPipelines();

} // namespace nsa
} // namespace mlir

#endif // NSA_PIPELINES_PIPELINES_H
