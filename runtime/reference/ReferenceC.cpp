//===- ReferenceC.cpp - the float64 reference behind a C entry point ------===//
//
// nsaReferenceForward and nsaReferenceBackward (include/NSA-c/Reference.h):
// the description and the arguments checked (LayerDesc.h), then
// ref::forward (and ref::backward). No exception leaves.
//
//===----------------------------------------------------------------------===//

#include "NSA-c/Reference.h"

#include "LayerDesc.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <utility>

using namespace mlir::nsa;

namespace {
int fail(const std::string &message, const char *fn = "nsaReferenceForward") {
  nsaSetLastError((std::string(fn) + ": " + message).c_str());
  return 1;
}
} // namespace

extern "C" int nsaReferenceForward(const nsaLayerDesc *desc, int64_t batch,
                                   int64_t tokens, const double *q,
                                   const double *k, const double *v,
                                   const double *gates,
                                   const double *cmpWeights,
                                   const int32_t *cuSeqlens,
                                   int64_t numSeqlens, double *out,
                                   int32_t *indices) {
  return nsaReferenceForwardWithMargins(desc, batch, tokens, q, k, v, gates,
                                        cmpWeights, cuSeqlens, numSeqlens,
                                        out, indices, nullptr);
}

namespace {
/// A call's description and arguments, checked (LayerDesc.h).
struct ParsedCall {
  ref::Config config;
  ref::Shape shape;
  ref::Inputs inputs;
};

/// Checks and copies the call `args` of `desc`; the error message is empty
/// on success.
std::string parseCall(const nsaLayerDesc &desc, const ref::CallArgs &args,
                      ParsedCall &call) {
  std::string error;
  if (!ref::configFromDesc(desc, call.config, error) ||
      !ref::inputsFromArgs(desc, call.config, args, call.shape, call.inputs,
                           error))
    return error.empty() ? "invalid arguments" : error;
  return "";
}

/// The selection margin of (row, h): how far the lowest-scoring block the
/// top-n picked (forced blocks aside) is above the highest it left out,
/// relative to max(1, |that score|); +inf when nothing was left out.
double selectionMargin(const ref::Shape &s, const ref::Config &c,
                       const ref::Inputs &in, const ref::Forward &fwd,
                       const std::vector<ref::Sequence> &seqs, int64_t row,
                       int64_t h) {
  int64_t n = c.numSelected;
  const int32_t *chosen = &fwd.indices[(row * s.kvHeads + h) * n];
  int64_t pos = row;
  for (const ref::Sequence &seq : seqs)
    if (row >= seq.tokenRow && row < seq.tokenRow + seq.length)
      pos = row - seq.tokenRow;
  int64_t current = pos / c.slcBlock;
  std::vector<double> scores =
      ref::blockScores(s, c, in.q, fwd.kc, fwd.cmp.lse, row, h);
  double lowest = INFINITY, highest = -INFINITY;
  std::vector<bool> picked(scores.size(), false);
  for (int64_t i = 0; i < n; ++i)
    if (chosen[i] >= 0 && chosen[i] < static_cast<int64_t>(scores.size()))
      picked[chosen[i]] = true;
  for (int64_t j = 0; j < static_cast<int64_t>(scores.size()); ++j) {
    if (picked[j] && !c.backbone.isForced(j, current))
      lowest = std::min(lowest, scores[j]);
    else if (!picked[j])
      highest = std::max(highest, scores[j]);
  }
  if (highest == -INFINITY)
    return INFINITY;
  return (lowest - highest) / std::max(1.0, std::abs(highest));
}
} // namespace

extern "C" int nsaReferenceForwardWithMargins(
    const nsaLayerDesc *desc, int64_t batch, int64_t tokens, const double *q,
    const double *k, const double *v, const double *gates,
    const double *cmpWeights, const int32_t *cuSeqlens, int64_t numSeqlens,
    double *out, int32_t *indices, double *margins) {
  nsaSetLastError(nullptr);
  if (!desc)
    return fail("no layer description");
  try {
    ParsedCall call;
    if (std::string error = parseCall(*desc,
                                      {batch, tokens, q, k, v, gates,
                                       cmpWeights, cuSeqlens, numSeqlens, out},
                                      call);
        !error.empty())
      return fail(error);
    if (tokens == 0)
      return 0; // nothing to compute or write
    const ref::Config &config = call.config;
    const ref::Shape &shape = call.shape;
    const ref::Inputs &inputs = call.inputs;
    ref::Forward fwd = ref::forward(shape, config, inputs);
    std::copy(fwd.out.begin(), fwd.out.end(), out);
    if (indices)
      std::copy(fwd.indices.begin(), fwd.indices.end(), indices);
    if (margins) {
      std::vector<ref::Sequence> seqs = ref::sequences(shape, config);
      for (int64_t row = 0; row < batch * tokens; ++row)
        for (int64_t h = 0; h < shape.kvHeads; ++h)
          margins[row * shape.kvHeads + h] =
              selectionMargin(shape, config, inputs, fwd, seqs, row, h);
    }
    return 0;
  } catch (const std::exception &e) {
    return fail(e.what());
  }
}

extern "C" int nsaReferenceBackward(
    const nsaLayerDesc *desc, int64_t batch, int64_t tokens, const double *q,
    const double *k, const double *v, const double *gates,
    const double *cmpWeights, const int32_t *cuSeqlens, int64_t numSeqlens,
    const int32_t *indices, const double *dout, double *dq, double *dk,
    double *dv, double *dgates, double *dcmpWeights) {
  const char *fn = "nsaReferenceBackward";
  nsaSetLastError(nullptr);
  if (!desc)
    return fail("no layer description", fn);
  if (tokens > 0) {
    for (auto [name, ptr] :
         {std::pair<const char *, const void *>{"dout", dout},
          {"dq", dq},
          {"dk", dk},
          {"dv", dv},
          {"dgates", dgates}})
      if (!ptr)
        return fail(std::string(name) + " is null", fn);
  }
  try {
    // `out` is not written: dq stands in for its pointer check.
    ParsedCall call;
    if (std::string error = parseCall(*desc,
                                      {batch, tokens, q, k, v, gates,
                                       cmpWeights, cuSeqlens, numSeqlens, dq},
                                      call);
        !error.empty())
      return fail(error, fn);
    const ref::Config &config = call.config;
    const ref::Shape &shape = call.shape;
    const ref::Inputs &inputs = call.inputs;
    if (config.linearPool != (dcmpWeights != nullptr))
      return fail(config.linearPool ? "the learned pool needs dcmpWeights"
                                    : "dcmpWeights is only for the learned "
                                      "pool",
                  fn);
    if (tokens == 0) { // no rows: only the pool's weights have a gradient
      if (dcmpWeights)
        std::fill(dcmpWeights,
                  dcmpWeights + 2 * desc->kvHeads * desc->config.cmpBlock,
                  0.0);
      return 0;
    }
    ref::Forward fwd = ref::forward(shape, config, inputs);
    if (indices) {
      // The given blocks, checked against each row's sequence.
      std::vector<ref::Sequence> seqs = ref::sequences(shape, config);
      int64_t n = config.numSelected, H = shape.kvHeads;
      for (const ref::Sequence &seq : seqs) {
        int64_t blocks = (seq.length + config.slcBlock - 1) / config.slcBlock;
        for (int64_t row = seq.tokenRow; row < seq.tokenRow + seq.length; ++row)
          for (int64_t i = 0; i < H * n; ++i) {
            int32_t j = indices[row * H * n + i];
            if (j < -1 || j >= blocks)
              return fail("indices[row " + std::to_string(row) + ", " +
                              std::to_string(i) + "] = " + std::to_string(j) +
                              " is neither -1 nor a block of its sequence",
                          fn);
          }
      }
      fwd.indices.assign(indices, indices + shape.batch * shape.tokens * H * n);
      fwd.slc = ref::selectedAttention(shape, config, inputs.q, inputs.k,
                                       inputs.v, fwd.indices);
    }
    ref::Buffer d(dout, dout + shape.batch * shape.tokens * shape.qHeads *
                                   shape.vDim);
    ref::Gradients g = ref::backward(shape, config, inputs, fwd, d);
    std::copy(g.q.begin(), g.q.end(), dq);
    std::copy(g.k.begin(), g.k.end(), dk);
    std::copy(g.v.begin(), g.v.end(), dv);
    std::copy(g.gates.begin(), g.gates.end(), dgates);
    if (dcmpWeights)
      std::copy(g.cmpWeights.begin(), g.cmpWeights.end(), dcmpWeights);
    return 0;
  } catch (const std::exception &e) {
    return fail(e.what(), fn);
  }
}
