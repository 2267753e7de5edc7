// Float64 Eq. 9/10 block scores of nsa-decode-bench's check data (its
// randomBF16 inputs, mean-pooled keys, the paper layer with backbone
// initial 1, local 2): for each step of a decoding loop, the smallest
// relative gap over the step's tokens and KV heads between the last block
// the top-n takes and the first it leaves. Gaps near f32 rounding are
// near ties that two kernels may break differently. Build and run (dev
// machine; batch row b, final length L, Tq, steps), e.g. the q16 check:
//   g++ -O2 -o decode_ties decode_ties.cpp && ./decode_ties 0 20001 16 20
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../BenchData.h"

using nsa::bench::fromBF16;
using nsa::bench::randomBF16;
using nsa::bench::toBF16;

int main(int argc, char **argv) {
  const int64_t HQ = 64, H = 4, G = 16, D = 192, l = 32, d = 16, lp = 64, n = 16;
  int64_t b = atoi(argv[1]), L = atoi(argv[2]), Tq = atoi(argv[3]), steps = atoi(argv[4]);
  auto sq = randomBF16(L * HQ * D, 10 * b + 1), sk = randomBF16(L * H * D, 10 * b + 2);
  int64_t blocks = (L - l) / d + 1;
  std::vector<double> kc(blocks * H * D);
  for (int64_t i = 0; i < blocks; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < D; ++e) {
        float s = 0;
        for (int64_t j = 0; j < l; ++j) s += double(fromBF16(sk[((i * d + j) * H + h) * D + e])) * (1.0f / l);
        kc[(i * H + h) * D + e] = fromBF16(toBF16(s));
      }
  double scale = 1 / std::sqrt(double(D));
  for (int64_t st = 0; st < steps; ++st) {
    int64_t end = L - (steps - 1 - st) * Tq;
    double worst = 1e9; int64_t wt = -1, wh = -1;
    for (int64_t t = end - Tq; t < end; ++t) {
      int64_t visible = t + 1 >= l ? (t + 1 - l) / d + 1 : 0, cur = t / lp;
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> scores(cur + 1, 0.0);
        for (int64_t hq = h * G; hq < (h + 1) * G; ++hq) {
          std::vector<double> s(visible);
          double m = -INFINITY;
          for (int64_t i = 0; i < visible; ++i) {
            double acc = 0;
            for (int64_t e = 0; e < D; ++e) acc += fromBF16(sq[(t * HQ + hq) * D + e]) * kc[(i * H + h) * D + e];
            s[i] = acc * scale; m = std::max(m, s[i]);
          }
          double sum = 0;
          for (double x : s) sum += std::exp(x - m);
          for (int64_t i = 0; i < visible; ++i) {
            double p = std::exp(s[i] - m) / sum;
            for (int64_t j = i * d / lp; j <= (i * d + l - 1) / lp && j <= cur; ++j) {
              int64_t lo = std::max(i * d, j * lp), hi = std::min(i * d + l, (j + 1) * lp);
              if (hi > lo) scores[j] += p * ((hi - lo) / d);
            }
          }
        }
        std::vector<double> rest;
        for (int64_t j = 1; j <= cur; ++j)
          if (cur - j >= 2) rest.push_back(scores[j]);
        std::sort(rest.rbegin(), rest.rend());
        int64_t slots = n - 3;
        if ((int64_t)rest.size() > slots) {
          double gap = (rest[slots - 1] - rest[slots]) / rest[slots - 1];
          if (gap < worst) worst = gap, wt = t, wh = h;
        }
      }
    }
    printf("b=%lld step=%lld kv_len=%lld smallest rel gap %.3e (t=%lld h=%lld)\n", (long long)b, (long long)st, (long long)end, worst, (long long)wt, (long long)wh);
  }
}
