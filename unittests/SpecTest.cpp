//===- SpecTest.cpp - the spec's forced-block counts against enumeration --===//
//
// Backbone::countForcedBlocks and maxForcedBlocks (closed form, bounded
// work) against the enumeration by forcedBlocks on random small patterns,
// and on the sizes that used to exhaust memory or time (issue 13).
//
//===----------------------------------------------------------------------===//

#include "NSA/Spec.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>

using mlir::nsa::spec::Backbone;

namespace {

int64_t enumeratedMax(const Backbone &bb, int64_t maxQueryBlock) {
  int64_t most = 0;
  std::vector<int64_t> tmp;
  for (int64_t c = 0; c <= maxQueryBlock; ++c) {
    tmp.clear();
    bb.forcedBlocks(c, tmp);
    most = std::max<int64_t>(most, tmp.size());
  }
  return most;
}

Backbone randomBackbone(std::mt19937_64 &rng, bool hubs) {
  auto pick = [&](int64_t n) {
    return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
  };
  Backbone bb;
  bb.initial = pick(6);
  bb.local = pick(6);
  bb.logLevels = pick(7);
  bb.hubStride = hubs && pick(2) ? 1 + pick(9) : 0;
  for (int64_t j = 0; j < 48; ++j)
    if (pick(8) == 0)
      bb.blocks.push_back(j);
  return bb;
}

TEST(Spec, ForcedBlockCountMatchesEnumeration) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> tmp;
  for (int trial = 0; trial < 3000; ++trial) {
    Backbone bb = randomBackbone(rng, true);
    for (int64_t c = 0; c < 160; ++c) {
      tmp.clear();
      bb.forcedBlocks(c, tmp);
      ASSERT_EQ(bb.countForcedBlocks(c), static_cast<int64_t>(tmp.size()))
          << "trial " << trial << ", c = " << c;
    }
  }
}

TEST(Spec, MaxForcedBlocksMatchesEnumeration) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    Backbone bb = randomBackbone(rng, true);
    int64_t bound = static_cast<int64_t>(rng() % 300);
    ASSERT_EQ(bb.maxForcedBlocks(bound), enumeratedMax(bb, bound))
        << "trial " << trial << ", bound " << bound;
    if (bb.hubStride == 0) {
      // Unbounded: the supremum, reached by some query within 2^7 + 60.
      ASSERT_EQ(bb.maxForcedBlocks(), enumeratedMax(bb, 400)) << trial;
    } else {
      ASSERT_EQ(bb.maxForcedBlocks(), -1);
    }
  }
}

TEST(Spec, HugePatternsAndBoundsStayCheap) {
  auto start = std::chrono::steady_clock::now();
  Backbone wide;
  wide.initial = 2147483647; // the config that listed 2^31 blocks
  wide.local = 2;
  EXPECT_EQ(wide.maxForcedBlocks(), int64_t(2147483647) + 2);
  EXPECT_EQ(wide.maxForcedBlocks(int64_t(1) << 56), int64_t(2147483647) + 2);
  EXPECT_EQ(wide.maxForcedBlocks(100), 101);

  Backbone paper; // 1 initial, 2 local: max_tokens = 2^62, T = 2^40
  paper.initial = 1;
  paper.local = 2;
  EXPECT_EQ(paper.maxForcedBlocks((int64_t(1) << 62) / 64), 3);
  EXPECT_EQ(paper.maxForcedBlocks((int64_t(1) << 40) / 64), 3);

  Backbone logs;
  logs.initial = 1;
  logs.local = 1;
  logs.logLevels = 62;
  logs.blocks = {5, 1000, int64_t(1) << 40};
  int64_t m = int64_t(1) << 50;
  int64_t got = logs.maxForcedBlocks(m);
  EXPECT_GE(got, logs.countForcedBlocks(m));
  EXPECT_LE(got, 1 + 1 + 62 + 3);
  EXPECT_EQ(logs.maxForcedBlocks(), 1 + 1 + 62 + 3);

  Backbone hubs;
  hubs.initial = 1;
  hubs.local = 2;
  hubs.hubStride = 1 << 20;
  int64_t huge = int64_t(1) << 56;
  EXPECT_EQ(hubs.maxForcedBlocks(huge), hubs.countForcedBlocks(huge));
  EXPECT_EQ(hubs.maxForcedBlocks(), -1);

  double seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  EXPECT_LT(seconds, 5.0);
}

} // namespace
