//===- CPURunner.cpp - JIT-compile and run nsa layers on the host ---------===//
//
// See CPURunner.h. The module text is generated per layer configuration with
// dynamic batch and token dimensions, so one compilation serves every
// sequence length.
//
//===----------------------------------------------------------------------===//

#include "CPURunner.h"

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Pipelines/Pipelines.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

using namespace mlir;
using namespace mlir::nsa;
using namespace mlir::nsa::cpu;

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

const char *cpu::dtypeName(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "f32";
  case DType::F16:
    return "f16";
  case DType::BF16:
    return "bf16";
  }
  return "?";
}

namespace {

size_t dtypeBytes(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

/// A host array of one element type with a memref descriptor over it.
struct Array {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> descriptor; // allocated, aligned, offset, sizes, strides

  Array(size_t elementBytes, ArrayRef<int64_t> shape) {
    int64_t count = 1;
    for (int64_t d : shape)
      count *= d;
    bytes.assign(std::max<int64_t>(count, 1) * elementBytes, 0);
    descriptor.resize(3 + 2 * shape.size());
    int64_t stride = 1;
    for (int64_t i = shape.size() - 1; i >= 0; --i) {
      descriptor[3 + i] = shape[i];
      descriptor[3 + shape.size() + i] = stride;
      stride *= shape[i];
    }
    auto ptr = reinterpret_cast<int64_t>(bytes.data());
    descriptor[0] = descriptor[1] = ptr;
    descriptor[2] = 0;
  }
  void *desc() { return descriptor.data(); }
};

Array makeArray(DType dtype, ArrayRef<int64_t> shape, const ref::Buffer &data) {
  Array a(dtypeBytes(dtype), shape);
  for (size_t i = 0; i < data.size(); ++i) {
    float f = static_cast<float>(data[i]);
    if (dtype == DType::F32)
      std::memcpy(&a.bytes[4 * i], &f, 4);
    else {
      uint16_t h = dtype == DType::BF16 ? ref::toBF16(f) : ref::toF16(f);
      std::memcpy(&a.bytes[2 * i], &h, 2);
    }
  }
  return a;
}

ref::Buffer readArray(DType dtype, const Array &a, size_t count) {
  ref::Buffer out(count);
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::F32) {
      float f;
      std::memcpy(&f, &a.bytes[4 * i], 4);
      out[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, &a.bytes[2 * i], 2);
      out[i] = dtype == DType::BF16 ? ref::fromBF16(h) : ref::fromF16(h);
    }
  }
  return out;
}

Array poisoned(DType dtype, ArrayRef<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape)
    count *= d;
  return makeArray(dtype, shape,
                   ref::Buffer(count, std::numeric_limits<double>::quiet_NaN()));
}

/// What @branches and @layer_train write, poisoned (NaN, indices -7, an
/// entry no kernel writes): the saved state of Spec section 9.1 in its
/// order, then the layer's output.
std::vector<Array> poisonedBranchOutputs(const LayerSpec &s, int64_t B,
                                         int64_t T) {
  std::vector<int64_t> outShape = {B, T, s.qHeads, s.vDim},
                       lseShape = {B, T, s.qHeads};
  Array idx(4, {B, T, s.kvHeads, s.config.numSelected});
  std::vector<int32_t> poison(idx.bytes.size() / 4, -7);
  std::memcpy(idx.bytes.data(), poison.data(), idx.bytes.size());
  std::vector<Array> outs;
  outs.push_back(poisoned(s.dtype, outShape));
  outs.push_back(poisoned(DType::F32, lseShape));
  outs.push_back(std::move(idx));
  for (int branch = 0; branch < 2; ++branch) {
    outs.push_back(poisoned(s.dtype, outShape));
    outs.push_back(poisoned(DType::F32, lseShape));
  }
  outs.push_back(poisoned(s.dtype, outShape));
  return outs;
}

} // namespace

double cpu::roundTo(DType dtype, double x) {
  float f = static_cast<float>(x);
  switch (dtype) {
  case DType::F32:
    return f;
  case DType::F16:
    return ref::fromF16(ref::toF16(f));
  case DType::BF16:
    return ref::fromBF16(ref::toBF16(f));
  }
  return x;
}

//===----------------------------------------------------------------------===//
// The module
//===----------------------------------------------------------------------===//

std::string CompiledLayer::moduleText(const LayerSpec &s,
                                      const std::string &prefix) {
  const ref::Config &c = s.config;
  std::string t = dtypeName(s.dtype);
  auto tensor = [&](std::string dims, const std::string &elt) {
    return "tensor<" + dims + "x" + elt + ">";
  };
  auto memref = [&](std::string dims, const std::string &elt) {
    return "memref<" + dims + "x" + elt + ">";
  };
  std::string hq = std::to_string(s.qHeads), h = std::to_string(s.kvHeads),
              dqk = std::to_string(s.qkDim), dv = std::to_string(s.vDim),
              n = std::to_string(c.numSelected), l = std::to_string(c.cmpBlock);
  std::string Q = tensor("?x?x" + hq + "x" + dqk, t),
              K = tensor("?x?x" + h + "x" + dqk, t),
              V = tensor("?x?x" + h + "x" + dv, t),
              G = tensor("?x?x" + hq + "x3", t),
              W = tensor("2x" + h + "x" + l, "f32"),
              WH = tensor(h + "x" + l, "f32"), CU = "tensor<?xi32>",
              O = tensor("?x?x" + hq + "x" + dv, t),
              OM = memref("?x?x" + hq + "x" + dv, t),
              L = tensor("?x?x" + hq, "f32"), LM = memref("?x?x" + hq, "f32"),
              I = tensor("?x?x" + h + "x" + n, "i32"),
              IM = memref("?x?x" + h + "x" + n, "i32");
  std::string pool = c.linearPool ? "linear" : "mean";
  double scaleValue =
      c.scale > 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(s.qkDim));
  std::string scale = llvm::formatv("{0:e9} : f32", scaleValue).str();
  std::string backbone =
      llvm::formatv("<initial = {0}, local = {1}, log_levels = {2}, "
                    "hub_stride = {3}",
                    c.backbone.initial, c.backbone.local,
                    c.backbone.logLevels, c.backbone.hubStride)
          .str();
  if (!c.backbone.blocks.empty()) {
    backbone += ", blocks = [";
    for (size_t i = 0; i < c.backbone.blocks.size(); ++i)
      backbone += (i ? ", " : "") + std::to_string(c.backbone.blocks[i]);
    backbone += "]";
  }
  backbone += ">";
  std::string config = llvm::formatv(
      "#nsa.config<cmp_block = {0}, cmp_stride = {1}, slc_block = {2}, "
      "num_selected = {3}, window = {4}, {5}pool = {6}, backbone = {7}{8}>",
      c.cmpBlock, c.cmpStride, c.slcBlock, c.numSelected, c.window,
      c.scale > 0.0 ? "scale = " + scale + ", " : std::string(), pool,
      backbone,
      c.maxTokens > 0 ? ", max_tokens = " + std::to_string(c.maxTokens)
                      : std::string());

  std::string args = "%q: " + Q + ", %k: " + K + ", %v: " + V + ", %g: " + G;
  std::string inTypes = Q + ", " + K + ", " + V + ", " + G;
  if (c.linearPool) {
    args += ", %w: " + W;
  }
  if (s.packed)
    args += ", %cu: " + CU;
  std::string cuOp = s.packed ? " cu_seqlens(%cu)" : "";
  std::string cuType = s.packed ? ", " + CU : "";

  std::string m;
  llvm::raw_string_ostream os(m);
  os << "func.func @" << prefix << "layer(" << args << ", %out: " << OM
     << ") {\n"
     << "  %o = nsa.sparse_attention %q, %k, %v, %g"
     << (c.linearPool ? " cmp_weights(%w)" : "") << cuOp
     << " {config = " << config << "} : (" << inTypes
     << (c.linearPool ? ", " + W : "") << cuType << ") -> " << O << "\n"
     << "  bufferization.materialize_in_destination %o in restrict writable "
        "%out : ("
     << O << ", " << OM << ") -> ()\n  return\n}\n\n";

  os << "func.func @" << prefix << "branches(" << args << ", %oc: " << OM << ", %lc: " << LM
     << ", %idx: " << IM << ", %os: " << OM << ", %ls: " << LM
     << ", %ow: " << OM << ", %lw: " << LM << ", %out: " << OM
     << ") {\n";
  std::string kw, vw, wType;
  if (c.linearPool) {
    for (int i = 0; i < 2; ++i)
      os << "  %w" << i << " = tensor.extract_slice %w[" << i << ", 0, 0] [1, "
         << h << ", " << l << "] [1, 1, 1] : " << W << " to " << WH << "\n";
    kw = " weights(%w0)";
    vw = " weights(%w1)";
    wType = ", " + WH;
  }
  std::string KC = tensor("?x?x" + h + "x" + dqk, t),
              VC = tensor("?x?x" + h + "x" + dv, t);
  std::string cmpAttrs = llvm::formatv("block = {0}, stride = {1}", c.cmpBlock,
                                       c.cmpStride)
                             .str();
  os << "  %kc = nsa.compress %k" << kw << cuOp << " {" << cmpAttrs
     << ", pool = #nsa.pool<" << pool << ">} : (" << K << wType << cuType
     << ") -> " << KC << "\n";
  os << "  %vc = nsa.compress %v" << vw << cuOp << " {" << cmpAttrs
     << ", pool = #nsa.pool<" << pool << ">} : (" << V << wType << cuType
     << ") -> " << VC << "\n";
  os << "  %oc0, %lc0 = nsa.compressed_attention %q, %kc, %vc" << cuOp << " {"
     << cmpAttrs << ", scale = " << scale << "} : (" << Q << ", " << KC << ", "
     << VC << cuType << ") -> (" << O << ", " << L << ")\n";
  os << "  %idx0 = nsa.select_blocks %q, %kc, %lc0" << cuOp
     << llvm::formatv(" {{cmp_block = {0}, cmp_stride = {1}, slc_block = {2}, "
                      "num_selected = {3}, scale = {4}, backbone = "
                      "#nsa.backbone{5}, max_tokens = {6}}",
                      c.cmpBlock, c.cmpStride, c.slcBlock, c.numSelected,
                      scale, backbone, c.maxTokens)
     << " : (" << Q << ", " << KC << ", " << L << cuType << ") -> " << I
     << "\n";
  os << "  %os0, %ls0 = nsa.selected_attention %q, %k, %v, %idx0" << cuOp
     << " {block = " << c.slcBlock << ", scale = " << scale << "} : (" << Q
     << ", " << K << ", " << V << ", " << I << cuType << ") -> (" << O << ", "
     << L << ")\n";
  os << "  %ow0, %lw0 = nsa.window_attention %q, %k, %v" << cuOp
     << " {window = " << c.window << ", scale = " << scale << "} : (" << Q
     << ", " << K << ", " << V << cuType << ") -> (" << O << ", " << L
     << ")\n";
  os << "  %o = nsa.combine %oc0, %os0, %ow0, %g : (" << O << ", " << O << ", "
     << O << ", " << G << ") -> " << O << "\n";
  struct Store {
    const char *value, *dest;
    const std::string &tensorType, &memrefType;
  };
  auto store = [&](const Store &st) {
    os << "  bufferization.materialize_in_destination " << st.value
       << " in restrict writable " << st.dest << " : (" << st.tensorType << ", "
       << st.memrefType << ") -> ()\n";
  };
  // @branches and @layer_train write the saved state (Spec section 9.1)
  // and the output.
  const Store branchStores[] = {
      {"%oc0", "%oc", O, OM}, {"%lc0", "%lc", L, LM}, {"%idx0", "%idx", I, IM},
      {"%os0", "%os", O, OM}, {"%ls0", "%ls", L, LM}, {"%ow0", "%ow", O, OM},
      {"%lw0", "%lw", L, LM}, {"%o", "%out", O, OM}};
  for (const Store &st : branchStores)
    store(st);
  os << "  return\n}\n";

  if (s.gradient) {
    std::string QM = memref("?x?x" + hq + "x" + dqk, t),
                KM = memref("?x?x" + h + "x" + dqk, t),
                VM = memref("?x?x" + h + "x" + dv, t),
                GM = memref("?x?x" + hq + "x3", t),
                WM = memref("2x" + h + "x" + l, "f32");
    os << "\nfunc.func @" << prefix << "layer_grad(" << args << ", %do: " << O
       << ", %dq: " << QM << ", %dk: " << KM << ", %dv: " << VM
       << ", %dg: " << GM << (c.linearPool ? ", %dw: " + WM : "") << ") {\n"
       << "  %dq0, %dk0, %dv0, %dg0" << (c.linearPool ? ", %dw0" : "")
       << " = nsa.sparse_attention_grad %q, %k, %v, %g, %do"
       << (c.linearPool ? " cmp_weights(%w)" : "") << cuOp
       << " {config = " << config << "} : (" << inTypes << ", " << O
       << (c.linearPool ? ", " + W : "") << cuType << ") -> (" << inTypes
       << (c.linearPool ? ", " + W : "") << ")\n";
    std::vector<Store> stores = {{"%dq0", "%dq", Q, QM},
                                 {"%dk0", "%dk", K, KM},
                                 {"%dv0", "%dv", V, VM},
                                 {"%dg0", "%dg", G, GM}};
    if (c.linearPool)
      stores.push_back({"%dw0", "%dw", W, WM});
    for (const Store &st : stores)
      store(st);
    os << "  return\n}\n";

    // Training (Spec section 9.1): the forward that also writes its saved
    // state (the arguments of @branches), and the gradient that takes it.
    std::string savedTypes =
        O + ", " + L + ", " + I + ", " + O + ", " + L + ", " + O + ", " + L;
    os << "\nfunc.func @" << prefix << "layer_train(" << args << ", %oc: " << OM
       << ", %lc: " << LM << ", %idx: " << IM << ", %os: " << OM
       << ", %ls: " << LM << ", %ow: " << OM << ", %lw: " << LM
       << ", %out: " << OM << ") {\n"
       << "  %o, %oc0, %lc0, %idx0, %os0, %ls0, %ow0, %lw0 = "
          "nsa.sparse_attention %q, %k, %v, %g"
       << (c.linearPool ? " cmp_weights(%w)" : "") << cuOp
       << " {config = " << config << "} : (" << inTypes
       << (c.linearPool ? ", " + W : "") << cuType << ") -> (" << O << ", "
       << savedTypes << ")\n";
    for (const Store &st : branchStores)
      store(st);
    os << "  return\n}\n";

    os << "\nfunc.func @" << prefix << "layer_grad_saved(" << args
       << ", %do: " << O << ", %oc: " << O << ", %lc: " << L << ", %idx: " << I
       << ", %os: " << O << ", %ls: " << L << ", %ow: " << O << ", %lw: " << L
       << ", %dq: " << QM << ", %dk: " << KM << ", %dv: " << VM
       << ", %dg: " << GM << (c.linearPool ? ", %dw: " + WM : "") << ") {\n"
       << "  %dq0, %dk0, %dv0, %dg0" << (c.linearPool ? ", %dw0" : "")
       << " = nsa.sparse_attention_grad %q, %k, %v, %g, %do"
       << (c.linearPool ? " cmp_weights(%w)" : "") << cuOp
       << " saved(%oc, %lc, %idx, %os, %ls, %ow, %lw) {config = " << config
       << "} : (" << inTypes << ", " << O << (c.linearPool ? ", " + W : "")
       << cuType << ", " << savedTypes << ") -> (" << inTypes
       << (c.linearPool ? ", " + W : "") << ")\n";
    for (const Store &st : stores)
      store(st);
    os << "  return\n}\n";
  }
  if (s.decodeQueries > 0) {
    // Spec section 12: the step's complete blocks, then the layer. The
    // new tokens a step are static (the flash decode kernels tile by them).
    std::string tq = std::to_string(s.decodeQueries);
    std::string KM = memref("?x?x" + h + "x" + dqk, t),
                VM = memref("?x?x" + h + "x" + dv, t);
    std::string Q = tensor("?x" + tq + "x" + hq + "x" + dqk, t),
                G = tensor("?x" + tq + "x" + hq + "x3", t),
                O = tensor("?x" + tq + "x" + hq + "x" + dv, t),
                OM = memref("?x" + tq + "x" + hq + "x" + dv, t);
    os << "\nfunc.func @" << prefix << "decode_step(%q: " << Q << ", %k: " << K
       << ", %v: " << V << ", %kc: " << KC << ", %vc: " << VC << ", %g: " << G
       << ", %lens: " << CU << (c.linearPool ? ", %w: " + W : "")
       << ", %out: " << OM << ", %kco: " << KM << ", %vco: " << VM << ") {\n";
    if (c.linearPool)
      for (int i = 0; i < 2; ++i)
        os << "  %w" << i << " = tensor.extract_slice %w[" << i
           << ", 0, 0] [1, " << h << ", " << l << "] [1, 1, 1] : " << W
           << " to " << WH << "\n";
    std::string append =
        llvm::formatv("{{{0}, pool = #nsa.pool<{1}>, appended = {2}}", cmpAttrs,
                      pool, s.decodeQueries)
            .str();
    os << "  %kc1 = nsa.compress_append %k, %kc kv_lens(%lens)" << kw << " "
       << append << " : (" << K << ", " << KC << ", " << CU << wType << ") -> "
       << KC << "\n";
    os << "  %vc1 = nsa.compress_append %v, %vc kv_lens(%lens)" << vw << " "
       << append << " : (" << V << ", " << VC << ", " << CU << wType << ") -> "
       << VC << "\n";
    os << "  %o = nsa.sparse_attention_decode %q, %k, %v, %kc1, %vc1, %g "
          "kv_lens(%lens) {config = "
       << config << "} : (" << Q << ", " << K << ", " << V << ", " << KC << ", "
       << VC << ", " << G << ", " << CU << ") -> " << O << "\n";
    store({"%o", "%out", O, OM});
    store({"%kc1", "%kco", KC, KM});
    store({"%vc1", "%vco", VC, VM});
    os << "  return\n}\n";
  }
  return m;
}

//===----------------------------------------------------------------------===//
// Compilation and execution
//===----------------------------------------------------------------------===//

CompiledLayer::~CompiledLayer() = default;

bool CompiledLayer::lowerAndLoad(const std::string &text,
                                 std::string &error) {
  static bool initialized = [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    return true;
  }();
  (void)initialized;

  DialectRegistry registry;
  registerNSAPipelineDialects(registry);
  context = std::make_unique<MLIRContext>(registry);
  std::string diagnostics;
  llvm::raw_string_ostream diagOS(diagnostics);
  ScopedDiagnosticHandler handler(context.get(), [&](Diagnostic &diag) {
    diagOS << diag.getLocation() << ": " << diag.str() << "\n";
    return success();
  });
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(text, context.get());
  if (!module) {
    error = "cannot parse the module:\n" + diagnostics;
    return false;
  }
  // C entry points for every function: memrefs are passed by descriptor.
  module->walk([](func::FuncOp f) {
    f->setAttr("llvm.emit_c_interface", UnitAttr::get(f.getContext()));
  });
  PassManager pm(context.get());
  NSAToCPUOptions options;
  options.queryTile = layerSpec.queryTile;
  options.kvTile = layerSpec.kvTile;
  buildNSAToCPUPipeline(pm, options);
  if (failed(pm.run(*module))) {
    error = "nsa-to-cpu failed:\n" + diagnostics;
    return false;
  }
  ExecutionEngineOptions engineOptions;
  auto transformer = makeOptimizingTransformer(/*optLevel=*/2,
                                               /*sizeLevel=*/0, nullptr);
  engineOptions.transformer = transformer;
  StringRef sharedLibs[] = {NSA_C_RUNNER_UTILS};
  engineOptions.sharedLibPaths = sharedLibs;
  auto created = ExecutionEngine::create(*module, engineOptions);
  if (!created) {
    error = "ExecutionEngine: " + llvm::toString(created.takeError());
    return false;
  }
  engine = std::move(*created);
  return true;
}

std::unique_ptr<CompiledLayer> CompiledLayer::compile(const LayerSpec &spec,
                                                      std::string &error) {
  std::unique_ptr<CompiledLayer> layer(new CompiledLayer());
  layer->layerSpec = spec;
  if (!layer->lowerAndLoad(moduleText(spec), error))
    return nullptr;
  return layer;
}

std::unique_ptr<CompiledLayer>
CompiledLayer::compileSource(const std::string &source,
                             const LayerSpec &tiles, std::string &error) {
  std::unique_ptr<CompiledLayer> layer(new CompiledLayer());
  LayerSpec &spec = layer->layerSpec;
  spec = tiles;
  {
    DialectRegistry registry;
    registerNSAPipelineDialects(registry);
    MLIRContext ctx(registry);
    ctx.allowUnregisteredDialects(false);
    ScopedDiagnosticHandler quiet(&ctx, [](Diagnostic &) { return success(); });
    OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(source, &ctx);
    SparseAttentionOp op;
    if (module)
      module->walk([&](SparseAttentionOp found) {
        op = found;
        return WalkResult::interrupt();
      });
    if (!op) {
      error = "the module has no valid nsa.sparse_attention";
      return nullptr;
    }
    auto q = op.getQuery().getType(), k = op.getKey().getType(),
         v = op.getValue().getType();
    Type elt = q.getElementType();
    spec.dtype = elt.isF32() ? DType::F32 : elt.isF16() ? DType::F16 : DType::BF16;
    spec.qHeads = q.getDimSize(2);
    spec.kvHeads = k.getDimSize(2);
    spec.qkDim = q.getDimSize(3);
    spec.vDim = v.getDimSize(3);
    spec.packed = static_cast<bool>(op.getCuSeqlens());
    ConfigAttr c = op.getConfig();
    spec.config.cmpBlock = c.getCmpBlock();
    spec.config.cmpStride = c.getCmpStride();
    spec.config.slcBlock = c.getSlcBlock();
    spec.config.numSelected = c.getNumSelected();
    spec.config.window = c.getWindow();
    spec.config.scale = c.getScaleOr(spec.qkDim);
    spec.config.linearPool = c.getPool() == PoolKind::Linear;
    spec.config.backbone = c.getBackbone().getSpec();
  }
  if (!layer->lowerAndLoad(source, error))
    return nullptr;
  return layer;
}

bool CompiledLayer::checkShape(const ref::Shape &shape,
                               std::string &error) const {
  const LayerSpec &s = layerSpec;
  if (shape.qHeads == s.qHeads && shape.kvHeads == s.kvHeads &&
      shape.qkDim == s.qkDim && shape.vDim == s.vDim &&
      shape.cuSeqlens.empty() != s.packed)
    return true;
  error = "shape does not match the compiled layer";
  return false;
}

namespace {

/// The inputs of an entry point as host arrays, in argument order.
std::vector<Array> inputArrays(const LayerSpec &s, const ref::Shape &shape,
                               const ref::Inputs &in) {
  int64_t B = shape.batch, T = shape.tokens;
  std::vector<Array> inputs;
  inputs.push_back(makeArray(s.dtype, {B, T, s.qHeads, s.qkDim}, in.q));
  inputs.push_back(makeArray(s.dtype, {B, T, s.kvHeads, s.qkDim}, in.k));
  inputs.push_back(makeArray(s.dtype, {B, T, s.kvHeads, s.vDim}, in.v));
  inputs.push_back(makeArray(s.dtype, {B, T, s.qHeads, 3}, in.gates));
  if (s.config.linearPool)
    inputs.push_back(makeArray(DType::F32, {2, s.kvHeads, s.config.cmpBlock},
                               in.cmpWeights));
  if (s.packed) {
    Array cu(4, {static_cast<int64_t>(shape.cuSeqlens.size())});
    std::memcpy(cu.bytes.data(), shape.cuSeqlens.data(),
                4 * shape.cuSeqlens.size());
    inputs.push_back(std::move(cu));
  }
  return inputs;
}

/// Calls the C entry point of `name` with pointers to `descriptors`.
bool invoke(ExecutionEngine &engine, const std::string &name,
            std::vector<void *> descriptors, std::string &error) {
  std::vector<void *> args;
  for (void *&d : descriptors)
    args.push_back(&d);
  llvm::Error err = engine.invokePacked("_mlir_ciface_" + name, args);
  if (!err)
    return true;
  error = llvm::toString(std::move(err));
  return false;
}

} // namespace

bool CompiledLayer::runFunction(const std::string &name,
                                const ref::Shape &shape, const ref::Inputs &in,
                                ref::Buffer &out, std::string &error) {
  if (!checkShape(shape, error))
    return false;
  std::vector<Array> inputs = inputArrays(layerSpec, shape, in);
  // The result is returned through a rank-4 descriptor of a buffer that the
  // compiled code allocated with malloc.
  std::vector<int64_t> result(3 + 2 * 4, 0);
  std::vector<void *> descriptors = {result.data()};
  for (Array &a : inputs)
    descriptors.push_back(a.desc());
  if (!invoke(*engine, name, descriptors, error))
    return false;
  int64_t count = result[3] * result[4] * result[5] * result[6];
  Array view(dtypeBytes(layerSpec.dtype), {0});
  view.bytes.resize(count * dtypeBytes(layerSpec.dtype));
  std::memcpy(view.bytes.data(),
              reinterpret_cast<uint8_t *>(result[1]) +
                  result[2] * dtypeBytes(layerSpec.dtype),
              view.bytes.size());
  std::free(reinterpret_cast<void *>(result[0]));
  out = readArray(layerSpec.dtype, view, count);
  return true;
}

bool CompiledLayer::runLayer(const ref::Shape &shape, const ref::Inputs &in,
                             ref::Buffer &out, std::string &error) {
  if (!checkShape(shape, error))
    return false;
  const LayerSpec &s = layerSpec;
  std::vector<Array> inputs = inputArrays(s, shape, in);
  std::vector<int64_t> outShape = {shape.batch, shape.tokens, s.qHeads,
                                   s.vDim};
  Array result = poisoned(s.dtype, outShape);
  std::vector<void *> descriptors;
  for (Array &a : inputs)
    descriptors.push_back(a.desc());
  descriptors.push_back(result.desc());
  if (!invoke(*engine, "layer", descriptors, error))
    return false;
  out = readArray(s.dtype, result,
                  shape.batch * shape.tokens * s.qHeads * s.vDim);
  return true;
}

bool CompiledLayer::run(const ref::Shape &shape, const ref::Inputs &in,
                        RunResult &result, std::string &error) {
  if (!checkShape(shape, error))
    return false;
  const LayerSpec &s = layerSpec;
  int64_t B = shape.batch, T = shape.tokens;
  std::vector<Array> inputs = inputArrays(s, shape, in);
  auto call = [&](const char *name, std::vector<Array> &outputs) {
    std::vector<void *> descriptors;
    for (Array &a : inputs)
      descriptors.push_back(a.desc());
    for (Array &a : outputs)
      descriptors.push_back(a.desc());
    return invoke(*engine, name, descriptors, error);
  };

  size_t outCount = B * T * s.qHeads * s.vDim, lseCount = B * T * s.qHeads;
  if (!runLayer(shape, in, result.out, error))
    return false;

  std::vector<Array> outs = poisonedBranchOutputs(s, B, T);
  if (!call("branches", outs))
    return false;
  result.cmpOut = readArray(s.dtype, outs[0], outCount);
  result.cmpLse = readArray(DType::F32, outs[1], lseCount);
  result.indices.resize(outs[2].bytes.size() / 4);
  std::memcpy(result.indices.data(), outs[2].bytes.data(),
              outs[2].bytes.size());
  result.slcOut = readArray(s.dtype, outs[3], outCount);
  result.slcLse = readArray(DType::F32, outs[4], lseCount);
  result.winOut = readArray(s.dtype, outs[5], outCount);
  result.winLse = readArray(DType::F32, outs[6], lseCount);
  result.branchOut = readArray(s.dtype, outs[7], outCount);
  return true;
}

bool CompiledLayer::runBackward(const ref::Shape &shape, const ref::Inputs &in,
                                const ref::Buffer &dOut, ref::Gradients &grads,
                                std::string &error, bool fromSaved) {
  if (!checkShape(shape, error))
    return false;
  const LayerSpec &s = layerSpec;
  if (!s.gradient) {
    error = "the layer was compiled without its gradient";
    return false;
  }
  int64_t B = shape.batch, T = shape.tokens;
  std::vector<Array> inputs = inputArrays(s, shape, in);
  std::vector<Array> saved;
  if (fromSaved) {
    // @layer_train writes the saved state and the layer's output.
    saved = poisonedBranchOutputs(s, B, T);
    std::vector<void *> descriptors;
    for (Array &a : inputs)
      descriptors.push_back(a.desc());
    for (Array &a : saved)
      descriptors.push_back(a.desc());
    if (!invoke(*engine, "layer_train", descriptors, error))
      return false;
    saved.pop_back(); // the output
  }
  inputs.push_back(makeArray(s.dtype, {B, T, s.qHeads, s.vDim}, dOut));
  for (Array &a : saved)
    inputs.push_back(std::move(a));
  std::vector<std::vector<int64_t>> shapes = {{B, T, s.qHeads, s.qkDim},
                                              {B, T, s.kvHeads, s.qkDim},
                                              {B, T, s.kvHeads, s.vDim},
                                              {B, T, s.qHeads, 3}};
  std::vector<Array> outs;
  for (const std::vector<int64_t> &dims : shapes)
    outs.push_back(poisoned(s.dtype, dims));
  if (s.config.linearPool)
    outs.push_back(poisoned(DType::F32, {2, s.kvHeads, s.config.cmpBlock}));
  std::vector<void *> descriptors;
  for (Array &a : inputs)
    descriptors.push_back(a.desc());
  for (Array &a : outs)
    descriptors.push_back(a.desc());
  if (!invoke(*engine, fromSaved ? "layer_grad_saved" : "layer_grad",
              descriptors, error))
    return false;
  auto count = [](const std::vector<int64_t> &dims) {
    int64_t n = 1;
    for (int64_t d : dims)
      n *= d;
    return n;
  };
  ref::Buffer *targets[] = {&grads.q, &grads.k, &grads.v, &grads.gates};
  for (int i = 0; i < 4; ++i)
    *targets[i] = readArray(s.dtype, outs[i], count(shapes[i]));
  grads.cmpWeights.clear();
  if (s.config.linearPool)
    grads.cmpWeights =
        readArray(DType::F32, outs[4], 2 * s.kvHeads * s.config.cmpBlock);
  return true;
}

bool CompiledLayer::runDecode(const DecodeInputs &in, DecodeResult &result,
                              std::string &error) {
  const LayerSpec &s = layerSpec;
  const ref::Config &c = s.config;
  int64_t B = in.batch, Tq = in.queries, Lmax = in.cacheTokens;
  int64_t rows = spec::numCompressedBlocks(Lmax, c.cmpBlock, c.cmpStride);
  // Argument checks before anything runs (docs/Decode.md, section 2).
  if (s.decodeQueries <= 0) {
    error = "the layer was compiled without its decoding step";
    return false;
  }
  if (Tq != s.decodeQueries || B <= 0 || Lmax < Tq) {
    error = llvm::formatv("decode: expects B > 0 and Tq = {0} <= Lmax, found "
                          "B = {1}, Tq = {2}, Lmax = {3}",
                          s.decodeQueries, B, Tq, Lmax)
                .str();
    return false;
  }
  if (static_cast<int64_t>(in.kvLens.size()) != B) {
    error = llvm::formatv("decode: expects {0} kv_lens, found {1}", B,
                          in.kvLens.size())
                .str();
    return false;
  }
  for (int64_t b = 0; b < B; ++b)
    if (in.kvLens[b] < Tq || in.kvLens[b] > Lmax) {
      error = llvm::formatv("decode: kv_lens[{0}] = {1} is outside [Tq, "
                            "Lmax] = [{2}, {3}]",
                            b, in.kvLens[b], Tq, Lmax)
                  .str();
      return false;
    }
  struct Expect {
    const ref::Buffer &buffer;
    int64_t size;
    const char *name;
  } expects[] = {{in.q, B * Tq * s.qHeads * s.qkDim, "q"},
                 {in.gates, B * Tq * s.qHeads * 3, "gates"},
                 {in.k, B * Lmax * s.kvHeads * s.qkDim, "k"},
                 {in.v, B * Lmax * s.kvHeads * s.vDim, "v"},
                 {in.kc, B * rows * s.kvHeads * s.qkDim, "kc"},
                 {in.vc, B * rows * s.kvHeads * s.vDim, "vc"},
                 {in.cmpWeights, c.linearPool ? 2 * s.kvHeads * c.cmpBlock : 0,
                  "cmp_weights"}};
  for (const Expect &e : expects)
    if (static_cast<int64_t>(e.buffer.size()) != e.size) {
      error = llvm::formatv("decode: expects {0} elements of {1}, found {2}",
                            e.size, e.name, e.buffer.size())
                  .str();
      return false;
    }

  std::vector<Array> args;
  args.push_back(makeArray(s.dtype, {B, Tq, s.qHeads, s.qkDim}, in.q));
  args.push_back(makeArray(s.dtype, {B, Lmax, s.kvHeads, s.qkDim}, in.k));
  args.push_back(makeArray(s.dtype, {B, Lmax, s.kvHeads, s.vDim}, in.v));
  args.push_back(makeArray(s.dtype, {B, rows, s.kvHeads, s.qkDim}, in.kc));
  args.push_back(makeArray(s.dtype, {B, rows, s.kvHeads, s.vDim}, in.vc));
  args.push_back(makeArray(s.dtype, {B, Tq, s.qHeads, 3}, in.gates));
  Array lens(4, {B});
  std::memcpy(lens.bytes.data(), in.kvLens.data(), 4 * B);
  args.push_back(std::move(lens));
  if (c.linearPool)
    args.push_back(
        makeArray(DType::F32, {2, s.kvHeads, c.cmpBlock}, in.cmpWeights));
  args.push_back(poisoned(s.dtype, {B, Tq, s.qHeads, s.vDim}));
  args.push_back(poisoned(s.dtype, {B, rows, s.kvHeads, s.qkDim}));
  args.push_back(poisoned(s.dtype, {B, rows, s.kvHeads, s.vDim}));
  std::vector<void *> descriptors;
  for (Array &a : args)
    descriptors.push_back(a.desc());
  if (!invoke(*engine, "decode_step", descriptors, error))
    return false;
  size_t n = args.size();
  result.out = readArray(s.dtype, args[n - 3], B * Tq * s.qHeads * s.vDim);
  result.kc = readArray(s.dtype, args[n - 2], B * rows * s.kvHeads * s.qkDim);
  result.vc = readArray(s.dtype, args[n - 1], B * rows * s.kvHeads * s.vDim);
  return true;
}
