// launch_gap: the GPU time between back-to-back launches of a kernel shaped
// like the decoding step's `_cluster` at B = 1 (64 blocks in clusters of 16,
// one block an SM by its shared memory), each spinning a set time, enqueued
// the ways the runtime could enqueue a step:
//   graph1    - each step a replay of a one-kernel graph (what nsaRunGraph
//               does for a step today);
//   direct    - cuLaunchKernelEx each step;
//   pdl       - cuLaunchKernelEx with programmatic stream serialization: the
//               kernel signals griddepcontrol.launch_dependents at its start
//               and waits in griddepcontrol.wait, so the next step's blocks
//               are resident before this one ends;
//   graph8    - eight steps captured in one graph (a model's decoding step
//               captured whole), replayed;
//   graph8pdl - the same, captured from launches with programmatic
//               serialization.
// Prints a JSON line per way: the median over rounds of the time a step
// (CUDA events around `steps` steps), minus nothing: spin + gap.
//
// Build: nvcc -O2 -arch=sm_90a -o launch_gap launch_gap.cu -lcuda

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,          \
                   cudaGetErrorString(e));                                     \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

__global__ void __cluster_dims__(16, 1, 1) step(long long ns, int pdl) {
  extern __shared__ char smem[];
  if (pdl) {
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns)
      break;
  }
  if (threadIdx.x == 0)
    smem[0] = 1;
}

struct Config {
  int blocks = 64, threads = 256, smem = 160 * 1024;
  long long ns = 18000;
};

static void launch(const Config &c, cudaStream_t s, int pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(c.blocks);
  cfg.blockDim = dim3(c.threads);
  cfg.dynamicSmemBytes = c.smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CHECK(cudaLaunchKernelEx(&cfg, step, c.ns, pdl));
}

static cudaGraphExec_t captured(const Config &c, cudaStream_t s, int n,
                                int pdl) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i)
    launch(c, s, pdl);
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  CHECK(cudaGraphDestroy(g));
  return exec;
}

int main(int argc, char **argv) {
  Config c;
  int steps = 400, rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strncmp(argv[i], "--ns=", 5))
      c.ns = std::atoll(argv[i] + 5);
    else if (!std::strncmp(argv[i], "--smem=", 7))
      c.smem = std::atoi(argv[i] + 7);
    else if (!std::strncmp(argv[i], "--threads=", 10))
      c.threads = std::atoi(argv[i] + 10);
  }
  CHECK(cudaFuncSetAttribute(step, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             c.smem));
  CHECK(cudaFuncSetAttribute(
      step, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  cudaGraphExec_t g1 = captured(c, s, 1, 0), g8 = captured(c, s, 8, 0),
                  g8p = captured(c, s, 8, 1);
  struct Way {
    const char *name;
    int per; // steps an enqueue
    void (*fn)(const Config &, cudaStream_t, cudaGraphExec_t);
    cudaGraphExec_t g;
  };
  Way ways[] = {
      {"graph1", 1,
       [](const Config &, cudaStream_t s, cudaGraphExec_t g) {
         CHECK(cudaGraphLaunch(g, s));
       },
       g1},
      {"direct", 1,
       [](const Config &c, cudaStream_t s, cudaGraphExec_t) {
         launch(c, s, 0);
       },
       nullptr},
      {"pdl", 1,
       [](const Config &c, cudaStream_t s, cudaGraphExec_t) {
         launch(c, s, 1);
       },
       nullptr},
      {"graph8", 8,
       [](const Config &, cudaStream_t s, cudaGraphExec_t g) {
         CHECK(cudaGraphLaunch(g, s));
       },
       g8},
      {"graph8pdl", 8,
       [](const Config &, cudaStream_t s, cudaGraphExec_t g) {
         CHECK(cudaGraphLaunch(g, s));
       },
       g8p},
  };
  for (const Way &w : ways) {
    std::vector<float> per;
    for (int r = 0; r < rounds + 1; ++r) {
      int n = steps / w.per;
      CHECK(cudaEventRecord(e0, s));
      for (int i = 0; i < n; ++i)
        w.fn(c, s, w.g);
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaEventSynchronize(e1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r) // the first round warms up
        per.push_back(1000.f * ms / (n * w.per));
    }
    std::sort(per.begin(), per.end());
    std::printf("{\"way\": \"%s\", \"spin_us\": %.2f, \"smem\": %d, "
                "\"threads\": %d, \"step_us\": %.3f, \"gap_us\": %.3f}\n",
                w.name, c.ns / 1000.0, c.smem, c.threads, per[rounds / 2],
                per[rounds / 2] - c.ns / 1000.0);
  }
  return 0;
}
