//===- nsa-demo.cpp - compile the paper's layer through every stage -------===//
//
// The README's demo. Reads an nsa module (by default the paper's layer in
// examples/paper_layer.mlir), verifies it, states what the layer costs at a
// sequence length, and runs each pipeline stage the project has, printing
// what every stage did to the IR.
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Spec.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::nsa;

static llvm::cl::opt<std::string> inputFile(llvm::cl::Positional,
                                            llvm::cl::desc("<nsa module>"),
                                            llvm::cl::init("-"));
static llvm::cl::opt<int64_t>
    seqLen("seq-len", llvm::cl::desc("sequence length for the cost summary"),
           llvm::cl::init(65536));
static llvm::cl::opt<bool> printIR("print-ir",
                                   llvm::cl::desc("print the IR after each stage"),
                                   llvm::cl::init(false));

/// Prints `op-name x count` for every op in `module` below the functions.
static void printOpCounts(ModuleOp module) {
  llvm::MapVector<StringRef, int> counts;
  module.walk([&](Operation *op) {
    if (!isa<ModuleOp, func::FuncOp>(op))
      ++counts[op->getName().getStringRef()];
  });
  for (auto &[name, count] : counts)
    llvm::outs() << "      " << name << " x" << count << "\n";
}

/// States the sizes and per-query work of one layer at `T` tokens.
static void describeLayer(SparseAttentionOp op, int64_t T) {
  ConfigAttr c = op.getConfig();
  auto q = op.getQuery().getType(), k = op.getKey().getType(),
       v = op.getValue().getType();
  int64_t hq = q.getDimSize(2), h = k.getDimSize(2), dqk = q.getDimSize(3),
          dv = v.getDimSize(3);
  int64_t l = c.getCmpBlock(), d = c.getCmpStride(), lp = c.getSlcBlock(),
          n = c.getNumSelected(), w = c.getWindow();
  llvm::outs() << llvm::formatv(
      "    layer: HQ={0} H={1} (G={2}) Dqk={3} Dv={4}; l={5} d={6} l'={7} "
      "n={8} w={9} scale={10:f6}; forced blocks={11}\n",
      hq, h, hq / h, dqk, dv, l, d, lp, n, w, c.getScaleOr(dqk),
      c.getBackbone().getSpec().maxForcedBlocks());
  // Keys each query attends to, summed over the T queries of one head: the
  // visible compressed blocks, the causal keys of n selected blocks (the
  // query's own block among them) and the window.
  double cmpKeys = 0, slcKeys = 0, winKeys = 0;
  for (int64_t t = 0; t < T; ++t) {
    cmpKeys += spec::numVisibleCompressedBlocks(t, l, d);
    slcKeys += t / lp < n ? t + 1 : (n - 1) * lp + t % lp + 1;
    winKeys += std::min(w, t + 1);
  }
  // Useful forward FLOPs: 2 * (Dqk + Dv) per (query head, key) pair.
  double perKey = 2.0 * (dqk + dv) * hq;
  double dense = perKey * static_cast<double>(T) * (T + 1) / 2;
  double sparse = perKey * (cmpKeys + slcKeys + winKeys);
  llvm::outs() << llvm::formatv(
      "    at T={0}: {1} compressed blocks; keys per query on average: "
      "{2:f0} compressed + {3:f0} selected + {4:f0} window\n"
      "    forward work {5:f1} GFLOP = {6:f2}% of dense causal attention "
      "({7:f1} GFLOP)\n",
      T, spec::numCompressedBlocks(T, l, d), cmpKeys / T, slcKeys / T,
      winKeys / T, sparse * 1e-9, 100.0 * sparse / dense, dense * 1e-9);
}

int main(int argc, char **argv) {
  llvm::cl::ParseCommandLineOptions(argc, argv, "nsa demo\n");
  DialectRegistry registry;
  registry.insert<NSADialect, arith::ArithDialect, func::FuncDialect,
                  tensor::TensorDialect>();
  MLIRContext context(registry);

  std::string error;
  auto file = openInputFile(inputFile, &error);
  if (!file) {
    llvm::errs() << "nsa-demo: " << error << "\n";
    return 1;
  }
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  SourceMgrDiagnosticHandler handler(sourceMgr, &context);

  llvm::outs() << "[1] parse and verify " << inputFile << "\n";
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module)
    return 1;
  int layers = 0;
  module->walk([&](SparseAttentionOp op) {
    ++layers;
    describeLayer(op, seqLen);
  });
  llvm::outs() << "    verified: " << layers << " nsa.sparse_attention\n";
  if (layers == 0) {
    llvm::errs() << "nsa-demo: no nsa.sparse_attention in " << inputFile << "\n";
    return 1;
  }

  struct Stage {
    const char *name, *what;
    std::function<void(OpPassManager &)> build;
  };
  Stage stages[] = {
      {"nsa-decompose", "one layer -> compression, selection, window, combine",
       [](OpPassManager &pm) { pm.addPass(createNSADecompose()); }},
  };
  int index = 2;
  for (Stage &stage : stages) {
    PassManager pm(&context);
    stage.build(pm);
    llvm::outs() << "[" << index++ << "] " << stage.name << ": " << stage.what
                 << "\n";
    if (failed(pm.run(*module))) {
      llvm::errs() << "nsa-demo: stage " << stage.name << " failed\n";
      return 1;
    }
    printOpCounts(*module);
    if (printIR)
      module->print(llvm::outs());
  }
  llvm::outs() << "[" << index
               << "] next stages (not built yet): nsa-tile, nsa-to-cpu "
                  "(CPU execution vs the float64 reference), nsa-to-ptx "
                  "(sm_90a cubin), runtime launch on the GPU\n";
  return 0;
}
