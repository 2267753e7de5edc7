// launch_probe: the floor under a decoding step's time on this machine.
//
// A step at B = 1 is a handful of small dependent launches and one stream
// synchronization; this times that shape with empty kernels (and kernels
// that spin for a set time), enqueued the ways the runtime could:
//   plain   - cuLaunchKernel each, then cuStreamSynchronize;
//   alloc   - the same between cuMemAllocAsync and cuMemFreeAsync;
//   graph   - the launches captured once as a graph, replayed;
//   pdl     - each launch with programmatic stream serialization (the next
//             kernel starts while the previous ends; it waits in
//             griddepcontrol.wait);
// and prints one JSON line per (way, kernels, spin) with the median us.
//
// Build: nvcc -O2 -arch=sm_90a -o launch_probe launch_probe.cu -lcuda

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));             \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

__global__ void spin(long long ns, int *flag, int pdl) {
  if (pdl)
    asm volatile("griddepcontrol.wait;" ::: "memory");
  long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns)
      break;
  }
  if (pdl)
    asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0 && blockIdx.x == 0 && flag)
    atomicAdd(flag, 1);
}

using Clock = std::chrono::steady_clock;

template <typename Fn> double medianUs(Fn fn, int reps = 200) {
  for (int i = 0; i < 20; ++i)
    fn();
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn();
    us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

int main() {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *flag;
  CHECK(cudaMalloc(&flag, 4));
  const int blocks = 132, threads = 256;
  for (int kernels : {1, 5})
    for (long long ns : {0LL, 2000LL}) {
      auto plain = [&] {
        for (int i = 0; i < kernels; ++i)
          spin<<<blocks, threads, 0, s>>>(ns, flag, 0);
        CHECK(cudaStreamSynchronize(s));
      };
      auto alloc = [&] {
        void *w;
        CHECK(cudaMallocAsync(&w, 1 << 20, s));
        for (int i = 0; i < kernels; ++i)
          spin<<<blocks, threads, 0, s>>>(ns, (int *)w, 0);
        CHECK(cudaFreeAsync(w, s));
        CHECK(cudaStreamSynchronize(s));
      };
      auto pdlLaunch = [&] {
        for (int i = 0; i < kernels; ++i) {
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = blocks;
          cfg.blockDim = threads;
          cfg.stream = s;
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[0].val.programmaticStreamSerializationAllowed = 1;
          cfg.attrs = attr;
          cfg.numAttrs = 1;
          CHECK(cudaLaunchKernelEx(&cfg, spin, ns, flag, 1));
        }
        CHECK(cudaStreamSynchronize(s));
      };
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kernels; ++i)
        spin<<<blocks, threads, 0, s>>>(ns, flag, 0);
      CHECK(cudaStreamEndCapture(s, &graph));
      CHECK(cudaGraphInstantiate(&exec, graph, 0));
      auto graphRun = [&] {
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
      };
      // The host's cost alone: enqueue without waiting (then drain).
      auto enqueueOnly = [&] {
        auto t0 = Clock::now();
        for (int i = 0; i < kernels; ++i)
          spin<<<blocks, threads, 0, s>>>(ns, flag, 0);
        double us = std::chrono::duration<double, std::micro>(Clock::now() - t0)
                        .count();
        CHECK(cudaStreamSynchronize(s));
        return us;
      };
      std::vector<double> enq;
      for (int i = 0; i < 200; ++i)
        enq.push_back(enqueueOnly());
      std::sort(enq.begin(), enq.end());
      std::printf("{\"kernels\": %d, \"spin_ns\": %lld, \"plain\": %.1f, "
                  "\"alloc\": %.1f, \"graph\": %.1f, \"pdl\": %.1f, "
                  "\"enqueue_only\": %.1f}\n",
                  kernels, ns, medianUs(plain), medianUs(alloc),
                  medianUs(graphRun), medianUs(pdlLaunch), enq[100]);
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
    }
  // A sync of an idle stream and an event query: the wait's own cost.
  std::printf("{\"idle_sync\": %.2f}\n",
              medianUs([&] { CHECK(cudaStreamSynchronize(s)); }));
  return 0;
}
