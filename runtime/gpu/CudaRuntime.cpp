//===- CudaRuntime.cpp - the nsa GPU runtime over a dlopen'ed libcuda -----===//
//
// Implements include/NSA/Runtime/nsa_runtime.h and the mgpu* host ABI that
// MLIR's `gpu-to-llvm` and the LLVM IR translation of `gpu.binary` emit:
//
//   mgpuModuleLoad(blob, size) / mgpuModuleUnload / mgpuModuleGetFunction
//   mgpuLaunchKernel(fn, grid, block, smem, stream, params, extra, count)
//   mgpuLaunchClusterKernel(fn, cluster, grid, block, ...) (sm_90 clusters)
//   mgpuStreamCreate / Destroy / Synchronize / WaitEvent
//   mgpuEventCreate / Destroy / Synchronize / Record
//   mgpuMemAlloc / MemFree / Memcpy / Memset16 / Memset32
//   mgpuSetDefaultDevice
//   mgpuTensorMapEncodeTiledMemref (TMA descriptors,
//   nvgpu.tma.create.descriptor)
//
// and times kernels by name between nsaProfileBegin and nsaProfileEnd.
//
// libcuda is loaded with dlopen on first use: the library links without it
// and reports nsaErrorNoDriver where there is none. Every driver call is
// checked; a failure inside an mgpu* entry point (which cannot return an
// error to generated code) is printed once and kept for nsaTakeAsyncError().
//
//===----------------------------------------------------------------------===//

#include "NSA/Runtime/nsa_runtime.h"

#include "CallCache.h"

#include <cuda.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

#define NSA_STR2(x) #x
#define NSA_STR(x) NSA_STR2(x)

// The driver entry points used; NSA_STR gives the versioned symbol names
// that cuda.h maps them to (cuMemAlloc -> cuMemAlloc_v2, ...).
#define NSA_CUDA_FUNCTIONS(X)                                                  \
  X(cuInit)                                                                    \
  X(cuDeviceGet)                                                               \
  X(cuDeviceGetCount)                                                          \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuCtxPushCurrent)                                                          \
  X(cuCtxPopCurrent)                                                           \
  X(cuCtxSynchronize)                                                          \
  X(cuModuleLoadData)                                                          \
  X(cuModuleUnload)                                                            \
  X(cuModuleGetFunction)                                                       \
  X(cuFuncSetAttribute)                                                        \
  X(cuLaunchKernel)                                                            \
  X(cuLaunchKernelEx)                                                          \
  X(cuStreamCreate)                                                            \
  X(cuStreamDestroy)                                                           \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamWaitEvent)                                                         \
  X(cuEventCreate)                                                             \
  X(cuEventDestroy)                                                            \
  X(cuEventRecord)                                                             \
  X(cuEventSynchronize)                                                        \
  X(cuEventElapsedTime)                                                        \
  X(cuMemAlloc)                                                                \
  X(cuMemFree)                                                                 \
  X(cuMemAllocAsync)                                                           \
  X(cuMemFreeAsync)                                                            \
  X(cuDeviceGetDefaultMemPool)                                                 \
  X(cuMemPoolSetAttribute)                                                     \
  X(cuMemcpyAsync)                                                             \
  X(cuMemcpyHtoD)                                                              \
  X(cuMemcpyDtoH)                                                              \
  X(cuMemAllocHost)                                                            \
  X(cuMemFreeHost)                                                             \
  X(cuMemsetD16Async)                                                          \
  X(cuMemsetD32Async)                                                          \
  X(cuMemsetD32)                                                               \
  X(cuTensorMapEncodeTiled)                                                    \
  X(cuStreamBeginCapture)                                                      \
  X(cuStreamEndCapture)                                                        \
  X(cuStreamIsCapturing)                                                       \
  X(cuThreadExchangeStreamCaptureMode)                                         \
  X(cuStreamGetId)                                                             \
  X(cuGraphGetNodes)                                                           \
  X(cuGraphNodeGetType)                                                        \
  X(cuGraphKernelNodeGetParams)                                                \
  X(cuGraphKernelNodeGetAttribute)                                             \
  X(cuGraphInstantiate)                                                        \
  X(cuGraphLaunch)                                                             \
  X(cuGraphDestroy)                                                            \
  X(cuGraphExecDestroy)                                                        \
  X(cuGetErrorName)                                                            \
  X(cuGetErrorString)

struct Driver {
#define NSA_DECLARE(name) decltype(&::name) name = nullptr;
  NSA_CUDA_FUNCTIONS(NSA_DECLARE)
#undef NSA_DECLARE
  void *handle = nullptr;
  CUcontext context = nullptr;
  int device = 0;
  /// Whether mgpuMemAlloc/MemFree use the device's stream-ordered pool (a
  /// driver or device without memory pools gets cuMemAlloc/cuMemFree).
  bool pools = false;
};

std::mutex asyncMutex;
nsaStatus asyncStatus = nsaSuccess;
std::string asyncMessage;

nsaStatus fail(nsaStatus status, std::string message) {
  nsaSetLastError(message.c_str());
  return status;
}

Driver &driver() {
  static Driver d;
  return d;
}

std::string describe(CUresult result) {
  Driver &d = driver();
  const char *name = nullptr, *text = nullptr;
  if (d.cuGetErrorName)
    d.cuGetErrorName(result, &name);
  if (d.cuGetErrorString)
    d.cuGetErrorString(result, &text);
  return std::string(name ? name : "CUDA error") + " (" +
         std::to_string(static_cast<int>(result)) +
         "): " + (text ? text : "no description");
}

/// Loads libcuda and resolves every entry point, once.
nsaStatus loadDriver() {
  static std::once_flag once;
  static nsaStatus status = nsaSuccess;
  static std::string message;
  std::call_once(once, [] {
    Driver &d = driver();
    const char *names[] = {"libcuda.so.1", "libcuda.so"};
    for (const char *name : names)
      if ((d.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
        break;
    if (!d.handle) {
      status = nsaErrorNoDriver;
      message = std::string("cannot load the CUDA driver (libcuda.so.1): ") +
                dlerror() + "; a GPU and its driver are needed";
      return;
    }
#define NSA_RESOLVE(fn)                                                        \
  d.fn = reinterpret_cast<decltype(d.fn)>(dlsym(d.handle, NSA_STR(fn)));       \
  if (!d.fn) {                                                                 \
    status = nsaErrorNoDriver;                                                 \
    message = "the CUDA driver lacks " NSA_STR(fn);                            \
    return;                                                                    \
  }
    NSA_CUDA_FUNCTIONS(NSA_RESOLVE)
#undef NSA_RESOLVE
    CUresult r = d.cuInit(0);
    if (r != CUDA_SUCCESS) {
      status = nsaErrorNoDriver;
      message = "cuInit failed: " + describe(r);
    }
  });
  if (status != nsaSuccess)
    return fail(status, message);
  return nsaSuccess;
}

/// Checks a driver call made by the C API.
nsaStatus check(CUresult result, const char *call) {
  if (result == CUDA_SUCCESS)
    return nsaSuccess;
  return fail(nsaErrorCuda, std::string(call) + " failed: " + describe(result));
}

/// Records the first failure of a driver call made by an mgpu* entry point.
void checkAsync(CUresult result, const char *call) {
  if (result == CUDA_SUCCESS)
    return;
  std::lock_guard<std::mutex> lock(asyncMutex);
  if (asyncStatus == nsaSuccess) {
    asyncStatus = nsaErrorCuda;
    asyncMessage = std::string(call) + " failed: " + describe(result);
    std::fprintf(stderr, "nsa runtime: %s\n", asyncMessage.c_str());
  }
}

void failAsync(nsaStatus status, const std::string &message) {
  std::lock_guard<std::mutex> lock(asyncMutex);
  if (asyncStatus == nsaSuccess) {
    asyncStatus = status;
    asyncMessage = message;
    std::fprintf(stderr, "nsa runtime: %s\n", message.c_str());
  }
}

/// Makes the device's primary context current for one scope.
class ScopedContext {
public:
  ScopedContext() {
    if (nsaStatus s = nsaInit(driver().device)) {
      // Without a driver nothing can run: record it quietly, the C API
      // reports it (modules are loaded by constructors at program start).
      std::lock_guard<std::mutex> lock(asyncMutex);
      if (asyncStatus == nsaSuccess) {
        asyncStatus = s;
        asyncMessage = nsaGetLastError();
      }
      return;
    }
    ok = driver().cuCtxPushCurrent(driver().context) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    if (ok) {
      CUcontext popped;
      driver().cuCtxPopCurrent(&popped);
    }
  }
  explicit operator bool() const { return ok; }

private:
  bool ok = false;
};

#define NSA_ASYNC(call) checkAsync(driver().call, #call)

/// NSA_ASYNC with the primary context current (nothing runs without one).
#define NSA_ASYNC_IN_CONTEXT(call)                                             \
  do {                                                                         \
    ScopedContext scope;                                                       \
    if (scope)                                                                 \
      NSA_ASYNC(call);                                                         \
  } while (false)

} // namespace

//===----------------------------------------------------------------------===//
// C API
//===----------------------------------------------------------------------===//


extern "C" nsaStatus nsaInit(int device) {
  if (nsaStatus s = loadDriver())
    return s;
  Driver &d = driver();
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (d.context && d.device == device)
    return nsaSuccess;
  int count = 0;
  if (nsaStatus s = check(d.cuDeviceGetCount(&count), "cuDeviceGetCount"))
    return s;
  if (device < 0 || device >= count)
    return fail(nsaErrorNoDevice, "no CUDA device " + std::to_string(device) +
                                      " (" + std::to_string(count) +
                                      " visible)");
  CUdevice dev;
  if (nsaStatus s = check(d.cuDeviceGet(&dev, device), "cuDeviceGet"))
    return s;
  if (nsaStatus s = check(d.cuDevicePrimaryCtxRetain(&d.context, dev),
                          "cuDevicePrimaryCtxRetain"))
    return s;
  // The buffers of generated code (mgpuMemAlloc) come from the device's
  // stream-ordered pool, which keeps what is freed for the next call
  // instead of unmapping it: a layer's intermediates (gigabytes at 64k
  // tokens) are not mapped again on every call.
  CUmemoryPool pool;
  cuuint64_t keepAll = ~cuuint64_t(0);
  d.pools = d.cuDeviceGetDefaultMemPool(&pool, dev) == CUDA_SUCCESS &&
            d.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                    &keepAll) == CUDA_SUCCESS;
  d.device = device;
  return nsaSuccess;
}

namespace {
/// Runs `body` with the primary context current; returns its status.
template <typename Fn> nsaStatus withContext(Fn body) {
  if (nsaStatus s = nsaInit(driver().device))
    return s;
  Driver &d = driver();
  if (nsaStatus s = check(d.cuCtxPushCurrent(d.context), "cuCtxPushCurrent"))
    return s;
  nsaStatus s = body(d);
  CUcontext popped;
  d.cuCtxPopCurrent(&popped);
  return s;
}
} // namespace

extern "C" nsaStatus nsaMalloc(void **ptr, size_t bytes) {
  if (!ptr)
    return fail(nsaErrorInvalidArgument, "nsaMalloc: null result pointer");
  return withContext([&](Driver &d) {
    CUdeviceptr p = 0;
    nsaStatus s = check(d.cuMemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc");
    *ptr = reinterpret_cast<void *>(p);
    return s;
  });
}

extern "C" nsaStatus nsaFree(void *ptr) {
  if (!ptr)
    return nsaSuccess;
  return withContext([&](Driver &d) {
    return check(d.cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)), "cuMemFree");
  });
}

extern "C" nsaStatus nsaMemcpyHtoD(void *dst, const void *src, size_t bytes) {
  if (!dst || !src)
    return fail(nsaErrorInvalidArgument, "nsaMemcpyHtoD: null pointer");
  return withContext([&](Driver &d) {
    return check(d.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes),
                 "cuMemcpyHtoD");
  });
}

extern "C" nsaStatus nsaMemcpyDtoH(void *dst, const void *src, size_t bytes) {
  if (!dst || !src)
    return fail(nsaErrorInvalidArgument, "nsaMemcpyDtoH: null pointer");
  return withContext([&](Driver &d) {
    return check(d.cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes),
                 "cuMemcpyDtoH");
  });
}

// For Layer.cpp: copies `bytes` from the device into this thread's pinned
// staging buffer (grown as needed and kept: page-locked copies run at the
// link's speed, pageable ones several times slower) and points `*host` at
// it.
extern "C" nsaStatus nsaStageDtoH(const void *src, size_t bytes,
                                  const void **host) {
  thread_local void *staging = nullptr;
  thread_local size_t capacity = 0;
  if (!src || !host)
    return fail(nsaErrorInvalidArgument, "nsaStageDtoH: null pointer");
  return withContext([&](Driver &d) {
    if (bytes > capacity) {
      if (staging) {
        if (nsaStatus s = check(d.cuMemFreeHost(staging), "cuMemFreeHost"))
          return s;
        staging = nullptr;
        capacity = 0;
      }
      if (nsaStatus s =
              check(d.cuMemAllocHost(&staging, bytes), "cuMemAllocHost"))
        return s;
      capacity = bytes;
    }
    *host = staging;
    return check(
        d.cuMemcpyDtoH(staging, reinterpret_cast<CUdeviceptr>(src), bytes),
        "cuMemcpyDtoH");
  });
}

extern "C" nsaStatus nsaMemset32(void *dst, uint32_t value, size_t count) {
  if (!dst)
    return fail(nsaErrorInvalidArgument, "nsaMemset32: null pointer");
  return withContext([&](Driver &d) {
    return check(
        d.cuMemsetD32(reinterpret_cast<CUdeviceptr>(dst), value, count),
        "cuMemsetD32");
  });
}

extern "C" nsaStatus nsaSynchronize(void) {
  return withContext([&](Driver &d) {
    return check(d.cuCtxSynchronize(), "cuCtxSynchronize");
  });
}

/// Records an argument error for the calling thread (used by Layer.cpp).
// For Layer.cpp: initializes the device nsaInit chose last (0 if none), so
// that a layer runs where the caller's tensors are.
extern "C" nsaStatus nsaInitCurrentDevice(void) {
  return nsaInit(driver().device);
}

extern "C" nsaStatus nsaFailInvalidArgument(const char *message) {
  return fail(nsaErrorInvalidArgument, message);
}

extern "C" nsaStatus nsaTakeAsyncError(void) {
  std::lock_guard<std::mutex> lock(asyncMutex);
  nsaStatus s = asyncStatus;
  if (s != nsaSuccess)
    nsaSetLastError(asyncMessage.c_str());
  asyncStatus = nsaSuccess;
  asyncMessage.clear();
  return s;
}

//===----------------------------------------------------------------------===//
// The mgpu* host ABI of MLIR's GPU lowering
//===----------------------------------------------------------------------===//

namespace {
/// A module of generated code. The global constructors of generated code
/// call mgpuModuleLoad at program (or library) start; the driver is loaded
/// and the module given to it only on its first kernel, so that a program
/// starts without touching CUDA (tools such as compute-sanitizer must
/// initialize CUDA before the program does).
struct LazyModule {
  const void *image;
  std::mutex mutex;
  CUmodule module = nullptr;
};
} // namespace

extern "C" void *mgpuModuleLoad(void *data, size_t /*size*/) {
  return new LazyModule{data};
}

extern "C" void mgpuModuleUnload(void *handle) {
  auto *lazy = static_cast<LazyModule *>(handle);
  if (!lazy)
    return;
  // Modules are unloaded by destructors at exit, possibly after the driver
  // has shut down; that is not an error.
  if (lazy->module && driver().cuModuleUnload) {
    CUresult r = driver().cuModuleUnload(lazy->module);
    if (r != CUDA_ERROR_DEINITIALIZED)
      checkAsync(r, "cuModuleUnload");
  }
  delete lazy;
}

namespace {
/// Kernel names (for timings) and the timings of nsaProfileBegin/End.
struct Profile {
  std::mutex mutex;
  std::map<CUfunction, std::string> names;
  /// Kernels named `*_pdl`: launched with programmatic stream
  /// serialization (they wait for their predecessor themselves).
  std::set<CUfunction> dependents;
  bool on = false;
  std::vector<nsaKernelTime> times;
  std::map<std::string, size_t> index;
};
Profile &profile() {
  static Profile p;
  return p;
}

/// Adds `ms` to the entry of `function`.
void recordTime(CUfunction function, double ms) {
  Profile &p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  std::string name = p.names.count(function) ? p.names[function] : "?";
  auto [it, fresh] = p.index.try_emplace(name, p.times.size());
  if (fresh) {
    nsaKernelTime t{};
    std::snprintf(t.name, sizeof(t.name), "%s", name.c_str());
    p.times.push_back(t);
  }
  p.times[it->second].launches += 1;
  p.times[it->second].ms += ms;
}
} // namespace

extern "C" void nsaProfileBegin(void) {
  Profile &p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.times.clear();
  p.index.clear();
  p.on = true;
}

extern "C" int64_t nsaProfileEnd(nsaKernelTime *out, int64_t capacity) {
  Profile &p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.on = false;
  for (int64_t i = 0; out && i < capacity && i < int64_t(p.times.size()); ++i)
    out[i] = p.times[i];
  return p.times.size();
}

extern "C" CUfunction mgpuModuleGetFunction(void *handle, const char *name) {
  CUfunction function = nullptr;
  auto *lazy = static_cast<LazyModule *>(handle);
  if (!lazy) {
    failAsync(nsaErrorCuda, std::string("no module for kernel ") + name);
    return nullptr;
  }
  CUmodule module;
  {
    std::lock_guard<std::mutex> lock(lazy->mutex);
    if (!lazy->module)
      NSA_ASYNC_IN_CONTEXT(cuModuleLoadData(&lazy->module, lazy->image));
    module = lazy->module;
  }
  if (!module)
    return nullptr; // the failure is recorded
  NSA_ASYNC(cuModuleGetFunction(&function, module, name));
  if (function) {
    std::lock_guard<std::mutex> lock(profile().mutex);
    profile().names[function] = name;
    size_t length = std::strlen(name);
    if (length > 4 && std::strcmp(name + length - 4, "_pdl") == 0)
      profile().dependents.insert(function);
  }
  return function;
}

namespace {
/// A switch that is on unless `variable` is "0" in the environment.
bool switchedOn(const char *variable) {
  const char *v = std::getenv(variable);
  return !v || std::strcmp(v, "0") != 0;
}

/// NSA_PDL=0 in the environment launches `*_pdl` kernels plainly (their
/// griddepcontrol.wait then returns at once).
bool dependentLaunches() {
  static const bool enabled = switchedOn("NSA_PDL");
  return enabled;
}
} // namespace

namespace {
/// A launch of `function` on `stream`, in clusters of `cluster` blocks
/// when that is not (1, 1, 1).
void launch(CUfunction function, const intptr_t (&cluster)[3],
            const intptr_t (&grid)[3], const intptr_t (&block)[3], int32_t smem,
            CUstream stream, void **params, void **extra) {
  ScopedContext scope;
  if (!scope)
    return;
  if (!function) {
    failAsync(nsaErrorCuda, "launch of a kernel that was not loaded");
    return;
  }
  if (grid[0] <= 0 || grid[1] <= 0 || grid[2] <= 0)
    return; // an empty grid launches nothing
  bool clustered = cluster[0] * cluster[1] * cluster[2] > 1;
  if (clustered &&
      (cluster[0] <= 0 || cluster[1] <= 0 || cluster[2] <= 0 ||
       grid[0] % cluster[0] || grid[1] % cluster[1] || grid[2] % cluster[2])) {
    failAsync(nsaErrorCuda, "a cluster launch whose grid is not a multiple "
                            "of its clusters");
    return;
  }
  // Above 48 KiB a kernel must opt in to its dynamic shared memory, and
  // above 8 blocks to its cluster size: once per function and size,
  // remembered (a decoding step's launches take a few microseconds each, a
  // call to the driver more).
  if (smem > 48 * 1024 || cluster[0] * cluster[1] * cluster[2] > 8) {
    thread_local std::map<CUfunction, std::pair<int32_t, bool>> optedIn;
    auto &[granted, wide] = optedIn[function];
    if (granted < smem) {
      NSA_ASYNC(cuFuncSetAttribute(
          function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
      granted = smem;
    }
    if (!wide && cluster[0] * cluster[1] * cluster[2] > 8) {
      NSA_ASYNC(cuFuncSetAttribute(
          function, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
      wide = true;
    }
  }
  bool timed, dependent;
  {
    std::lock_guard<std::mutex> lock(profile().mutex);
    timed = profile().on;
    dependent = profile().dependents.count(function) != 0;
  }
  CUevent start = nullptr, stop = nullptr;
  if (timed) {
    NSA_ASYNC(cuEventCreate(&start, CU_EVENT_DEFAULT));
    NSA_ASYNC(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    NSA_ASYNC(cuEventRecord(start, stream));
  }
  // A dependent kernel starts while the kernel before it on `stream` ends;
  // it waits for that one in griddepcontrol.wait. (Timed launches go
  // plainly: events sit between them.)
  bool early = dependent && !timed && dependentLaunches();
  if (early || clustered) {
    CUlaunchAttribute attributes[2] = {};
    unsigned count = 0;
    if (early) {
      attributes[count].id =
          CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attributes[count++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (clustered) {
      attributes[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attributes[count].value.clusterDim.x = cluster[0];
      attributes[count].value.clusterDim.y = cluster[1];
      attributes[count++].value.clusterDim.z = cluster[2];
    }
    CUlaunchConfig config = {};
    config.gridDimX = grid[0];
    config.gridDimY = grid[1];
    config.gridDimZ = grid[2];
    config.blockDimX = block[0];
    config.blockDimY = block[1];
    config.blockDimZ = block[2];
    config.sharedMemBytes = smem;
    config.hStream = stream;
    config.attrs = attributes;
    config.numAttrs = count;
    NSA_ASYNC(cuLaunchKernelEx(&config, function, params, extra));
  } else {
    NSA_ASYNC(cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0],
                             block[1], block[2], smem, stream, params, extra));
  }
  if (timed) {
    float ms = 0;
    NSA_ASYNC(cuEventRecord(stop, stream));
    NSA_ASYNC(cuEventSynchronize(stop));
    NSA_ASYNC(cuEventElapsedTime(&ms, start, stop));
    NSA_ASYNC(cuEventDestroy(start));
    NSA_ASYNC(cuEventDestroy(stop));
    recordTime(function, ms);
  }
}
} // namespace

extern "C" void mgpuLaunchKernel(CUfunction function, intptr_t gridX,
                                 intptr_t gridY, intptr_t gridZ,
                                 intptr_t blockX, intptr_t blockY,
                                 intptr_t blockZ, int32_t smem, CUstream stream,
                                 void **params, void **extra,
                                 size_t /*paramsCount*/) {
  launch(function, {1, 1, 1}, {gridX, gridY, gridZ}, {blockX, blockY, blockZ},
         smem, stream, params, extra);
}

/// gpu.launch_func with clusters (sm_90).
extern "C" void mgpuLaunchClusterKernel(
    CUfunction function, intptr_t clusterX, intptr_t clusterY,
    intptr_t clusterZ, intptr_t gridX, intptr_t gridY, intptr_t gridZ,
    intptr_t blockX, intptr_t blockY, intptr_t blockZ, int32_t smem,
    CUstream stream, void **params, void **extra, size_t /*paramsCount*/) {
  launch(function, {clusterX, clusterY, clusterZ}, {gridX, gridY, gridZ},
         {blockX, blockY, blockZ}, smem, stream, params, extra);
}

namespace {
/// The streams of finished calls, per context, for the next calls: the
/// generated code makes one a call, and cuStreamCreate with cuStreamDestroy
/// cost microseconds, a large part of a decoding step at B = 1.
struct StreamPool {
  std::mutex mutex;
  std::vector<std::pair<CUcontext, CUstream>> free;
};
StreamPool &streamPool() {
  static StreamPool pool;
  return pool;
}
constexpr size_t kPooledStreams = 16;
} // namespace

namespace {
/// The stream nsaRunGraph is capturing on this thread: the generated code's
/// streams are it, and its waits are left to the graph's replay.
thread_local CUstream capturing = nullptr;
/// Where nsaRunGraph's capture on this thread keeps the generated code's
/// allocations (null: in the graph, as allocation and free nodes).
thread_local std::vector<CUdeviceptr> *captureArena = nullptr;
/// The bytes allocated into `captureArena`.
thread_local size_t captureArenaBytes = 0;
} // namespace

extern "C" CUstream mgpuStreamCreate() {
  if (capturing)
    return capturing;
  {
    StreamPool &pool = streamPool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    for (size_t i = pool.free.size(); i-- > 0;)
      if (pool.free[i].first == driver().context) {
        CUstream stream = pool.free[i].second;
        pool.free.erase(pool.free.begin() + i);
        return stream;
      }
  }
  CUstream stream = nullptr;
  NSA_ASYNC_IN_CONTEXT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  return stream;
}

/// Keeps `stream` for a later call (work still on it stays in its order).
extern "C" void mgpuStreamDestroy(CUstream stream) {
  if (!stream || stream == capturing)
    return;
  {
    StreamPool &pool = streamPool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (driver().context && pool.free.size() < kPooledStreams) {
      pool.free.emplace_back(driver().context, stream);
      return;
    }
  }
  NSA_ASYNC_IN_CONTEXT(cuStreamDestroy(stream));
}

extern "C" void mgpuStreamSynchronize(CUstream stream) {
  if (capturing)
    return;
  NSA_ASYNC_IN_CONTEXT(cuStreamSynchronize(stream));
}

extern "C" void mgpuStreamWaitEvent(CUstream stream, CUevent event) {
  NSA_ASYNC_IN_CONTEXT(cuStreamWaitEvent(stream, event, 0));
}

extern "C" CUevent mgpuEventCreate() {
  CUevent event = nullptr;
  NSA_ASYNC_IN_CONTEXT(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  return event;
}

extern "C" void mgpuEventDestroy(CUevent event) {
  NSA_ASYNC_IN_CONTEXT(cuEventDestroy(event));
}

extern "C" void mgpuEventSynchronize(CUevent event) {
  if (capturing)
    return;
  NSA_ASYNC_IN_CONTEXT(cuEventSynchronize(event));
}

extern "C" void mgpuEventRecord(CUevent event, CUstream stream) {
  NSA_ASYNC_IN_CONTEXT(cuEventRecord(event, stream));
}

// Generated code (nsa-async-launches) enqueues a call's allocations,
// launches and frees on one stream and synchronizes it at the end. Buffers
// come from the stream-ordered pool (see nsaInit) and go back to it in the
// order of the stream they are freed on, after every kernel enqueued there
// before the free; the driver reuses freed memory for an allocation on
// another stream only once that is safe.
extern "C" void *mgpuMemAlloc(uint64_t bytes, CUstream stream,
                              bool /*isHostShared*/) {
  CUdeviceptr ptr = 0;
  ScopedContext scope; // initializes the driver: `pools` is known after it
  if (!scope)
    return nullptr;
  if (capturing && captureArena) {
    // Allocated now, for the graph's lifetime (the capture is relaxed).
    NSA_ASYNC(cuMemAlloc(&ptr, bytes ? bytes : 1));
    if (ptr) {
      captureArena->push_back(ptr);
      captureArenaBytes += bytes;
    }
  } else if (driver().pools)
    NSA_ASYNC(cuMemAllocAsync(&ptr, bytes ? bytes : 1, stream));
  else
    NSA_ASYNC(cuMemAlloc(&ptr, bytes ? bytes : 1));
  return reinterpret_cast<void *>(ptr);
}

extern "C" void mgpuMemFree(void *ptr, CUstream stream) {
  if (!ptr)
    return;
  if (capturing && captureArena &&
      std::find(captureArena->begin(), captureArena->end(),
                reinterpret_cast<CUdeviceptr>(ptr)) != captureArena->end())
    return; // the graph's own, freed with it
  ScopedContext scope;
  if (!scope)
    return;
  if (driver().pools) {
    NSA_ASYNC(cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(ptr), stream));
    return;
  }
  // Not stream-ordered: after the work enqueued before the free.
  if (stream)
    NSA_ASYNC(cuStreamSynchronize(stream));
  NSA_ASYNC(cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)));
}

extern "C" void mgpuMemcpy(void *dst, void *src, size_t bytes,
                           CUstream stream) {
  NSA_ASYNC_IN_CONTEXT(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                     reinterpret_cast<CUdeviceptr>(src), bytes,
                                     stream));
}

extern "C" void mgpuMemset32(void *dst, unsigned int value, size_t count,
                             CUstream stream) {
  NSA_ASYNC_IN_CONTEXT(cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(dst),
                                        value, count, stream));
}

extern "C" void mgpuMemset16(void *dst, unsigned short value, size_t count,
                             CUstream stream) {
  NSA_ASYNC_IN_CONTEXT(cuMemsetD16Async(reinterpret_cast<CUdeviceptr>(dst),
                                        value, count, stream));
}

//===----------------------------------------------------------------------===//
// Graph replay of generated calls
//===----------------------------------------------------------------------===//

namespace {
/// A captured graph's only node, a kernel launch, with its arguments (the
/// graph's: kept with it). An async call launches it on the caller's
/// stream itself, so that a `*_pdl` kernel is placed on the SMs while the
/// launch before it there ends (programmatic serialization), which a
/// graph's launch is not: at B = 1 a decoding step is one such launch,
/// and back to back most of the gap between steps goes.
struct SingleKernel {
  CUfunction function = nullptr;
  intptr_t cluster[3] = {1, 1, 1}, grid[3] = {}, block[3] = {};
  int32_t smem = 0;
  void **params = nullptr;
};

/// `graph`'s only node where that is a kernel launch by function with
/// kernel parameters; a null function otherwise.
SingleKernel singleKernel(CUgraph graph) {
  Driver &d = driver();
  size_t count = 0;
  CUgraphNode node = nullptr;
  CUgraphNodeType type;
  CUDA_KERNEL_NODE_PARAMS params = {};
  if (d.cuGraphGetNodes(graph, nullptr, &count) != CUDA_SUCCESS ||
      count != 1 || d.cuGraphGetNodes(graph, &node, &count) != CUDA_SUCCESS ||
      d.cuGraphNodeGetType(node, &type) != CUDA_SUCCESS ||
      type != CU_GRAPH_NODE_TYPE_KERNEL ||
      d.cuGraphKernelNodeGetParams(node, &params) != CUDA_SUCCESS ||
      !params.func || !params.kernelParams || params.extra)
    return {};
  SingleKernel k;
  CUkernelNodeAttrValue value = {};
  if (d.cuGraphKernelNodeGetAttribute(
          node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &value) ==
          CUDA_SUCCESS &&
      value.clusterDim.x && value.clusterDim.y && value.clusterDim.z) {
    k.cluster[0] = value.clusterDim.x;
    k.cluster[1] = value.clusterDim.y;
    k.cluster[2] = value.clusterDim.z;
  }
  k.grid[0] = params.gridDimX;
  k.grid[1] = params.gridDimY;
  k.grid[2] = params.gridDimZ;
  k.block[0] = params.blockDimX;
  k.block[1] = params.blockDimY;
  k.block[2] = params.blockDimZ;
  k.smem = static_cast<int32_t>(params.sharedMemBytes);
  k.params = params.kernelParams;
  k.function = params.func;
  return k;
}

/// The calls nsaRunGraph has seen, by entry and key (a call's memref
/// descriptors: pointers, sizes and strides), most recent last (CallCache.h).
/// An async call is also keyed by its stream's id (unique for the process's
/// life): each stream has its own graph and memory, which only calls on that
/// stream use, one after the other.
struct GraphCache {
  struct Call {
    /// Of the entry, context, stream and key: compared first.
    uint64_t hash;
    const void *entry;
    std::vector<int64_t> key;
    CUcontext context;
    bool ordered = false;
    unsigned long long streamId = 0;
    /// Captured and instantiated on the second sighting; null before, or
    /// for good where capturing failed (`direct`).
    CUgraphExec exec = nullptr;
    bool direct = false;
    /// An async call's graph of one kernel launch: not instantiated, the
    /// call launches `single` itself.
    CUgraph graph = nullptr;
    SingleKernel single;
    /// The memory the graph's kernels use, allocated while capturing (as
    /// allocation nodes, a replay of a decoding step at B = 1 took
    /// microseconds more; see NSA_GRAPH_ARENA).
    std::vector<CUdeviceptr> arena;
    size_t arenaBytes = 0;
  };
  std::mutex mutex;
  nsa::runtime::CallCache<Call> calls;
};
GraphCache &graphCache() {
  static GraphCache cache;
  return cache;
}
using nsa::runtime::environmentCount;

/// Calls remembered; the least recently used is dropped (and its graph and
/// workspace freed) past it. A key first seen runs directly and is captured
/// only when seen again, so a model that cycles through more keys than this
/// (a layer's calls are one key each) would run every call directly:
/// NSA_GRAPH_CALLS=N in the environment sets it (default 512, enough for a
/// 61-layer model's decoding calls on several streams).
size_t rememberedCalls() {
  static const size_t calls =
      environmentCount("NSA_GRAPH_CALLS", 512, size_t(1) << 20);
  return calls;
}

/// The workspace the remembered calls' graphs may hold together: past it,
/// the least recently used calls with a workspace are dropped (never the
/// call just captured). NSA_GRAPH_MEMORY=MiB in the environment sets it
/// (default 4096: the workspaces of a step at B = 1 are about 1.4 MB each).
size_t rememberedBytes() {
  static const size_t bytes =
      environmentCount("NSA_GRAPH_MEMORY", 4096, size_t(1) << 24) << 20;
  return bytes;
}

/// NSA_GRAPHS=0 in the environment runs every call directly.
bool graphsEnabled() {
  static const bool enabled = switchedOn("NSA_GRAPHS");
  return enabled;
}

/// NSA_GRAPH_ARENA=0 in the environment captures the generated code's
/// allocations and frees as graph nodes instead of memory of the graph's own.
bool graphArenas() {
  static const bool enabled = switchedOn("NSA_GRAPH_ARENA");
  return enabled;
}

/// NSA_SINGLE_LAUNCHES=0 in the environment replays an async call's graph
/// of one kernel launch as a graph too (no programmatic serialization
/// between calls).
bool singleLaunches() {
  static const bool enabled = switchedOn("NSA_SINGLE_LAUNCHES");
  return enabled;
}

/// Frees `call`'s graph and its memory (synchronizing the context first
/// where it has memory: a replay may still use it).
void release(GraphCache::Call &call) {
  if (call.exec)
    NSA_ASYNC_IN_CONTEXT(cuGraphExecDestroy(call.exec));
  call.exec = nullptr;
  if (call.graph)
    NSA_ASYNC_IN_CONTEXT(cuGraphDestroy(call.graph));
  call.graph = nullptr;
  call.single = {};
  if (call.arena.empty())
    return;
  NSA_ASYNC_IN_CONTEXT(cuCtxSynchronize());
  for (CUdeviceptr p : call.arena)
    NSA_ASYNC_IN_CONTEXT(cuMemFree(p));
  call.arena.clear();
  call.arenaBytes = 0;
}

/// Captures `body` on a pooled stream into a graph; null where the capture
/// fails (the failure is not the call's: it then runs directly). The
/// allocations `body` makes are kept in `arena` (unless
/// NSA_GRAPH_ARENA=0): the graph then holds only the kernels, and replays
/// of one graph run one after the other (CUDA orders them; a launch of
/// `single` is ordered on the one stream of its call), so the memory is
/// theirs alone. The capture is relaxed for those allocations.
CUgraph capture(void (*body)(void *), void *context,
                std::vector<CUdeviceptr> &arena, size_t &arenaBytes) {
  Driver &d = driver();
  CUstream stream = mgpuStreamCreate();
  if (!stream)
    return nullptr;
  bool own = graphArenas();
  if (d.cuStreamBeginCapture(stream, own ? CU_STREAM_CAPTURE_MODE_RELAXED
                                         : CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) !=
      CUDA_SUCCESS) {
    mgpuStreamDestroy(stream);
    return nullptr;
  }
  capturing = stream;
  captureArena = own ? &arena : nullptr;
  captureArenaBytes = 0;
  body(context);
  captureArena = nullptr;
  arenaBytes = captureArenaBytes;
  capturing = nullptr;
  CUgraph graph = nullptr;
  CUresult ended = d.cuStreamEndCapture(stream, &graph);
  mgpuStreamDestroy(stream);
  // An error recorded while capturing belongs to the capture (enqueueing
  // into a capture fails where the stream could not be captured).
  {
    std::lock_guard<std::mutex> lock(asyncMutex);
    if (asyncStatus != nsaSuccess) {
      asyncStatus = nsaSuccess;
      asyncMessage.clear();
      ended = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
  }
  if (ended != CUDA_SUCCESS && graph) {
    d.cuGraphDestroy(graph);
    graph = nullptr;
  }
  return graph;
}

/// Captures `call` (capture): an async call's graph of one kernel launch
/// kept as `single`, any other graph instantiated; for good `direct` where
/// that fails.
void prepare(GraphCache::Call &call, void (*body)(void *), void *context) {
  Driver &d = driver();
  if (CUgraph graph = capture(body, context, call.arena, call.arenaBytes)) {
    if (call.ordered && singleLaunches())
      call.single = singleKernel(graph);
    if (call.single.function) {
      call.graph = graph;
      return;
    }
    if (d.cuGraphInstantiate(&call.exec, graph, 0) != CUDA_SUCCESS)
      call.exec = nullptr;
    d.cuGraphDestroy(graph);
  }
  call.direct = !call.exec;
  if (call.direct)
    release(call);
}
} // namespace

/// Runs `body` into the caller's capture on `stream` (a stream-ordered call
/// made while the caller captures its own graph, e.g. a model's whole
/// decoding step): the generated code's streams are `stream`, its waits are
/// left to the caller's graph, and its allocations become the graph's
/// allocation and free nodes (memory of the caller's graph, not ours, so
/// that it lives as long as that graph). The thread's capture mode is
/// relaxed meanwhile: loading a module or encoding a tensor map the first
/// time is not a stream operation.
static nsaStatus captureInto(CUstream stream, void (*body)(void *), void *context,
                             CUstreamCaptureStatus status) {
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    return fail(nsaErrorCuda, "nsaRunGraph: the caller's stream capture was "
                              "invalidated before this call");
  Driver &d = driver();
  if (!d.pools)
    return fail(nsaErrorCuda,
                "nsaRunGraph: capturing a call needs the device's "
                "stream-ordered memory pool, which this device lacks");
  if (capturing)
    return fail(nsaErrorCuda, "nsaRunGraph: called while capturing a call");
  ScopedContext scope;
  if (!scope)
    return nsaTakeAsyncError();
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  NSA_ASYNC(cuThreadExchangeStreamCaptureMode(&mode));
  capturing = stream;
  captureArena = nullptr;
  body(context);
  capturing = nullptr;
  NSA_ASYNC(cuThreadExchangeStreamCaptureMode(&mode));
  return nsaTakeAsyncError();
}

/// The caller's stream: CU_STREAM_LEGACY for null.
static CUstream callerStream(void *stream) {
  return stream ? static_cast<CUstream>(stream) : CU_STREAM_LEGACY;
}

// For Layer.cpp: waits until `stream` (null: the legacy default stream) has
// run what was enqueued on it.
extern "C" nsaStatus nsaWaitStream(void *stream) {
  return withContext([&](Driver &d) {
    return check(d.cuStreamSynchronize(callerStream(stream)),
                 "cuStreamSynchronize");
  });
}

// For Layer.cpp: whether `stream` (not null) is being captured into a graph
// (`*capturing`); an invalidated capture counts as one.
extern "C" nsaStatus nsaStreamCapturing(void *stream, int *capturing) {
  *capturing = 0;
  if (!stream)
    return nsaSuccess; // the legacy default stream is never captured
  return withContext([&](Driver &d) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    nsaStatus s = check(
        d.cuStreamIsCapturing(static_cast<CUstream>(stream), &status),
        "cuStreamIsCapturing");
    *capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
    return s;
  });
}

// For Layer.cpp: runs generated host code that enqueues its work on streams
// of its own and waits for them (`body`), replaying it as a CUDA graph from
// the second call with the same entry and key on: one launch instead of
// one per kernel, allocation and free, which at B = 1 is most of a decoding
// step. The first sighting runs directly (it also loads the modules); a
// capture that fails runs directly for good. Not while kernels are timed
// (nsaProfileBegin), nor with NSA_GRAPHS=0, nor without the stream-ordered
// memory pool (graph allocations need it). With `async` the call is ordered
// on `stream` (null: the legacy default stream): a replay is launched there
// and not waited for, and what runs directly first waits for `stream`.
// An async call is remembered for its stream: where its graph is one
// kernel launch (a decoding step at small B), the replay is that launch on
// `stream`, with programmatic serialization for a `*_pdl` kernel (it is
// placed on the SMs while the step before it ends). With `async` on a
// stream the caller is capturing, `body` is captured into the caller's
// graph instead (captureInto).
extern "C" nsaStatus nsaRunGraph(const void *entry, const int64_t *key,
                                 size_t words, void (*body)(void *),
                                 void *context, void *stream, int async) {
  if (nsaStatus s = nsaInit(driver().device))
    return s;
  Driver &d = driver();
  // Runs `body` directly, after what `stream` holds where `async`.
  auto direct = [&]() -> nsaStatus {
    if (async)
      if (nsaStatus s = nsaWaitStream(stream))
        return s;
    body(context);
    return nsaTakeAsyncError();
  };
  if (async && stream) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (nsaStatus s = withContext([&](Driver &d) {
          return check(
              d.cuStreamIsCapturing(static_cast<CUstream>(stream), &status),
              "cuStreamIsCapturing");
        }))
      return s;
    if (status != CU_STREAM_CAPTURE_STATUS_NONE)
      return captureInto(static_cast<CUstream>(stream), body, context,
                         status);
  }
  bool timed;
  {
    std::lock_guard<std::mutex> lock(profile().mutex);
    timed = profile().on;
  }
  if (!graphsEnabled() || timed || !d.pools)
    return direct();
  // An async call's entry is its stream's (where the driver names it).
  bool ordered = false;
  unsigned long long streamId = 0;
  if (async) {
    ScopedContext scope;
    if (!scope)
      return nsaTakeAsyncError();
    ordered = d.cuStreamGetId(callerStream(stream), &streamId) == CUDA_SUCCESS;
  }
  nsa::runtime::CallHash hash;
  hash.mix(reinterpret_cast<uintptr_t>(entry));
  hash.mix(reinterpret_cast<uintptr_t>(d.context));
  hash.mix(streamId);
  for (size_t i = 0; i < words; ++i)
    hash.mix(static_cast<uint64_t>(key[i]));
  GraphCache &cache = graphCache();
  std::unique_lock<std::mutex> lock(cache.mutex);
  // Made the most recent: `found` stays valid, and trim never drops it.
  GraphCache::Call *found =
      cache.calls.find(hash.get(), [&](const GraphCache::Call &c) {
        return c.entry == entry && c.context == d.context &&
               c.ordered == ordered && c.streamId == streamId &&
               c.key.size() == words &&
               std::equal(c.key.begin(), c.key.end(), key);
      });
  if (!found) {
    // First sighting: remember it, run directly.
    cache.calls.remember({hash.get(), entry,
                          std::vector<int64_t>(key, key + words), d.context,
                          ordered, streamId},
                         rememberedCalls(), release);
    lock.unlock();
    return direct();
  }
  GraphCache::Call &call = *found;
  if (!call.exec && !call.single.function && !call.direct) {
    ScopedContext scope;
    if (!scope)
      return nsaTakeAsyncError();
    prepare(call, body, context);
    cache.calls.trim(rememberedBytes(), release);
  }
  if (call.direct) {
    lock.unlock();
    return direct();
  }
  // Launches are serialized by the lock; launches of one graph run one
  // after the other (CUDA orders them), so its allocations are its own,
  // as are a single launch's on its call's stream (a `*_pdl` kernel waits
  // for the launch before it before it touches memory).
  if (call.single.function) {
    const SingleKernel &k = call.single;
    launch(k.function, k.cluster, k.grid, k.block, k.smem,
           callerStream(stream), k.params, nullptr);
    return nsaTakeAsyncError();
  }
  if (async) {
    ScopedContext scope;
    if (scope)
      NSA_ASYNC(cuGraphLaunch(call.exec, callerStream(stream)));
    return nsaTakeAsyncError();
  }
  CUstream own = mgpuStreamCreate();
  {
    ScopedContext scope;
    if (scope) {
      NSA_ASYNC(cuGraphLaunch(call.exec, own));
      NSA_ASYNC(cuStreamSynchronize(own));
    }
  }
  mgpuStreamDestroy(own);
  return nsaTakeAsyncError();
}

extern "C" void mgpuSetDefaultDevice(int32_t device) {
  if (nsaInit(device) != nsaSuccess)
    failAsync(nsaErrorNoDevice, nsaGetLastError());
}

/// 256 bytes of zeros in device memory, allocated once: the storage of the
/// tensor maps of empty tensors. 0 (and an async error) if allocation fails.
static CUdeviceptr emptyTensorStorage() {
  static std::mutex mutex;
  static CUdeviceptr storage = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (storage)
    return storage;
  ScopedContext scope;
  if (!scope)
    return 0;
  CUresult r = driver().cuMemAlloc(&storage, 256);
  if (r == CUDA_SUCCESS)
    r = driver().cuMemsetD32(storage, 0, 64);
  if (r != CUDA_SUCCESS) {
    checkAsync(r, "allocating the storage of empty tensor maps");
    storage = 0;
  }
  return storage;
}

/// A TMA tensor map for the ranked memref `descriptor` (allocated, aligned,
/// offset, sizes[rank], strides[rank]) with a box of `boxDims` elements (both
/// outermost first), copied to device memory, as `nvgpu.tma.create.descriptor`
/// lowers to. The arguments are checked first (TMA's rules: rank 1 to 5, unit
/// innermost stride, 16-byte aligned address and strides, box sides 1 to
/// 256); a bad one returns null and is reported by nsaTakeAsyncError. Equal
/// maps share one device copy, so calling a layer repeatedly allocates
/// nothing new.
extern "C" void *mgpuTensorMapEncodeTiledMemref(
    int64_t rank, void *descriptor, CUtensorMapDataType dataType,
    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill,
    int64_t *boxDims) {
  auto invalid = [](const std::string &why) -> void * {
    failAsync(nsaErrorInvalidArgument,
              "mgpuTensorMapEncodeTiledMemref: " + why);
    return nullptr;
  };
  // Bytes per element of each CUtensorMapDataType, in enum order.
  static const int64_t elementBytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  if (rank < 1 || rank > 5)
    return invalid("rank " + std::to_string(rank) + " (TMA takes 1 to 5)");
  if (static_cast<unsigned>(dataType) >= std::size(elementBytes))
    return invalid("unknown data type " + std::to_string(dataType));
  if (!descriptor || !boxDims)
    return invalid("null descriptor or box");
  const int64_t *words = static_cast<const int64_t *>(descriptor);
  const int64_t *sizes = words + 3, *strides = words + 3 + rank;
  int64_t bytes = elementBytes[dataType];
  uintptr_t address = static_cast<uintptr_t>(words[1]) + words[2] * bytes;
  // An empty tensor (a layer with no keys yet) has nothing a kernel may
  // load, but its kernel still takes a map: one over a single 16-byte row
  // of zeros, whose box reads past the end are zero-filled.
  bool empty =
      std::any_of(sizes, sizes + rank, [](int64_t s) { return s == 0; });
  int64_t oneRow[5] = {1, 1, 1, 1, 1};
  int64_t rowStrides[5] = {};
  if (empty) {
    CUdeviceptr zeros = emptyTensorStorage();
    if (!zeros)
      return nullptr;
    address = static_cast<uintptr_t>(zeros);
    for (int64_t r = 0; r < rank; ++r)
      rowStrides[r] = 16 / bytes;
    rowStrides[rank - 1] = 1;
    sizes = oneRow;
    strides = rowStrides;
  }
  if (!address || address % 16)
    return invalid("the tensor's address is null or not 16-byte aligned");
  if (strides[rank - 1] != 1)
    return invalid("the innermost stride is " +
                   std::to_string(strides[rank - 1]) + ", TMA needs 1");
  // The driver takes every array innermost first.
  cuuint64_t dims[5], byteStrides[4];
  cuuint32_t box[5], elementStrides[5];
  for (int64_t r = 0; r < rank; ++r) {
    int64_t size = sizes[rank - 1 - r], side = boxDims[rank - 1 - r];
    if (size < 1 || side < 1 || side > 256)
      return invalid("dimension " + std::to_string(rank - 1 - r) + ": size " +
                     std::to_string(size) + ", box " + std::to_string(side) +
                     " (sizes >= 1, box sides 1 to 256)");
    dims[r] = size;
    box[r] = side;
    elementStrides[r] = 1;
    if (r + 1 < rank) {
      int64_t stride = strides[rank - 2 - r] * bytes;
      if (stride <= 0 || stride % 16)
        return invalid("dimension " + std::to_string(rank - 2 - r) +
                       ": stride of " + std::to_string(stride) +
                       " bytes, TMA needs a positive multiple of 16");
      byteStrides[r] = stride;
    }
  }
  ScopedContext scope;
  if (!scope)
    return nullptr;
  CUtensorMap map;
  CUresult r = driver().cuTensorMapEncodeTiled(
      &map, dataType, static_cast<cuuint32_t>(rank),
      reinterpret_cast<void *>(address), dims, byteStrides, box, elementStrides,
      interleave, swizzle, l2Promotion, oobFill);
  if (r != CUDA_SUCCESS) {
    checkAsync(r, "cuTensorMapEncodeTiled");
    return nullptr;
  }
  static std::mutex mutex;
  static std::map<std::array<uint64_t, 16>, CUdeviceptr> copies;
  static_assert(sizeof(CUtensorMap) == sizeof(std::array<uint64_t, 16>));
  std::array<uint64_t, 16> key;
  std::memcpy(key.data(), &map, sizeof(map));
  std::lock_guard<std::mutex> lock(mutex);
  CUdeviceptr &copy = copies[key];
  if (!copy) {
    CUresult a = driver().cuMemAlloc(&copy, sizeof(map));
    if (a == CUDA_SUCCESS)
      a = driver().cuMemcpyHtoD(copy, &map, sizeof(map));
    if (a != CUDA_SUCCESS) {
      checkAsync(a, "copying a tensor map to the device");
      copies.erase(key);
      return nullptr;
    }
  }
  return reinterpret_cast<void *>(copy);
}
