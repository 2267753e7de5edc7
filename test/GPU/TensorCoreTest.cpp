//===- TensorCoreTest.cpp - the tensor-core fragment paths on a GPU -------===//
//
// Runs mma-paths.mlir (compiled ahead of time through nsa-to-ptx with
// block-size=64) and compares each of its four contraction paths (ldmatrix,
// ldmatrix.trans, single loads from global memory, single loads from
// misaligned shared rows) with a float64 product of the same bf16 inputs.
// Skipped where there is no GPU.
//
//===----------------------------------------------------------------------===//

#include "GPUTest.h"

#include "NSA/Runtime/nsa_runtime.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using nsa_gpu_test::Result;

namespace {
template <typename T, int Rank> struct MemRef {
  T *allocated, *aligned;
  int64_t offset, sizes[Rank], strides[Rank];
};

template <typename T, int Rank>
MemRef<T, Rank> view(std::vector<T> &data, const int64_t (&shape)[Rank]) {
  MemRef<T, Rank> m{data.data(), data.data(), 0, {}, {}};
  int64_t stride = 1;
  for (int i = Rank - 1; i >= 0; --i) {
    m.sizes[i] = shape[i];
    m.strides[i] = stride;
    stride *= shape[i];
  }
  return m;
}

constexpr int64_t kTiles = 4, kM = 32, kN = 40, kK = 64, kPaths = 4;

/// Random bf16 bits (truncated floats) and their values.
std::vector<uint16_t> randomBF16(size_t n, uint64_t seed,
                                 std::vector<double> &values) {
  std::vector<float> f = nsa_gpu_test::randomFloats(n, seed);
  std::vector<uint16_t> bits(n);
  values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t word;
    std::memcpy(&word, &f[i], 4);
    bits[i] = static_cast<uint16_t>(word >> 16);
    word = static_cast<uint32_t>(bits[i]) << 16;
    float back;
    std::memcpy(&back, &word, 4);
    values[i] = back;
  }
  return bits;
}
} // namespace

extern "C" void _mlir_ciface_mma_paths(MemRef<uint16_t, 3> *a,
                                       MemRef<uint16_t, 3> *b,
                                       MemRef<uint16_t, 3> *bn,
                                       MemRef<float, 4> *out);

NSA_GPU_TEST(EveryFragmentPathMatchesFloat64) {
  if (nsaInit(0) != nsaSuccess)
    return message = std::string("no GPU: ") + nsaGetLastError(), Result::Skip;
  std::vector<double> av, bv, unused;
  std::vector<uint16_t> a = randomBF16(kTiles * kM * kK, 1, av);
  std::vector<uint16_t> b = randomBF16(kTiles * kN * kK, 2, bv);
  // The same B stored [k][n].
  std::vector<uint16_t> bn(b.size());
  for (int64_t t = 0; t < kTiles; ++t)
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t k = 0; k < kK; ++k)
        bn[(t * kK + k) * kN + n] = b[(t * kN + n) * kK + k];
  std::vector<float> out(kPaths * kTiles * kM * kN,
                         std::numeric_limits<float>::quiet_NaN());
  auto ma = view(a, {kTiles, kM, kK});
  auto mb = view(b, {kTiles, kN, kK});
  auto mbn = view(bn, {kTiles, kK, kN});
  auto mo = view(out, {kPaths, kTiles, kM, kN});
  _mlir_ciface_mma_paths(&ma, &mb, &mbn, &mo);
  if (nsaTakeAsyncError() != nsaSuccess)
    return message = nsaGetLastError(), Result::Fail;
  const char *names[kPaths] = {"ldmatrix", "ldmatrix.trans", "global B",
                               "misaligned A"};
  double worst = 0;
  for (int64_t p = 0; p < kPaths; ++p) {
    double err = 0, norm = 0;
    for (int64_t t = 0; t < kTiles; ++t)
      for (int64_t m = 0; m < kM; ++m)
        for (int64_t n = 0; n < kN; ++n) {
          double want = 0;
          for (int64_t k = 0; k < kK; ++k)
            want += av[(t * kM + m) * kK + k] * bv[(t * kN + n) * kK + k];
          double got = out[((p * kTiles + t) * kM + m) * kN + n];
          err += (got - want) * (got - want);
          norm += want * want;
        }
    double rel = std::sqrt(err / norm);
    // f32 accumulation of exact bf16 products: far below bf16 rounding.
    if (!(rel <= 1e-5))
      return message = std::string(names[p]) + ": relative L2 error " +
                       std::to_string(rel),
             Result::Fail;
    worst = rel > worst ? rel : worst;
  }
  message = "4 paths x 4 tiles of 32x40x64, relative L2 error <= " +
            std::to_string(worst);
  return Result::Pass;
}

int main() { return nsa_gpu_test::runAll(); }
