//===- RuntimeSmokeTest.cpp - the nsa runtime end to end on a GPU ---------===//
//
// Runs GPU code compiled ahead of time through nsa-to-ptx (runtime-smoke.mlir)
// via the runtime's mgpu* ABI and checks the result. Where no GPU or driver
// is present (CI) the runtime must say so clearly, and the GPU part is
// skipped rather than failed.
//
//===----------------------------------------------------------------------===//

#include "GPUTest.h"

#include "NSA/Runtime/nsa_runtime.h"

#include <cstdint>
#include <string>
#include <vector>

using nsa_gpu_test::Result;

namespace {
struct MemRef1D {
  float *allocated, *aligned;
  int64_t offset, size, stride;
};
} // namespace

extern "C" void _mlir_ciface_double_on_gpu(MemRef1D *host);

static bool haveGPU(std::string &why) {
  nsaStatus s = nsaInit(0);
  why = nsaGetLastError();
  return s == nsaSuccess;
}

NSA_GPU_TEST(ReportsAMissingDriverClearly) {
  if (haveGPU(message))
    return message = "a GPU is present", Result::Skip;
  nsaStatus s = nsaInit(0);
  if (s != nsaErrorNoDriver && s != nsaErrorNoDevice)
    return message = "unexpected status " + std::to_string(s), Result::Fail;
  if (std::string(nsaGetLastError()).find("CUDA") == std::string::npos)
    return message = std::string("unclear: ") + nsaGetLastError(), Result::Fail;
  // Nothing was launched: the module constructor recorded the failure.
  if (nsaTakeAsyncError() == nsaSuccess)
    return message = "no error recorded by the module constructor",
           Result::Fail;
  void *p = nullptr;
  if (nsaMalloc(&p, 16) == nsaSuccess || nsaMalloc(nullptr, 16) !=
                                             nsaErrorInvalidArgument)
    return message = "nsaMalloc did not fail as it should", Result::Fail;
  message = nsaGetLastError();
  return Result::Pass;
}

NSA_GPU_TEST(DoublesAVectorOnTheGPU) {
  if (!haveGPU(message))
    return message = "no GPU: " + message, Result::Skip;
  if (nsaTakeAsyncError() != nsaSuccess)
    return message = nsaGetLastError(), Result::Fail;
  for (int64_t n : {1, 127, 128, 129, 1000003}) {
    std::vector<float> data = nsa_gpu_test::randomFloats(n, n), want(n);
    for (int64_t i = 0; i < n; ++i)
      want[i] = 2 * data[i];
    MemRef1D desc{data.data(), data.data(), 0, n, 1};
    _mlir_ciface_double_on_gpu(&desc);
    if (nsaTakeAsyncError() != nsaSuccess)
      return message = nsaGetLastError(), Result::Fail;
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += !(data[i] == want[i]);
    if (wrong)
      return message = std::to_string(wrong) + " wrong of " +
                       std::to_string(n),
             Result::Fail;
  }
  message = "n = 1, 127, 128, 129, 1000003 exact; 64 KiB dynamic shared memory";
  return Result::Pass;
}

int main() { return nsa_gpu_test::runAll(); }
