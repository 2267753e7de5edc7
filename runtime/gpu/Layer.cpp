//===- Layer.cpp - checked calls of layers compiled by nsa-to-ptx ---------===//
//
// nsaLayerForward, nsaLayerForwardTrain, nsaLayerBackward and nsaLayerDecode
// (include/NSA/Runtime/nsa_runtime.h): every argument is checked against the
// sizes the layer was compiled for before anything is launched (the
// backward also reads back and checks the saved indices); then the compiled
// entry point (`_mlir_ciface_<name>layer`, `..._layer_train`,
// `..._layer_grad_saved`) is called with memref descriptors of the caller's
// device tensors.
//
//===----------------------------------------------------------------------===//

#include "NSA/Runtime/Descriptor.h"
#include "NSA/Runtime/nsa_runtime.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

// Set by the runtime's other translation unit.
extern "C" nsaStatus nsaFailInvalidArgument(const char *message);
extern "C" nsaStatus nsaInitCurrentDevice(void);
extern "C" nsaStatus nsaStageDtoH(const void *src, size_t bytes,
                                  const void **host);
extern "C" nsaStatus nsaRunGraph(const void *entry, const int64_t *key,
                                 size_t words, void (*body)(void *),
                                 void *context, void *stream, int async);
extern "C" nsaStatus nsaWaitStream(void *stream);
extern "C" nsaStatus nsaStreamCapturing(void *stream, int *capturing);

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

/// The most memref arguments of a compiled entry: q, k, v, gates,
/// cmp_weights, cu_seqlens, dout, the 7 saved tensors and 5 gradients.
constexpr size_t kMaxEntryArgs = 19;

nsaStatus invalid(const char *fn, const std::string &message) {
  return nsaFailInvalidArgument((std::string(fn) + ": " + message).c_str());
}

/// Calls `entry` with exactly `args.size()` pointer arguments.
template <size_t... I>
void callWith(void (*entry)(void), const std::vector<void *> &args,
              std::index_sequence<I...>) {
  using Fn = void (*)(decltype((void)I, (void *)nullptr)...);
  reinterpret_cast<Fn>(entry)(args[I]...);
}

template <size_t N = 1>
void callEntry(void (*entry)(void), const std::vector<void *> &args) {
  if constexpr (N <= kMaxEntryArgs) {
    if (args.size() == N)
      return callWith(entry, args, std::make_index_sequence<N>());
    callEntry<N + 1>(entry, args);
  }
}

/// A device tensor argument: null exactly when not `needed`, 16-byte
/// aligned.
struct Pointer {
  const char *name;
  const void *ptr;
  bool needed;
};

nsaStatus checkPointers(const char *fn, std::initializer_list<Pointer> all) {
  for (const Pointer &p : all) {
    if (p.needed && !p.ptr)
      return invalid(fn, std::string(p.name) + " is null");
    if (!p.needed && p.ptr)
      return invalid(fn, std::string("the layer takes no ") + p.name);
    if (p.ptr && reinterpret_cast<uintptr_t>(p.ptr) % 16)
      return invalid(fn, std::string(p.name) + " is not 16-byte aligned");
  }
  return nsaSuccess;
}

nsaStatus checkDtype(const char *fn, const nsaLayer &l, nsaDType dtype) {
  if (dtype == l.dtype)
    return nsaSuccess;
  return invalid(fn, "the layer was compiled for dtype " +
                         std::to_string(l.dtype) + ", the tensors have " +
                         std::to_string(dtype));
}

/// Checks the layer description and the call's inputs (and `out` where
/// `needsOut`); reads the sequence offsets back into `cu` (packed layers).
/// Launches nothing and, unpacked, touches no device.
nsaStatus checkCall(const char *fn, const nsaLayer *layer,
                    const nsaLayerArgs *args, bool needsOut,
                    std::vector<int32_t> &cu) {
  if (!layer || !layer->entry)
    return invalid(fn, "no compiled layer");
  if (!args)
    return invalid(fn, "no arguments");
  const nsaLayer &l = *layer;
  const nsaLayerArgs &a = *args;
  if (a.batch < 1 || a.tokens < 1)
    return invalid(fn, "batch and tokens must be positive, found " +
                           std::to_string(a.batch) + " and " +
                           std::to_string(a.tokens));
  // The compiled layer's own description (a hand-made nsaLayer can be
  // anything).
  if (l.qHeads < 1 || l.kvHeads < 1 || l.qkDim < 1 || l.vDim < 1 ||
      l.cmpBlock < 1 || l.qHeads % l.kvHeads)
    return invalid(fn, "the layer's heads and dims must be positive and "
                       "qHeads a multiple of kvHeads, found qHeads = " +
                           std::to_string(l.qHeads) +
                           ", kvHeads = " + std::to_string(l.kvHeads) +
                           ", qkDim = " + std::to_string(l.qkDim) +
                           ", vDim = " + std::to_string(l.vDim) +
                           ", cmpBlock = " + std::to_string(l.cmpBlock));
  // Token positions are 32-bit in cu_seqlens and in the kernels; batches
  // and sequences index the grid's z dimension.
  if (a.tokens > INT32_MAX)
    return invalid(fn, "tokens must be at most 2147483647, found " +
                           std::to_string(a.tokens));
  if (a.batch > kMaxGridZ)
    return invalid(fn, "batch must be at most 65535, found " +
                           std::to_string(a.batch));
  int64_t widest = std::max({l.qkDim, l.vDim, int64_t(3)}), bytes = 0;
  if (__builtin_mul_overflow(a.batch, a.tokens, &bytes) ||
      __builtin_mul_overflow(bytes, l.qHeads, &bytes) ||
      __builtin_mul_overflow(bytes, widest, &bytes) ||
      __builtin_mul_overflow(bytes, int64_t(4), &bytes))
    return invalid(fn, "batch x tokens x heads x dim overflows 64-bit sizes");
  if (nsaStatus s = checkDtype(fn, l, a.dtype))
    return s;
  if (nsaStatus s =
          checkPointers(fn, {{"q", a.q, true},
                             {"k", a.k, true},
                             {"v", a.v, true},
                             {"gates", a.gates, true},
                             {"cmpWeights", a.cmpWeights, l.learnedPool != 0},
                             {"cuSeqlens", a.cuSeqlens, l.packed != 0}}))
    return s;
  if (needsOut)
    if (nsaStatus s = checkPointers(fn, {{"out", a.out, true}}))
      return s;
  cu.clear();
  if (l.packed) {
    if (a.batch != 1)
      return invalid(fn, "packed sequences need batch 1, found " +
                             std::to_string(a.batch));
    if (a.numSeqlens < 2 || a.numSeqlens > kMaxGridZ + 1)
      return invalid(fn, "cuSeqlens needs 2 to 65536 offsets (1 to 65535 "
                         "sequences), found " +
                             std::to_string(a.numSeqlens));
    // The offsets decide which rows are read: check them on the host.
    cu.resize(a.numSeqlens);
    if (nsaStatus s = nsaMemcpyDtoH(cu.data(), a.cuSeqlens, 4 * cu.size()))
      return s;
    if (cu.front() != 0 || cu.back() != a.tokens)
      return invalid(fn, "cuSeqlens must start at 0 and end at tokens (" +
                             std::to_string(a.tokens) + "), found " +
                             std::to_string(cu.front()) + " .. " +
                             std::to_string(cu.back()));
    for (size_t i = 1; i < cu.size(); ++i)
      if (cu[i] < cu[i - 1])
        return invalid(fn, "cuSeqlens decreases at entry " + std::to_string(i));
  } else if (a.numSeqlens) {
    return invalid(fn, "the layer takes no cuSeqlens");
  }
  return nsaSuccess;
}

/// The shape of the output, its gradient and the saved branch outputs:
/// [B, T, HQ, Dv].
std::vector<int64_t> outputShape(const nsaLayer &l, const nsaLayerArgs &a) {
  return {a.batch, a.tokens, l.qHeads, l.vDim};
}

/// The descriptors of the inputs every entry takes first: q, k, v, gates,
/// then cmp_weights and cu_seqlens where the layer has them.
std::vector<Descriptor> inputDescriptors(const nsaLayer &l,
                                         const nsaLayerArgs &a) {
  int64_t B = a.batch, T = a.tokens;
  std::vector<Descriptor> descs = {Descriptor(a.q, {B, T, l.qHeads, l.qkDim}),
                                   Descriptor(a.k, {B, T, l.kvHeads, l.qkDim}),
                                   Descriptor(a.v, {B, T, l.kvHeads, l.vDim}),
                                   Descriptor(a.gates, {B, T, l.qHeads, 3})};
  if (l.learnedPool)
    descs.emplace_back(a.cmpWeights,
                       std::vector<int64_t>{2, l.kvHeads, l.cmpBlock});
  if (l.packed)
    descs.emplace_back(a.cuSeqlens, std::vector<int64_t>{a.numSeqlens});
  return descs;
}

/// Calls `entry` on `descs` (on the device of the last nsaInit) and waits
/// for the device.
nsaStatus launch(void (*entry)(void), std::vector<Descriptor> &descs) {
  if (nsaStatus s = nsaInitCurrentDevice())
    return s;
  std::vector<void *> pointers;
  for (Descriptor &d : descs)
    pointers.push_back(d.get());
  callEntry(entry, pointers);
  if (nsaStatus s = nsaTakeAsyncError())
    return s;
  return nsaSynchronize();
}

/// Calls a decoding step's `entry` on `descs` through nsaRunGraph, keyed by
/// the descriptors (pointers, sizes, strides: all the generated host code
/// reads), so that a step whose tensors repeat replays one graph. It relies
/// on the entry's own wait: the step's generated code enqueues its work on
/// one stream and synchronizes it before it returns (nsa-async-launches;
/// checked in its host code), and a device-wide synchronization after it
/// cost microseconds a call, a large part of a step at B = 1.
nsaStatus launchStep(void (*entry)(void), std::vector<Descriptor> &descs,
                     void *stream, bool async) {
  if (nsaStatus s = nsaInitCurrentDevice())
    return s;
  struct Call {
    void (*entry)(void);
    std::vector<void *> pointers;
  } call{entry, {}};
  std::vector<int64_t> key;
  for (Descriptor &d : descs) {
    call.pointers.push_back(d.get());
    key.push_back(static_cast<int64_t>(d.words.size()));
    key.insert(key.end(), d.words.begin(), d.words.end());
  }
  return nsaRunGraph(
      reinterpret_cast<const void *>(entry), key.data(), key.size(),
      [](void *context) {
        auto *c = static_cast<Call *>(context);
        callEntry(c->entry, c->pointers);
      },
      &call, stream, async);
}

/// The checks both training entries share: checkCall's, then the layer's
/// training entries and the saved state's pointers.
nsaStatus checkTrainingCall(const char *fn, const nsaLayer *layer,
                            const nsaLayerArgs *args, bool needsOut,
                            const nsaLayerSaved *saved,
                            std::vector<int32_t> &cu) {
  if (nsaStatus s = checkCall(fn, layer, args, needsOut, cu))
    return s;
  const nsaLayer &l = *layer;
  if (!l.train || !l.backward || l.slcBlock < 1 || l.numSelected < 1)
    return invalid(fn, "the layer has no training entries (compile it with "
                       "nsa-gen-layer --gradient: train, backward, slcBlock "
                       "and numSelected)");
  if (!saved)
    return invalid(fn, "no saved state");
  return checkPointers(fn, {{"saved.cmpOut", saved->cmpOut, true},
                            {"saved.cmpLse", saved->cmpLse, true},
                            {"saved.indices", saved->indices, true},
                            {"saved.slcOut", saved->slcOut, true},
                            {"saved.slcLse", saved->slcLse, true},
                            {"saved.winOut", saved->winOut, true},
                            {"saved.winLse", saved->winLse, true}});
}

/// The saved state's descriptors in the entries' order (Spec section 9.1).
void appendSaved(std::vector<Descriptor> &descs, const nsaLayer &l,
                 const nsaLayerArgs &a, const nsaLayerSaved &saved) {
  std::vector<int64_t> out = outputShape(l, a),
                       lse = {a.batch, a.tokens, l.qHeads},
                       idx = {a.batch, a.tokens, l.kvHeads, l.numSelected};
  descs.emplace_back(saved.cmpOut, out);
  descs.emplace_back(saved.cmpLse, lse);
  descs.emplace_back(saved.indices, idx);
  descs.emplace_back(saved.slcOut, out);
  descs.emplace_back(saved.slcLse, lse);
  descs.emplace_back(saved.winOut, out);
  descs.emplace_back(saved.winLse, lse);
}

/// Reads the saved indices back, a bounded chunk of rows at a time, and
/// checks that each is -1 or a selection block of its row's sequence (the
/// kernels load the blocks they name): per sequence the chunk's least and
/// largest entry, the offending entry looked up only on failure.
nsaStatus checkSavedIndices(const char *fn, const nsaLayer &l,
                            const nsaLayerArgs &a, const int32_t *indices,
                            const std::vector<int32_t> &cu) {
  int64_t perRow = 0, bytes = 0;
  if (__builtin_mul_overflow(l.kvHeads, l.numSelected, &perRow) ||
      __builtin_mul_overflow(a.batch, a.tokens, &bytes) ||
      __builtin_mul_overflow(bytes, perRow, &bytes) ||
      __builtin_mul_overflow(bytes, int64_t(4), &bytes))
    return invalid(fn, "batch x tokens x kvHeads x numSelected overflows "
                       "64-bit sizes");
  // Sequences as (first row, rows): the batch's, or cu_seqlens'.
  std::vector<std::pair<int64_t, int64_t>> seqs;
  for (int64_t b = 0; b < a.batch && cu.empty(); ++b)
    seqs.emplace_back(b * a.tokens, a.tokens);
  for (size_t i = 0; i + 1 < cu.size(); ++i)
    seqs.emplace_back(cu[i], cu[i + 1] - cu[i]);
  const int64_t chunkRows = std::max<int64_t>(1, (int64_t(1) << 20) / perRow);
  const int64_t allRows = a.batch * a.tokens;
  size_t seq = 0;
  for (int64_t first = 0; first < allRows; first += chunkRows) {
    int64_t rows = std::min(chunkRows, allRows - first);
    const void *staged = nullptr;
    if (nsaStatus s =
            nsaStageDtoH(indices + first * perRow,
                         static_cast<size_t>(4 * rows * perRow), &staged))
      return s;
    const int32_t *chunk = static_cast<const int32_t *>(staged);
    // The sequences this chunk of rows overlaps, each against its blocks.
    for (int64_t r = 0; r < rows;) {
      while (seqs[seq].first + seqs[seq].second <= first + r)
        ++seq;
      auto [seqFirst, length] = seqs[seq];
      int64_t blocks = (length + l.slcBlock - 1) / l.slcBlock;
      int64_t upTo = std::min(rows, seqFirst + length - first);
      const int32_t *begin = chunk + r * perRow, *end = chunk + upTo * perRow;
      // A plain min/max loop: the compiler vectorizes it (minmax_element's
      // branches it does not).
      int32_t lo = INT32_MAX, hi = INT32_MIN;
      for (const int32_t *p = begin; p != end; ++p) {
        lo = std::min(lo, *p);
        hi = std::max(hi, *p);
      }
      if (lo < -1 || hi >= blocks) {
        const int32_t *bad = std::find_if(
            begin, end, [&](int32_t j) { return j < -1 || j >= blocks; });
        int64_t at = bad - chunk, row = first + at / perRow, i = at % perRow;
        return invalid(fn, "saved.indices[" + std::to_string(row / a.tokens) +
                               ", " + std::to_string(row % a.tokens) + ", " +
                               std::to_string(i / l.numSelected) + ", " +
                               std::to_string(i % l.numSelected) +
                               "] = " + std::to_string(*bad) +
                               " is neither -1 nor a block of its sequence "
                               "(0 .. " +
                               std::to_string(blocks - 1) + ")");
      }
      r = upTo;
    }
  }
  return nsaSuccess;
}

} // namespace

extern "C" nsaStatus nsaLayerForward(const nsaLayer *layer,
                                     const nsaLayerArgs *args) {
  const char *fn = "nsaLayerForward";
  std::vector<int32_t> cu;
  if (nsaStatus s = checkCall(fn, layer, args, /*needsOut=*/true, cu))
    return s;
  const nsaLayer &l = *layer;
  const nsaLayerArgs &a = *args;
  std::vector<Descriptor> descs = inputDescriptors(l, a);
  descs.emplace_back(a.out, outputShape(l, a));
  return launch(l.entry, descs);
}

extern "C" size_t nsaLayerSavedBytes(const nsaLayer *layer, int64_t batch,
                                     int64_t tokens, int which) {
  if (!layer || layer->numSelected < 1 || batch < 1 || tokens < 1)
    return 0;
  int64_t per = which == 0 ? layer->qHeads * layer->vDim *
                                 (layer->dtype == nsaF32 ? 4 : 2)
                : which == 1 ? layer->qHeads * 4
                : which == 2 ? layer->kvHeads * layer->numSelected * 4
                             : 0;
  int64_t bytes = 0;
  if (per <= 0 || __builtin_mul_overflow(batch, tokens, &bytes) ||
      __builtin_mul_overflow(bytes, per, &bytes))
    return 0;
  return static_cast<size_t>(bytes);
}

extern "C" nsaStatus nsaLayerForwardTrain(const nsaLayer *layer,
                                          const nsaLayerArgs *args,
                                          const nsaLayerSaved *saved) {
  const char *fn = "nsaLayerForwardTrain";
  std::vector<int32_t> cu;
  if (nsaStatus s =
          checkTrainingCall(fn, layer, args, /*needsOut=*/true, saved, cu))
    return s;
  const nsaLayer &l = *layer;
  const nsaLayerArgs &a = *args;
  std::vector<Descriptor> descs = inputDescriptors(l, a);
  appendSaved(descs, l, a, *saved);
  descs.emplace_back(a.out, outputShape(l, a));
  return launch(l.train, descs);
}

extern "C" nsaStatus nsaLayerBackward(const nsaLayer *layer,
                                      const nsaLayerArgs *args,
                                      const nsaLayerSaved *saved,
                                      const nsaLayerGrads *grads) {
  const char *fn = "nsaLayerBackward";
  std::vector<int32_t> cu;
  if (nsaStatus s =
          checkTrainingCall(fn, layer, args, /*needsOut=*/false, saved, cu))
    return s;
  const nsaLayer &l = *layer;
  const nsaLayerArgs &a = *args;
  if (!grads)
    return invalid(fn, "no gradients");
  if (nsaStatus s = checkPointers(
          fn, {{"grads.dout", grads->dout, true},
               {"grads.dq", grads->dq, true},
               {"grads.dk", grads->dk, true},
               {"grads.dv", grads->dv, true},
               {"grads.dgates", grads->dgates, true},
               {"grads.dcmpWeights", grads->dcmpWeights, l.learnedPool != 0}}))
    return s;
  if (nsaStatus s = nsaInitCurrentDevice())
    return s;
  if (nsaStatus s = checkSavedIndices(fn, l, a, saved->indices, cu))
    return s;
  int64_t B = a.batch, T = a.tokens;
  std::vector<Descriptor> descs = inputDescriptors(l, a);
  descs.emplace_back(grads->dout, outputShape(l, a));
  appendSaved(descs, l, a, *saved);
  descs.emplace_back(grads->dq, std::vector<int64_t>{B, T, l.qHeads, l.qkDim});
  descs.emplace_back(grads->dk, std::vector<int64_t>{B, T, l.kvHeads, l.qkDim});
  descs.emplace_back(grads->dv, std::vector<int64_t>{B, T, l.kvHeads, l.vDim});
  descs.emplace_back(grads->dgates, std::vector<int64_t>{B, T, l.qHeads, 3});
  if (l.learnedPool)
    descs.emplace_back(grads->dcmpWeights,
                       std::vector<int64_t>{2, l.kvHeads, l.cmpBlock});
  return launch(l.backward, descs);
}

namespace {
/// nsaLayerDecode (`async` false) and nsaLayerDecodeAsync.
nsaStatus decodeStep(const char *fn, const nsaLayer *layer,
                     const nsaLayerDecodeArgs *args, void *stream, bool async) {
  if (!layer || !layer->decode || layer->decodeQueries < 1 ||
      layer->cmpStride < 1)
    return invalid(fn, "the layer has no decoding step (compile it with "
                       "nsa-gen-layer --decode: decode, decodeQueries and "
                       "cmpStride)");
  if (!args)
    return invalid(fn, "no arguments");
  const nsaLayer &l = *layer;
  const nsaLayerDecodeArgs &a = *args;
  if (l.qHeads < 1 || l.kvHeads < 1 || l.qkDim < 1 || l.vDim < 1 ||
      l.cmpBlock < 1 || l.qHeads % l.kvHeads || l.packed)
    return invalid(fn, "the layer's heads and dims must be positive, qHeads "
                       "a multiple of kvHeads, and the layer not packed");
  if (a.queries != l.decodeQueries)
    return invalid(
        fn,
        "the layer was compiled for " + std::to_string(l.decodeQueries) +
            " new tokens a step, found queries = " + std::to_string(a.queries));
  if (a.batch < 1 || a.batch > kMaxGridZ || a.cacheTokens < a.queries ||
      a.cacheTokens > INT32_MAX)
    return invalid(fn, "expects 1 <= batch <= 65535 and queries <= "
                       "cacheTokens <= 2147483647, found batch = " +
                           std::to_string(a.batch) +
                           ", cacheTokens = " + std::to_string(a.cacheTokens));
  int64_t widest = std::max({l.qkDim, l.vDim, int64_t(3)}), bytes = 0;
  if (__builtin_mul_overflow(a.batch, a.cacheTokens, &bytes) ||
      __builtin_mul_overflow(bytes, std::max(l.qHeads, l.kvHeads), &bytes) ||
      __builtin_mul_overflow(bytes, widest, &bytes) ||
      __builtin_mul_overflow(bytes, int64_t(4), &bytes))
    return invalid(fn, "batch x cacheTokens x heads x dim overflows 64-bit "
                       "sizes");
  if (nsaStatus s = checkDtype(fn, l, a.dtype))
    return s;
  if (nsaStatus s =
          checkPointers(fn, {{"q", a.q, true},
                             {"gates", a.gates, true},
                             {"kCache", a.kCache, true},
                             {"vCache", a.vCache, true},
                             {"kcCache", a.kcCache, true},
                             {"vcCache", a.vcCache, true},
                             {"cmpWeights", a.cmpWeights, l.learnedPool != 0},
                             {"kvLens", a.kvLens, true},
                             {"out", a.out, true}}))
    return s;
  // The lengths decide which cache rows are read: check them on the host.
  // (Through the pinned staging buffer: a pageable copy costs several
  // microseconds more, a large part of a step at B = 1.)
  const int32_t *lens = a.kvLensHost;
  if (!lens && async) {
    // Reading kvLens back waits for the stream, which a capture cannot.
    int capturing = 0;
    if (nsaStatus s = nsaStreamCapturing(stream, &capturing))
      return s;
    if (capturing)
      return invalid(fn, "`stream` is being captured into a graph: pass "
                         "kvLensHost (the lengths cannot be read back "
                         "while capturing)");
  }
  if (!lens) {
    // (Stream-ordered: what the stream does before the step may write them.)
    if (async)
      if (nsaStatus s = nsaWaitStream(stream))
        return s;
    const void *staged = nullptr;
    if (nsaStatus s = nsaStageDtoH(a.kvLens, 4 * a.batch, &staged))
      return s;
    lens = static_cast<const int32_t *>(staged);
  }
  for (int64_t b = 0; b < a.batch; ++b)
    if (lens[b] < a.queries || lens[b] > a.cacheTokens)
      return invalid(fn, "kvLens[" + std::to_string(b) +
                             "] = " + std::to_string(lens[b]) +
                             " is outside [queries, cacheTokens] = [" +
                             std::to_string(a.queries) + ", " +
                             std::to_string(a.cacheTokens) + "]");
  int64_t B = a.batch, Tq = a.queries, L = a.cacheTokens;
  int64_t rows = L < l.cmpBlock ? 0 : (L - l.cmpBlock) / l.cmpStride + 1;
  // @decode_step(q, k, v, kc, vc, g, kv_lens[, w], out, kc_out, vc_out):
  // the compressed caches are updated in place.
  std::vector<Descriptor> descs = {
      Descriptor(a.q, {B, Tq, l.qHeads, l.qkDim}),
      Descriptor(a.kCache, {B, L, l.kvHeads, l.qkDim}),
      Descriptor(a.vCache, {B, L, l.kvHeads, l.vDim}),
      Descriptor(a.kcCache, {B, rows, l.kvHeads, l.qkDim}),
      Descriptor(a.vcCache, {B, rows, l.kvHeads, l.vDim}),
      Descriptor(a.gates, {B, Tq, l.qHeads, 3}),
      Descriptor(a.kvLens, {B})};
  if (l.learnedPool)
    descs.emplace_back(a.cmpWeights,
                       std::vector<int64_t>{2, l.kvHeads, l.cmpBlock});
  descs.emplace_back(a.out, std::vector<int64_t>{B, Tq, l.qHeads, l.vDim});
  descs.emplace_back(a.kcCache,
                     std::vector<int64_t>{B, rows, l.kvHeads, l.qkDim});
  descs.emplace_back(a.vcCache,
                     std::vector<int64_t>{B, rows, l.kvHeads, l.vDim});
  return launchStep(l.decode, descs, stream, async);
}
} // namespace

extern "C" nsaStatus nsaLayerDecode(const nsaLayer *layer,
                                    const nsaLayerDecodeArgs *args) {
  return decodeStep("nsaLayerDecode", layer, args, nullptr, false);
}

extern "C" nsaStatus nsaLayerDecodeAsync(const nsaLayer *layer,
                                         const nsaLayerDecodeArgs *args,
                                         void *stream) {
  return decodeStep("nsaLayerDecodeAsync", layer, args, stream, true);
}
