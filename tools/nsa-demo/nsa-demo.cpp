//===- nsa-demo.cpp - compile the paper's layer through every stage -------===//
//
// The README's demo. Reads an nsa module (by default the paper's layer in
// examples/paper_layer.mlir), verifies it, states what the layer costs at a
// sequence length, runs each pipeline stage the project has, printing what
// every stage did to the IR, then JIT-runs the layer on the CPU and prints
// its error against the float64 reference.
//
//===----------------------------------------------------------------------===//

#include "CPURunner.h"
#include "NSAReference.h"

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Pipelines/Pipelines.h"
#include "NSA/Spec.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>

using namespace mlir;
using namespace mlir::nsa;

static llvm::cl::opt<std::string> inputFile(llvm::cl::Positional,
                                            llvm::cl::desc("<nsa module>"),
                                            llvm::cl::init("-"));
static llvm::cl::opt<int64_t>
    seqLen("seq-len", llvm::cl::desc("sequence length for the cost summary"),
           llvm::cl::init(65536));
static llvm::cl::opt<int64_t>
    runTokens("run-tokens",
              llvm::cl::desc("sequence length of the CPU run (0: skip)"),
              llvm::cl::init(256));
static llvm::cl::opt<bool>
    printIR("print-ir", llvm::cl::desc("print the IR after each stage"),
            llvm::cl::init(false));

/// Prints the total op count of `module` and the count of its structural ops
/// (nsa ops, loops, linalg ops, tile data movement, LLVM functions and calls).
static void printOpCounts(ModuleOp module) {
  llvm::MapVector<StringRef, int> counts;
  int total = 0;
  module.walk([&](Operation *op) {
    if (isa<ModuleOp>(op))
      return;
    ++total;
    StringRef name = op->getName().getStringRef();
    if (name.starts_with("nsa.") || name.starts_with("scf.f") ||
        name == "scf.if" || name.starts_with("linalg.") ||
        name == "tensor.pad" || name == "tensor.parallel_insert_slice" ||
        name == "llvm.func" || name == "llvm.call" ||
        name.starts_with("llvm.intr.exp"))
      ++counts[name];
  });
  llvm::outs() << "      " << total << " ops;";
  for (auto &[name, count] : counts)
    if (name != "linalg.yield" && name != "linalg.index")
      llvm::outs() << " " << name << " x" << count;
  llvm::outs() << "\n";
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

/// JIT-compiles `source` through nsa-to-cpu, runs its first function on
/// random inputs of `tokens` tokens and compares it with the float64
/// reference. Returns true on failure.
static bool runOnCPU(const std::string &source, int64_t tokens, int index) {
  using namespace mlir::nsa::cpu;
  llvm::outs() << "[" << index
               << "] CPU run: JIT-compile nsa-to-cpu, T=" << tokens
               << ", B=1, random inputs, vs the float64 reference\n";
  std::string error;
  auto start = std::chrono::steady_clock::now();
  std::unique_ptr<CompiledLayer> layer =
      CompiledLayer::compileSource(source, LayerSpec(), error);
  if (!layer) {
    llvm::errs() << "nsa-demo: " << error << "\n";
    return true;
  }
  auto compiled = std::chrono::steady_clock::now();
  const LayerSpec &spec = layer->spec();
  ref::Shape shape;
  shape.tokens = tokens;
  shape.qHeads = spec.qHeads;
  shape.kvHeads = spec.kvHeads;
  shape.qkDim = spec.qkDim;
  shape.vDim = spec.vDim;
  int64_t rows = shape.batch * shape.tokens;
  ref::Inputs in;
  in.q = ref::randomBuffer(rows * shape.qHeads * shape.qkDim, 1);
  in.k = ref::randomBuffer(rows * shape.kvHeads * shape.qkDim, 2);
  in.v = ref::randomBuffer(rows * shape.kvHeads * shape.vDim, 3);
  in.gates = ref::randomBuffer(rows * shape.qHeads * 3, 4, -3.0, 3.0);
  for (ref::Buffer *b : {&in.q, &in.k, &in.v, &in.gates})
    for (double &x : *b)
      x = roundTo(spec.dtype, x);
  ref::Buffer out;
  std::string name = "nsa_layer";
  if (!layer->runFunction(name, shape, in, out, error)) {
    llvm::errs() << "nsa-demo: " << error << "\n";
    return true;
  }
  auto ran = std::chrono::steady_clock::now();
  ref::Forward want = ref::forward(shape, spec.config, in);
  double err = ref::relativeL2(out, want.out);
  auto seconds = [](auto a, auto b) {
    return std::chrono::duration<double>(b - a).count();
  };
  llvm::outs() << llvm::formatv(
      "    lower + JIT {0:f2} s, run {1:f2} s; relative L2 error vs float64 "
      "reference: {2:e2} ({3} inputs, tolerance {4})\n",
      seconds(start, compiled), seconds(compiled, ran), err,
      dtypeName(spec.dtype), spec.dtype == DType::F32 ? "1e-5" : "1e-2");
  return !(err <= (spec.dtype == DType::F32 ? 1e-5 : 1e-2));
}

/// Compiles the example again through nsa-to-ptx to an sm_90a cubin (PTX
/// where no ptxas is found) and states what the kernels are. Returns true on
/// failure.
static bool compileForGPU(MLIRContext &context, llvm::SourceMgr &sourceMgr,
                          int index) {
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module)
    return true;
  NSAToPTXOptions options;
  bool haveAssembler =
      static_cast<bool>(llvm::sys::findProgramByName("ptxas")) ||
      llvm::sys::fs::exists("/usr/local/cuda/bin/ptxas");
  options.format = haveAssembler ? "bin" : "isa";
  llvm::outs() << "[" << index << "] nsa-to-ptx: attention-strategy="
               << static_cast<std::string>(options.attentionStrategy)
               << " (FlashAttention-2 kernels: cp.async tiles, ldmatrix + "
                  "mma.sync, softmax and top-n in registers), sm_90a "
               << (haveAssembler ? "cubin" : "PTX") << "\n";
  PassManager pm(&context);
  buildNSAToPTXPipeline(pm, options);
  auto start = std::chrono::steady_clock::now();
  if (failed(pm.run(*module))) {
    llvm::errs() << "nsa-demo: nsa-to-ptx failed\n";
    return true;
  }
  int kernels = 0;
  size_t bytes = 0;
  module->walk([&](gpu::BinaryOp binary) {
    ++kernels;
    for (Attribute object : binary.getObjects())
      bytes += cast<gpu::ObjectAttr>(object).getObject().size();
  });
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  llvm::outs() << llvm::formatv(
      "    {0} kernels, {1} bytes of device code, {2:f2} s; the host code "
      "calls the nsa runtime (docs/Runtime.md). Run on a GPU: "
      "scripts/gpu-tests.sh and bench/run.sh (docs/Benchmarks.md)\n",
      kernels, bytes, seconds);
  return false;
}

int main(int argc, char **argv) {
  llvm::cl::ParseCommandLineOptions(argc, argv, "nsa demo\n");
  DialectRegistry registry;
  registerNSAPipelineDialects(registry);
  MLIRContext context(registry);

  std::string error;
  auto file = openInputFile(inputFile, &error);
  if (!file) {
    llvm::errs() << "nsa-demo: " << error << "\n";
    return 1;
  }
  llvm::SourceMgr sourceMgr;
  std::string source = file->getBuffer().str();
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
    llvm::errs() << "nsa-demo: no nsa.sparse_attention in " << inputFile
                 << "\n";
    return 1;
  }

  struct Stage {
    const char *name, *what;
    std::function<void(OpPassManager &)> build;
  };
  NSAToCPUOptions cpuOptions;
  Stage stages[] = {
      {"nsa-decompose", "one layer -> compression, selection, window, combine",
       [](OpPassManager &pm) { pm.addPass(createDecompose()); }},
      {"nsa-tile", "branch ops -> GQA-grouped scf.forall tiles, online softmax",
       [&](OpPassManager &pm) {
         buildNSATilePipeline(pm, cpuOptions.queryTile, cpuOptions.kvTile);
       }},
      {"nsa-to-cpu (rest)", "bufferize, free, loops, LLVM dialect",
       [&](OpPassManager &pm) { buildNSAToCPUPipeline(pm, cpuOptions); }},
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

  if (runTokens > 0 && runOnCPU(source, runTokens, index++))
    return 1;
  return compileForGPU(context, sourceMgr, index) ? 1 : 0;
}
