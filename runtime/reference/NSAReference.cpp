//===- NSAReference.cpp - float64 reference of NSA ------------------------===//
//
// Forward and backward of docs/Spec.md in float64. Every branch is "attention
// over a key set" (Spec section 1); the branches differ only in the key sets
// built below, so forward and backward share one implementation of each.
//
//===----------------------------------------------------------------------===//

#include "NSAReference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <thread>

using namespace mlir::nsa;
using namespace mlir::nsa::ref;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// A dense [rows, heads, dim] view into a buffer.
struct View {
  const double *data;
  int64_t heads, dim;
  const double *at(int64_t row, int64_t head) const {
    return data + (row * heads + head) * dim;
  }
};

struct MutView {
  double *data;
  int64_t heads, dim;
  double *at(int64_t row, int64_t head) const {
    return data + (row * heads + head) * dim;
  }
};

double dot(const double *a, const double *b, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    sum += a[i] * b[i];
  return sum;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// Appends to `keys` the key rows (global rows of the key tensor) that token
/// `t` of `seq` sees through KV head `h`.
using KeySetFn = std::function<void(const Sequence &seq, int64_t t, int64_t h,
                                    std::vector<int64_t> &keys)>;

/// Runs `body(begin, end)` over [0, n) split across the machine's cores
/// (tokens are independent in every forward branch; the backward sums its
/// key gradients per chunk).
void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)> &body) {
  int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  if (n < 512 || threads == 1) {
    body(0, n);
    return;
  }
  std::vector<std::thread> pool;
  int64_t chunk = (n + threads - 1) / threads;
  for (int64_t begin = 0; begin < n; begin += chunk)
    pool.emplace_back(body, begin, std::min(n, begin + chunk));
  for (std::thread &t : pool)
    t.join();
}

/// Calls `fn(row, h, hq)` for every query head `hq` of KV head `h` at token
/// `t` of `seq` whose key set (left in `keys`) is not empty.
template <typename Fn>
void forEachQueryHead(const Shape &s, const Sequence &seq, int64_t t,
                      const KeySetFn &keySet, std::vector<int64_t> &keys,
                      Fn fn) {
  int64_t row = seq.tokenRow + t;
  for (int64_t h = 0; h < s.kvHeads; ++h) {
    keys.clear();
    keySet(seq, t, h, keys);
    if (keys.empty())
      continue;
    for (int64_t hq = h * s.group(); hq < (h + 1) * s.group(); ++hq)
      fn(row, h, hq);
  }
}

/// Spec section 1 for every token and query head of a branch.
Attention attend(const Shape &s, double scale, const Buffer &q, const Buffer &k,
                 const Buffer &v, const std::vector<Sequence> &seqs,
                 const KeySetFn &keySet) {
  int64_t rows = s.batch * s.tokens;
  Attention a;
  a.out.assign(rows * s.qHeads * s.vDim, 0.0);
  a.lse.assign(rows * s.qHeads, kNegInf);
  View qv{q.data(), s.qHeads, s.qkDim}, kv{k.data(), s.kvHeads, s.qkDim},
      vv{v.data(), s.kvHeads, s.vDim};
  MutView ov{a.out.data(), s.qHeads, s.vDim};
  for (const Sequence &seq : seqs) {
    parallelFor(seq.length, [&](int64_t tBegin, int64_t tEnd) {
      std::vector<int64_t> keys;
      std::vector<double> z;
      for (int64_t t = tBegin; t < tEnd; ++t)
        forEachQueryHead(
            s, seq, t, keySet, keys, [&](int64_t row, int64_t h, int64_t hq) {
              z.resize(keys.size());
              double maxZ = kNegInf;
              for (size_t j = 0; j < keys.size(); ++j) {
                z[j] = scale * dot(qv.at(row, hq), kv.at(keys[j], h), s.qkDim);
                maxZ = std::max(maxZ, z[j]);
              }
              double sum = 0.0;
              for (double zj : z)
                sum += std::exp(zj - maxZ);
              double lse = maxZ + std::log(sum);
              a.lse[row * s.qHeads + hq] = lse;
              double *o = ov.at(row, hq);
              for (size_t j = 0; j < keys.size(); ++j) {
                double p = std::exp(z[j] - lse);
                const double *vj = vv.at(keys[j], h);
                for (int64_t e = 0; e < s.vDim; ++e)
                  o[e] += p * vj[e];
              }
            });
    });
  }
  return a;
}

/// Backward of `attend`: accumulates dq, dk, dv for `dOut`.
void attendBackward(const Shape &s, double scale, const Buffer &q,
                    const Buffer &k, const Buffer &v, const Attention &fwd,
                    const Buffer &dOut, const std::vector<Sequence> &seqs,
                    const KeySetFn &keySet, Buffer &dq, Buffer &dk,
                    Buffer &dv) {
  View qv{q.data(), s.qHeads, s.qkDim}, kv{k.data(), s.kvHeads, s.qkDim},
      vv{v.data(), s.kvHeads, s.vDim}, ov{fwd.out.data(), s.qHeads, s.vDim},
      dov{dOut.data(), s.qHeads, s.vDim};
  MutView dqv{dq.data(), s.qHeads, s.qkDim};
  std::mutex merge;
  for (const Sequence &seq : seqs)
    // Tokens in parallel: dq rows are each token's own, dk and dv are
    // summed per chunk of tokens and merged.
    parallelFor(seq.length, [&](int64_t tBegin, int64_t tEnd) {
      Buffer dkPart(dk.size(), 0.0), dvPart(dv.size(), 0.0);
      MutView dkv{dkPart.data(), s.kvHeads, s.qkDim},
          dvv{dvPart.data(), s.kvHeads, s.vDim};
      std::vector<int64_t> keys;
      for (int64_t t = tBegin; t < tEnd; ++t)
        forEachQueryHead(
            s, seq, t, keySet, keys, [&](int64_t row, int64_t h, int64_t hq) {
              double lse = fwd.lse[row * s.qHeads + hq];
              const double *qi = qv.at(row, hq), *doi = dov.at(row, hq);
              double delta = dot(doi, ov.at(row, hq), s.vDim);
              for (int64_t key : keys) {
                const double *kj = kv.at(key, h), *vj = vv.at(key, h);
                double p = std::exp(scale * dot(qi, kj, s.qkDim) - lse);
                double dz = p * (dot(doi, vj, s.vDim) - delta);
                double *dqi = dqv.at(row, hq), *dkj = dkv.at(key, h),
                       *dvj = dvv.at(key, h);
                for (int64_t e = 0; e < s.qkDim; ++e) {
                  dqi[e] += scale * dz * kj[e];
                  dkj[e] += scale * dz * qi[e];
                }
                for (int64_t e = 0; e < s.vDim; ++e)
                  dvj[e] += p * doi[e];
              }
            });
      std::lock_guard<std::mutex> lock(merge);
      for (size_t i = 0; i < dk.size(); ++i)
        dk[i] += dkPart[i];
      for (size_t i = 0; i < dv.size(); ++i)
        dv[i] += dvPart[i];
    });
}

/// Key sets of the three branches (Spec sections 4, 6, 7).
KeySetFn compressedKeys(const Config &c) {
  return
      [c](const Sequence &seq, int64_t t, int64_t, std::vector<int64_t> &keys) {
        int64_t visible =
            spec::numVisibleCompressedBlocks(t, c.cmpBlock, c.cmpStride);
        for (int64_t i = 0; i < visible; ++i)
          keys.push_back(seq.cmpRow + i);
      };
}

KeySetFn selectedKeys(const Shape &s, const Config &c,
                      const std::vector<int32_t> &indices) {
  int64_t n =
      static_cast<int64_t>(indices.size()) / (s.batch * s.tokens * s.kvHeads);
  return [&s, &indices, n, c](const Sequence &seq, int64_t t, int64_t h,
                              std::vector<int64_t> &keys) {
    const int32_t *row = &indices[((seq.tokenRow + t) * s.kvHeads + h) * n];
    std::vector<int64_t> blocks;
    for (int64_t i = 0; i < n; ++i)
      if (row[i] >= 0)
        blocks.push_back(row[i]);
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    for (int64_t j : blocks)
      for (int64_t key = j * c.slcBlock;
           key < (j + 1) * c.slcBlock && key <= t && key < seq.length; ++key)
        keys.push_back(seq.tokenRow + key);
  };
}

KeySetFn windowKeys(const Config &c) {
  return [c](const Sequence &seq, int64_t t, int64_t,
             std::vector<int64_t> &keys) {
    for (int64_t key = std::max<int64_t>(0, t - c.window + 1); key <= t; ++key)
      keys.push_back(seq.tokenRow + key);
  };
}

/// The pooling weight of position `j` of a block for KV head `h`.
double poolWeight(const Config &c, const Buffer *weights, int64_t h,
                  int64_t j) {
  return weights ? (*weights)[h * c.cmpBlock + j] : 1.0 / c.cmpBlock;
}

} // namespace

//===----------------------------------------------------------------------===//
// Shapes and sequences
//===----------------------------------------------------------------------===//

int64_t Shape::compressedRows(int64_t cmpBlock, int64_t cmpStride) const {
  return cuSeqlens.empty()
             ? spec::numCompressedBlocks(tokens, cmpBlock, cmpStride)
             : spec::numPackedCompressedRows(tokens, cmpStride);
}

double Config::scaleFor(const Shape &s) const {
  return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(s.qkDim));
}

std::vector<Sequence> ref::sequences(const Shape &s, const Config &c) {
  std::vector<Sequence> seqs;
  if (s.cuSeqlens.empty()) {
    int64_t rows = s.compressedRows(c.cmpBlock, c.cmpStride);
    for (int64_t b = 0; b < s.batch; ++b)
      seqs.push_back({b * s.tokens, s.tokens, b * rows});
    return seqs;
  }
  int64_t cmpRow = 0;
  for (size_t i = 0; i + 1 < s.cuSeqlens.size(); ++i) {
    int64_t length = s.cuSeqlens[i + 1] - s.cuSeqlens[i];
    seqs.push_back({s.cuSeqlens[i], length, cmpRow});
    cmpRow += spec::numCompressedBlocks(length, c.cmpBlock, c.cmpStride);
  }
  return seqs;
}

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

Buffer ref::compress(const Shape &s, const Config &c, const Buffer &x,
                     int64_t dim, const Buffer *weights) {
  int64_t rows = s.compressedRows(c.cmpBlock, c.cmpStride);
  Buffer out(s.batch * rows * s.kvHeads * dim, 0.0);
  View xv{x.data(), s.kvHeads, dim};
  MutView ov{out.data(), s.kvHeads, dim};
  for (const Sequence &seq : sequences(s, c)) {
    int64_t blocks =
        spec::numCompressedBlocks(seq.length, c.cmpBlock, c.cmpStride);
    for (int64_t i = 0; i < blocks; ++i)
      for (int64_t h = 0; h < s.kvHeads; ++h) {
        double *o = ov.at(seq.cmpRow + i, h);
        for (int64_t j = 0; j < c.cmpBlock; ++j) {
          double w = poolWeight(c, weights, h, j);
          const double *xi = xv.at(seq.tokenRow + i * c.cmpStride + j, h);
          for (int64_t e = 0; e < dim; ++e)
            o[e] += w * xi[e];
        }
      }
  }
  return out;
}

Attention ref::compressedAttention(const Shape &s, const Config &c,
                                   const Buffer &q, const Buffer &kc,
                                   const Buffer &vc) {
  return attend(s, c.scaleFor(s), q, kc, vc, sequences(s, c),
                compressedKeys(c));
}

std::vector<double> ref::blockScores(const Shape &s, const Config &c,
                                     const Buffer &q, const Buffer &kc,
                                     const Buffer &lseCmp, int64_t row,
                                     int64_t h) {
  const Sequence *seq = nullptr;
  std::vector<Sequence> seqs = sequences(s, c);
  for (const Sequence &candidate : seqs)
    if (row >= candidate.tokenRow &&
        row < candidate.tokenRow + candidate.length)
      seq = &candidate;
  int64_t t = row - seq->tokenRow;
  std::vector<double> scores(t / c.slcBlock + 1, 0.0);
  int64_t visible =
      spec::numVisibleCompressedBlocks(t, c.cmpBlock, c.cmpStride);
  View qv{q.data(), s.qHeads, s.qkDim}, kv{kc.data(), s.kvHeads, s.qkDim};
  double scale = c.scaleFor(s);
  for (int64_t hq = h * s.group(); hq < (h + 1) * s.group(); ++hq) {
    double lse = lseCmp[row * s.qHeads + hq];
    for (int64_t i = 0; i < visible; ++i) {
      // Spec 5.1 and 5.2: p_cmp spread over the overlapped selection blocks.
      double p = std::exp(
          scale * dot(qv.at(row, hq), kv.at(seq->cmpRow + i, h), s.qkDim) -
          lse);
      int64_t first = i * c.cmpStride / c.slcBlock,
              last = (i * c.cmpStride + c.cmpBlock - 1) / c.slcBlock;
      for (int64_t j = first; j <= last; ++j)
        scores[j] +=
            p * spec::overlapWeight(i, j, c.cmpBlock, c.cmpStride, c.slcBlock);
    }
  }
  return scores;
}

std::vector<int32_t> ref::selectBlocks(const Shape &s, const Config &c,
                                       const Buffer &q, const Buffer &kc,
                                       const Buffer &lseCmp) {
  int64_t n = c.numSelected;
  std::vector<int32_t> indices(s.batch * s.tokens * s.kvHeads * n, -1);
  for (const Sequence &seq : sequences(s, c)) {
    parallelFor(seq.length, [&](int64_t tBegin, int64_t tEnd) {
      std::vector<int64_t> forced, chosen, rest;
      for (int64_t t = tBegin; t < tEnd; ++t) {
        int64_t row = seq.tokenRow + t, current = t / c.slcBlock;
        forced.clear();
        c.backbone.forcedBlocks(current, forced);
        for (int64_t h = 0; h < s.kvHeads; ++h) {
          std::vector<double> scores = blockScores(s, c, q, kc, lseCmp, row, h);
          // Spec 5.4: forced blocks, then the best non-forced candidates;
          // ties to the lower index.
          chosen = forced;
          // More forced blocks than n only happens past a config's
          // max_tokens with hub blocks: the local ones first, then the
          // lowest-indexed others.
          if (static_cast<int64_t>(chosen.size()) > n) {
            std::stable_partition(chosen.begin(), chosen.end(), [&](int64_t j) {
              return current - j < c.backbone.local;
            });
            chosen.resize(n);
          }
          rest.clear();
          for (int64_t j = 0; j <= current; ++j)
            if (!std::binary_search(forced.begin(), forced.end(), j))
              rest.push_back(j);
          // Spec 14: a NaN score ranks above every number.
          for (double &x : scores)
            if (std::isnan(x))
              x = spec::kNaNScore;
          std::stable_sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) {
            return scores[a] > scores[b];
          });
          int64_t slots =
              std::max<int64_t>(0, std::min<int64_t>(n, current + 1) -
                                       static_cast<int64_t>(chosen.size()));
          chosen.insert(chosen.end(), rest.begin(), rest.begin() + slots);
          std::sort(chosen.begin(), chosen.end());
          int32_t *out = &indices[(row * s.kvHeads + h) * n];
          for (size_t i = 0; i < chosen.size(); ++i)
            out[i] = static_cast<int32_t>(chosen[i]);
        }
      }
    });
  }
  return indices;
}

Attention ref::selectedAttention(const Shape &s, const Config &c,
                                 const Buffer &q, const Buffer &k,
                                 const Buffer &v,
                                 const std::vector<int32_t> &indices) {
  return attend(s, c.scaleFor(s), q, k, v, sequences(s, c),
                selectedKeys(s, c, indices));
}

Attention ref::windowAttention(const Shape &s, const Config &c, const Buffer &q,
                               const Buffer &k, const Buffer &v) {
  return attend(s, c.scaleFor(s), q, k, v, sequences(s, c), windowKeys(c));
}

Buffer ref::combine(const Shape &s, const Buffer &cmp, const Buffer &slc,
                    const Buffer &win, const Buffer &gates) {
  Buffer out(cmp.size());
  int64_t rows = s.batch * s.tokens * s.qHeads;
  for (int64_t r = 0; r < rows; ++r) {
    double g0 = sigmoid(gates[r * 3]), g1 = sigmoid(gates[r * 3 + 1]),
           g2 = sigmoid(gates[r * 3 + 2]);
    for (int64_t e = 0; e < s.vDim; ++e) {
      int64_t i = r * s.vDim + e;
      out[i] = g0 * cmp[i] + g1 * slc[i] + g2 * win[i];
    }
  }
  return out;
}

Forward ref::forward(const Shape &s, const Config &c, const Inputs &in) {
  Forward f;
  Buffer wk, wv;
  if (c.linearPool) {
    int64_t half = s.kvHeads * c.cmpBlock;
    wk.assign(in.cmpWeights.begin(), in.cmpWeights.begin() + half);
    wv.assign(in.cmpWeights.begin() + half, in.cmpWeights.end());
  }
  f.kc = compress(s, c, in.k, s.qkDim, c.linearPool ? &wk : nullptr);
  f.vc = compress(s, c, in.v, s.vDim, c.linearPool ? &wv : nullptr);
  f.cmp = compressedAttention(s, c, in.q, f.kc, f.vc);
  f.indices = selectBlocks(s, c, in.q, f.kc, f.cmp.lse);
  f.slc = selectedAttention(s, c, in.q, in.k, in.v, f.indices);
  f.win = windowAttention(s, c, in.q, in.k, in.v);
  f.out = combine(s, f.cmp.out, f.slc.out, f.win.out, in.gates);
  return f;
}

//===----------------------------------------------------------------------===//
// Backward (Spec section 9)
//===----------------------------------------------------------------------===//

namespace {

/// Backward of `compress`: scatters `dxc` into `dx` and, for the linear
/// pool, accumulates the weight gradient `dw` [H, l].
void compressBackward(const Shape &s, const Config &c, const Buffer &x,
                      int64_t dim, const Buffer *weights, const Buffer &dxc,
                      Buffer &dx, Buffer *dw) {
  View xv{x.data(), s.kvHeads, dim}, dcv{dxc.data(), s.kvHeads, dim};
  MutView dxv{dx.data(), s.kvHeads, dim};
  for (const Sequence &seq : sequences(s, c)) {
    int64_t blocks =
        spec::numCompressedBlocks(seq.length, c.cmpBlock, c.cmpStride);
    for (int64_t i = 0; i < blocks; ++i)
      for (int64_t h = 0; h < s.kvHeads; ++h) {
        const double *g = dcv.at(seq.cmpRow + i, h);
        for (int64_t j = 0; j < c.cmpBlock; ++j) {
          int64_t row = seq.tokenRow + i * c.cmpStride + j;
          double w = poolWeight(c, weights, h, j);
          double *d = dxv.at(row, h);
          for (int64_t e = 0; e < dim; ++e)
            d[e] += w * g[e];
          if (dw)
            (*dw)[h * c.cmpBlock + j] += dot(xv.at(row, h), g, dim);
        }
      }
  }
}

} // namespace

Gradients ref::backward(const Shape &s, const Config &c, const Inputs &in,
                        const Forward &f, const Buffer &dOut) {
  int64_t rows = s.batch * s.tokens;
  Gradients g;
  g.q.assign(in.q.size(), 0.0);
  g.k.assign(in.k.size(), 0.0);
  g.v.assign(in.v.size(), 0.0);
  g.gates.assign(in.gates.size(), 0.0);

  // Gates: o = sum_b sigmoid(g_b) o_b.
  Buffer dBranch[3];
  const Buffer *branch[3] = {&f.cmp.out, &f.slc.out, &f.win.out};
  for (Buffer &d : dBranch)
    d.assign(dOut.size(), 0.0);
  for (int64_t r = 0; r < rows * s.qHeads; ++r)
    for (int b = 0; b < 3; ++b) {
      double sg = sigmoid(in.gates[r * 3 + b]);
      const double *o = branch[b]->data() + r * s.vDim;
      const double *d = dOut.data() + r * s.vDim;
      g.gates[r * 3 + b] = sg * (1.0 - sg) * dot(o, d, s.vDim);
      for (int64_t e = 0; e < s.vDim; ++e)
        dBranch[b][r * s.vDim + e] = sg * d[e];
    }

  double scale = c.scaleFor(s);
  std::vector<Sequence> seqs = sequences(s, c);
  Buffer dkc(f.kc.size(), 0.0), dvc(f.vc.size(), 0.0);
  attendBackward(s, scale, in.q, f.kc, f.vc, f.cmp, dBranch[0], seqs,
                 compressedKeys(c), g.q, dkc, dvc);
  attendBackward(s, scale, in.q, in.k, in.v, f.slc, dBranch[1], seqs,
                 selectedKeys(s, c, f.indices), g.q, g.k, g.v);
  attendBackward(s, scale, in.q, in.k, in.v, f.win, dBranch[2], seqs,
                 windowKeys(c), g.q, g.k, g.v);

  // Compression.
  Buffer wk, wv, dwk, dwv;
  if (c.linearPool) {
    int64_t half = s.kvHeads * c.cmpBlock;
    wk.assign(in.cmpWeights.begin(), in.cmpWeights.begin() + half);
    wv.assign(in.cmpWeights.begin() + half, in.cmpWeights.end());
    dwk.assign(half, 0.0);
    dwv.assign(half, 0.0);
  }
  compressBackward(s, c, in.k, s.qkDim, c.linearPool ? &wk : nullptr, dkc, g.k,
                   c.linearPool ? &dwk : nullptr);
  compressBackward(s, c, in.v, s.vDim, c.linearPool ? &wv : nullptr, dvc, g.v,
                   c.linearPool ? &dwv : nullptr);
  if (c.linearPool) {
    g.cmpWeights = dwk;
    g.cmpWeights.insert(g.cmpWeights.end(), dwv.begin(), dwv.end());
  }
  return g;
}

//===----------------------------------------------------------------------===//
// Test helpers
//===----------------------------------------------------------------------===//

std::vector<Shape>
ref::testShapes(const Shape &dims, int64_t batch,
                const std::vector<int64_t> &tokens,
                const std::vector<std::vector<int32_t>> &packed) {
  std::vector<Shape> shapes;
  for (int64_t T : tokens) {
    Shape s = dims;
    s.batch = batch;
    s.tokens = T;
    s.cuSeqlens.clear();
    shapes.push_back(s);
  }
  for (const std::vector<int32_t> &cu : packed) {
    Shape s = dims;
    s.batch = 1;
    s.tokens = cu.back();
    s.cuSeqlens = cu;
    shapes.push_back(s);
  }
  return shapes;
}

Buffer ref::randomBuffer(int64_t size, uint64_t seed, double lo, double hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Buffer out(size);
  for (double &x : out)
    x = dist(gen);
  return out;
}

double ref::relativeL2(const Buffer &a, const Buffer &b) {
  if (a.size() != b.size())
    return std::numeric_limits<double>::infinity();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i]))
      return std::numeric_limits<double>::infinity();
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

uint16_t ref::toBF16(float f) {
  if (std::isnan(f))
    return 0x7fc0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1); // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float ref::fromBF16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t ref::toF16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

float ref::fromF16(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

ref::SelectionGap ref::selectionGap(const Shape &s, const Config &c,
                                    const Inputs &in, const Forward &fwd,
                                    const int32_t *got, int64_t row,
                                    int64_t h) {
  int64_t n = c.numSelected;
  const int32_t *want = &fwd.indices[(row * s.kvHeads + h) * n];
  SelectionGap gap;
  if (std::equal(got, got + n, want))
    return gap;
  gap.same = false;
  std::vector<double> scores =
      blockScores(s, c, in.q, fwd.kc, fwd.cmp.lse, row, h);
  std::set<int32_t> gs(got, got + n), ws(want, want + n);
  gap.valid = gs.size() == ws.size();
  for (int32_t j : gs) {
    if (j < -1 || j >= static_cast<int32_t>(scores.size()))
      gap.valid = false;
    else if (j >= 0 && !ws.count(j))
      gap.lowestChosen = std::min(gap.lowestChosen, scores[j]);
  }
  for (int32_t j : ws)
    if (j >= 0 && !gs.count(j))
      gap.highestOther = std::max(gap.highestOther, scores[j]);
  return gap;
}
