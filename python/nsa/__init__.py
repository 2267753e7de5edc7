"""nsa: Native Sparse Attention compiled by the nsa MLIR pipeline.

    import torch, nsa
    out = nsa.sparse_attention(q, k, v, gates)            # the paper's config
    out = nsa.sparse_attention(q, k, v, gates, nsa.NSAConfig(window=256))

CPU tensors run the layer JIT-compiled by nsa-to-cpu (libNSA-C); CUDA
tensors run a layer compiled ahead of time by nsa-to-ptx (libnsa_layers, or
the libraries named in NSA_LAYER_LIBRARIES) through the nsa runtime. The
layer is a PyTorch operator, torch.ops.nsa.sparse_attention, with its
backward and fake implementations (torch.compile, torch.export).
``nsa.reference`` is the float64 reference every kernel is tested against.
See docs/Embedding.md. Needs torch 2.5 or newer.
"""

import torch as _torch

if not hasattr(_torch.library, "custom_op"):
    raise ImportError(f"nsa needs torch 2.5 or newer (torch.library."
                      f"custom_op), found torch {_torch.__version__}")

from . import _library  # noqa: E402,F401 (registers torch.ops.nsa.*)
from .config import NSAConfig  # noqa: E402
from .module import SparseAttention  # noqa: E402
from .ops import (NSAError, gpu_layers, reference,  # noqa: E402
                  reference_backward, sparse_attention)

__all__ = ["NSAConfig", "NSAError", "SparseAttention", "gpu_layers",
           "reference", "reference_backward", "sparse_attention"]
