//===- nsa-fuzz.cpp - libFuzzer targets over nsa's lowering --------------===//
//
// One input is an MLIR module as text. It is parsed (and so verified) in a
// context that knows only the dialects nsa's input uses (builtin, func,
// arith, tensor, nsa), so that the fuzzer spends its time in nsa's
// attribute and op verifiers rather than in other dialects' parsers. A
// module that verifies is printed, parsed again in a second context and
// lowered. Failures are diagnostics, and expected; a crash, a hang or
// running out of memory is a bug. The passes load the dialects they
// produce themselves (their dependent dialects).
//
// Built twice from this file (test/Fuzz/CMakeLists.txt):
// - nsa-fuzz, the front end: nsa-analyze-reach, nsa-decompose and the
//   tiling front (nsa-tile, canonicalize, cse) that nsa-to-cpu starts with.
// - nsa-fuzz-gpu (NSA_FUZZ_GPU), the GPU lowering: the whole nsa-to-ptx
//   pipeline (nsa-flash-attention or the generic mapping, NVVM, LLVM's
//   NVPTX back end) to PTX text, for sm_90a or sm_80 as the input's last
//   byte says; no ptxas.
//
// Inputs whose first byte is 0xff are structured instead: the bytes give
// an op kind (the layer, its gradient, a decoding step, a compressed
// cache's append), the sizes and every `#nsa.config` parameter (small
// values, powers of two and their neighbours, negatives, raw 64-bit
// values), which is printed as a module and run as above. This reaches
// the verifiers', analyses' and kernel builders' arithmetic with values
// text mutation rarely forms (the OOMs and hangs of issues 13 and 53 came
// from such values).
//
// Built with clang's -fsanitize=fuzzer,address (NSA_ENABLE_FUZZER, see
// scripts/fuzz.sh, which also prepares the seed corpus from test/).
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Pipelines/Pipelines.h"
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
#include <utility>
#include <vector>

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
#ifdef NSA_FUZZ_GPU
    // The GPU lowering's external models (NVVM target, translations).
    DialectRegistry pipelineDialects;
    nsa::registerNSAPipelineDialects(pipelineDialects);
    all = make(pipelineDialects);
#else
    all = make(inputDialects);
#endif
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

/// The op kinds of structured inputs (bits 6-7 of the flags byte).
enum class Kind { Layer, Gradient, Decode, Append };

/// A static size, or `?` for 0.
std::string dim(int64_t v) { return v == 0 ? "?" : std::to_string(v); }

/// The `#nsa.config` of a structured input. The flags byte after its
/// window (into `flags`) says which optional parameters it has (1 scale,
/// 2 linear pool, 4 blocks, 8 max_tokens, 16 max_hops) and what the op
/// holds besides (32 cu_seqlens, bits 6-7 the Kind).
std::string structuredConfig(Bytes &b, uint8_t &flags) {
  std::string cfg = "#nsa.config<cmp_block = " + std::to_string(b.value()) +
                    ", cmp_stride = " + std::to_string(b.value()) +
                    ", slc_block = " + std::to_string(b.value()) +
                    ", num_selected = " + std::to_string(b.value()) +
                    ", window = " + std::to_string(b.value());
  flags = b.byte();
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
  return cfg + ">";
}

/// One function whose arguments are `args` (name, type) and whose body is
/// `op` with results `results` (types), returning the first.
std::string function(
    const std::vector<std::pair<std::string, std::string>> &args,
    const std::string &op, const std::vector<std::string> &results) {
  std::string params, operandTypes, resultNames, resultTypes;
  for (size_t i = 0; i < args.size(); ++i) {
    params += (i ? ", %" : "%") + args[i].first + ": " + args[i].second;
    operandTypes += (i ? ", " : "") + args[i].second;
  }
  for (size_t i = 0; i < results.size(); ++i) {
    resultNames += (i ? ", %r" : "%r") + std::to_string(i);
    resultTypes += (i ? ", " : "") + results[i];
  }
  return "func.func @f(" + params + ") -> " + results[0] + " {\n  " +
         resultNames + " = " + op + " : (" + operandTypes + ") -> (" +
         resultTypes + ")\n  return %r0 : " + results[0] + "\n}\n";
}

/// The module of one nsa op with every size and config parameter taken
/// from `b` (dims of 0 mean dynamic): nsa.sparse_attention, its gradient,
/// a decoding step or a compressed cache's append.
std::string structuredModule(Bytes b) {
  std::string B = dim(b.value()), T = dim(b.value());
  std::string HQ = dim(b.value()), H = dim(b.value()), Dqk = dim(b.value()),
              Dv = dim(b.value());
  const char *elts[] = {"bf16", "f16", "f32", "i32"};
  std::string e = elts[b.byte() % 4];
  uint8_t flags = 0;
  std::string cfg = structuredConfig(b, flags);
  auto kind = static_cast<Kind>(flags >> 6);
  auto t = [&](const std::string &rows, const std::string &heads,
               const std::string &d) {
    return "tensor<" + B + "x" + rows + "x" + heads + "x" + d + "x" + e + ">";
  };
  std::string q = t(T, HQ, Dqk), o = t(T, HQ, Dv), g = t(T, HQ, "3");
  std::string k = t(T, H, Dqk), v = t(T, H, Dv);
  if (kind == Kind::Decode || kind == Kind::Append) {
    // The caches: L tokens and Lc compressed rows a batch row.
    std::string L = dim(b.value()), Lc = dim(b.value());
    std::string lens = "tensor<" + B + "xi32>";
    std::string kc = t(Lc, H, Dqk), vc = t(Lc, H, Dv);
    if (kind == Kind::Append)
      return function({{"k", t(L, H, Dqk)}, {"kc", kc}, {"lens", lens}},
                      "nsa.compress_append %k, %kc kv_lens(%lens) {block = " +
                          std::to_string(b.value()) +
                          ", stride = " + std::to_string(b.value()) +
                          ", pool = #nsa.pool<mean>, appended = " +
                          std::to_string(b.value()) + "}",
                      {kc});
    return function({{"q", q},
                     {"k", t(L, H, Dqk)},
                     {"v", t(L, H, Dv)},
                     {"kc", kc},
                     {"vc", vc},
                     {"g", g},
                     {"lens", lens}},
                    "nsa.sparse_attention_decode %q, %k, %v, %kc, %vc, %g "
                    "kv_lens(%lens) {config = " +
                        cfg + "}",
                    {o});
  }
  std::vector<std::pair<std::string, std::string>> args = {
      {"q", q}, {"k", k}, {"v", v}, {"g", g}};
  std::string operands = "%q, %k, %v, %g", w;
  std::vector<std::string> results = {o};
  if (kind == Kind::Gradient) {
    args.push_back({"do", o});
    operands += ", %do";
    results = {q, k, v, g};
  }
  if (flags & 2) {
    w = "tensor<2x" + H + "x" + dim(b.value()) + "xf32>";
    args.push_back({"w", w});
    operands += " cmp_weights(%w)";
    if (kind == Kind::Gradient)
      results.push_back(w);
  }
  if (flags & 32) {
    args.push_back({"cu", "tensor<?xi32>"});
    operands += " cu_seqlens(%cu)";
  }
  return function(args,
                  std::string(kind == Kind::Gradient
                                  ? "nsa.sparse_attention_grad "
                                  : "nsa.sparse_attention ") +
                      operands + " {config = " + cfg + "}",
                  results);
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
#ifdef NSA_FUZZ_GPU
  nsa::NSAToPTXOptions options;
  options.chip = size > 0 && data[size - 1] & 1 ? "sm_80" : "sm_90a";
  options.format = "isa";
  nsa::buildNSAToPTXPipeline(pm, options);
#else
  pm.addPass(nsa::createAnalyzeReach());
  pm.addPass(nsa::createDecompose());
  // nsa-to-cpu's tiles.
  nsa::buildNSATilePipeline(pm, /*queryTile=*/16, /*kvTile=*/64);
#endif
  (void)pm.run(*module);
  return 0;
}
