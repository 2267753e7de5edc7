//===- ReachTest.cpp - the hop bound against brute-force BFS --------------===//
//
// spec::analyzeReach is exact: it must equal a breadth-first search over the
// token graph from every token, for every backbone pattern and combination,
// and for sequence lengths that end inside a block.
//
//===----------------------------------------------------------------------===//

#include "NSA/Reach.h"

#include "gtest/gtest.h"

#include <random>

using namespace mlir::nsa::spec;

namespace {

struct Pattern {
  const char *name;
  Backbone backbone;
};

std::vector<Pattern> patterns() {
  std::vector<Pattern> p;
  p.push_back({"none", Backbone{}});
  p.push_back({"paper", Backbone{1, 2}});
  p.push_back({"local-only", Backbone{0, 1}});
  p.push_back({"log", Backbone{0, 1, 4}});
  p.push_back({"log-no-local", Backbone{0, 0, 3}});
  p.push_back({"hubs", Backbone{0, 1, 0, 3}});
  p.push_back({"explicit", Backbone{0, 0, 0, 0, {2, 5}}});
  p.push_back({"all", Backbone{1, 2, 2, 4, {3}}});
  return p;
}

TEST(Reach, MatchesBruteForceOnEveryPattern) {
  for (const Pattern &p : patterns())
    for (int64_t block : {1, 4, 7})
      for (int64_t window : {1, 3, 9})
        for (int64_t tokens : {1, 2, 17, 40, 61}) {
          int64_t want = bruteForceHops(tokens, block, window, p.backbone);
          ReachReport got = analyzeReach(tokens, block, window, p.backbone);
          EXPECT_EQ(got.hops, want)
              << p.name << " l'=" << block << " w=" << window
              << " T=" << tokens;
        }
}

TEST(Reach, MatchesBruteForceOnRandomBackbones) {
  std::mt19937_64 gen(42);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  for (int trial = 0; trial < 300; ++trial) {
    Backbone b;
    b.initial = pick(0, 2);
    b.local = pick(0, 3);
    b.logLevels = pick(0, 4);
    b.hubStride = pick(0, 1) ? pick(1, 6) : 0;
    for (int64_t j = 0; j < 12; ++j)
      if (pick(0, 9) == 0)
        b.blocks.push_back(j);
    int64_t block = pick(1, 8), window = pick(1, 12), tokens = pick(1, 90);
    EXPECT_EQ(analyzeReach(tokens, block, window, b).hops,
              bruteForceHops(tokens, block, window, b))
        << "trial " << trial << ": I=" << b.initial << " L=" << b.local
        << " K=" << b.logLevels << " S=" << b.hubStride << " l'=" << block
        << " w=" << window << " T=" << tokens;
  }
}

TEST(Reach, MatchesBruteForceWithManyBlocksAndAttractors) {
  // Up to 160 blocks, hubs of every stride and dense explicit lists: the
  // attractor bound of analyzeReach's last step changes often per source.
  std::mt19937_64 gen(7);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  for (int trial = 0; trial < 80; ++trial) {
    Backbone b;
    b.initial = pick(0, 3);
    b.local = pick(0, 2);
    b.logLevels = pick(0, 3);
    b.hubStride = pick(0, 2) ? pick(1, 12) : 0;
    for (int64_t j = 0; j < 160; ++j)
      if (pick(0, 15) == 0)
        b.blocks.push_back(j);
    int64_t block = pick(1, 2), window = pick(1, 6), tokens = pick(100, 160);
    EXPECT_EQ(analyzeReach(tokens, block, window, b).hops,
              bruteForceHops(tokens, block, window, b))
        << "trial " << trial << ": I=" << b.initial << " L=" << b.local
        << " K=" << b.logLevels << " S=" << b.hubStride << " l'=" << block
        << " w=" << window << " T=" << tokens;
  }
}

TEST(Reach, KnownValues) {
  // Window only, w = 1: no token ever reaches a later one.
  EXPECT_EQ(analyzeReach(10, 4, 1, Backbone{}).hops, -1);
  // A window covering everything: one hop.
  EXPECT_EQ(analyzeReach(100, 16, 100, Backbone{}).hops, 1);
  // Window w alone moves w - 1 tokens a hop: ceil((T - 1) / (w - 1)).
  EXPECT_EQ(analyzeReach(100, 16, 10, Backbone{}).hops, 11);
  // The paper's layer grows linearly; log-spaced blocks make it logarithmic.
  ReachReport paper = analyzeReach(65536, 64, 512, Backbone{1, 2});
  ReachReport log = analyzeReach(65536, 64, 512, Backbone{1, 2, 11});
  EXPECT_GT(paper.hops, 100);
  EXPECT_LE(log.hops, 12);
  // 1024 blocks: 2^0 .. 2^9 back exist, and 2^0 = 1 back is a local block.
  EXPECT_EQ(log.forcedBlocks, 1 + 2 + 9);
}

} // namespace
