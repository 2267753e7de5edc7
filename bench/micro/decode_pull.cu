// How fast can N blocks pull the paper layer's compressed K/V cache at
// B = 1, 64k (4096 rows, 4 KV heads, Dqk 192, Dv 128, bf16) into shared
// memory? The same rows `_cluster`'s compressed phase reads, three ways:
//   cpasync: 16-byte cp.async by every thread (what `_cluster` does);
//   bulk:    one cp.async.bulk a row, on an mbarrier (the split-K launches);
//   tma:     2-D TMA boxes of 128 rows (one instruction a box).
// Each block takes one head's contiguous range of rows; eight copies of
// the cache are cycled so L2 (50 MB) holds none of it. Times: the span
// from the first block's start to the last block's end (%globaltimer),
// and CUDA events around one launch. Build (dev machine):
//   nvcc -O2 -arch=sm_90a -std=c++17 -o decode_pull decode_pull.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>

constexpr int kRows = 4096, kHeads = 4, kDk = 192, kDv = 128, kCopies = 8;
constexpr int kThreads = 128;

__device__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ uint32_t smem(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ void barInit(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(bar)),
               "r"(count));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ void barExpect(uint64_t *bar, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(bar)),
      "r"(bytes)
      : "memory");
}
__device__ void barWait(uint64_t *bar) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 "
               "p, [%0], 0;\n @!p bra W;\n}" ::"r"(smem(bar))
               : "memory");
}

struct Args {
  const uint16_t *k, *v;
  int rowsPerBlock, blocksPerHead, method;
  uint64_t *times;
  float *sink;
};

__global__ void __launch_bounds__(kThreads) pull(Args a, const __grid_constant__ CUtensorMap kMap,
                                                 const __grid_constant__ CUtensorMap vMap) {
  extern __shared__ __align__(1024) unsigned char s[];
  __shared__ __align__(8) uint64_t bar;
  uint64_t t0 = now();
  int head = blockIdx.x / a.blocksPerHead;
  int row0 = (blockIdx.x % a.blocksPerHead) * a.rowsPerBlock;
  int R = a.rowsPerBlock;
  unsigned char *kS = s, *vS = s + R * 400;
  if (a.method == 0) {
    // 16-byte pieces: K rows 24 pieces (stride 400 B), V rows 16 (272 B).
    for (int i = threadIdx.x; i < R * 24; i += kThreads) {
      int r = i / 24, c = i % 24;
      const uint16_t *g = a.k + ((size_t)(row0 + r) * kHeads + head) * kDk + c * 8;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem(kS + r * 400 + c * 16)), "l"(g));
    }
    for (int i = threadIdx.x; i < R * 16; i += kThreads) {
      int r = i / 16, c = i % 16;
      const uint16_t *g = a.v + ((size_t)(row0 + r) * kHeads + head) * kDv + c * 8;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem(vS + r * 272 + c * 16)), "l"(g));
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
    __syncthreads();
  } else {
    if (threadIdx.x == 0) {
      barInit(&bar, 1);
      barExpect(&bar, R * (kDk + kDv) * 2);
    }
    __syncthreads();
    if (a.method == 1) {
      for (int r = threadIdx.x; r < R; r += kThreads) {
        const uint16_t *gk = a.k + ((size_t)(row0 + r) * kHeads + head) * kDk;
        const uint16_t *gv = a.v + ((size_t)(row0 + r) * kHeads + head) * kDv;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 384, [%2];"
                     ::"r"(smem(kS + r * 400)), "l"(gk), "r"(smem(&bar)) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 256, [%2];"
                     ::"r"(smem(vS + r * 272)), "l"(gv), "r"(smem(&bar)) : "memory");
      }
    } else if (threadIdx.x == 0) {
      // Dense boxes (384-byte and 256-byte rows) of 128 rows.
      unsigned char *vD = s + R * 384;
      for (int r = 0; r < R; r += 128) {
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                     ::"r"(smem(kS + r * 384)), "l"(&kMap), "r"(0), "r"(head), "r"(row0 + r), "r"(smem(&bar)) : "memory");
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                     ::"r"(smem(vD + r * 256)), "l"(&vMap), "r"(0), "r"(head), "r"(row0 + r), "r"(smem(&bar)) : "memory");
      }
    }
    barWait(&bar);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.sink[blockIdx.x] = (float)kS[R * 100] + (float)vS[R];
    a.times[2 * blockIdx.x] = t0;
    a.times[2 * blockIdx.x + 1] = now();
  }
}

static void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
}

static CUtensorMap map3d(const void *base, int d) {
  CUtensorMap m;
  cuuint64_t dims[3] = {(cuuint64_t)d, kHeads, kRows};
  cuuint64_t strides[2] = {(cuuint64_t)d * 2, (cuuint64_t)d * 2 * kHeads};
  cuuint32_t box[3] = {(cuuint32_t)d, 1, 128}, es[3] = {1, 1, 1};
  CUresult r = cuTensorMapEncodeTiled(
      &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(base), dims,
      strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
    exit(1);
  }
  return m;
}

int main() {
  size_t kElems = (size_t)kRows * kHeads * kDk, vElems = (size_t)kRows * kHeads * kDv;
  uint16_t *k, *v;
  check(cudaMalloc(&k, kElems * 2 * kCopies), "malloc");
  check(cudaMalloc(&v, vElems * 2 * kCopies), "malloc");
  std::vector<uint16_t> host(kElems * kCopies, 0x3c00);
  check(cudaMemcpy(k, host.data(), kElems * 2 * kCopies, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(v, host.data(), vElems * 2 * kCopies, cudaMemcpyHostToDevice), "copy");
  uint64_t *times;
  float *sink;
  check(cudaMalloc(&times, 2 * 256 * 8), "malloc");
  check(cudaMalloc(&sink, 256 * 4), "malloc");
  check(cudaFuncSetAttribute(pull, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024), "attr");
  std::vector<CUtensorMap> kMaps, vMaps;
  for (int c = 0; c < kCopies; ++c) {
    kMaps.push_back(map3d(k + c * kElems, kDk));
    vMaps.push_back(map3d(v + c * vElems, kDv));
  }
  const char *names[3] = {"cpasync", "bulk", "tma"};
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  printf("| method | blocks | rows a block | span us (median) | event us (median) | GB/s (span) |\n|---|---|---|---|---|---|\n");
  for (int method = 0; method < 3; ++method)
    for (int perHead : {16, 32}) {
      int blocks = perHead * kHeads, R = kRows / perHead;
      std::vector<double> spans, events;
      for (int rep = 0; rep < 64; ++rep) {
        int c = rep % kCopies;
        Args a{k + c * kElems, v + c * vElems, R, perHead, method, times, sink};
        cudaEventRecord(e0);
        pull<<<blocks, kThreads, R * 400 + R * 272>>>(a, kMaps[c], vMaps[c]);
        cudaEventRecord(e1);
        check(cudaEventSynchronize(e1), "run");
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        std::vector<uint64_t> t(2 * blocks);
        check(cudaMemcpy(t.data(), times, t.size() * 8, cudaMemcpyDeviceToHost), "copy");
        uint64_t lo = ~0ull, hi = 0;
        for (int b = 0; b < blocks; ++b)
          lo = std::min(lo, t[2 * b]), hi = std::max(hi, t[2 * b + 1]);
        if (rep >= 8) {
          spans.push_back((hi - lo) / 1e3);
          events.push_back(ms * 1e3);
        }
      }
      std::sort(spans.begin(), spans.end());
      std::sort(events.begin(), events.end());
      double span = spans[spans.size() / 2];
      printf("| %s | %d | %d | %.2f | %.2f | %.0f |\n", names[method], blocks, R,
             span, events[events.size() / 2],
             (kElems + vElems) * 2 / (span * 1e3));
    }
  return 0;
}
