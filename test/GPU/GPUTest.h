//===- GPUTest.h - a minimal test harness for the GPU tests ------*- C++ -*-===//
//
// The GPU test binaries are built on the dev machine and run on the GPU
// machine, whose C library may be older: they need no symbol newer than
// GLIBC_2.34 and GLIBCXX_3.4.29, so no GoogleTest and no std::mt19937. Each
// check prints a line; main() ends with "N passed, N failed, N skipped".
//
//===----------------------------------------------------------------------===//

#ifndef NSA_TEST_GPU_GPUTEST_H
#define NSA_TEST_GPU_GPUTEST_H

#include "NSA/Runtime/nsa_runtime.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace nsa_gpu_test {

enum class Result { Pass, Fail, Skip };

struct Test {
  const char *name;
  std::function<Result(std::string &message)> body;
};

inline std::vector<Test> &registry() {
  static std::vector<Test> tests;
  return tests;
}

struct Register {
  Register(const char *name, std::function<Result(std::string &)> body) {
    registry().push_back({name, std::move(body)});
  }
};

/// Uniform values in [-1, 1) from a fixed seed (splitmix64; std::mt19937
/// would pull in libstdc++'s random.o and a newer libc symbol).
inline std::vector<float> randomFloats(size_t n, uint64_t seed) {
  std::vector<float> out(n);
  for (float &x : out) {
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
  }
  return out;
}

/// The exit status of a run with no failures where there is no GPU: ctest
/// reports the test as skipped (SKIP_RETURN_CODE in test/GPU/CMakeLists.txt),
/// not passed.
constexpr int kNoGPUExitCode = 77;

/// Runs every registered test whose name contains $NSA_GPU_TEST_FILTER
/// (all when unset); returns the process exit status: 1 if any failed, else
/// kNoGPUExitCode if tests were skipped for want of a GPU, else 0.
inline int runAll() {
  int passed = 0, failed = 0, skipped = 0;
  const char *filter = std::getenv("NSA_GPU_TEST_FILTER");
  for (const Test &t : registry()) {
    if (filter && !std::strstr(t.name, filter))
      continue;
    std::string message;
    Result r = t.body(message);
    const char *tag = r == Result::Pass   ? "PASS"
                      : r == Result::Skip ? "SKIP"
                                          : "FAIL";
    std::printf("[%s] %s%s%s\n", tag, t.name, message.empty() ? "" : ": ",
                message.c_str());
    (r == Result::Pass ? passed : r == Result::Skip ? skipped : failed)++;
  }
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  if (failed)
    return 1;
  if (skipped && nsaInit(0) != nsaSuccess) {
    std::printf("no GPU: reported as skipped\n");
    return kNoGPUExitCode;
  }
  return 0;
}

} // namespace nsa_gpu_test

#define NSA_GPU_TEST(name)                                                     \
  static nsa_gpu_test::Result name(std::string &message);                     \
  static nsa_gpu_test::Register name##Registration(#name, name);               \
  static nsa_gpu_test::Result name(std::string &message)

#endif // NSA_TEST_GPU_GPUTEST_H
