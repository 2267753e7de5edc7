//===- CallCache.h - the calls the graph cache remembers --------*- C++ -*-===//
//
// The policy of nsaRunGraph's graph cache, apart from the driver: which
// calls are remembered, which one a call is, and which are dropped (the
// least recently used past NSA_GRAPH_CALLS calls, and those holding
// workspace past NSA_GRAPH_MEMORY). CudaRuntime.cpp keeps the graphs and
// frees them in the `release` callbacks; unittests/CallCacheTest.cpp checks
// the policy on the CPU.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_RUNTIME_GPU_CALLCACHE_H
#define NSA_RUNTIME_GPU_CALLCACHE_H

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <list>
#include <utility>

namespace nsa::runtime {

/// FNV-1a over 64-bit words: a call's identity, compared before its key.
class CallHash {
public:
  void mix(uint64_t word) { value = (value ^ word) * 0x100000001b3ull; }
  uint64_t get() const { return value; }

private:
  uint64_t value = 0xcbf29ce484222325ull;
};

/// The whole number from 1 to `max` that environment variable `name`
/// holds, or `fallback` where it is unset or empty; anything else is
/// reported on stderr and ignored.
inline size_t environmentCount(const char *name, size_t fallback,
                               size_t max) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    return fallback;
  char *end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (*end || !std::isdigit(static_cast<unsigned char>(*v)) || n < 1 ||
      n > max) {
    std::fprintf(stderr,
                 "nsa: ignoring %s=%s (not a whole number from 1 to %zu); "
                 "using %zu\n",
                 name, v, max, fallback);
    return fallback;
  }
  return static_cast<size_t>(n);
}

/// Calls, the most recently used last. A list: a model cycling through its
/// layers' calls finds each at the front and moves it to the back, which
/// must not cost a move per remembered call, and a call found stays where
/// it is (its address too) until it is dropped. `Call` has a `uint64_t
/// hash` and a `size_t arenaBytes` (the workspace its graph holds).
template <typename Call> class CallCache {
public:
  /// The call with `hash` that `matches` accepts, made the most recent;
  /// null where there is none.
  template <typename Match> Call *find(uint64_t hash, Match matches) {
    auto it = std::find_if(calls.begin(), calls.end(), [&](const Call &c) {
      return c.hash == hash && matches(c);
    });
    if (it == calls.end())
      return nullptr;
    calls.splice(calls.end(), calls, it);
    return &calls.back();
  }

  /// Remembers `call` as the most recent, first dropping the least recently
  /// used (`release` frees what each holds) while `limit` (at least 1) or
  /// more are remembered.
  template <typename Release>
  Call &remember(Call call, size_t limit, Release release) {
    while (!calls.empty() && calls.size() >= std::max<size_t>(limit, 1)) {
      release(calls.front());
      calls.pop_front();
    }
    calls.push_back(std::move(call));
    return calls.back();
  }

  /// Drops the least recently used calls that hold a workspace, never the
  /// most recent, while the workspaces come to more than `bytes`.
  template <typename Release> void trim(size_t bytes, Release release) {
    size_t total = arenaBytes();
    for (auto it = calls.begin();
         total > bytes && std::next(it) != calls.end();) {
      if (!it->arenaBytes) {
        ++it;
        continue;
      }
      total -= it->arenaBytes;
      release(*it);
      it = calls.erase(it);
    }
  }

  /// The workspace the remembered calls hold together.
  size_t arenaBytes() const {
    size_t total = 0;
    for (const Call &c : calls)
      total += c.arenaBytes;
    return total;
  }

  size_t size() const { return calls.size(); }
  /// Least recently used first.
  const std::list<Call> &order() const { return calls; }

private:
  std::list<Call> calls;
};

} // namespace nsa::runtime

#endif // NSA_RUNTIME_GPU_CALLCACHE_H
