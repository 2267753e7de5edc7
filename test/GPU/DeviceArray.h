//===- DeviceArray.h - device buffers and entry calls for GPU tests -*- C++
//-*-===//
//
// What the GPU tests that call compiled entry points directly share: device
// buffers with memref descriptors, bf16 conversion of reference buffers, and
// calls of `_mlir_ciface_*` entries with an exact number of descriptor
// pointers.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_TEST_GPU_DEVICEARRAY_H
#define NSA_TEST_GPU_DEVICEARRAY_H

#include "NSAReference.h"

#include "NSA/Runtime/Descriptor.h"
#include "NSA/Runtime/nsa_runtime.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace nsa_gpu_test {

using Entry = void (*)();
#define NSA_ENTRY(fn) reinterpret_cast<nsa_gpu_test::Entry>(&fn)

/// A device buffer with a memref descriptor.
struct DeviceArray {
  void *ptr = nullptr;
  size_t elementBytes = 0, count = 0;
  std::vector<int64_t> descriptor;

  DeviceArray(size_t elementBytes, std::vector<int64_t> shape)
      : elementBytes(elementBytes) {
    count = 1;
    for (int64_t d : shape)
      count *= d;
    nsaMalloc(&ptr, std::max<size_t>(count, 1) * elementBytes);
    descriptor = nsa::runtime::contiguousDescriptor(ptr, shape);
  }
  DeviceArray(const DeviceArray &) = delete;
  ~DeviceArray() { nsaFree(ptr); }
  void *desc() { return descriptor.data(); }

  void upload(const void *host) {
    nsaMemcpyHtoD(ptr, host, count * elementBytes);
  }
  void download(void *host) const {
    nsaMemcpyDtoH(host, ptr, count * elementBytes);
  }
};

inline std::vector<uint16_t> toBF16(const mlir::nsa::ref::Buffer &x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = mlir::nsa::ref::toBF16(static_cast<float>(x[i]));
  return out;
}

inline mlir::nsa::ref::Buffer fromBF16(const std::vector<uint16_t> &x) {
  mlir::nsa::ref::Buffer out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = mlir::nsa::ref::fromBF16(x[i]);
  return out;
}

/// Random inputs of a layer for `s` and `c`, exact in bf16 (the learned
/// pool's weights, when `c` has it, stay f32), from seeds `seed` on.
inline mlir::nsa::ref::Inputs randomLayerInputs(const mlir::nsa::ref::Shape &s,
                                                const mlir::nsa::ref::Config &c,
                                                uint64_t seed) {
  namespace ref = mlir::nsa::ref;
  int64_t rows = s.batch * s.tokens;
  ref::Inputs in;
  in.q = ref::randomBuffer(rows * s.qHeads * s.qkDim, seed);
  in.k = ref::randomBuffer(rows * s.kvHeads * s.qkDim, seed + 1);
  in.v = ref::randomBuffer(rows * s.kvHeads * s.vDim, seed + 2);
  in.gates = ref::randomBuffer(rows * s.qHeads * 3, seed + 3, -3, 3);
  for (ref::Buffer *b : {&in.q, &in.k, &in.v, &in.gates})
    for (double &x : *b)
      x = ref::fromBF16(ref::toBF16(static_cast<float>(x)));
  if (c.linearPool)
    in.cmpWeights = ref::randomBuffer(2 * s.kvHeads * c.cmpBlock, seed + 4, 0.0,
                                      2.0 / c.cmpBlock);
  return in;
}

/// A layer's inputs on the device (bf16, the pool weights f32) and their
/// descriptors in the entry points' argument order.
struct DeviceInputs {
  DeviceArray q, k, v, g, w, cu;
  std::vector<void *> descs;

  DeviceInputs(const mlir::nsa::ref::Shape &s, const mlir::nsa::ref::Config &c,
               const mlir::nsa::ref::Inputs &in)
      : q(2, {s.batch, s.tokens, s.qHeads, s.qkDim}),
        k(2, {s.batch, s.tokens, s.kvHeads, s.qkDim}),
        v(2, {s.batch, s.tokens, s.kvHeads, s.vDim}),
        g(2, {s.batch, s.tokens, s.qHeads, 3}),
        w(4, {2, s.kvHeads, c.cmpBlock}),
        cu(4, {static_cast<int64_t>(s.cuSeqlens.size())}) {
    q.upload(toBF16(in.q).data());
    k.upload(toBF16(in.k).data());
    v.upload(toBF16(in.v).data());
    g.upload(toBF16(in.gates).data());
    descs = {q.desc(), k.desc(), v.desc(), g.desc()};
    if (c.linearPool) {
      std::vector<float> wf(in.cmpWeights.begin(), in.cmpWeights.end());
      w.upload(wf.data());
      descs.push_back(w.desc());
    }
    if (!s.cuSeqlens.empty()) {
      cu.upload(s.cuSeqlens.data());
      descs.push_back(cu.desc());
    }
  }
};

/// Calls `fn` with the descriptors `args`, as a function of exactly
/// `args.size()` pointers (the arities of the layer, branch and gradient
/// entries; false for others).
template <size_t... I>
void callWith(Entry fn, const std::vector<void *> &args,
              std::index_sequence<I...>) {
  using Fn = void (*)(decltype((void)I, (void *)nullptr)...);
  reinterpret_cast<Fn>(fn)(args[I]...);
}

inline bool call(Entry fn, const std::vector<void *> &args) {
  switch (args.size()) {
  case 5:
    callWith(fn, args, std::make_index_sequence<5>());
    return true;
  case 6:
    callWith(fn, args, std::make_index_sequence<6>());
    return true;
  case 7:
    callWith(fn, args, std::make_index_sequence<7>());
    return true;
  case 9:
    callWith(fn, args, std::make_index_sequence<9>());
    return true;
  case 10:
    callWith(fn, args, std::make_index_sequence<10>());
    return true;
  case 11:
    callWith(fn, args, std::make_index_sequence<11>());
    return true;
  case 12:
    callWith(fn, args, std::make_index_sequence<12>());
    return true;
  case 13:
    callWith(fn, args, std::make_index_sequence<13>());
    return true;
  case 14:
    callWith(fn, args, std::make_index_sequence<14>());
    return true;
  default:
    return false;
  }
}

} // namespace nsa_gpu_test

#endif // NSA_TEST_GPU_DEVICEARRAY_H
