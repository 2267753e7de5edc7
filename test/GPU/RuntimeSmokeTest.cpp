//===- RuntimeSmokeTest.cpp - the nsa runtime end to end on a GPU ---------===//
//
// Runs GPU code compiled ahead of time through nsa-to-ptx (runtime-smoke.mlir)
// via the runtime's mgpu* ABI and checks the result. Where no GPU or driver
// is present (CI) the runtime must say so clearly, and the GPU part is
// skipped rather than failed.
//
//===----------------------------------------------------------------------===//

#include "NSA/Runtime/nsa_runtime.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

struct MemRef1D {
  float *allocated, *aligned;
  int64_t offset, size, stride;
};

} // namespace

extern "C" void _mlir_ciface_double_on_gpu(MemRef1D *host);

namespace {

bool haveGPU(std::string &why) {
  nsaStatus s = nsaInit(0);
  why = nsaGetLastError();
  return s == nsaSuccess;
}

TEST(Runtime, ReportsAMissingDriverClearly) {
  std::string why;
  if (haveGPU(why))
    GTEST_SKIP() << "a GPU is present";
  EXPECT_TRUE(nsaInit(0) == nsaErrorNoDriver || nsaInit(0) == nsaErrorNoDevice);
  EXPECT_NE(std::string(nsaGetLastError()).find("CUDA"), std::string::npos)
      << nsaGetLastError();
  // Nothing is launched: the module constructor recorded the failure.
  EXPECT_NE(nsaTakeAsyncError(), nsaSuccess);
  void *p = nullptr;
  EXPECT_NE(nsaMalloc(&p, 16), nsaSuccess);
  EXPECT_EQ(nsaMalloc(nullptr, 16), nsaErrorInvalidArgument);
}

TEST(Runtime, DoublesAVectorOnTheGPU) {
  std::string why;
  if (!haveGPU(why))
    GTEST_SKIP() << "no GPU: " << why;
  ASSERT_EQ(nsaTakeAsyncError(), nsaSuccess) << nsaGetLastError();
  for (int64_t n : {1, 127, 128, 129, 1000003}) {
    std::mt19937 gen(n);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<float> data(n), want(n);
    for (int64_t i = 0; i < n; ++i) {
      data[i] = dist(gen);
      want[i] = 2 * data[i];
    }
    MemRef1D desc{data.data(), data.data(), 0, n, 1};
    _mlir_ciface_double_on_gpu(&desc);
    ASSERT_EQ(nsaTakeAsyncError(), nsaSuccess) << nsaGetLastError();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += !(data[i] == want[i]);
    EXPECT_EQ(wrong, 0) << "n = " << n;
  }
}

} // namespace
