// Instruction fetch on Hopper: how long straight-line code takes when its
// lines are cold (fetched from L2) and warm (still in the SM's instruction
// caches from the launch before), by code size: the decode kernel's merge
// and selection stall on `no_instruction` at every 256-byte line of their
// straight-line code (ncu source profile).
//
// Each kernel runs `kb` KiB of independent FMAs (16 bytes a SASS
// instruction, four chains) in every warp of one block an SM; thread 0 of
// each block reads %globaltimer before and after. Printed per size: the
// median block's time for the first launch after a different kernel of
// 256 KiB ran (cold), and for a launch right after one of itself (warm).
//
//   nvcc -O3 -arch=sm_90a -o icache bench/micro/icache.cu && ./icache
#include <algorithm>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t err = (x);                                                     \
    if (err != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(err));           \
      return 1;                                                                \
    }                                                                          \
  } while (0)

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

#define FMA4                                                                   \
  asm volatile("fma.rn.f32 %0, %0, 0f3F800001, 0f3F000000;\n\t"                \
               "fma.rn.f32 %1, %1, 0f3F800001, 0f3F000000;\n\t"                \
               "fma.rn.f32 %2, %2, 0f3F800001, 0f3F000000;\n\t"                \
               "fma.rn.f32 %3, %3, 0f3F800001, 0f3F000000;"                    \
               : "+f"(x0), "+f"(x1), "+f"(x2), "+f"(x3))

template <int KB>
__global__ void __launch_bounds__(256, 1)
    straight(float *out, unsigned long long *times) {
  float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3;
  __syncthreads();
  unsigned long long t0 = now();
#pragma unroll
  for (int i = 0; i < KB * 1024 / 16 / 4; ++i)
    FMA4;
  __syncthreads();
  unsigned long long t1 = now();
  if (threadIdx.x == 0)
    times[blockIdx.x] = t1 - t0;
  out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3;
}

template <int KB>
int measure(int threads, float *out, unsigned long long *times, int blocks) {
  std::vector<unsigned long long> host(blocks);
  auto median = [&] {
    cudaMemcpy(host.data(), times, blocks * 8, cudaMemcpyDeviceToHost);
    std::sort(host.begin(), host.end());
    return host[blocks / 2] / 1000.0;
  };
  double cold[5], warm[5];
  for (int r = 0; r < 5; ++r) {
    straight<256><<<blocks, threads>>>(out, times); // evicts
    straight<KB><<<blocks, threads>>>(out, times);
    CHECK(cudaDeviceSynchronize());
    cold[r] = median();
    straight<KB><<<blocks, threads>>>(out, times);
    CHECK(cudaDeviceSynchronize());
    warm[r] = median();
  }
  std::sort(cold, cold + 5);
  std::sort(warm, warm + 5);
  std::printf("{\"kib\": %d, \"threads\": %d, \"cold_us\": %.3f, "
              "\"warm_us\": %.3f, \"cold_ns_per_line\": %.1f, "
              "\"warm_ns_per_line\": %.1f}\n",
              KB, threads, cold[2], warm[2], cold[2] * 1000 / (KB * 4),
              warm[2] * 1000 / (KB * 4));
  return 0;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *out;
  unsigned long long *times;
  CHECK(cudaMalloc(&out, sms * 256 * sizeof(float)));
  CHECK(cudaMalloc(&times, sms * 8));
  for (int threads : {128, 256}) {
    measure<4>(threads, out, times, sms);
    measure<8>(threads, out, times, sms);
    measure<16>(threads, out, times, sms);
    measure<32>(threads, out, times, sms);
    measure<64>(threads, out, times, sms);
    measure<96>(threads, out, times, sms);
    measure<128>(threads, out, times, sms);
    measure<160>(threads, out, times, sms);
  }
  return 0;
}
