//===- Reach.cpp - worst-case hop bound of an NSA backbone ----------------===//
//
// The algorithm of docs/Spec.md, "Reach". Token x reaches token t >= x in one
// hop (one layer) when t - x < w or block(x) is forced for block(t).
//
// 1. Sources: for s0 < s1 in one block, every t >= s1 needs at least as many
//    hops from s0 as from s1, so only the first token of each block is a
//    worst-case source.
// 2. Relative edges (window, local, log-spaced) are invariant under shifts by
//    whole blocks: one breadth-first search from token 0 over per-block
//    states "reached = [0, p) u [q, l')" gives, for every block offset j, the
//    hop at which block j is first entered (always at its offset 0), becomes
//    full, and has its first `T mod l'` tokens reached.
// 3. Absolute patterns (initial, hubs, explicit) are attractors: once their
//    block a is entered at hop e, every later token is reached at e + 1.
//    So dist(b0, t) = min(rel(t - b0), 1 + min over attractors a in
//    [b0, block(t)] of entry(a - b0)), maximised over b0 and t.
//
//===----------------------------------------------------------------------===//

#include "NSA/Reach.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <vector>

using namespace mlir::nsa::spec;

namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

/// a * b, or the largest int64 where that overflows (a, b >= 0).
int64_t saturatingMul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max()
                                          : r;
}

/// Hops from the first token of block 0 using only the relative edges.
struct RelativeReach {
  std::vector<int64_t> entry;   ///< block j first reached (at offset 0)
  std::vector<int64_t> full;    ///< every token of block j reached
  std::vector<int64_t> partial; ///< tokens [0, m) of block j reached
  bool tooCostly = false;       ///< stopped after kMaxReachSteps updates
};

RelativeReach relativeReach(int64_t numBlocks, int64_t blockSize,
                            int64_t partialLen, int64_t window,
                            const Backbone &bb) {
  const int64_t B = blockSize;
  RelativeReach r;
  // Without the own block forced (local = 0) block 0 fills through the
  // window alone, w - 1 tokens a hop, each hop at least one step: where
  // that is past the step bound the search would end refused, so refuse
  // now (two blocks of 2^40 tokens and w = 17 took 2^24 steps, 0.4 s, to
  // get there; w = 1 never fills a block and is answered by the search).
  if (bb.local == 0 && window > 1 && (B - 1) / (window - 1) > kMaxReachSteps) {
    r.tooCostly = true;
    return r;
  }
  std::vector<int64_t> p(numBlocks, 0), q(numBlocks, B);
  r.entry.assign(numBlocks, kInf);
  r.full.assign(numBlocks, kInf);
  r.partial.assign(numBlocks, kInf);
  auto record = [&](int64_t c, int64_t hop) {
    if (q[c] <= p[c]) {
      p[c] = B;
      q[c] = 0;
    }
    if (r.entry[c] == kInf && (p[c] > 0 || q[c] == 0))
      r.entry[c] = hop;
    if (r.full[c] == kInf && p[c] == B)
      r.full[c] = hop;
    if (r.partial[c] == kInf && (p[c] >= partialLen || p[c] == B))
      r.partial[c] = hop;
  };
  p[0] = 1;
  record(0, 0);

  // Forced offsets of later blocks: local (1 .. L-1) and log-spaced (2^i).
  // Only offsets below numBlocks reach a block (a local count of 2^29 once
  // listed 2^29 offsets here: 4 GB).
  std::vector<int64_t> forward;
  for (int64_t d = 1; d < std::min(bb.local, numBlocks); ++d)
    forward.push_back(d);
  for (int64_t i = 0; i < bb.logLevels && i < 62 && (int64_t(1) << i) < numBlocks;
       ++i)
    forward.push_back(int64_t(1) << i);
  std::sort(forward.begin(), forward.end());
  forward.erase(std::unique(forward.begin(), forward.end()), forward.end());

  // One hop's updates are merged per block as they are made (prefix `p`
  // only grows, suffix start `q` only falls), so memory stays O(blocks)
  // however many updates a hop makes: a window as long as the sequence
  // makes every active block update every later one (once 2^28 updates,
  // 6 GB, were listed). Every update counts against kMaxReachSteps.
  std::vector<int64_t> active = {0}, changed;
  std::vector<int64_t> nextP(p), nextQ(q);
  std::vector<char> isChanged(numBlocks, 0);
  int64_t steps = 0;
  for (int64_t hop = 1; !active.empty(); ++hop) {
    changed.clear();
    auto update = [&](int64_t block, int64_t up, int64_t uq) {
      ++steps;
      if (up <= nextP[block] && uq >= nextQ[block])
        return;
      nextP[block] = std::max(nextP[block], up);
      nextQ[block] = std::min(nextQ[block], uq);
      if (!isChanged[block]) {
        isChanged[block] = 1;
        changed.push_back(block);
      }
    };
    for (int64_t c : active) {
      int64_t pc = p[c], qc = q[c];
      int64_t first = pc > 0 ? 0 : qc, last = qc < B ? B - 1 : pc - 1;
      if (bb.local >= 1)
        update(c, 0, first); // own block from `first` on
      for (int64_t d : forward)
        if (c + d < numBlocks)
          update(c + d, B, 0);
      if (pc > 0) // the prefix grows through the window
        update(c, std::min(B, pc - 1 + window), B);
      int64_t reachEnd = c * B + last + window - 1; // inclusive, global
      for (int64_t d = c + 1; d < numBlocks && d * B <= reachEnd; ++d)
        update(d, std::min(B, reachEnd - d * B + 1), B);
      // A window far shorter than the blocks fills them w - 1 tokens a
      // hop; a long one updates many blocks a hop.
      if (steps > kMaxReachSteps) {
        r.tooCostly = true;
        return r;
      }
    }
    for (int64_t c : changed) {
      p[c] = nextP[c];
      q[c] = nextQ[c];
    }
    for (int64_t c : changed) {
      isChanged[c] = 0;
      record(c, hop); // may fill the block: p = l', q = 0
      nextP[c] = p[c];
      nextQ[c] = q[c];
    }
    active.swap(changed);
  }
  return r;
}


/// Range maxima of `values` in O(1) a query (a sparse table, n log n).
class RangeMax {
public:
  explicit RangeMax(const std::vector<int64_t> &values) : levels{values} {
    for (size_t w = 1; 2 * w <= values.size(); w *= 2) {
      const std::vector<int64_t> &prev = levels.back();
      std::vector<int64_t> next(prev.size() - w);
      for (size_t i = 0; i < next.size(); ++i)
        next[i] = std::max(prev[i], prev[i + w]);
      levels.push_back(std::move(next));
    }
  }
  /// The largest value in [lo, hi), lo < hi.
  int64_t operator()(int64_t lo, int64_t hi) const {
    int k = 63 - __builtin_clzll(static_cast<uint64_t>(hi - lo));
    return std::max(levels[k][lo], levels[k][hi - (int64_t(1) << k)]);
  }

private:
  std::vector<std::vector<int64_t>> levels;
};

struct WorstPair {
  int64_t hops = 0, source = 0, target = 0;
  bool tooCostly = false;
};

/// max over b0 <= c of min(direct(c - b0), 1 + min over attractors a in
/// [b0, c] of entry(a - b0)), with the first (b0, c) attaining it.
///
/// For one b0 the attractor bound `via` only falls, and only at attractors
/// that lower it: between two such attractors it is constant, and the worst
/// target there is min(range max of `full`, via + 1). Once via + 1 is no
/// more than the worst so far, no later target of b0 can beat it. Hubs are
/// periodic: the hubs that lower `via` for a b0 are the record lows of
/// entry over offsets r, r + s, r + 2s, ... (r the first hub's offset),
/// listed once per residue. So the work is O(n log n) plus, per b0, the
/// record lows and the initial and explicit attractors it visits, counted
/// against kMaxReachSteps (it was O(n^2): a second at 32768 blocks).
WorstPair worstPair(const RelativeReach &rel, int64_t numBlocks,
                    const Backbone &bb) {
  const int64_t n = numBlocks, last = n - 1;
  RangeMax fullMax(rel.full);
  // Hub record lows per residue r: offsets j = r + k s with entry[j] below
  // entry at every earlier offset of the residue.
  int64_t s = bb.hubStride > 0 && bb.hubStride < n ? bb.hubStride : 0;
  std::vector<std::vector<int64_t>> hubLows(s);
  for (int64_t r = 0; r < s; ++r) {
    int64_t low = kInf;
    for (int64_t j = r; j < n; j += s)
      if (rel.entry[j] < low) {
        low = rel.entry[j];
        hubLows[r].push_back(j);
      }
  }
  // The other attractors, absolute and increasing (a hub stride at or past
  // n leaves block 0 only, which the initial blocks or this list hold).
  std::vector<int64_t> others;
  for (int64_t a = 0; a < std::min(bb.initial, n); ++a)
    others.push_back(a);
  if (bb.hubStride >= n)
    others.push_back(0);
  for (int64_t a : bb.blocks)
    if (a >= 0 && a < n)
      others.push_back(a);
  std::sort(others.begin(), others.end());
  others.erase(std::unique(others.begin(), others.end()), others.end());

  WorstPair w;
  int64_t steps = 0;
  // Targets [lo, hi) of source b0 under the bound `via`.
  auto consider = [&](int64_t b0, int64_t lo, int64_t hi, int64_t via) {
    int64_t cap = via >= kInf ? kInf : via + 1;
    int64_t end = std::min(hi, last);
    if (lo < end && std::min(fullMax(lo - b0, end - b0), cap) > w.hops) {
      int64_t value = std::min(fullMax(lo - b0, end - b0), cap);
      int64_t c = lo;
      while (std::min(rel.full[c - b0], cap) < value)
        ++c, ++steps;
      w = {value, b0, c, false};
    }
    if (hi == n && lo <= last && std::min(rel.partial[last - b0], cap) > w.hops)
      w = {std::min(rel.partial[last - b0], cap), b0, last, false};
  };
  for (int64_t b0 = 0; b0 < n; ++b0) {
    const std::vector<int64_t> *lows =
        s ? &hubLows[(s - b0 % s) % s] : nullptr;
    size_t hi = 0; // next hub record low (an offset from b0)
    auto oi = std::lower_bound(others.begin(), others.end(), b0);
    int64_t via = kInf, from = b0;
    while (true) {
      if (steps > kMaxReachSteps) {
        w.tooCostly = true;
        return w;
      }
      // The next attractor that lowers via, hubs and others merged.
      int64_t next = n;
      while (lows && hi < lows->size() && b0 + (*lows)[hi] < n &&
             rel.entry[(*lows)[hi]] >= via)
        ++hi, ++steps;
      if (lows && hi < lows->size() && b0 + (*lows)[hi] < n)
        next = b0 + (*lows)[hi];
      while (oi != others.end() && *oi < next && rel.entry[*oi - b0] >= via)
        ++oi, ++steps;
      if (oi != others.end() && *oi < next)
        next = *oi;
      consider(b0, from, next, via);
      if (next == n)
        break;
      via = rel.entry[next - b0];
      from = next;
      if (via + 1 <= w.hops)
        break; // no later target of b0 beats the worst so far
      ++steps;
    }
  }
  return w;
}

} // namespace

ReachReport mlir::nsa::spec::analyzeReach(int64_t seqLen, int64_t slcBlock,
                               int64_t window, const Backbone &bb) {
  ReachReport report;
  if (seqLen <= 0)
    return report;
  // Positions stay far from 2^63 (sums of a few of them are formed below),
  // and a window longer than the sequence is the sequence.
  if (seqLen > kMaxReachTokens ||
      numSelectionBlocks(seqLen, slcBlock) > kMaxReachBlocks) {
    report.tooCostly = true;
    return report;
  }
  window = std::min(window, seqLen);
  int64_t lastBlock = numSelectionBlocks(seqLen, slcBlock) - 1;
  report.forcedBlocks = bb.maxForcedBlocks(lastBlock);
  int64_t blockKeys = saturatingMul(report.forcedBlocks, slcBlock);
  report.backboneKeys =
      blockKeys >= seqLen - window ? seqLen : blockKeys + window;
  if (window == seqLen) {
    // The window alone joins every pair in one hop.
    report.hops = seqLen > 1 ? 1 : 0;
    report.targetBlock = lastBlock;
    return report;
  }
  int64_t numBlocks = numSelectionBlocks(seqLen, slcBlock);
  int64_t partialLen = seqLen - (numBlocks - 1) * slcBlock;
  // One block: its tokens past the sequence do not exist, so the block may
  // end with the sequence (the same hops; far less work when l' >> T).
  RelativeReach rel = relativeReach(
      numBlocks, numBlocks == 1 ? seqLen : slcBlock, partialLen, window, bb);
  if (rel.tooCostly) {
    report.tooCostly = true;
    return report;
  }
  WorstPair worst = worstPair(rel, numBlocks, bb);
  if (worst.tooCostly) {
    report.tooCostly = true;
    return report;
  }
  report.sourceBlock = worst.source;
  report.targetBlock = worst.target;
  int64_t hopsMax = worst.hops;
  report.hops = hopsMax >= kInf ? -1 : hopsMax;
  return report;
}

int64_t mlir::nsa::spec::bruteForceHops(int64_t seqLen, int64_t slcBlock, int64_t window,
                             const Backbone &bb) {
  int64_t worst = 0;
  std::vector<int64_t> dist(seqLen);
  for (int64_t s = 0; s < seqLen; ++s) {
    std::fill(dist.begin(), dist.end(), -1);
    std::deque<int64_t> queue = {s};
    dist[s] = 0;
    while (!queue.empty()) {
      int64_t x = queue.front();
      queue.pop_front();
      for (int64_t t = x + 1; t < seqLen; ++t) {
        if (dist[t] >= 0)
          continue;
        if (t - x < window || bb.isForced(x / slcBlock, t / slcBlock)) {
          dist[t] = dist[x] + 1;
          queue.push_back(t);
        }
      }
    }
    for (int64_t t = s; t < seqLen; ++t) {
      if (dist[t] < 0)
        return -1;
      worst = std::max(worst, dist[t]);
    }
  }
  return worst;
}
