//===- nsa-fuzz.cpp - libFuzzer target over the nsa front end -------------===//
//
// One input is an MLIR module as text. It is parsed (and so verified) in a
// context that knows only the dialects nsa's input uses (builtin, func,
// arith, tensor, nsa), so that the fuzzer spends its time in nsa's
// attribute and op verifiers rather than in other dialects' parsers. A
// module that verifies is printed, parsed again in a second context and
// run through nsa-analyze-reach, nsa-decompose and the
// tiling front (nsa-tile, canonicalize, cse). Failures are diagnostics, and
// expected; a crash, a hang or running out of memory is a bug. The passes
// load the dialects they produce themselves (their dependent dialects).
//
// Inputs whose first byte is 0xff are structured instead: the bytes give
// the sizes and every `#nsa.config` parameter of one nsa.sparse_attention
// (small values, powers of two and their neighbours, negatives, raw 64-bit
// values), which is printed as a module and run as above. This reaches
// the verifiers' and analyses' arithmetic with values text mutation rarely
// forms (the OOMs and hangs of issue 13 came from such values).
//
// Built with clang's -fsanitize=fuzzer,address (NSA_ENABLE_FUZZER, see
// scripts/fuzz.sh, which also prepares the seed corpus from test/).
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

using namespace mlir;

namespace {

/// A context with diagnostics swallowed. Contexts are replaced every few
/// hundred inputs so that uniqued attributes and types do not accumulate
/// over a million runs.
struct Contexts {
  DialectRegistry inputDialects;
  std::unique_ptr<MLIRContext> input, all;
  int uses = 0;

  Contexts() {
    inputDialects.insert<nsa::NSADialect, arith::ArithDialect,
                         func::FuncDialect, tensor::TensorDialect>();
  }
  static std::unique_ptr<MLIRContext> make(const DialectRegistry &registry) {
    auto ctx = std::make_unique<MLIRContext>(registry,
                                             MLIRContext::Threading::DISABLED);
    ctx->getDiagEngine().registerHandler([](Diagnostic &) { return success(); });
    return ctx;
  }
  void refresh() {
    if (input && ++uses % 256)
      return;
    input = make(inputDialects);
    all = make(inputDialects);
  }
};

/// Reads fuzz bytes as interesting integers.
class Bytes {
public:
  Bytes(const uint8_t *data, size_t size) : data(data), size(size) {}
  uint8_t byte() { return pos < size ? data[pos++] : 0; }
  int64_t value() {
    uint8_t kind = byte();
    if (kind < 128)
      return kind % 80;
    if (kind < 192) {
      int64_t p = int64_t(1) << (kind % 63);
      return p + (byte() % 3) - 1;
    }
    if (kind < 224)
      return -int64_t(kind % 32) - 1;
    uint64_t raw = 0;
    for (int i = 0; i < 8; ++i)
      raw = raw << 8 | byte();
    return static_cast<int64_t>(raw);
  }

private:
  const uint8_t *data;
  size_t size, pos = 0;
};

/// The module of one nsa.sparse_attention with every size and config
/// parameter taken from `b` (dims of 0 mean dynamic).
std::string structuredModule(Bytes b) {
  auto dim = [&](int64_t v) {
    return v == 0 ? std::string("?") : std::to_string(v);
  };
  std::string B = dim(b.value()), T = dim(b.value());
  std::string HQ = dim(b.value()), H = dim(b.value()), Dqk = dim(b.value()),
              Dv = dim(b.value());
  const char *elts[] = {"bf16", "f16", "f32", "i32"};
  std::string e = elts[b.byte() % 4];
  std::string cfg = "#nsa.config<cmp_block = " + std::to_string(b.value()) +
                    ", cmp_stride = " + std::to_string(b.value()) +
                    ", slc_block = " + std::to_string(b.value()) +
                    ", num_selected = " + std::to_string(b.value()) +
                    ", window = " + std::to_string(b.value());
  uint8_t flags = b.byte();
  if (flags & 1)
    cfg += ", scale = " + std::to_string(b.value() / 7.0) + " : f32";
  if (flags & 2)
    cfg += ", pool = linear";
  cfg += ", backbone = <initial = " + std::to_string(b.value()) +
         ", local = " + std::to_string(b.value()) +
         ", log_levels = " + std::to_string(b.value()) +
         ", hub_stride = " + std::to_string(b.value());
  if (flags & 4) {
    cfg += ", blocks = [";
    int count = 1 + b.byte() % 4;
    for (int i = 0; i < count; ++i)
      cfg += (i ? ", " : "") + std::to_string(b.value());
    cfg += "]";
  }
  cfg += ">";
  if (flags & 8)
    cfg += ", max_tokens = " + std::to_string(b.value());
  if (flags & 16)
    cfg += ", max_hops = " + std::to_string(b.value());
  cfg += ">";
  auto t = [&](const std::string &heads, const std::string &d) {
    return "tensor<" + B + "x" + T + "x" + heads + "x" + d + "x" + e + ">";
  };
  std::string q = t(HQ, Dqk), k = t(H, Dqk), v = t(H, Dv), g = t(HQ, "3"),
              o = t(HQ, Dv);
  std::string args = "%q: " + q + ", %k: " + k + ", %v: " + v + ", %g: " + g;
  std::string operands = "%q, %k, %v, %g", types = q + ", " + k + ", " + v +
                                                   ", " + g;
  if (flags & 2) {
    std::string w = "tensor<2x" + H + "x" + dim(b.value()) + "xf32>";
    args += ", %w: " + w;
    operands += " cmp_weights(%w)";
    types += ", " + w;
  }
  if (flags & 32) {
    args += ", %cu: tensor<?xi32>";
    operands += " cu_seqlens(%cu)";
    types += ", tensor<?xi32>";
  }
  return "func.func @f(" + args + ") -> " + o +
         " {\n  %o = nsa.sparse_attention " + operands + " {config = " + cfg +
         "} : (" + types + ") -> " + o + "\n  return %o : " + o + "\n}\n";
}

/// How far inputs got, printed at exit (scripts/fuzz.sh reports it).
struct Counts {
  uint64_t inputs = 0, verified = 0;
  ~Counts() {
    std::fprintf(stderr,
                 "nsa-fuzz: %llu inputs, %llu parsed and verified and run "
                 "through the passes\n",
                 static_cast<unsigned long long>(inputs),
                 static_cast<unsigned long long>(verified));
  }
};
Counts counts;

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static Contexts contexts;
  contexts.refresh();
  ++counts.inputs;
  std::string text = size > 0 && data[0] == 0xff
                         ? structuredModule(Bytes(data + 1, size - 1))
                         : std::string(reinterpret_cast<const char *>(data),
                                       size);
  // For triage: `NSA_FUZZ_PRINT=1 nsa-fuzz <input>` shows the module.
  static bool print = std::getenv("NSA_FUZZ_PRINT");
  if (print)
    std::fprintf(stderr, "%s\n", text.c_str());
  std::string verified;
  {
    OwningOpRef<ModuleOp> module =
        parseSourceString<ModuleOp>(text, contexts.input.get());
    if (!module)
      return 0;
    llvm::raw_string_ostream os(verified);
    module->print(os);
  }
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(verified, contexts.all.get());
  if (!module)
    return 0;
  ++counts.verified;
  PassManager pm(contexts.all.get());
  pm.enableVerifier(true);
  pm.addPass(nsa::createAnalyzeReach());
  pm.addPass(nsa::createDecompose());
  // nsa-to-cpu's tiles.
  nsa::buildNSATilePipeline(pm, /*queryTile=*/16, /*kvTile=*/64);
  (void)pm.run(*module);
  return 0;
}
