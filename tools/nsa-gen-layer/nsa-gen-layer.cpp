//===- nsa-gen-layer.cpp - the test layers' nsa modules
//--------------------===//
//
// Prints the nsa module of one layer configuration with two entry points,
// `@<prefix>layer` (one nsa.sparse_attention) and `@<prefix>branches` (the
// branch ops, every intermediate written out), as the CPU tests build in
// memory, and with --gradient `@<prefix>layer_grad` (one
// nsa.sparse_attention_grad that recomputes the forward),
// `@<prefix>layer_train` (the forward with its saved state) and
// `@<prefix>layer_grad_saved` (the gradient from that state; docs/Spec.md
// section 9.1), and with --decode=Tq `@<prefix>decode_step` (a decoding
// step over a KV cache, Spec section 12). The GPU tests compile these ahead
// of time with nsa-to-ptx.
//
//   nsa-gen-layer --prefix=paper_ --q-heads=16 --kv-heads=1 --qk-dim=192 ...
//
//===----------------------------------------------------------------------===//

#include "CPURunner.h"

#include "NSA/Pipelines/Pipelines.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdio>

namespace cl = llvm::cl;
using namespace mlir::nsa;

static cl::OptionCategory category("nsa-gen-layer options");
static cl::opt<std::string> prefix("prefix", cl::init(""), cl::cat(category),
                                   cl::desc("entry point name prefix"));
static cl::opt<int64_t> qHeads("q-heads", cl::init(16), cl::cat(category));
static cl::opt<int64_t> kvHeads("kv-heads", cl::init(1), cl::cat(category));
static cl::opt<int64_t> qkDim("qk-dim", cl::init(192), cl::cat(category));
static cl::opt<int64_t> vDim("v-dim", cl::init(128), cl::cat(category));
static cl::opt<int64_t> cmpBlock("cmp-block", cl::init(32), cl::cat(category),
                                 cl::desc("l"));
static cl::opt<int64_t> cmpStride("cmp-stride", cl::init(16),
                                  cl::cat(category), cl::desc("d"));
static cl::opt<int64_t> slcBlock("slc-block", cl::init(64), cl::cat(category),
                                 cl::desc("l'"));
static cl::opt<int64_t> numSelected("num-selected", cl::init(16),
                                    cl::cat(category), cl::desc("n"));
static cl::opt<int64_t> window("window", cl::init(512), cl::cat(category),
                               cl::desc("w"));
static cl::opt<int64_t> initial("initial", cl::init(1), cl::cat(category),
                                cl::desc("backbone: initial blocks"));
static cl::opt<int64_t> local("local", cl::init(2), cl::cat(category),
                              cl::desc("backbone: local blocks"));
static cl::opt<int64_t>
    logLevels("log-levels", cl::init(0), cl::cat(category),
              cl::desc("backbone: blocks 2^i back, i < levels"));
static cl::opt<int64_t> hubStride("hub-stride", cl::init(0), cl::cat(category),
                                  cl::desc("backbone: every s-th block"));
static cl::list<int64_t> blocks("blocks", cl::CommaSeparated,
                                cl::cat(category),
                                cl::desc("backbone: explicit blocks"));
static cl::opt<int64_t> maxTokens("max-tokens", cl::init(0), cl::cat(category),
                                  cl::desc("declared maximum T (hubs need "
                                           "it)"));
static cl::opt<bool> linear("linear", cl::init(false), cl::cat(category),
                            cl::desc("learned (linear) pool"));
static cl::opt<bool> packed("packed", cl::init(false), cl::cat(category),
                            cl::desc("packed sequences (cu_seqlens)"));
static cl::opt<bool> gradient("gradient", cl::init(false), cl::cat(category),
                              cl::desc("also emit the training entries "
                                       "@<prefix>layer_grad, layer_train and "
                                       "layer_grad_saved"));
static cl::opt<int64_t> decode("decode", cl::init(0), cl::cat(category),
                               cl::desc("also emit @<prefix>decode_step for "
                                        "this many new tokens a step "
                                        "(nsaLayerDecode)"));
static cl::opt<cpu::DType>
    dtype("dtype", cl::init(cpu::DType::BF16), cl::cat(category),
          cl::desc("element type of q, k, v, gates and the output"),
          cl::values(clEnumValN(cpu::DType::BF16, "bf16", "bfloat16"),
                     clEnumValN(cpu::DType::F16, "f16", "float16"),
                     clEnumValN(cpu::DType::F32, "f32", "float32")));

enum class Emit { MLIR, Entry };
static cl::opt<Emit>
    emit("emit", cl::init(Emit::MLIR), cl::cat(category),
         cl::desc("what to print"),
         cl::values(clEnumValN(Emit::MLIR, "mlir", "the layer's nsa module"),
                    clEnumValN(Emit::Entry, "entry",
                               "its C entry in a layer library")));
static cl::opt<std::string>
    pipeline("pipeline", cl::init(""), cl::cat(category),
             cl::desc("with --emit=entry: the nsa-to-ptx options recorded"));

/// A C string literal of `s`.
/// `s` as a C string literal: quotes and backslashes escaped, control and
/// non-ASCII bytes as octal escapes (a newline in --pipeline stays inside
/// the literal).
static std::string cString(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char octal[5];
      std::snprintf(octal, sizeof(octal), "\\%03o", c);
      out += octal;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

/// The C source of the layer's nsaLayerEntry.
static std::string entrySource(const cpu::LayerSpec &spec) {
  const char *dtypes[] = {"nsaF32", "nsaF16", "nsaBF16"};
  std::string name = prefix, var = "nsa_layer_entry_" + prefix;
  if (!name.empty() && name.back() == '_')
    name.pop_back();
  const ref::Config &c = spec.config;
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "/* Generated by nsa-gen-layer --emit=entry. */\n"
     << "#include \"NSA-c/Runtime.h\"\n\n"
     << "extern void _mlir_ciface_" << prefix << "layer(void);\n";
  if (spec.gradient)
    os << "extern void _mlir_ciface_" << prefix << "layer_train(void);\n"
       << "extern void _mlir_ciface_" << prefix << "layer_grad_saved(void);\n";
  if (spec.decodeQueries > 0)
    os << "extern void _mlir_ciface_" << prefix << "decode_step(void);\n";
  if (!c.backbone.blocks.empty()) {
    os << "static const int64_t " << var << "blocks[] = {";
    llvm::interleaveComma(c.backbone.blocks, os);
    os << "};\n";
  }
  os << "const nsaLayerEntry " << var << " = {\n"
     << "  {" << cString(name) << ", " << spec.qHeads << ", " << spec.kvHeads
     << ", " << spec.qkDim << ", " << spec.vDim << ", " << c.cmpBlock << ", "
     << dtypes[static_cast<int>(spec.dtype)] << ", " << spec.packed << ", "
     << c.linearPool << ", &_mlir_ciface_" << prefix << "layer";
  if (spec.gradient)
    os << ",\n   " << c.slcBlock << ", " << c.numSelected << ", &_mlir_ciface_"
       << prefix << "layer_train, &_mlir_ciface_" << prefix
       << "layer_grad_saved";
  else if (spec.decodeQueries > 0)
    os << ",\n   0, 0, 0, 0";
  if (spec.decodeQueries > 0)
    os << ",\n   " << spec.decodeQueries << ", " << c.cmpStride
       << ", &_mlir_ciface_" << prefix << "decode_step";
  os << "},\n"
     << "  {" << spec.qHeads << ", " << spec.kvHeads << ", " << spec.qkDim
     << ", " << spec.vDim << ", " << dtypes[static_cast<int>(spec.dtype)]
     << ", " << spec.packed << ",\n   {" << c.cmpBlock << ", " << c.cmpStride
     << ", " << c.slcBlock << ", " << c.numSelected << ", " << c.window
     << ", " << llvm::formatv("{0:e17}", c.scale).str() << ", "
     << c.linearPool << ", 0, " << c.backbone.initial << ", "
     << c.backbone.local << ", " << c.backbone.logLevels << ", "
     << c.backbone.hubStride << ", "
     << (c.backbone.blocks.empty() ? std::string("0") : var + "blocks")
     << ", " << c.backbone.blocks.size() << ", " << c.maxTokens << "}},\n"
     << "  " << cString(pipeline) << "};\n";
  return s;
}

int main(int argc, char **argv) {
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(argc, argv, "nsa test-layer generator\n");
  // Sizes that cannot even be spelled as a tensor type; everything else
  // the dialect's verifiers judge below.
  for (auto [name, value] :
       {std::pair<const char *, int64_t>{"q-heads", qHeads},
        {"kv-heads", kvHeads},
        {"qk-dim", qkDim},
        {"v-dim", vDim}})
    if (value <= 0) {
      llvm::errs() << "nsa-gen-layer: --" << name
                   << " must be positive, found " << value << "\n";
      return 1;
    }
  cpu::LayerSpec spec;
  spec.qHeads = qHeads;
  spec.kvHeads = kvHeads;
  spec.qkDim = qkDim;
  spec.vDim = vDim;
  spec.config.cmpBlock = cmpBlock;
  spec.config.cmpStride = cmpStride;
  spec.config.slcBlock = slcBlock;
  spec.config.numSelected = numSelected;
  spec.config.window = window;
  spec.config.backbone = {initial, local};
  spec.config.backbone.logLevels = logLevels;
  spec.config.backbone.hubStride = hubStride;
  spec.config.backbone.blocks.assign(blocks.begin(), blocks.end());
  llvm::sort(spec.config.backbone.blocks);
  spec.config.maxTokens = maxTokens;
  spec.config.linearPool = linear;
  spec.packed = packed;
  spec.gradient = gradient;
  if (decode < 0 || (decode > 0 && packed)) {
    llvm::errs() << "nsa-gen-layer: --decode must be positive and without "
                    "--packed, found "
                 << decode << "\n";
    return 1;
  }
  spec.decodeQueries = decode;
  spec.dtype = dtype;
  // C entry points (`_mlir_ciface_<name>`, memrefs by descriptor).
  std::string text = cpu::CompiledLayer::moduleText(spec, prefix);
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end - pos);
    if (line.rfind("func.func @", 0) == 0 && line.size() > 2 &&
        line.compare(line.size() - 2, 2, " {") == 0)
      line.insert(line.size() - 2, " attributes {llvm.emit_c_interface}");
    out += line + "\n";
    pos = end == std::string::npos ? text.size() : end + 1;
  }
  // The module must pass the dialect's own checks (config, GQA heads,
  // shapes) before anything is compiled from it.
  mlir::DialectRegistry registry;
  registerNSAPipelineDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  if (!mlir::parseSourceString<mlir::ModuleOp>(out, &context)) {
    llvm::errs() << "nsa-gen-layer: the options give an invalid layer (the "
                    "diagnostics above)\n";
    return 1;
  }
  llvm::outs() << (emit == Emit::Entry ? entrySource(spec) : out);
  return 0;
}
