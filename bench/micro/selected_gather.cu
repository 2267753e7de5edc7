// The memory ceiling of selected attention (issue 9): the time to read, and
// do nothing else with, the K and V rows of every (token, KV head)'s
// selected blocks, in the order and pattern the selected-attention kernel
// reads them. Not a test: a benchmark printing one JSON line per case.
//
// Each block of 128 threads is one (token, KV head), as in the flash
// kernel's grid (token fastest, then head). It reads n blocks of l' keys:
// block 0, the token's own block and the one before (the paper's backbone),
// and n - 3 others drawn uniformly from the causal blocks without repeats,
// as random inputs select them. Every 16-byte chunk of K (l' x Dqk bf16)
// and V (l' x Dv bf16) of those blocks is loaded; an XOR of all of them is
// written so that no load is dropped.
//
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o selected_gather \
//     bench/micro/selected_gather.cu
//   ./selected_gather [T ...]     (default 8192 65536)
//
// Cases: "selected" (the pattern above), "local" (every token reads the
// same n blocks ending at its own: perfect reuse between neighbours, the
// L2-resident best case), "stream" (each block reads n distinct blocks of a
// 24 MB buffer in turn, which stays in L2: the L2 -> SM ceiling).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kThreads = 128;

__device__ uint32_t hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

/// The j-th selected block of (token t, head h): 0, c, c - 1, then random
/// distinct causal blocks (rejection against the earlier picks).
__device__ int pick(int mode, int t, int h, int j, int slcBlock, int n,
                    int *chosen) {
  int c = t / slcBlock;
  if (c + 1 <= n)
    return j; // no more causal blocks than n: all of them
  if (mode == 1)
    return c - j;
  if (j == 0)
    return 0;
  if (j == 1)
    return c;
  if (j == 2)
    return c - 1;
  for (uint32_t salt = 0;; ++salt) {
    int b = hash(uint32_t(t) * 2654435761U ^ uint32_t(h) * 97U ^
                 uint32_t(j) * 40503U ^ salt * 7919U) %
            uint32_t(c + 1);
    bool seen = false;
    for (int i = 0; i < j; ++i)
      seen |= chosen[i] == b;
    if (!seen)
      return b;
  }
}

/// K rows [T, H, Dqk] and V rows [T, H, Dv], bf16 as uint16.
__global__ void gather(int mode, const uint4 *k, const uint4 *v, int T, int H,
                       int qkDim, int vDim, int slcBlock, int n,
                       uint32_t *out) {
  __shared__ int chosen[32];
  int t = blockIdx.x, h = blockIdx.y;
  int blocks = mode == 2 ? n : min(n, t / slcBlock + 1);
  if (threadIdx.x == 0)
    for (int j = 0; j < blocks; ++j)
      chosen[j] = mode == 2 ? 0 : pick(mode, t, h, j, slcBlock, n, chosen);
  __syncthreads();
  uint4 acc = {0, 0, 0, 0};
  int kChunks = qkDim / 8, vChunks = vDim / 8; // 16-byte chunks per row
  for (int j = 0; j < blocks; ++j) {
    int64_t key0;
    if (mode == 2) {
      // Streaming: n distinct blocks of a 24 MB window, per block.
      int64_t blocks = (int64_t(24) << 20) /
                       (int64_t(slcBlock) * H * (qkDim + vDim) * 2);
      key0 = ((int64_t(t) * n + j) % blocks) * slcBlock;
    } else {
      key0 = int64_t(chosen[j]) * slcBlock;
    }
    for (int i = threadIdx.x; i < slcBlock * kChunks; i += kThreads) {
      int64_t row = key0 + i / kChunks;
      uint4 x = k[(row * H + h) * kChunks + i % kChunks];
      acc.x ^= x.x, acc.y ^= x.y, acc.z ^= x.z, acc.w ^= x.w;
    }
    for (int i = threadIdx.x; i < slcBlock * vChunks; i += kThreads) {
      int64_t row = key0 + i / vChunks;
      uint4 x = v[(row * H + h) * vChunks + i % vChunks];
      acc.x ^= x.x, acc.y ^= x.y, acc.z ^= x.z, acc.w ^= x.w;
    }
  }
  uint32_t r = acc.x ^ acc.y ^ acc.z ^ acc.w;
  if (r == 0x12345678U)
    out[blockIdx.y * gridDim.x + blockIdx.x] = r;
}

void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "selected_gather: %s: %s\n", what,
                 cudaGetErrorString(e));
    std::exit(1);
  }
}

} // namespace

int main(int argc, char **argv) {
  std::vector<int> lengths;
  for (int i = 1; i < argc; ++i)
    lengths.push_back(std::atoi(argv[i]));
  if (lengths.empty())
    lengths = {8192, 65536};
  const int H = 4, slcBlock = 64, n = 16;
  const char *modes[] = {"selected", "local", "stream"};
  for (int qkDim : {192, 128}) {
    const int vDim = 128;
    for (int T : lengths) {
      size_t kBytes = size_t(T) * H * qkDim * 2, vBytes = size_t(T) * H * vDim * 2;
      size_t stream = (size_t(24) << 20) + size_t(slcBlock) * H * (qkDim + vDim) * 2;
      uint4 *k, *v;
      uint32_t *out;
      check(cudaMalloc(&k, std::max(kBytes, stream)), "cudaMalloc");
      check(cudaMalloc(&v, std::max(vBytes, stream)), "cudaMalloc");
      check(cudaMalloc(&out, size_t(T) * H * 4), "cudaMalloc");
      check(cudaMemset(k, 1, std::max(kBytes, stream)), "cudaMemset");
      check(cudaMemset(v, 2, std::max(vBytes, stream)), "cudaMemset");
      for (int mode = 0; mode < 3; ++mode) {
        dim3 grid(T, H);
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        for (int w = 0; w < 2; ++w)
          gather<<<grid, kThreads>>>(mode, k, v, T, H, qkDim, vDim, slcBlock,
                                     n, out);
        check(cudaDeviceSynchronize(), "warm-up");
        std::vector<float> ms;
        for (int r = 0; r < 5; ++r) {
          cudaEventRecord(a);
          gather<<<grid, kThreads>>>(mode, k, v, T, H, qkDim, vDim, slcBlock,
                                     n, out);
          cudaEventRecord(b);
          check(cudaEventSynchronize(b), "run");
          float t;
          cudaEventElapsedTime(&t, a, b);
          ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        double med = ms[ms.size() / 2];
        // Bytes of the selected blocks (causal: fewer than n early on).
        double bytes = 0;
        for (int t = 0; t < T; ++t)
          bytes += double(std::min(n, t / slcBlock + 1)) * slcBlock * H *
                   (qkDim + vDim) * 2;
        if (mode == 2)
          bytes = double(T) * n * slcBlock * H * (qkDim + vDim) * 2;
        std::printf("{\"case\": \"%s\", \"T\": %d, \"qk_dim\": %d, "
                    "\"v_dim\": %d, \"ms\": %.3f, \"GB\": %.1f, "
                    "\"TB_per_s\": %.2f}\n",
                    modes[mode], T, qkDim, vDim, med, bytes / 1e9,
                    bytes / med / 1e9);
        std::fflush(stdout);
      }
      cudaFree(k);
      cudaFree(v);
      cudaFree(out);
    }
  }
  return 0;
}
