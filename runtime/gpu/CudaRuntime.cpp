//===- CudaRuntime.cpp - the nsa GPU runtime over a dlopen'ed libcuda -----===//
//
// Implements include/NSA/Runtime/nsa_runtime.h and the mgpu* host ABI that
// MLIR's `gpu-to-llvm` and the LLVM IR translation of `gpu.binary` emit:
//
//   mgpuModuleLoad(blob, size) / mgpuModuleUnload / mgpuModuleGetFunction
//   mgpuLaunchKernel(fn, grid, block, smem, stream, params, extra, count)
//   mgpuStreamCreate / Destroy / Synchronize / WaitEvent
//   mgpuEventCreate / Destroy / Synchronize / Record
//   mgpuMemAlloc / MemFree / Memcpy / Memset16 / Memset32
//   mgpuSetDefaultDevice
//
// libcuda is loaded with dlopen on first use: the library links without it
// and reports nsaErrorNoDriver where there is none. Every driver call is
// checked; a failure inside an mgpu* entry point (which cannot return an
// error to generated code) is printed once and kept for nsaTakeAsyncError().
//
//===----------------------------------------------------------------------===//

#include "NSA/Runtime/nsa_runtime.h"

#include <cuda.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

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
  X(cuStreamCreate)                                                            \
  X(cuStreamDestroy)                                                           \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamWaitEvent)                                                         \
  X(cuEventCreate)                                                             \
  X(cuEventDestroy)                                                            \
  X(cuEventRecord)                                                             \
  X(cuEventSynchronize)                                                        \
  X(cuMemAlloc)                                                                \
  X(cuMemFree)                                                                 \
  X(cuMemcpyAsync)                                                             \
  X(cuMemcpyHtoD)                                                              \
  X(cuMemcpyDtoH)                                                              \
  X(cuMemsetD16Async)                                                          \
  X(cuMemsetD32Async)                                                          \
  X(cuMemsetD32)                                                               \
  X(cuGetErrorName)                                                            \
  X(cuGetErrorString)

struct Driver {
#define NSA_DECLARE(name) decltype(&::name) name = nullptr;
  NSA_CUDA_FUNCTIONS(NSA_DECLARE)
#undef NSA_DECLARE
  void *handle = nullptr;
  CUcontext context = nullptr;
  int device = 0;
};

thread_local std::string lastError;
std::mutex asyncMutex;
nsaStatus asyncStatus = nsaSuccess;
std::string asyncMessage;

nsaStatus fail(nsaStatus status, std::string message) {
  lastError = std::move(message);
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
         std::to_string(static_cast<int>(result)) + "): " +
         (text ? text : "no description");
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
        asyncMessage = lastError;
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

} // namespace

//===----------------------------------------------------------------------===//
// C API
//===----------------------------------------------------------------------===//

extern "C" const char *nsaGetLastError(void) { return lastError.c_str(); }

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

extern "C" nsaStatus nsaMemset32(void *dst, uint32_t value, size_t count) {
  if (!dst)
    return fail(nsaErrorInvalidArgument, "nsaMemset32: null pointer");
  return withContext([&](Driver &d) {
    return check(d.cuMemsetD32(reinterpret_cast<CUdeviceptr>(dst), value, count),
                 "cuMemsetD32");
  });
}

extern "C" nsaStatus nsaSynchronize(void) {
  return withContext(
      [&](Driver &d) { return check(d.cuCtxSynchronize(), "cuCtxSynchronize"); });
}

/// Records an argument error for the calling thread (used by Layer.cpp).
extern "C" nsaStatus nsaFailInvalidArgument(const char *message) {
  return fail(nsaErrorInvalidArgument, message);
}

extern "C" nsaStatus nsaTakeAsyncError(void) {
  std::lock_guard<std::mutex> lock(asyncMutex);
  nsaStatus s = asyncStatus;
  if (s != nsaSuccess)
    lastError = asyncMessage;
  asyncStatus = nsaSuccess;
  asyncMessage.clear();
  return s;
}

//===----------------------------------------------------------------------===//
// The mgpu* host ABI of MLIR's GPU lowering
//===----------------------------------------------------------------------===//

extern "C" CUmodule mgpuModuleLoad(void *data, size_t /*size*/) {
  ScopedContext scope;
  CUmodule module = nullptr;
  if (scope)
    NSA_ASYNC(cuModuleLoadData(&module, data));
  return module;
}

extern "C" void mgpuModuleUnload(CUmodule module) {
  if (!module || !driver().cuModuleUnload)
    return;
  // Modules are unloaded by destructors at exit, possibly after the driver
  // has shut down; that is not an error.
  CUresult r = driver().cuModuleUnload(module);
  if (r != CUDA_ERROR_DEINITIALIZED)
    checkAsync(r, "cuModuleUnload");
}

extern "C" CUfunction mgpuModuleGetFunction(CUmodule module,
                                            const char *name) {
  CUfunction function = nullptr;
  if (!module) {
    failAsync(nsaErrorCuda, std::string("no module for kernel ") + name);
    return nullptr;
  }
  NSA_ASYNC(cuModuleGetFunction(&function, module, name));
  return function;
}

extern "C" void mgpuLaunchKernel(CUfunction function, intptr_t gridX,
                                 intptr_t gridY, intptr_t gridZ,
                                 intptr_t blockX, intptr_t blockY,
                                 intptr_t blockZ, int32_t smem,
                                 CUstream stream, void **params, void **extra,
                                 size_t /*paramsCount*/) {
  ScopedContext scope;
  if (!scope)
    return;
  if (!function) {
    failAsync(nsaErrorCuda, "launch of a kernel that was not loaded");
    return;
  }
  if (gridX <= 0 || gridY <= 0 || gridZ <= 0)
    return; // an empty grid launches nothing
  // Above 48 KiB a kernel must opt in to its dynamic shared memory.
  if (smem > 48 * 1024)
    NSA_ASYNC(cuFuncSetAttribute(
        function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
  NSA_ASYNC(cuLaunchKernel(function, gridX, gridY, gridZ, blockX, blockY,
                           blockZ, smem, stream, params, extra));
}

extern "C" CUstream mgpuStreamCreate() {
  ScopedContext scope;
  CUstream stream = nullptr;
  if (scope)
    NSA_ASYNC(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  return stream;
}

extern "C" void mgpuStreamDestroy(CUstream stream) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuStreamDestroy(stream));
}

extern "C" void mgpuStreamSynchronize(CUstream stream) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuStreamSynchronize(stream));
}

extern "C" void mgpuStreamWaitEvent(CUstream stream, CUevent event) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuStreamWaitEvent(stream, event, 0));
}

extern "C" CUevent mgpuEventCreate() {
  ScopedContext scope;
  CUevent event = nullptr;
  if (scope)
    NSA_ASYNC(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  return event;
}

extern "C" void mgpuEventDestroy(CUevent event) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuEventDestroy(event));
}

extern "C" void mgpuEventSynchronize(CUevent event) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuEventSynchronize(event));
}

extern "C" void mgpuEventRecord(CUevent event, CUstream stream) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuEventRecord(event, stream));
}

extern "C" void *mgpuMemAlloc(uint64_t bytes, CUstream /*stream*/,
                              bool /*isHostShared*/) {
  ScopedContext scope;
  CUdeviceptr ptr = 0;
  if (scope)
    NSA_ASYNC(cuMemAlloc(&ptr, bytes ? bytes : 1));
  return reinterpret_cast<void *>(ptr);
}

extern "C" void mgpuMemFree(void *ptr, CUstream /*stream*/) {
  ScopedContext scope;
  if (scope && ptr)
    NSA_ASYNC(cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)));
}

extern "C" void mgpuMemcpy(void *dst, void *src, size_t bytes,
                           CUstream stream) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                            reinterpret_cast<CUdeviceptr>(src), bytes, stream));
}

extern "C" void mgpuMemset32(void *dst, unsigned int value, size_t count,
                             CUstream stream) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(dst), value,
                               count, stream));
}

extern "C" void mgpuMemset16(void *dst, unsigned short value, size_t count,
                             CUstream stream) {
  ScopedContext scope;
  if (scope)
    NSA_ASYNC(cuMemsetD16Async(reinterpret_cast<CUdeviceptr>(dst), value,
                               count, stream));
}

extern "C" void mgpuSetDefaultDevice(int32_t device) {
  if (nsaInit(device) != nsaSuccess)
    failAsync(nsaErrorNoDevice, lastError);
}
