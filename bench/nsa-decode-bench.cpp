//===- nsa-decode-bench.cpp - decoding steps of the paper layer -----------===//
//
// Times one decoding step (docs/Spec.md section 12: nsa.compress_append of
// the step's complete blocks, then nsa.sparse_attention_decode) of the
// paper layer (HQ 64, H 4, Dqk 192, Dv 128; l 32, d 16, l' 64, n 16,
// w 512), one new token a batch row, through nsaLayerDecode (its argument
// checks included, the lengths given on the host as well, as a decoding loop
// has them), for each cache length given and B = 1 and 64. Prints one JSON
// object per line:
//   {"impl": "nsa decode", "variant": ..., "B": ..., "L": ..., "us": median,
//    "bytes": ..., "tbps": bytes / time, "hbm_fraction": tbps / 4.3}
// where bytes are what NSA must read per step (compressed keys and values,
// the 16 selected blocks and the window, per batch row and KV head;
// docs/Decode.md section 4), then one profiled step's kernels:
//   {"impl": "nsa decode kernel: <name>", "B": ..., "L": ..., "us": ...}
//
// Steps whose tensors repeat replay a CUDA graph (nsaRunGraph; NSA_GRAPHS=0
// runs each directly): the time is of replays. Then the same steps
// stream-ordered (nsaLayerDecodeAsync), as a model's layers run: at B = 1
// on eight layers' caches in turn (--layers=N: N layers' at every B),
// nothing waited for between steps:
//   {"impl": "nsa decode, stream-ordered", ..., "us": a step,
//    "enqueue_us": the host's time to enqueue one, "layers": 8}
// and those steps captured into one graph of the bench's own (a model's
// decoding step captured whole), replayed back to back:
//   {"impl": "nsa decode, captured", ..., "us": a step, "layers": 8}
//
// First, a check on the GPU: a decoding loop of --steps steps (20) over two
// batch rows of different lengths on the same buffers, each step's rows
// against the compiled forward's rows over the same tokens (relative L2 <=
// 1e-2); the compressed caches start with the blocks complete before the
// first step (host mean pools) and NaN after, the key and value caches hold
// every token (those past kv_lens must not be read). The steps are run in
// turn directly (nsaLayerDecode), stream-ordered (nsaLayerDecodeAsync,
// three times back to back) and captured into a graph of the bench's own
// ("mode"). --long-check adds a
// loop of 4 steps at 70001 and 3001 tokens, where the selection takes
// several passes.
//
//===----------------------------------------------------------------------===//

#include "NSA-c/Runtime.h"
#include "NSA/Runtime/Descriptor.h"
#include "NSA/Runtime/nsa_runtime.h"
#include "NSA/Spec.h"

#include "BenchData.h"

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_c64_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_t264_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_q4_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_q16_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_dsel_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_q4dsel_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_nopush_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_q4nopush_;
extern "C" const nsaLayerEntry nsa_layer_entry_bench_decode_trace_;

namespace {

using nsa::bench::fromBF16;
using nsa::bench::randomBF16;
using nsa::bench::toBF16;

constexpr int64_t HQ = 64, H = 4, DQK = 192, DV = 128, L_ = 32, D_ = 16,
                  LP = 64, N = 16, W = 512;

[[noreturn]] void fail(const char *what) {
  std::fprintf(stderr, "nsa-decode-bench: %s: %s\n", what, nsaGetLastError());
  std::exit(1);
}

/// A device buffer of `count` elements of `bytes` each.
struct Buffer {
  void *ptr = nullptr;
  size_t size = 0;
  Buffer(size_t count, size_t bytes) : size(count * bytes) {
    if (nsaMalloc(&ptr, std::max<size_t>(size, 16)) != nsaSuccess)
      fail("nsaMalloc");
  }
  Buffer(const Buffer &) = delete;
  ~Buffer() { nsaFree(ptr); }
  void upload(const void *host) {
    if (nsaMemcpyHtoD(ptr, host, size) != nsaSuccess)
      fail("upload");
  }
  void download(void *host) const {
    if (nsaMemcpyDtoH(host, ptr, size) != nsaSuccess)
      fail("download");
  }
};

/// The mean pool (Spec section 3) of the first `blocks` compressed rows of
/// `x [L, H, D]` (bf16), as bf16 rows `[rows, H, D]`, NaN past `blocks`.
std::vector<uint16_t> meanPool(const uint16_t *x, int64_t blocks, int64_t rows,
                               int64_t dim) {
  std::vector<uint16_t> out(rows * H * dim, toBF16(NAN));
  for (int64_t i = 0; i < blocks; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < dim; ++e) {
        float sum = 0;
        for (int64_t j = 0; j < L_; ++j)
          sum += fromBF16(x[((i * D_ + j) * H + h) * dim + e]);
        out[(i * H + h) * dim + e] = toBF16(sum / L_);
      }
  return out;
}

/// The relative gap, in float64 Eq. 9/10 block scores (Spec section 5),
/// between the last block the top-n of token `t` and KV head `h` takes
/// and the first it leaves (+inf where it leaves none): `qRows` [HQ, DQK]
/// are the token's queries, `kc` [blocks, H, DQK] the pooled keys (bf16).
/// Below about 1e-5 the f32 sums of two kernels may rank the two blocks
/// either way (a near tie), and their rows then differ.
double selectionGap(const uint16_t *qRows, const std::vector<uint16_t> &kc,
                    int64_t t, int64_t h) {
  int64_t visible = mlir::nsa::spec::numVisibleCompressedBlocks(t, L_, D_);
  int64_t current = t / LP;
  double scale = 1 / std::sqrt(static_cast<double>(DQK));
  std::vector<double> scores(current + 1, 0.0), s(visible);
  for (int64_t hq = h * (HQ / H); hq < (h + 1) * (HQ / H); ++hq) {
    double m = -INFINITY, sum = 0;
    for (int64_t i = 0; i < visible; ++i) {
      double dot = 0;
      for (int64_t e = 0; e < DQK; ++e)
        dot += static_cast<double>(fromBF16(qRows[hq * DQK + e])) *
               fromBF16(kc[(i * H + h) * DQK + e]);
      s[i] = dot * scale;
      m = std::max(m, s[i]);
    }
    for (double x : s)
      sum += std::exp(x - m);
    for (int64_t i = 0; i < visible; ++i)
      for (int64_t j = i * D_ / LP; j <= std::min((i * D_ + L_ - 1) / LP, current);
           ++j)
        scores[j] += std::exp(s[i] - m) / sum *
                     mlir::nsa::spec::overlapWeight(i, j, L_, D_, LP);
  }
  // The bench layer's backbone: the initial block and two local ones.
  std::vector<double> rest;
  for (int64_t j = 1; j + 2 <= current; ++j)
    rest.push_back(scores[j]);
  int64_t free = N - 3;
  if (static_cast<int64_t>(rest.size()) <= free)
    return INFINITY;
  std::nth_element(rest.begin(), rest.begin() + free - 1, rest.end(),
                   std::greater<double>());
  double taken = rest[free - 1];
  double left = *std::max_element(rest.begin() + free, rest.end());
  return (taken - left) / taken;
}

/// What the bench needs of libcuda (loaded at run time, as the runtime
/// does) to capture steps into a graph of its own, as a model captures its
/// whole decoding step: a stream of the runtime's context, the capture, and
/// the graph's replays.
struct Capture {
#define NSA_BENCH_CUDA(X)                                                      \
  X(cuDeviceGet)                                                               \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuCtxSetCurrent)                                                           \
  X(cuStreamCreate)                                                            \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamBeginCapture)                                                      \
  X(cuStreamEndCapture)                                                        \
  X(cuGraphInstantiate)                                                        \
  X(cuGraphLaunch)                                                             \
  X(cuGraphDestroy)                                                            \
  X(cuGraphExecDestroy)
#define NSA_BENCH_STR2(x) #x
#define NSA_BENCH_STR(x) NSA_BENCH_STR2(x)
#define NSA_BENCH_DECLARE(name) decltype(&::name) name = nullptr;
  NSA_BENCH_CUDA(NSA_BENCH_DECLARE)
#undef NSA_BENCH_DECLARE
  CUstream stream = nullptr;

  static Capture &get() {
    static Capture c;
    return c;
  }
  Capture() {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      fail("dlopen libcuda.so.1");
#define NSA_BENCH_LOAD(name)                                                   \
  name = reinterpret_cast<decltype(name)>(dlsym(lib, NSA_BENCH_STR(name)));    \
  if (!name)                                                                   \
    fail("dlsym " NSA_BENCH_STR(name));
    NSA_BENCH_CUDA(NSA_BENCH_LOAD)
#undef NSA_BENCH_LOAD
    CUdevice device;
    CUcontext context;
    if (cuDeviceGet(&device, 0) || cuDevicePrimaryCtxRetain(&context, device) ||
        cuCtxSetCurrent(context) ||
        cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING))
      fail("a stream of the primary context");
  }
  /// The steps `enqueue` puts on `stream` (through nsaLayerDecodeAsync),
  /// captured into one instantiated graph.
  CUgraphExec capture(const std::function<void(CUstream)> &enqueue) {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    if (cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
      fail("cuStreamBeginCapture");
    enqueue(stream);
    if (cuStreamEndCapture(stream, &graph) ||
        cuGraphInstantiate(&exec, graph, 0))
      fail("capturing decoding steps into a graph");
    cuGraphDestroy(graph);
    return exec;
  }
  void replay(CUgraphExec exec) {
    if (cuGraphLaunch(exec, stream))
      fail("cuGraphLaunch");
  }
  void wait() {
    if (cuStreamSynchronize(stream))
      fail("cuStreamSynchronize");
  }
};

nsaLayerDecodeArgs decodeArgs(int64_t B, int64_t Tq, int64_t L, Buffer &q,
                              Buffer &g, Buffer &k, Buffer &v, Buffer &kc,
                              Buffer &vc, Buffer &lens, Buffer &out) {
  nsaLayerDecodeArgs a = {};
  a.batch = B;
  a.queries = Tq;
  a.cacheTokens = L;
  a.dtype = nsaBF16;
  a.q = q.ptr;
  a.gates = g.ptr;
  a.kCache = k.ptr;
  a.vCache = v.ptr;
  a.kcCache = kc.ptr;
  a.vcCache = vc.ptr;
  a.kvLens = static_cast<const int32_t *>(lens.ptr);
  a.out = out.ptr;
  return a;
}

/// A decoding loop over two sequences (final lengths `lens`): `steps`
/// steps of Tq tokens each on the same buffers, as a serving loop runs them
/// (the second step on is a graph replay, nsaRunGraph), each step's rows
/// against the forward's rows over the same tokens. The caches hold every
/// token from the start (the keys past kv_lens must not be read); the
/// compressed caches only the blocks complete before the first step, NaN
/// after (the steps append the rest). Returns whether every row of every
/// step is within 1e-2.
bool checkAgainstForward(const nsaLayer &layer, std::vector<int32_t> lens,
                         int64_t steps) {
  int64_t B = lens.size(), Lmax = *std::max_element(lens.begin(), lens.end());
  int64_t Tq = layer.decodeQueries, rowElems = Tq * HQ * DV;
  int64_t rows = mlir::nsa::spec::numCompressedBlocks(Lmax, L_, D_);
  std::vector<uint16_t> k(B * Lmax * H * DQK, toBF16(NAN)),
      v(B * Lmax * H * DV, toBF16(NAN)), kc, vc;
  // Per step: its queries, gates, lengths; per batch row and step, the
  // forward's rows.
  std::vector<std::vector<uint16_t>> q(steps), g(steps);
  std::vector<std::vector<int32_t>> stepLens(steps);
  std::vector<std::vector<uint16_t>> want(B * steps);
  // Per batch row, every block pooled (for selectionGap).
  std::vector<std::vector<uint16_t>> pooled(B);
  bool ok = true;
  for (int64_t b = 0; b < B; ++b) {
    int64_t L = lens[b];
    std::vector<uint16_t> sq = randomBF16(L * HQ * DQK, 10 * b + 1),
                          sk = randomBF16(L * H * DQK, 10 * b + 2),
                          sv = randomBF16(L * H * DV, 10 * b + 3),
                          sg = randomBF16(L * HQ * 3, 10 * b + 4);
    // The forward over the sequence's L tokens.
    Buffer fq(sq.size(), 2), fk(sk.size(), 2), fv(sv.size(), 2),
        fg(sg.size(), 2), fo(L * HQ * DV, 2);
    fq.upload(sq.data());
    fk.upload(sk.data());
    fv.upload(sv.data());
    fg.upload(sg.data());
    nsaLayerArgs fa = {};
    fa.batch = 1;
    fa.tokens = L;
    fa.dtype = nsaBF16;
    fa.q = fq.ptr;
    fa.k = fk.ptr;
    fa.v = fv.ptr;
    fa.gates = fg.ptr;
    fa.out = fo.ptr;
    if (nsaLayerForward(&layer, &fa) != nsaSuccess)
      fail("nsaLayerForward");
    std::vector<uint16_t> all(L * HQ * DV);
    fo.download(all.data());
    for (int64_t st = 0; st < steps; ++st) {
      // Step st ends at token `end` (its kv_lens).
      int64_t end = L - (steps - 1 - st) * Tq;
      stepLens[st].push_back(static_cast<int32_t>(end));
      want[b * steps + st].assign(all.begin() + (end - Tq) * HQ * DV,
                                  all.begin() + end * HQ * DV);
      q[st].insert(q[st].end(), sq.begin() + (end - Tq) * HQ * DQK,
                   sq.begin() + end * HQ * DQK);
      g[st].insert(g[st].end(), sg.begin() + (end - Tq) * HQ * 3,
                   sg.begin() + end * HQ * 3);
    }
    std::copy(sk.begin(), sk.end(), k.begin() + b * Lmax * H * DQK);
    std::copy(sv.begin(), sv.end(), v.begin() + b * Lmax * H * DV);
    int64_t before =
        mlir::nsa::spec::numCompressedBlocks(L - steps * Tq, L_, D_);
    std::vector<uint16_t> pk = meanPool(sk.data(), before, rows, DQK),
                          pv = meanPool(sv.data(), before, rows, DV);
    int64_t blocks = mlir::nsa::spec::numCompressedBlocks(L, L_, D_);
    pooled[b] = meanPool(sk.data(), blocks, blocks, DQK);
    kc.insert(kc.end(), pk.begin(), pk.end());
    vc.insert(vc.end(), pv.begin(), pv.end());
  }
  Buffer dq(q[0].size(), 2), dg(g[0].size(), 2), dk(k.size(), 2),
      dv(v.size(), 2), dkc(kc.size(), 2), dvc(vc.size(), 2), dl(B, 4),
      dout(B * rowElems, 2);
  dk.upload(k.data());
  dv.upload(v.data());
  dkc.upload(kc.data());
  dvc.upload(vc.data());
  std::vector<uint16_t> poison(B * rowElems, toBF16(NAN));
  nsaLayerDecodeArgs a =
      decodeArgs(B, Tq, Lmax, dq, dg, dk, dv, dkc, dvc, dl, dout);
  for (int64_t st = 0; st < steps; ++st) {
    dq.upload(q[st].data());
    dg.upload(g[st].data());
    dl.upload(stepLens[st].data());
    dout.upload(poison.data());
    // Every third step from the second stream-ordered (on the legacy
    // default stream, which the copies use too), three times back to back
    // (the later launches start while the one before ends, on the same
    // workspace), then waited for; every third from the third captured
    // into a graph of the bench's own (the lengths given on the host, as a
    // capture needs) and replayed.
    const char *mode = st % 3 == 0 ? "direct" : st % 3 == 1 ? "async"
                                                            : "captured";
    bool async = st % 3 == 1, captured = st % 3 == 2;
    if (captured) {
      nsaLayerDecodeArgs c = a;
      c.kvLensHost = stepLens[st].data();
      Capture &cap = Capture::get();
      CUgraphExec exec = cap.capture([&](CUstream stream) {
        if (nsaLayerDecodeAsync(&layer, &c, stream) != nsaSuccess)
          fail("nsaLayerDecodeAsync (captured)");
      });
      cap.replay(exec);
      cap.wait();
      cap.cuGraphExecDestroy(exec);
    } else if (async) {
      for (int repeat = 0; repeat < 3; ++repeat)
        if (nsaLayerDecodeAsync(&layer, &a, nullptr) != nsaSuccess)
          fail("nsaLayerDecodeAsync");
      if (nsaSynchronize() != nsaSuccess)
        fail("nsaSynchronize");
    } else if (nsaLayerDecode(&layer, &a) != nsaSuccess) {
      fail("nsaLayerDecode");
    }
    std::vector<uint16_t> got(B * rowElems);
    dout.download(got.data());
    for (int64_t b = 0; b < B; ++b) {
      double num = 0, den = 0;
      bool finite = true;
      for (int64_t i = 0; i < rowElems; ++i) {
        double x = fromBF16(got[b * rowElems + i]),
               y = fromBF16(want[b * steps + st][i]);
        finite &= std::isfinite(x);
        num += (x - y) * (x - y);
        den += y * y;
      }
      double err = finite ? std::sqrt(num / den) : INFINITY;
      // Past 1e-2: the (token, KV head) groups with a near tie in the
      // float64 block scores (selectionGap < 1e-5) left out, the other
      // rows must still be within 1e-2.
      int64_t ties = 0;
      double untied = err;
      if (finite && err > 1e-2) {
        num = den = 0;
        for (int64_t j = 0; j < Tq; ++j) {
          int64_t t = stepLens[st][b] - Tq + j;
          const uint16_t *qRows = &q[st][(b * Tq + j) * HQ * DQK];
          for (int64_t h = 0; h < H; ++h) {
            if (selectionGap(qRows, pooled[b], t, h) < 1e-5) {
              ++ties;
              continue;
            }
            for (int64_t i = 0; i < (HQ / H) * DV; ++i) {
              int64_t at = (j * HQ + h * (HQ / H)) * DV + i;
              double x = fromBF16(got[b * rowElems + at]),
                     y = fromBF16(want[b * steps + st][at]);
              num += (x - y) * (x - y);
              den += y * y;
            }
          }
        }
        if (ties)
          untied = std::sqrt(num / den);
      }
      bool pass = untied <= 1e-2;
      ok &= pass;
      std::printf("{\"check\": \"decode rows = forward's rows\", \"Tq\": "
                  "%lld, \"step\": %lld, \"mode\": \"%s\", \"kv_len\": %d, "
                  "\"rel_l2\": %.3e, \"near_ties\": %lld, "
                  "\"rel_l2_untied\": %.3e, \"pass\": %s}\n",
                  static_cast<long long>(Tq), static_cast<long long>(st),
                  mode, stepLens[st][b], err,
                  static_cast<long long>(ties), untied,
                  pass ? "true" : "false");
    }
  }
  // A length past the cache is refused before any launch, read back from
  // the device or given on the host.
  std::vector<int32_t> bad(B, static_cast<int32_t>(Lmax + 1));
  dl.upload(bad.data());
  nsaStatus s = nsaLayerDecode(&layer, &a);
  bool refused = s == nsaErrorInvalidArgument &&
                 std::strstr(nsaGetLastError(), "kvLens[0]");
  s = nsaLayerDecodeAsync(&layer, &a, nullptr);
  refused = refused && s == nsaErrorInvalidArgument &&
            std::strstr(nsaGetLastError(), "nsaLayerDecodeAsync: kvLens[0]");
  a.kvLensHost = bad.data();
  dl.upload(lens.data());
  s = nsaLayerDecode(&layer, &a);
  refused = refused && s == nsaErrorInvalidArgument &&
            std::strstr(nsaGetLastError(), "kvLens[0]");
  s = nsaLayerDecodeAsync(&layer, &a, nullptr);
  refused = refused && s == nsaErrorInvalidArgument &&
            std::strstr(nsaGetLastError(), "nsaLayerDecodeAsync: kvLens[0]");
  std::printf("{\"check\": \"kv_lens > cacheTokens refused\", \"pass\": %s, "
              "\"message\": \"%s\"}\n",
              refused ? "true" : "false", refused ? nsaGetLastError() : "");
  // While `stream` is captured kvLens cannot be read back: a call without
  // the lengths on the host is refused (and enqueues nothing).
  a.kvLensHost = nullptr;
  bool capRefused = false;
  Capture &cap = Capture::get();
  cap.cuGraphExecDestroy(cap.capture([&](CUstream stream) {
    capRefused =
        nsaLayerDecodeAsync(&layer, &a, stream) == nsaErrorInvalidArgument &&
        std::strstr(nsaGetLastError(), "kvLensHost");
  }));
  std::printf("{\"check\": \"captured without kvLensHost refused\", "
              "\"pass\": %s, \"message\": \"%s\"}\n",
              capRefused ? "true" : "false",
              capRefused ? nsaGetLastError() : "");
  std::fflush(stdout);
  return ok && refused && capRefused;
}

/// Bytes a step must read per batch row: every KV head's compressed keys and
/// values, its 16 selected blocks and its window.
double stepBytes(int64_t L) {
  double rows = mlir::nsa::spec::numCompressedBlocks(L, L_, D_);
  double selected = std::min<double>(L, N * LP),
         window = std::min<int64_t>(L, W);
  return H * (rows + selected + window) * (DQK + DV) * 2.0;
}

} // namespace

int main(int argc, char **argv) {
  int reps = 20, steps = 20;
  int64_t layers = 0; // 0: eight at B = 1, one otherwise
  bool longCheck = false;
  std::string variant = "default";
  std::vector<int64_t> lengths;
  std::vector<int64_t> batches = {1, 64};
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0)
      reps = std::atoi(argv[i] + 7);
    else if (std::strncmp(argv[i], "--steps=", 8) == 0)
      steps = std::atoi(argv[i] + 8);
    else if (std::strncmp(argv[i], "--layers=", 9) == 0)
      layers = std::atoll(argv[i] + 9);
    else if (std::strcmp(argv[i], "--long-check") == 0)
      longCheck = true;
    else if (std::strncmp(argv[i], "--variant=", 10) == 0)
      variant = argv[i] + 10;
    else if (std::strncmp(argv[i], "--batches=", 10) == 0) {
      batches.clear();
      for (const char *p = argv[i] + 10; *p;) {
        batches.push_back(std::atoll(p));
        p = std::strchr(p, ',');
        if (!p)
          break;
        ++p;
      }
    } else
      lengths.push_back(std::atoll(argv[i]));
  }
  const std::pair<const char *, const nsaLayerEntry *> variants[] = {
      {"default", &nsa_layer_entry_bench_decode_},
      {"c64", &nsa_layer_entry_bench_decode_c64_},
      {"t264", &nsa_layer_entry_bench_decode_t264_},
      {"q4", &nsa_layer_entry_bench_decode_q4_},
      {"q16", &nsa_layer_entry_bench_decode_q16_},
      {"dsel", &nsa_layer_entry_bench_decode_dsel_},
      {"q4dsel", &nsa_layer_entry_bench_decode_q4dsel_},
      {"nopush", &nsa_layer_entry_bench_decode_nopush_},
      {"q4nopush", &nsa_layer_entry_bench_decode_q4nopush_},
      {"trace", &nsa_layer_entry_bench_decode_trace_}};
  const nsaLayerEntry *entry = nullptr;
  for (const auto &[name, e] : variants)
    if (variant == name)
      entry = e;
  if (reps < 1 || steps < 1 || layers < 0 || lengths.empty() || !entry ||
      std::any_of(lengths.begin(), lengths.end(),
                  [](int64_t L) { return L < 1; })) {
    std::fprintf(
        stderr,
        "usage: nsa-decode-bench [--reps=N] [--steps=N] "
        "[--batches=1,64] [--layers=N] "
        "[--variant=default|c64|t264|q4|q16|dsel|q4dsel|nopush|q4nopush|"
        "trace] "
        "[--long-check] L...\n");
    return 2;
  }
  if (nsaInit(0) != nsaSuccess)
    fail("nsaInit");
  const nsaLayer &layer = entry->layer;
  int64_t Tq = layer.decodeQueries;
  // Short rows (one span of candidate blocks) and long ones (several spans,
  // their best ranked again).
  bool ok = checkAgainstForward(layer, {1999, 1000}, steps);
  ok = checkAgainstForward(layer, {20001, 8999}, steps) && ok;
  // Past 64k tokens the selection ranks its candidates in several passes
  // (1,024 candidates a pass; docs/Decode.md section 4).
  if (longCheck)
    ok = checkAgainstForward(layer, {70001, 3001}, std::min(steps, 4)) && ok;
  for (int64_t B : batches)
    for (int64_t L : lengths) {
      int64_t rows = mlir::nsa::spec::numCompressedBlocks(L, L_, D_);
      Buffer q(B * Tq * HQ * DQK, 2), g(B * Tq * HQ * 3, 2),
          k(B * L * H * DQK, 2), v(B * L * H * DV, 2),
          kc(B * rows * H * DQK, 2), vc(B * rows * H * DV, 2), lens(B, 4),
          out(B * Tq * HQ * DV, 2);
      // Random bf16 (the values do not change the time): one block of
      // them, repeated over each buffer.
      std::vector<uint16_t> block = randomBF16(size_t(1) << 22, L + B);
      auto fill = [&](Buffer &x) {
        for (size_t at = 0; at < x.size; at += 2 * block.size())
          if (nsaMemcpyHtoD(static_cast<char *>(x.ptr) + at, block.data(),
                            std::min(x.size - at, 2 * block.size())) !=
              nsaSuccess)
            fail("upload");
      };
      for (Buffer *x : {&q, &g, &k, &v, &kc, &vc})
        fill(*x);
      std::vector<int32_t> hostLens(B, static_cast<int32_t>(L));
      lens.upload(hostLens.data());
      nsaLayerDecodeArgs a =
          decodeArgs(B, Tq, L, q, g, k, v, kc, vc, lens, out);
      // As a decoding loop calls it: the lengths also on the host.
      a.kvLensHost = hostLens.data();
      // Warm-up: the first call runs directly, the second is captured
      // (nsaRunGraph), the timed ones replay.
      for (int w = 0; w < 2; ++w)
        if (nsaLayerDecode(&layer, &a) != nsaSuccess)
          fail("nsaLayerDecode");
      std::vector<double> us;
      for (int r = 0; r < reps; ++r) {
        auto start = std::chrono::steady_clock::now();
        if (nsaLayerDecode(&layer, &a) != nsaSuccess)
          fail("nsaLayerDecode");
        us.push_back(std::chrono::duration<double, std::micro>(
                         std::chrono::steady_clock::now() - start)
                         .count());
      }
      std::sort(us.begin(), us.end());
      double median = us[us.size() / 2], bytes = B * stepBytes(L);
      double tbps = bytes / (median * 1e-6) * 1e-12;
      std::printf("{\"impl\": \"nsa decode\", \"variant\": \"%s\", "
                  "\"B\": %lld, "
                  "\"L\": %lld, \"us\": %.1f, \"bytes\": %.0f, \"tbps\": "
                  "%.4f, \"hbm_fraction\": %.4f, \"reps\": %d}\n",
                  variant.c_str(), static_cast<long long>(B),
                  static_cast<long long>(L), median, bytes, tbps, tbps / 4.3,
                  reps);
      // Stream-ordered, as a model's layers run one after the other: steps
      // on `sets` layers' caches in turn (at B = 1 eight, more than L2
      // holds; at B = 64 a step alone reads more), through
      // nsaLayerDecodeAsync, with nothing waited for between steps. The
      // time a step of `reps` after every set's graph is captured.
      {
        int64_t sets = layers ? layers : B == 1 ? 8 : 1;
        std::vector<std::unique_ptr<Buffer>> own;
        std::vector<nsaLayerDecodeArgs> setArgs = {a};
        for (int64_t i = 1; i < sets; ++i) {
          Buffer *kk = own.emplace_back(new Buffer(B * L * H * DQK, 2)).get();
          Buffer *vv = own.emplace_back(new Buffer(B * L * H * DV, 2)).get();
          Buffer *kcc =
              own.emplace_back(new Buffer(B * rows * H * DQK, 2)).get();
          Buffer *vcc =
              own.emplace_back(new Buffer(B * rows * H * DV, 2)).get();
          for (Buffer *x : {kk, vv, kcc, vcc})
            fill(*x);
          setArgs.push_back(
              decodeArgs(B, Tq, L, q, g, *kk, *vv, *kcc, *vcc, lens, out));
          setArgs.back().kvLensHost = hostLens.data();
        }
        for (const nsaLayerDecodeArgs &ai : setArgs)
          for (int w = 0; w < 3; ++w)
            if (nsaLayerDecodeAsync(&layer, &ai, nullptr) != nsaSuccess)
              fail("nsaLayerDecodeAsync");
        if (nsaSynchronize() != nsaSuccess)
          fail("nsaSynchronize");
        auto start = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r)
          if (nsaLayerDecodeAsync(&layer, &setArgs[r % sets], nullptr) !=
              nsaSuccess)
            fail("nsaLayerDecodeAsync");
        // The host's time to enqueue a step: where it comes near `step`,
        // the host, not the device, sets the pace.
        double enqueue = std::chrono::duration<double, std::micro>(
                             std::chrono::steady_clock::now() - start)
                             .count() /
                         reps;
        if (nsaSynchronize() != nsaSuccess)
          fail("nsaSynchronize");
        double step = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - start)
                          .count() /
                      reps;
        double tbps = bytes / (step * 1e-6) * 1e-12;
        std::printf("{\"impl\": \"nsa decode, stream-ordered\", "
                    "\"variant\": \"%s\", \"B\": %lld, \"L\": %lld, "
                    "\"us\": %.1f, \"enqueue_us\": %.1f, \"hbm_fraction\": "
                    "%.4f, \"layers\": %lld, \"reps\": %d}\n",
                    variant.c_str(), static_cast<long long>(B),
                    static_cast<long long>(L), step, enqueue, tbps / 4.3,
                    static_cast<long long>(sets), reps);
        // The same steps captured into one graph of the bench's own, as a
        // model captures its whole decoding step, replayed: the time a
        // step (a layer) of the replays.
        Capture &cap = Capture::get();
        CUgraphExec exec = cap.capture([&](CUstream stream) {
          for (const nsaLayerDecodeArgs &ai : setArgs)
            if (nsaLayerDecodeAsync(&layer, &ai, stream) != nsaSuccess)
              fail("nsaLayerDecodeAsync (captured)");
        });
        int64_t replays = std::max<int64_t>(reps / sets, 1);
        for (int w = 0; w < 3; ++w)
          cap.replay(exec);
        cap.wait();
        start = std::chrono::steady_clock::now();
        for (int64_t r = 0; r < replays; ++r)
          cap.replay(exec);
        cap.wait();
        step = std::chrono::duration<double, std::micro>(
                   std::chrono::steady_clock::now() - start)
                   .count() /
               (replays * sets);
        cap.cuGraphExecDestroy(exec);
        tbps = bytes / (step * 1e-6) * 1e-12;
        std::printf("{\"impl\": \"nsa decode, captured\", "
                    "\"variant\": \"%s\", \"B\": %lld, \"L\": %lld, "
                    "\"us\": %.1f, \"hbm_fraction\": %.4f, \"layers\": "
                    "%lld, \"reps\": %lld}\n",
                    variant.c_str(), static_cast<long long>(B),
                    static_cast<long long>(L), step, tbps / 4.3,
                    static_cast<long long>(sets),
                    static_cast<long long>(replays * sets));
      }
      // One profiled step: each kernel's time, by the op it was named after.
      nsaProfileBegin();
      if (nsaLayerDecode(&layer, &a) != nsaSuccess)
        fail("nsaLayerDecode");
      std::vector<nsaKernelTime> times(64);
      int64_t count = nsaProfileEnd(times.data(), times.size());
      times.resize(std::min<int64_t>(count, times.size()));
      for (const nsaKernelTime &t : times)
        std::printf("{\"impl\": \"nsa decode kernel: %s\", \"B\": %lld, "
                    "\"L\": %lld, \"us\": %.1f}\n",
                    t.name, static_cast<long long>(B),
                    static_cast<long long>(L), t.ms * 1e3);
      std::fflush(stdout);
    }
  return ok ? 0 : 1;
}
