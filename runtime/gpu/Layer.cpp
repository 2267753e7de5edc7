//===- Layer.cpp - checked calls of layers compiled by nsa-to-ptx ---------===//
//
// nsaLayerForward (include/NSA/Runtime/nsa_runtime.h): every argument is
// checked against the sizes the layer was compiled for before anything is
// launched; then the compiled entry point is called with memref descriptors
// of the caller's device tensors.
//
//===----------------------------------------------------------------------===//

#include "NSA/Runtime/nsa_runtime.h"
#include "NSA/Runtime/Descriptor.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// Set by the runtime's other translation unit.
extern "C" nsaStatus nsaFailInvalidArgument(const char *message);
extern "C" nsaStatus nsaInitCurrentDevice(void);

namespace {

/// A rank-N memref descriptor of a contiguous tensor.
struct Descriptor {
  std::vector<int64_t> words;
  Descriptor(const void *ptr, const std::vector<int64_t> &shape)
      : words(nsa::runtime::contiguousDescriptor(ptr, shape)) {}
  void *get() { return words.data(); }
};

/// The largest grid dimension z, which counts batches or sequences.
constexpr int64_t kMaxGridZ = 65535;

nsaStatus invalid(const std::string &message) {
  return nsaFailInvalidArgument(("nsaLayerForward: " + message).c_str());
}

/// Calls `entry` with exactly `args.size()` pointer arguments.
template <size_t... I>
void callWith(void (*entry)(void), const std::vector<void *> &args,
              std::index_sequence<I...>) {
  using Fn = void (*)(decltype((void)I, (void *)nullptr)...);
  reinterpret_cast<Fn>(entry)(args[I]...);
}

} // namespace

extern "C" nsaStatus nsaLayerForward(const nsaLayer *layer,
                                     const nsaLayerArgs *args) {
  if (!layer || !layer->entry)
    return invalid("no compiled layer");
  if (!args)
    return invalid("no arguments");
  const nsaLayer &l = *layer;
  const nsaLayerArgs &a = *args;
  if (a.batch < 1 || a.tokens < 1)
    return invalid("batch and tokens must be positive, found " +
                   std::to_string(a.batch) + " and " +
                   std::to_string(a.tokens));
  // The compiled layer's own description (a hand-made nsaLayer can be
  // anything).
  if (l.qHeads < 1 || l.kvHeads < 1 || l.qkDim < 1 || l.vDim < 1 ||
      l.cmpBlock < 1 || l.qHeads % l.kvHeads)
    return invalid("the layer's heads and dims must be positive and qHeads a "
                   "multiple of kvHeads, found qHeads = " +
                   std::to_string(l.qHeads) +
                   ", kvHeads = " + std::to_string(l.kvHeads) +
                   ", qkDim = " + std::to_string(l.qkDim) +
                   ", vDim = " + std::to_string(l.vDim) +
                   ", cmpBlock = " + std::to_string(l.cmpBlock));
  // Token positions are 32-bit in cu_seqlens and in the kernels; batches
  // and sequences index the grid's z dimension.
  if (a.tokens > INT32_MAX)
    return invalid("tokens must be at most 2147483647, found " +
                   std::to_string(a.tokens));
  if (a.batch > kMaxGridZ)
    return invalid("batch must be at most 65535, found " +
                   std::to_string(a.batch));
  int64_t widest = std::max({l.qkDim, l.vDim, int64_t(3)}), bytes = 0;
  if (__builtin_mul_overflow(a.batch, a.tokens, &bytes) ||
      __builtin_mul_overflow(bytes, l.qHeads, &bytes) ||
      __builtin_mul_overflow(bytes, widest, &bytes) ||
      __builtin_mul_overflow(bytes, int64_t(4), &bytes))
    return invalid("batch x tokens x heads x dim overflows 64-bit sizes");
  if (a.dtype != l.dtype)
    return invalid("the layer was compiled for dtype " +
                   std::to_string(l.dtype) + ", the tensors have " +
                   std::to_string(a.dtype));
  struct Pointer {
    const char *name;
    const void *ptr;
    bool needed;
  };
  Pointer pointers[] = {{"q", a.q, true},
                        {"k", a.k, true},
                        {"v", a.v, true},
                        {"gates", a.gates, true},
                        {"out", a.out, true},
                        {"cmpWeights", a.cmpWeights, l.learnedPool != 0},
                        {"cuSeqlens", a.cuSeqlens, l.packed != 0}};
  for (const Pointer &p : pointers) {
    if (p.needed && !p.ptr)
      return invalid(std::string(p.name) + " is null");
    if (!p.needed && p.ptr)
      return invalid(std::string("the layer takes no ") + p.name);
    if (p.ptr && reinterpret_cast<uintptr_t>(p.ptr) % 16)
      return invalid(std::string(p.name) + " is not 16-byte aligned");
  }
  std::vector<int32_t> cu;
  if (l.packed) {
    if (a.batch != 1)
      return invalid("packed sequences need batch 1, found " +
                     std::to_string(a.batch));
    if (a.numSeqlens < 2 || a.numSeqlens > kMaxGridZ + 1)
      return invalid("cuSeqlens needs 2 to 65536 offsets (1 to 65535 "
                     "sequences), found " +
                     std::to_string(a.numSeqlens));
    // The offsets decide which rows are read: check them on the host.
    cu.resize(a.numSeqlens);
    if (nsaStatus s = nsaMemcpyDtoH(cu.data(), a.cuSeqlens, 4 * cu.size()))
      return s;
    if (cu.front() != 0 || cu.back() != a.tokens)
      return invalid("cuSeqlens must start at 0 and end at tokens (" +
                     std::to_string(a.tokens) + "), found " +
                     std::to_string(cu.front()) + " .. " +
                     std::to_string(cu.back()));
    for (size_t i = 1; i < cu.size(); ++i)
      if (cu[i] < cu[i - 1])
        return invalid("cuSeqlens decreases at entry " + std::to_string(i));
  } else if (a.numSeqlens) {
    return invalid("the layer takes no cuSeqlens");
  }
  if (nsaStatus s = nsaInitCurrentDevice())
    return s;

  int64_t B = a.batch, T = a.tokens;
  std::vector<Descriptor> descs = {
      Descriptor(a.q, {B, T, l.qHeads, l.qkDim}),
      Descriptor(a.k, {B, T, l.kvHeads, l.qkDim}),
      Descriptor(a.v, {B, T, l.kvHeads, l.vDim}),
      Descriptor(a.gates, {B, T, l.qHeads, 3})};
  if (l.learnedPool)
    descs.emplace_back(a.cmpWeights,
                       std::vector<int64_t>{2, l.kvHeads, l.cmpBlock});
  if (l.packed)
    descs.emplace_back(a.cuSeqlens, std::vector<int64_t>{a.numSeqlens});
  descs.emplace_back(a.out, std::vector<int64_t>{B, T, l.qHeads, l.vDim});
  std::vector<void *> pointersOut;
  for (Descriptor &d : descs)
    pointersOut.push_back(d.get());
  switch (pointersOut.size()) {
  case 5:
    callWith(l.entry, pointersOut, std::make_index_sequence<5>());
    break;
  case 6:
    callWith(l.entry, pointersOut, std::make_index_sequence<6>());
    break;
  case 7:
    callWith(l.entry, pointersOut, std::make_index_sequence<7>());
    break;
  }
  if (nsaStatus s = nsaTakeAsyncError())
    return s;
  return nsaSynchronize();
}
