//===- embed_jit.cpp - the C++ JIT of nsa in a project of its own ---------===//
//
// mlir::nsa::cpu::CompiledLayer (NSA/CPU/CPURunner.h, NSA::NSACPURunner)
// lowers nsa modules with nsa-to-cpu and JIT-compiles them with MLIR's
// ExecutionEngine. Two ways in, both checked here against the float64
// reference (NSA/CPU/NSAReference.h) on random inputs whose length is not a
// multiple of any tile:
//
//   1. a layer from its description (LayerSpec): forward and gradient;
//   2. a user's own module (compileSource): any function of signature
//      (q, k, v, gates) -> out whose first nsa.sparse_attention defines the
//      layer, run by name with runFunction.
//
//===----------------------------------------------------------------------===//

#include "CPURunner.h"
#include "NSAReference.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

using namespace mlir::nsa;

namespace {

/// A small layer: 4 query heads on 2 KV heads, bf16.
cpu::LayerSpec smallLayer() {
  cpu::LayerSpec spec;
  spec.qHeads = 4;
  spec.kvHeads = 2;
  spec.qkDim = 32;
  spec.vDim = 16;
  spec.dtype = cpu::DType::BF16;
  spec.config.cmpBlock = 16;
  spec.config.cmpStride = 8;
  spec.config.slcBlock = 32;
  spec.config.numSelected = 4;
  spec.config.window = 48;
  spec.gradient = true; // also compile the gradient, for runBackward
  return spec;
}

/// Random inputs of `shape`, rounded to `dtype` as the compiled code sees
/// them.
ref::Inputs randomInputs(const ref::Shape &s, cpu::DType dtype) {
  int64_t rows = s.batch * s.tokens;
  ref::Inputs in;
  in.q = ref::randomBuffer(rows * s.qHeads * s.qkDim, 1);
  in.k = ref::randomBuffer(rows * s.kvHeads * s.qkDim, 2);
  in.v = ref::randomBuffer(rows * s.kvHeads * s.vDim, 3);
  in.gates = ref::randomBuffer(rows * s.qHeads * 3, 4, -3.0, 3.0);
  for (ref::Buffer *b : {&in.q, &in.k, &in.v, &in.gates})
    for (double &x : *b)
      x = cpu::roundTo(dtype, x);
  return in;
}

/// Prints and checks one relative L2 error (NaN fails).
bool check(const char *what, const ref::Buffer &got, const ref::Buffer &want) {
  double err = ref::relativeL2(got, want);
  std::printf("embed-jit: %-28s relative L2 %.2e\n", what, err);
  return err <= 1e-2;
}

ref::Shape shapeOf(const cpu::LayerSpec &spec, int64_t batch, int64_t tokens) {
  ref::Shape s;
  s.batch = batch;
  s.tokens = tokens;
  s.qHeads = spec.qHeads;
  s.kvHeads = spec.kvHeads;
  s.qkDim = spec.qkDim;
  s.vDim = spec.vDim;
  return s;
}

/// Way 1: from a description, forward and gradient.
bool fromSpec() {
  std::string error;
  cpu::LayerSpec spec = smallLayer();
  std::unique_ptr<cpu::CompiledLayer> layer =
      cpu::CompiledLayer::compile(spec, error);
  if (!layer)
    return std::fprintf(stderr, "embed-jit: %s\n", error.c_str()), false;
  ref::Shape shape = shapeOf(spec, /*batch=*/2, /*tokens=*/77);
  ref::Inputs in = randomInputs(shape, spec.dtype);
  ref::Buffer out;
  if (!layer->runLayer(shape, in, out, error))
    return std::fprintf(stderr, "embed-jit: %s\n", error.c_str()), false;
  ref::Forward want = ref::forward(shape, spec.config, in);
  bool ok = check("forward (description)", out, want.out);

  ref::Buffer dOut = ref::randomBuffer(out.size(), 5);
  for (double &x : dOut)
    x = cpu::roundTo(spec.dtype, x);
  ref::Gradients grads;
  if (!layer->runBackward(shape, in, dOut, grads, error))
    return std::fprintf(stderr, "embed-jit: %s\n", error.c_str()), false;
  ref::Gradients wantGrads =
      ref::backward(shape, spec.config, in, want, dOut);
  ok &= check("dq", grads.q, wantGrads.q);
  ok &= check("dk", grads.k, wantGrads.k);
  ok &= check("dv", grads.v, wantGrads.v);
  return ok;
}

/// Way 2: a module of the user's, its function run by name.
bool fromSource() {
  const char *source = R"mlir(
func.func @my_attention(%q: tensor<1x?x4x32xbf16>, %k: tensor<1x?x2x32xbf16>,
                        %v: tensor<1x?x2x16xbf16>, %g: tensor<1x?x4x3xbf16>)
    -> tensor<1x?x4x16xbf16> {
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<
         cmp_block = 16, cmp_stride = 8, slc_block = 32, num_selected = 4,
         window = 48>}
     : (tensor<1x?x4x32xbf16>, tensor<1x?x2x32xbf16>, tensor<1x?x2x16xbf16>,
        tensor<1x?x4x3xbf16>) -> tensor<1x?x4x16xbf16>
  return %o : tensor<1x?x4x16xbf16>
}
)mlir";
  std::string error;
  // The tiles of nsa-to-cpu come from the second argument; heads, dims,
  // dtype and config from the module.
  std::unique_ptr<cpu::CompiledLayer> layer =
      cpu::CompiledLayer::compileSource(source, cpu::LayerSpec(), error);
  if (!layer)
    return std::fprintf(stderr, "embed-jit: %s\n", error.c_str()), false;
  const cpu::LayerSpec &spec = layer->spec();
  ref::Shape shape = shapeOf(spec, /*batch=*/1, /*tokens=*/101);
  ref::Inputs in = randomInputs(shape, spec.dtype);
  ref::Buffer out(1, NAN);
  if (!layer->runFunction("my_attention", shape, in, out, error))
    return std::fprintf(stderr, "embed-jit: %s\n", error.c_str()), false;
  return check("forward (user module)", out,
               ref::forward(shape, spec.config, in).out);
}

} // namespace

int main() {
  bool ok = fromSpec();
  ok &= fromSource();
  std::printf("embed-jit: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
