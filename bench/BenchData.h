//===- BenchData.h - bf16 data of the decoding bench ------------*- C++ -*-===//
//
// The bf16 conversions and the fixed-seed random inputs of
// nsa-decode-bench, shared with bench/micro/decode_ties.cpp so that the
// micro scores exactly the bench's check data.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_BENCH_BENCHDATA_H
#define NSA_BENCH_BENCHDATA_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace nsa::bench {

/// f32 to bf16, round to nearest even; NaN stays a quiet NaN.
inline uint16_t toBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f))
    return 0x7fc0;
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

inline float fromBF16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// `count` random bf16 in [-1, 1) from a fixed-seed LCG.
inline std::vector<uint16_t> randomBF16(size_t count, uint64_t seed) {
  std::vector<uint16_t> out(count);
  uint64_t state = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (uint16_t &h : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    h = toBF16(static_cast<float>((state >> 40) * 0x1.0p-23 - 1.0));
  }
  return out;
}

} // namespace nsa::bench

#endif // NSA_BENCH_BENCHDATA_H
