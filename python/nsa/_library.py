"""The layer as PyTorch operators (torch.library), so that torch.compile,
torch.export and autograd see it:

    torch.ops.nsa.sparse_attention(q, k, v, gates, cmp_weights, cu_seqlens,
                                   config, scale) -> out
    torch.ops.nsa.sparse_attention_train(...same...) -> [out, *saved]
    torch.ops.nsa.sparse_attention_backward(dout, q, k, v, gates,
        cmp_weights, cu_seqlens, saved, config, scale) -> [dq, dk, dv,
        dgates(, dcmp_weights)]

`config` is the NSAConfig as integers (config_ints), `scale` the softmax
scale (0: 1/sqrt(Dqk)). `sparse_attention_train` is the CUDA forward that
also returns the saved state (Spec section 9.1: each branch's output and
lse, the selected indices) for the backward; on the CPU it returns [out]
and the backward recomputes the forward through the JIT-compiled gradient.
Both forward ops are differentiable (register_autograd); each has a fake
(meta) implementation. nsa.sparse_attention is the checked entry point
that calls them.
"""

import functools
from typing import List, Optional

import torch
from torch import Tensor

from . import ops
from .config import NSAConfig

_INT_FIELDS = ("cmp_block", "cmp_stride", "slc_block", "num_selected",
               "window", "initial", "local", "log_levels", "hub_stride",
               "max_tokens")


def config_ints(config):
    """NSAConfig -> the operators' `config` integers (blocks last)."""
    return ([getattr(config, f) for f in _INT_FIELDS] +
            [int(config.pool == "linear")] + list(config.blocks))


@functools.lru_cache(maxsize=256)
def _config_from(ints, scale):
    return _make_config(list(ints), scale)


def config_from(ints, scale):
    """The operators' `config` integers and scale -> NSAConfig (cached)."""
    return _config_from(tuple(int(i) for i in ints), float(scale))


def _make_config(ints, scale):
    n = len(_INT_FIELDS)
    if len(ints) < n + 1:
        raise ValueError(f"nsa: config must hold at least {n + 1} integers "
                         f"(config_ints), found {len(ints)}")
    fields = dict(zip(_INT_FIELDS, (int(i) for i in ints[:n])))
    return NSAConfig(**fields, pool="linear" if ints[n] else "mean",
                     blocks=tuple(int(b) for b in ints[n + 1:]),
                     scale=float(scale) if scale else None)


def _saved_like(q, k, v, num_selected):
    """The empty saved state of a CUDA training forward (Spec 9.1)."""
    B, T, HQ, _ = q.shape
    out = (B, T, HQ, v.shape[3])
    f32 = dict(dtype=torch.float32, device=q.device)
    return [q.new_empty(out), q.new_empty((B, T, HQ), **f32),
            q.new_empty((B, T, k.shape[2], num_selected), dtype=torch.int32),
            q.new_empty(out), q.new_empty((B, T, HQ), **f32),
            q.new_empty(out), q.new_empty((B, T, HQ), **f32)]


@torch.library.custom_op("nsa::sparse_attention", mutates_args=())
def sparse_attention(q: Tensor, k: Tensor, v: Tensor, gates: Tensor,
                     cmp_weights: Optional[Tensor],
                     cu_seqlens: Optional[Tensor], config: List[int],
                     scale: float) -> Tensor:
    c = config_from(config, scale)
    desc, _ = ops._check_inputs(q, k, v, gates, c, cu_seqlens, cmp_weights)
    out = ops._output(q, v, None)
    if q.device.type == "cuda":
        return ops._forward_cuda(desc, q, k, v, gates, cu_seqlens,
                                 cmp_weights, out)
    return ops._forward_cpu(desc, q, k, v, gates, cu_seqlens, cmp_weights,
                            out)


@sparse_attention.register_fake
def _(q, k, v, gates, cmp_weights, cu_seqlens, config, scale):
    return q.new_empty((*q.shape[:3], v.shape[3]))


@torch.library.custom_op("nsa::sparse_attention_train", mutates_args=())
def sparse_attention_train(q: Tensor, k: Tensor, v: Tensor, gates: Tensor,
                           cmp_weights: Optional[Tensor],
                           cu_seqlens: Optional[Tensor], config: List[int],
                           scale: float) -> List[Tensor]:
    c = config_from(config, scale)
    desc, _ = ops._check_inputs(q, k, v, gates, c, cu_seqlens, cmp_weights)
    out = ops._output(q, v, None)
    if q.device.type != "cuda":
        return [ops._forward_cpu(desc, q, k, v, gates, cu_seqlens,
                                 cmp_weights, out)]
    saved = _saved_like(q, k, v, c.num_selected)
    ops._forward_train_cuda(desc, q, k, v, gates, cu_seqlens, cmp_weights,
                            out, saved)
    return [out] + saved


@sparse_attention_train.register_fake
def _(q, k, v, gates, cmp_weights, cu_seqlens, config, scale):
    out = q.new_empty((*q.shape[:3], v.shape[3]))
    if q.device.type != "cuda":
        return [out]
    return [out] + _saved_like(q, k, v, config_from(config, scale)
                               .num_selected)


@torch.library.custom_op("nsa::sparse_attention_backward", mutates_args=())
def sparse_attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor,
                              gates: Tensor, cmp_weights: Optional[Tensor],
                              cu_seqlens: Optional[Tensor],
                              saved: List[Tensor], config: List[int],
                              scale: float) -> List[Tensor]:
    c = config_from(config, scale)
    desc, _ = ops._check_inputs(q, k, v, gates, c, cu_seqlens, cmp_weights)
    dout = dout.to(q.dtype).contiguous()
    if q.device.type != "cuda":
        grads = ops._backward_cpu(desc, q, k, v, gates, cu_seqlens,
                                  cmp_weights, dout)
    else:
        if not saved:  # the forward kept no state: make it
            saved = _saved_like(q, k, v, c.num_selected)
            ops._forward_train_cuda(desc, q, k, v, gates, cu_seqlens,
                                    cmp_weights, None, saved)
        grads = ops._backward_cuda(desc, q, k, v, gates, cu_seqlens,
                                   cmp_weights, saved, dout)
    return [g for g in grads if g is not None]


@sparse_attention_backward.register_fake
def _(dout, q, k, v, gates, cmp_weights, cu_seqlens, saved, config, scale):
    grads = [torch.empty_like(t) for t in (q, k, v, gates)]
    if cmp_weights is not None:
        grads.append(torch.empty_like(cmp_weights))
    return grads


def _input_grads(grads, cmp_weights):
    """The backward op's list as autograd's per-input gradients."""
    dw = grads[4] if cmp_weights is not None else None
    return grads[0], grads[1], grads[2], grads[3], dw, None, None, None


def _setup(ctx, inputs, output):
    q, k, v, gates, cmp_weights, cu_seqlens, config, scale = inputs
    ctx.config, ctx.scale = config, scale
    saved = list(output[1:]) if isinstance(output, (list, tuple)) else []
    ctx.num_saved = len(saved)
    ctx.save_for_backward(q, k, v, gates, cmp_weights, cu_seqlens, *saved)


def _backward(ctx, dout):
    q, k, v, gates, cmp_weights, cu_seqlens, *saved = ctx.saved_tensors
    grads = torch.ops.nsa.sparse_attention_backward(
        dout, q, k, v, gates, cmp_weights, cu_seqlens, saved, ctx.config,
        ctx.scale)
    return _input_grads(grads, cmp_weights)


def _backward_train(ctx, douts):
    return _backward(ctx, douts[0])


sparse_attention.register_autograd(_backward, setup_context=_setup)
sparse_attention_train.register_autograd(_backward_train,
                                         setup_context=_setup)
