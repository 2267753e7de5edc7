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

/// The ranges random backbones, blocks, windows and lengths are drawn from.
struct RandomCases {
  uint64_t seed;
  int trials;
  int64_t maxInitial, maxLocal, maxLogLevels;
  int64_t hubOdds, maxHubStride; ///< hubs unless pick(0, hubOdds) == 0
  int64_t explicitSpan, explicitOdds; ///< j < span listed when pick(0, odds) == 0
  int64_t maxBlock, maxWindow, minTokens, maxTokens;
};

void expectRandomCasesMatchBruteForce(const RandomCases &r) {
  std::mt19937_64 gen(r.seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  for (int trial = 0; trial < r.trials; ++trial) {
    Backbone b;
    b.initial = pick(0, r.maxInitial);
    b.local = pick(0, r.maxLocal);
    b.logLevels = pick(0, r.maxLogLevels);
    b.hubStride = pick(0, r.hubOdds) ? pick(1, r.maxHubStride) : 0;
    for (int64_t j = 0; j < r.explicitSpan; ++j)
      if (pick(0, r.explicitOdds) == 0)
        b.blocks.push_back(j);
    int64_t block = pick(1, r.maxBlock), window = pick(1, r.maxWindow);
    int64_t tokens = pick(r.minTokens, r.maxTokens);
    EXPECT_EQ(analyzeReach(tokens, block, window, b).hops,
              bruteForceHops(tokens, block, window, b))
        << "seed " << r.seed << " trial " << trial << ": I=" << b.initial
        << " L=" << b.local << " K=" << b.logLevels << " S=" << b.hubStride
        << " l'=" << block << " w=" << window << " T=" << tokens;
  }
}

TEST(Reach, MatchesBruteForceOnRandomBackbones) {
  expectRandomCasesMatchBruteForce({42, 300, 2, 3, 4, 1, 6, 12, 9, 8, 12, 1, 90});
}

TEST(Reach, MatchesBruteForceWithManyBlocksAndAttractors) {
  // Up to 160 blocks, hubs of every stride and dense explicit lists: the
  // attractor bound of analyzeReach's last step changes often per source.
  expectRandomCasesMatchBruteForce(
      {7, 80, 3, 2, 3, 2, 12, 160, 15, 2, 6, 100, 160});
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
