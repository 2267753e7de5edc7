/*===- nsa_runtime.h - the nsa GPU runtime, C API ------------------*- C -*-===*
 *
 * The small runtime that launches code compiled by `nsa-to-ptx`. It loads
 * the CUDA driver (libcuda) at run time, so programs link without it and fail
 * with a clear error where there is none, implements the `mgpu*` host ABI
 * that MLIR's GPU lowering emits (module load, kernel launch with large
 * dynamic shared memory, streams, memory), and checks every driver call.
 *
 * Functions return nsaSuccess or an error code; nsaGetLastError() describes
 * the last error of the calling thread. Errors inside the mgpu* entry points,
 * which return nothing to the generated code, are kept until
 * nsaTakeAsyncError() reads them.
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_RUNTIME_NSA_RUNTIME_H
#define NSA_RUNTIME_NSA_RUNTIME_H

#include "NSA-c/Error.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nsaStatus {
  nsaSuccess = 0,
  nsaErrorNoDriver = 1,        /* libcuda could not be loaded or used */
  nsaErrorNoDevice = 2,        /* no CUDA device with that ordinal */
  nsaErrorCuda = 3,            /* a driver call failed */
  nsaErrorInvalidArgument = 4, /* rejected before any launch */
} nsaStatus;

/* nsaGetLastError() describes the calling thread's last error
 * (NSA-c/Error.h). */

/* Loads libcuda (once) and makes `device` current for later calls. */
nsaStatus nsaInit(int device);

/* Device memory and copies (synchronous). */
nsaStatus nsaMalloc(void **devicePtr, size_t bytes);
nsaStatus nsaFree(void *devicePtr);
nsaStatus nsaMemcpyHtoD(void *devicePtr, const void *hostPtr, size_t bytes);
nsaStatus nsaMemcpyDtoH(void *hostPtr, const void *devicePtr, size_t bytes);
nsaStatus nsaMemset32(void *devicePtr, uint32_t value, size_t count);
nsaStatus nsaSynchronize(void);

/* The first error raised inside an mgpu* entry point since the last call,
 * cleared by reading it. */
nsaStatus nsaTakeAsyncError(void);

/*===----------------------------------------------------------------------===*
 * Kernel timings
 *
 * Between nsaProfileBegin and nsaProfileEnd every kernel launched through the
 * mgpu* ABI is timed with CUDA events and waited for (so launches do not
 * overlap), and its time is added to its kernel's entry. nsa-to-ptx names
 * kernels after the op they compute: `<function>_<op>_<k>`.
 *===----------------------------------------------------------------------===*/

typedef struct nsaKernelTime {
  char name[128];
  int64_t launches;
  double ms; /* summed over launches */
} nsaKernelTime;

/* Clears the timings and starts timing launches. */
void nsaProfileBegin(void);

/* Stops timing; writes up to `capacity` entries, in the order the kernels
 * were first launched, and returns how many kernels were timed. */
int64_t nsaProfileEnd(nsaKernelTime *out, int64_t capacity);

/*===----------------------------------------------------------------------===*
 * Compiled layers
 *
 * A layer compiled ahead of time by nsa-to-ptx (nsa-gen-layer,
 * nsa_add_gpu_layer) exports `_mlir_ciface_<name>layer`, which takes memref
 * descriptors. nsaLayerForward checks every argument against the layer's
 * compiled sizes before anything is launched, then calls it.
 *===----------------------------------------------------------------------===*/

typedef enum nsaDType { nsaBF16 = 0, nsaF16 = 1, nsaF32 = 2 } nsaDType;

/* What a layer was compiled for. */
typedef struct nsaLayer {
  const char *name;
  int64_t qHeads, kvHeads, qkDim, vDim;
  int64_t cmpBlock; /* l, the length of the learned pool's weights */
  nsaDType dtype;
  int packed;      /* takes cu_seqlens */
  int learnedPool; /* takes cmp_weights [2, H, l] (f32) */
  void (*entry)(void); /* &_mlir_ciface_<name>layer */
  /* Training (layers compiled with --gradient; zero otherwise): */
  int64_t slcBlock, numSelected; /* l' and n: the saved indices' blocks */
  void (*train)(void);    /* &_mlir_ciface_<name>layer_train */
  void (*backward)(void); /* &_mlir_ciface_<name>layer_grad_saved */
  /* Decoding (layers compiled with --decode=Tq; zero otherwise): */
  int64_t decodeQueries, cmpStride; /* Tq, and d for the compressed rows */
  void (*decode)(void);             /* &_mlir_ciface_<name>decode_step */
} nsaLayer;

/* One call: contiguous device tensors in the [B, T, heads, dim] layout,
 * every pointer 16-byte aligned. */
typedef struct nsaLayerArgs {
  int64_t batch, tokens;
  nsaDType dtype;
  const void *q, *k, *v; /* [B,T,HQ,Dqk], [B,T,H,Dqk], [B,T,H,Dv] */
  const void *gates;     /* [B,T,HQ,3] gate logits, dtype */
  const float *cmpWeights; /* [2,H,l] when learnedPool, else NULL */
  const int32_t *cuSeqlens; /* [numSeqlens] device i32 when packed */
  int64_t numSeqlens;
  void *out; /* [B,T,HQ,Dv], dtype */
} nsaLayerArgs;

/* Checks `args` (null or misaligned pointers, sizes, dtype, cu_seqlens:
 * 0 first, non-decreasing, `tokens` last), then runs the layer on the
 * device of the last nsaInit (0 if none) and waits for it. Returns
 * nsaErrorInvalidArgument, naming the first problem, before any launch.
 * Layer libraries (NSA-c/Runtime.h) describe their layers for callers that
 * pick one. */
nsaStatus nsaLayerForward(const nsaLayer *layer, const nsaLayerArgs *args);

/* One decoding step over a KV cache (docs/Spec.md section 12): batch row b
 * of the caches holds kvLens[b] tokens, the last `queries` of them this
 * step's (already written to kCache, vCache by the caller). The step writes
 * the compressed blocks the step completed into kcCache, vcCache (in place;
 * [B, Nc(cacheTokens), H, D] with Nc(L) = L < l ? 0 : (L - l) / d + 1) and
 * the output rows of the new tokens. */
typedef struct nsaLayerDecodeArgs {
  int64_t batch, queries, cacheTokens; /* B, Tq, Lmax */
  nsaDType dtype;
  const void *q, *gates;       /* [B,Tq,HQ,Dqk], [B,Tq,HQ,3] */
  const void *kCache, *vCache; /* [B,Lmax,H,Dqk], [B,Lmax,H,Dv] */
  void *kcCache, *vcCache;     /* [B,Nc(Lmax),H,Dqk], [B,Nc(Lmax),H,Dv] */
  const float *cmpWeights;     /* [2,H,l] when learnedPool, else NULL */
  const int32_t *kvLens;       /* [B] device i32 */
  void *out;                   /* [B,Tq,HQ,Dv] */
  /* Optional: the same lengths on the host (a decoding loop has them).
   * Where given they are checked instead of reading kvLens back, which
   * saves a round trip to the device; the kernels read only rows inside
   * the caches whatever kvLens holds. NULL: kvLens is read back. */
  const int32_t *kvLensHost;
} nsaLayerDecodeArgs;

/* Checks `args` (pointers, sizes, dtype, and the lengths, kvLensHost or
 * kvLens read back: queries <= kvLens[b] <= cacheTokens), then runs the
 * step and waits for it. Returns nsaErrorInvalidArgument, naming the first
 * problem, before any launch. */
nsaStatus nsaLayerDecode(const nsaLayer *layer, const nsaLayerDecodeArgs *args);

/* nsaLayerDecode ordered on `stream` (a CUstream; NULL: the legacy default
 * stream) that does not wait for the step: the way to call a layer a step
 * of a model, whose layers run back to back on one stream. From the second
 * call with the same tensors (pointers and sizes) on, the call is one CUDA
 * graph launch on `stream` (the second first captures the graph). The
 * first such call (it runs the step directly and loads its kernels), and
 * every call while kernels are timed, with NSA_GRAPHS=0 or without a
 * stream-ordered memory pool, first wait for `stream` and then run the step
 * and wait for it. Without kvLensHost the call waits for `stream` to read
 * kvLens back. The tensors must stay as they are until `stream` has run the
 * step. Same checks and errors as nsaLayerDecode, before any launch.
 *
 * Where `stream` is being captured into a graph (cuStreamBeginCapture, e.g.
 * a model capturing its whole decoding step), the step's kernels are
 * captured into that graph instead (with its workspace as the graph's
 * allocation and free nodes; it needs the stream-ordered memory pool), and
 * nothing runs now. kvLensHost is then required (the lengths cannot be read
 * back while capturing): it is checked at capture time, and a replay reads
 * kvLens as the device then holds it; the kernels read only rows inside the
 * caches whatever it holds. */
nsaStatus nsaLayerDecodeAsync(const nsaLayer *layer,
                              const nsaLayerDecodeArgs *args, void *stream);

/*===----------------------------------------------------------------------===*
 * Training
 *
 * nsaLayerForwardTrain is nsaLayerForward that also writes the state the
 * backward needs (docs/Spec.md section 9.1, docs/Runtime.md); nsaLayerBackward
 * takes that state and the output's gradient and writes the gradients of
 * q, k, v, the gate logits and (learned pool) cmpWeights, without
 * recomputing the forward. The selected indices are held fixed. Both check
 * every argument as nsaLayerForward does, before any launch, and need a
 * layer compiled with --gradient (train and backward set).
 *===----------------------------------------------------------------------===*/

/* The saved state: per branch its output and lse, and the selected
 * indices. Contiguous device tensors, 16-byte aligned. */
typedef struct nsaLayerSaved {
  void *cmpOut;      /* [B,T,HQ,Dv] dtype */
  float *cmpLse;     /* [B,T,HQ] */
  int32_t *indices;  /* [B,T,H,n]: selection blocks, -1 for none */
  void *slcOut;      /* [B,T,HQ,Dv] dtype */
  float *slcLse;     /* [B,T,HQ] */
  void *winOut;      /* [B,T,HQ,Dv] dtype */
  float *winLse;     /* [B,T,HQ] */
} nsaLayerSaved;

/* Bytes of each saved tensor for `batch` x `tokens`: outputs, lse, indices
 * (0 for a layer without training entries or bad sizes). */
size_t nsaLayerSavedBytes(const nsaLayer *layer, int64_t batch, int64_t tokens,
                          int which /* 0 output, 1 lse, 2 indices */);

/* The gradients of one backward call. */
typedef struct nsaLayerGrads {
  const void *dout;    /* [B,T,HQ,Dv] dtype: the gradient of args->out */
  void *dq, *dk, *dv;  /* the shapes and dtype of q, k, v */
  void *dgates;        /* [B,T,HQ,3] dtype */
  float *dcmpWeights;  /* [2,H,l] when learnedPool, else NULL */
} nsaLayerGrads;

/* The forward (args->out) and its saved state. */
nsaStatus nsaLayerForwardTrain(const nsaLayer *layer, const nsaLayerArgs *args,
                               const nsaLayerSaved *saved);

/* The gradients from `saved` (as nsaLayerForwardTrain wrote it for the same
 * q, k, v, gates, cmpWeights and cuSeqlens; args->out is not read and may
 * be NULL). The saved indices are read back and checked (each -1 or a
 * selection block of its sequence) before any launch. */
nsaStatus nsaLayerBackward(const nsaLayer *layer, const nsaLayerArgs *args,
                           const nsaLayerSaved *saved,
                           const nsaLayerGrads *grads);

#ifdef __cplusplus
}
#endif

#endif /* NSA_RUNTIME_NSA_RUNTIME_H */
