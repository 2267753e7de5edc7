/*===- NSA-c/Runtime.h - compiled GPU layers and their libraries ----*- C -*-===*
 *
 * The GPU runtime's C API (NSA/Runtime/nsa_runtime.h: nsaInit, memory,
 * nsaLayerForward) and the registry of a library of layers compiled ahead
 * of time (nsa_add_gpu_layer + nsa_add_layer_library in CMake): each entry
 * pairs the runtime's nsaLayer with the description it was compiled from,
 * so that a caller (the Python package, say) picks the layer that matches
 * its tensors and configuration.
 *
 *   for (int64_t i = 0; i < nsaLayerLibraryCount(); ++i) {
 *     const nsaLayerEntry *e = nsaLayerLibraryGet(i);
 *     if (matches(&e->desc)) return nsaLayerForward(&e->layer, &args);
 *   }
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_RUNTIME_H
#define NSA_C_RUNTIME_H

#include "NSA-c/Layer.h"
#include "NSA/Runtime/nsa_runtime.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nsaLayerEntry {
  nsaLayer layer;     /* what nsaLayerForward takes */
  nsaLayerDesc desc;  /* what it was compiled for */
  const char *pipeline; /* the nsa-to-ptx options it was compiled with */
} nsaLayerEntry;

/* Exported by a layer library (libnsa_layers and those made with
 * nsa_add_layer_library): the number of layers, and entry `i` (NULL out of
 * range). */
int64_t nsaLayerLibraryCount(void);
const nsaLayerEntry *nsaLayerLibraryGet(int64_t i);

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_RUNTIME_H */
