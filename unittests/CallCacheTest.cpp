//===- CallCacheTest.cpp - the graph cache's policy on the CPU ------------===//
//
// runtime/gpu/CallCache.h decides which calls nsaRunGraph remembers and
// which it drops; the GPU runtime only frees what those hold. These tests
// run that policy without a driver: LRU order under NSA_GRAPH_CALLS, the
// workspace budget under NSA_GRAPH_MEMORY, the environment parser, and that
// a call found stays put while others are dropped.
//
//===----------------------------------------------------------------------===//

#include "CallCache.h"

#include "gtest/gtest.h"

#include <functional>
#include <string>
#include <vector>

using nsa::runtime::CallCache;
using nsa::runtime::CallHash;
using nsa::runtime::environmentCount;

namespace {

struct Call {
  uint64_t hash;
  int id;
  size_t arenaBytes = 0;
};

/// Ids, least recently used first.
std::vector<int> ids(const CallCache<Call> &cache) {
  std::vector<int> out;
  for (const Call &c : cache.order())
    out.push_back(c.id);
  return out;
}

/// Finds call `id` (hash id % 4, so that hashes collide and the match
/// decides).
Call *find(CallCache<Call> &cache, int id) {
  return cache.find(uint64_t(id % 4), [&](const Call &c) { return c.id == id; });
}

struct Released {
  std::vector<int> ids;
  void operator()(Call &c) { ids.push_back(c.id); }
};

TEST(CallCache, FindsOnlyWhatItRemembers) {
  CallCache<Call> cache;
  Released released;
  EXPECT_EQ(find(cache, 1), nullptr);
  cache.remember({1, 1}, 8, std::ref(released));
  cache.remember({1, 5}, 8, std::ref(released));
  ASSERT_NE(find(cache, 1), nullptr);
  EXPECT_EQ(find(cache, 1)->id, 1);
  EXPECT_EQ(find(cache, 5)->id, 5);
  EXPECT_EQ(find(cache, 9), nullptr); // Same hash, no match.
  EXPECT_TRUE(released.ids.empty());
}

TEST(CallCache, ComparesTheHashFirst) {
  CallCache<Call> cache;
  Released released;
  for (int id = 0; id < 6; ++id)
    cache.remember({uint64_t(id), id}, 8, std::ref(released));
  int compared = 0;
  Call *c = cache.find(3, [&](const Call &c) {
    ++compared;
    return c.id == 3;
  });
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->id, 3);
  EXPECT_EQ(compared, 1);
}

TEST(CallCache, DropsTheLeastRecentlyUsed) {
  CallCache<Call> cache;
  Released released;
  for (int id = 1; id <= 3; ++id)
    cache.remember({uint64_t(id % 4), id}, 3, std::ref(released));
  EXPECT_EQ(ids(cache), (std::vector<int>{1, 2, 3}));
  find(cache, 1);
  EXPECT_EQ(ids(cache), (std::vector<int>{2, 3, 1}));
  cache.remember({0, 4}, 3, std::ref(released));
  EXPECT_EQ(released.ids, std::vector<int>{2});
  EXPECT_EQ(ids(cache), (std::vector<int>{3, 1, 4}));
  EXPECT_EQ(find(cache, 2), nullptr);
}

// A model cycling through one more call than the limit never finds one (the
// reason NSA_GRAPH_CALLS defaults to 512); at the limit every call is found
// after the first round.
TEST(CallCache, CyclingThroughCalls) {
  for (int calls : {4, 5}) {
    CallCache<Call> cache;
    Released released;
    int found = 0;
    for (int round = 0; round < 3; ++round)
      for (int id = 0; id < calls; ++id) {
        if (find(cache, id))
          ++found;
        else
          cache.remember({uint64_t(id % 4), id}, 4, std::ref(released));
      }
    EXPECT_EQ(found, calls == 4 ? 8 : 0) << calls << " calls";
    EXPECT_LE(cache.size(), 4u);
  }
}

TEST(CallCache, TrimKeepsTheWorkspaceUnderBudget) {
  CallCache<Call> cache;
  Released released;
  // 1: 40 bytes, 2: none, 3: 30, 4: 50 (the most recent).
  cache.remember({1, 1, 40}, 8, std::ref(released));
  cache.remember({2, 2, 0}, 8, std::ref(released));
  cache.remember({3, 3, 30}, 8, std::ref(released));
  cache.remember({0, 4, 50}, 8, std::ref(released));
  EXPECT_EQ(cache.arenaBytes(), 120u);
  cache.trim(120, std::ref(released));
  EXPECT_TRUE(released.ids.empty());
  // Over by 1: the least recently used with a workspace goes; the call
  // without one stays.
  cache.trim(119, std::ref(released));
  EXPECT_EQ(released.ids, std::vector<int>{1});
  EXPECT_EQ(ids(cache), (std::vector<int>{2, 3, 4}));
  // Made recent, 3 outlives 4.
  find(cache, 3);
  cache.trim(31, std::ref(released));
  EXPECT_EQ(released.ids, (std::vector<int>{1, 4}));
  EXPECT_EQ(ids(cache), (std::vector<int>{2, 3}));
  EXPECT_EQ(cache.arenaBytes(), 30u);
}

TEST(CallCache, TrimNeverDropsTheMostRecent) {
  CallCache<Call> cache;
  Released released;
  cache.remember({1, 1, 10}, 8, std::ref(released));
  Call &recent = cache.remember({2, 2, 1000}, 8, std::ref(released));
  cache.trim(1, std::ref(released));
  EXPECT_EQ(released.ids, std::vector<int>{1});
  EXPECT_EQ(ids(cache), std::vector<int>{2});
  EXPECT_EQ(recent.arenaBytes, 1000u);
}

// nsaRunGraph holds the call it found while it captures and trims.
TEST(CallCache, AFoundCallStaysPut) {
  CallCache<Call> cache;
  Released released;
  for (int id = 0; id < 4; ++id)
    cache.remember({uint64_t(id), id, 8}, 4, std::ref(released));
  Call *two = find(cache, 2);
  ASSERT_NE(two, nullptr);
  cache.trim(8, std::ref(released));
  EXPECT_EQ(released.ids, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(two, &cache.order().back());
  EXPECT_EQ(two->id, 2);
}

TEST(CallCache, LimitOfZeroKeepsOne) {
  CallCache<Call> cache;
  Released released;
  cache.remember({1, 1}, 0, std::ref(released));
  cache.remember({2, 2}, 0, std::ref(released));
  EXPECT_EQ(ids(cache), std::vector<int>{2});
}

TEST(CallHash, DependsOnEveryWordAndItsPlace) {
  auto of = [](std::vector<uint64_t> words) {
    CallHash h;
    for (uint64_t w : words)
      h.mix(w);
    return h.get();
  };
  EXPECT_EQ(of({1, 2, 3}), of({1, 2, 3}));
  EXPECT_NE(of({1, 2, 3}), of({1, 3, 2}));
  EXPECT_NE(of({1, 2, 3}), of({1, 2, 4}));
  EXPECT_NE(of({1, 2}), of({1, 2, 0}));
  EXPECT_EQ(of({}), 0xcbf29ce484222325ull);
}

TEST(EnvironmentCount, ReadsWholeNumbersInRange) {
  const char *name = "NSA_CALL_CACHE_TEST";
  ::unsetenv(name);
  EXPECT_EQ(environmentCount(name, 512, 1000), 512u);
  ::setenv(name, "", 1);
  EXPECT_EQ(environmentCount(name, 512, 1000), 512u);
  ::setenv(name, "7", 1);
  EXPECT_EQ(environmentCount(name, 512, 1000), 7u);
  ::setenv(name, "1000", 1);
  EXPECT_EQ(environmentCount(name, 512, 1000), 1000u);
  ::setenv(name, "1", 1);
  EXPECT_EQ(environmentCount(name, 512, 1000), 1u);
  ::unsetenv(name);
}

TEST(EnvironmentCount, WarnsAndFallsBack) {
  const char *name = "NSA_CALL_CACHE_TEST";
  for (const char *bad :
       {"0", "1001", "-3", "+3", " 3", "3 ", "3x", "abc", "1e3", "0x10",
        "99999999999999999999999"}) {
    ::setenv(name, bad, 1);
    testing::internal::CaptureStderr();
    EXPECT_EQ(environmentCount(name, 512, 1000), 512u) << bad;
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find(std::string("ignoring NSA_CALL_CACHE_TEST=") + bad),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("using 512"), std::string::npos) << err;
  }
  ::unsetenv(name);
}

} // namespace
