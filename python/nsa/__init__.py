"""nsa: Native Sparse Attention compiled by the nsa MLIR pipeline.

    import torch, nsa
    out = nsa.sparse_attention(q, k, v, gates)            # the paper's config
    out = nsa.sparse_attention(q, k, v, gates, nsa.NSAConfig(window=256))

CPU tensors run the layer JIT-compiled by nsa-to-cpu (libNSA-C); CUDA
tensors run a layer compiled ahead of time by nsa-to-ptx (libnsa_layers, or
the libraries named in NSA_LAYER_LIBRARIES) through the nsa runtime.
``nsa.reference`` is the float64 reference every kernel is tested against.
See docs/Embedding.md.
"""

from .config import NSAConfig
from .ops import (NSAError, gpu_layers, reference, reference_backward,
                  sparse_attention)

__all__ = ["NSAConfig", "NSAError", "gpu_layers", "reference",
           "reference_backward", "sparse_attention"]
