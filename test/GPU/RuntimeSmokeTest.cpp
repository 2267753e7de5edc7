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
#include <cstring>
#include <utility>
#include <string>
#include <vector>

using nsa_gpu_test::Result;

namespace {
struct MemRef1D {
  float *allocated, *aligned;
  int64_t offset, size, stride;
};

struct MemRef2D {
  uint16_t *allocated, *aligned;
  int64_t offset, sizes[2], strides[2];
};
} // namespace

extern "C" void _mlir_ciface_double_on_gpu(MemRef1D *host);
extern "C" void _mlir_ciface_tma_copy(MemRef2D *in, MemRef2D *out,
                                      MemRef1D *nonzero);
// The runtime's TMA entry point (CUtensorMapDataType etc. are C enums).
extern "C" void *mgpuTensorMapEncodeTiledMemref(int64_t rank, void *descriptor,
                                                int dataType, int interleave,
                                                int swizzle, int l2Promotion,
                                                int oobFill, int64_t *boxDims);
constexpr int kBF16 = 9; // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16

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
  // The modules' constructors do not touch the driver (it is loaded on a
  // module's first kernel), so nothing failed before this call.
  if (nsaTakeAsyncError() != nsaSuccess)
    return message = std::string("the module constructors touched the "
                                 "driver: ") + nsaGetLastError(),
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
  // Kernel timings: one timed launch of the named kernel.
  std::vector<float> data(4096, 1.0f);
  MemRef1D desc{data.data(), data.data(), 0, 4096, 1};
  nsaProfileBegin();
  _mlir_ciface_double_on_gpu(&desc);
  nsaKernelTime times[4];
  int64_t kernels = nsaProfileEnd(times, 4);
  if (kernels != 1 || std::string(times[0].name) != "double_in_place" ||
      times[0].launches != 1 || !(times[0].ms > 0) || data[4095] != 2.0f)
    return message = "kernel timing: " + std::to_string(kernels) +
                     " kernels, first " + (kernels ? times[0].name : "-"),
           Result::Fail;
  _mlir_ciface_double_on_gpu(&desc); // not timed any more
  if (nsaProfileEnd(times, 4) != 1 || times[0].launches != 1)
    return message = "timed after nsaProfileEnd", Result::Fail;
  message = "n = 1, 127, 128, 129, 1000003 exact; 64 KiB dynamic shared "
            "memory; timed launch " +
            std::to_string(times[0].ms) + " ms";
  return Result::Pass;
}

NSA_GPU_TEST(TensorMapEncodingRejectsBadTensors) {
  // Checked before the driver is asked: runs without a GPU too.
  alignas(16) static uint16_t data[64 * 64];
  struct Bad {
    const char *expect;
    int64_t rank, offset, sizes[2], strides[2], box[2];
  } cases[] = {
      {"not 16-byte aligned", 2, 3, {64, 64}, {64, 1}, {64, 64}},
      {"stride of 200 bytes", 2, 0, {64, 100}, {100, 1}, {64, 64}},
      {"innermost stride is 2", 2, 0, {64, 32}, {64, 2}, {64, 32}},
      {"box sides 1 to 256", 2, 0, {64, 64}, {64, 1}, {64, 300}},
      {"rank 6", 6, 0, {64, 64}, {64, 1}, {64, 64}},
  };
  for (Bad &c : cases) {
    int64_t desc[7] = {reinterpret_cast<int64_t>(data),
                       reinterpret_cast<int64_t>(data),
                       c.offset,
                       c.sizes[0],
                       c.sizes[1],
                       c.strides[0],
                       c.strides[1]};
    void *map = mgpuTensorMapEncodeTiledMemref(c.rank, desc, kBF16, 0, 0, 0, 0,
                                               c.box);
    nsaStatus s = nsaTakeAsyncError();
    std::string got = nsaGetLastError();
    if (map || s != nsaErrorInvalidArgument ||
        got.find(c.expect) == std::string::npos)
      return message = std::string("expected '") + c.expect + "', got " + got,
             Result::Fail;
  }
  message = "5 bad tensors refused, e.g. " + std::string(nsaGetLastError());
  return Result::Pass;
}

NSA_GPU_TEST(CopiesThroughTMATiles) {
  if (!haveGPU(message))
    return message = "no GPU: " + message, Result::Skip;
  if (nsaTakeAsyncError() != nsaSuccess)
    return message = nsaGetLastError(), Result::Fail;
  // Tile multiples and not (TMA needs rows of a multiple of 16 bytes).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{128, 64},
                            {200, 136},
                            {1, 8},
                            {1000, 1000}}) {
    std::vector<float> f = nsa_gpu_test::randomFloats(rows * cols, rows + cols);
    std::vector<uint16_t> in(rows * cols), out(rows * cols, 0xffff);
    for (size_t i = 0; i < in.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &f[i], 4);
      in[i] = static_cast<uint16_t>(bits >> 16);
    }
    int32_t nonzero = 0;
    MemRef2D a{in.data(), in.data(), 0, {rows, cols}, {cols, 1}};
    MemRef2D b{out.data(), out.data(), 0, {rows, cols}, {cols, 1}};
    MemRef1D n{reinterpret_cast<float *>(&nonzero),
               reinterpret_cast<float *>(&nonzero), 0, 1, 1};
    _mlir_ciface_tma_copy(&a, &b, &n);
    if (nsaTakeAsyncError() != nsaSuccess)
      return message = nsaGetLastError(), Result::Fail;
    int64_t wrong = 0;
    for (size_t i = 0; i < in.size(); ++i)
      wrong += in[i] != out[i];
    if (wrong || nonzero)
      return message = std::to_string(rows) + "x" + std::to_string(cols) +
                       ": " + std::to_string(wrong) + " wrong, " +
                       std::to_string(nonzero) + " unfilled out-of-bounds",
             Result::Fail;
  }
  // Equal maps share one device copy.
  alignas(16) static uint16_t host[64 * 64];
  void *dev = nullptr;
  nsaMalloc(&dev, sizeof(host));
  int64_t desc[7] = {reinterpret_cast<int64_t>(dev),
                     reinterpret_cast<int64_t>(dev), 0, 64, 64, 64, 1};
  int64_t box[2] = {64, 64};
  void *m1 = mgpuTensorMapEncodeTiledMemref(2, desc, kBF16, 0, 0, 0, 0, box);
  void *m2 = mgpuTensorMapEncodeTiledMemref(2, desc, kBF16, 0, 0, 0, 0, box);
  nsaFree(dev);
  if (!m1 || m1 != m2 || nsaTakeAsyncError() != nsaSuccess)
    return message = "tensor maps not shared", Result::Fail;
  message = "128x64, 200x136, 1x8, 1000x1000 bf16 exact through 64x64 TMA "
            "tiles, zero fill outside";
  return Result::Pass;
}

int main() { return nsa_gpu_test::runAll(); }
