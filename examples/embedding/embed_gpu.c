/*===- embed_gpu.c - an ahead-of-time layer of this project's own --------===*
 *
 * embed_layers (nsa_add_gpu_layer + nsa_add_layer_library in this
 * project's CMakeLists.txt) holds one layer. This program finds it through
 * the library's registry, checks the description it was compiled from, and
 * where a GPU is runs it on random bf16 inputs (B 2, T 300: no tile
 * multiple) against the float64 reference, the output poisoned first.
 * Without a GPU it stops after the registry checks (exit 0, "skipped").
 *
 *===----------------------------------------------------------------------===*/

#include "NSA-c/Reference.h"
#include "NSA-c/Runtime.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint16_t toBF16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static double fromBF16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Random bf16 values in [-1, 1) (an LCG: the same on every machine), with
 * their float64 values for the reference. */
static void randomBF16(size_t n, uint64_t seed, uint16_t *bits,
                       double *values) {
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    float f = (float)((seed >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
    bits[i] = toBF16(f);
    values[i] = fromBF16(bits[i]);
  }
}

int main(void) {
  if (nsaLayerLibraryCount() != 1) {
    fprintf(stderr, "embed-gpu: expected 1 layer, found %lld\n",
            (long long)nsaLayerLibraryCount());
    return 1;
  }
  const nsaLayerEntry *e = nsaLayerLibraryGet(0);
  const nsaLayerDesc *d = &e->desc;
  if (nsaLayerLibraryGet(1) || strcmp(e->layer.name, "embed_tiny") ||
      d->qHeads != 4 || d->kvHeads != 2 || d->qkDim != 64 || d->vDim != 64 ||
      d->config.cmpBlock != 16 || d->config.window != 48 ||
      d->dtype != nsaBF16) {
    fprintf(stderr, "embed-gpu: the registry's entry is not embed_tiny\n");
    return 1;
  }
  printf("embed-gpu: layer %s (%lld/%lld heads, dims %lld/%lld), compiled "
         "with '%s'\n",
         e->layer.name, (long long)d->qHeads, (long long)d->kvHeads,
         (long long)d->qkDim, (long long)d->vDim, e->pipeline);
  if (nsaInit(0) != nsaSuccess) {
    printf("embed-gpu: skipped the GPU run: %s\n", nsaGetLastError());
    return 0;
  }

  const int64_t B = 2, T = 300;
  size_t nq = B * T * d->qHeads * d->qkDim, nk = B * T * d->kvHeads * d->qkDim,
         nv = B * T * d->kvHeads * d->vDim, ng = B * T * d->qHeads * 3,
         no = B * T * d->qHeads * d->vDim;
  size_t sizes[4] = {nq, nk, nv, ng};
  uint16_t *bits[4];
  double *values[4];
  void *dev[5];
  for (int i = 0; i < 4; ++i) {
    bits[i] = malloc(2 * sizes[i]);
    values[i] = malloc(8 * sizes[i]);
    randomBF16(sizes[i], 17 + i, bits[i], values[i]);
    if (nsaMalloc(&dev[i], 2 * sizes[i]) ||
        nsaMemcpyHtoD(dev[i], bits[i], 2 * sizes[i]))
      return fprintf(stderr, "embed-gpu: %s\n", nsaGetLastError()), 1;
  }
  /* Poison the output (bf16 NaN pairs) so that nothing unwritten passes. */
  if (nsaMalloc(&dev[4], 2 * no) || nsaMemset32(dev[4], 0x7fc07fc0u, no / 2))
    return fprintf(stderr, "embed-gpu: %s\n", nsaGetLastError()), 1;

  nsaLayerArgs args = {B, T, nsaBF16, dev[0], dev[1], dev[2], dev[3],
                       NULL, NULL, 0, dev[4]};
  if (nsaLayerForward(&e->layer, &args) != nsaSuccess)
    return fprintf(stderr, "embed-gpu: %s\n", nsaGetLastError()), 1;
  uint16_t *outBits = malloc(2 * no);
  double *ref = malloc(8 * no);
  if (nsaMemcpyDtoH(outBits, dev[4], 2 * no))
    return fprintf(stderr, "embed-gpu: %s\n", nsaGetLastError()), 1;
  if (nsaReferenceForward(d, B, T, values[0], values[1], values[2],
                          values[3], NULL, NULL, 0, ref, NULL))
    return fprintf(stderr, "embed-gpu: %s\n", nsaGetLastError()), 1;
  double err = 0, norm = 0;
  for (size_t i = 0; i < no; ++i) {
    double diff = fromBF16(outBits[i]) - ref[i];
    err += diff * diff;
    norm += ref[i] * ref[i];
  }
  double rel = sqrt(err / norm);
  printf("embed-gpu: B %lld, T %lld on the GPU: relative L2 error %.3e "
         "against the float64 reference (tolerance 1e-2)\n",
         (long long)B, (long long)T, rel);
  return rel <= 1e-2 ? 0 : 1; /* NaN fails */
}
