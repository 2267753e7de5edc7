"""nsa.SparseAttention: an NSA attention layer as a torch.nn.Module."""

import torch
from torch import nn

from .config import NSAConfig
from .ops import sparse_attention


class SparseAttention(nn.Module):
    """Native Sparse Attention over hidden states [B, T, hidden]:

        q, k, v, gate logits = projections of x
        o = nsa.sparse_attention(q, k, v, gates, config)   # [B, T, HQ, Dv]
        y = o_proj(o)                                       # [B, T, hidden]

    num_heads query heads share num_kv_heads KV heads (GQA); head_dim is
    Dqk, v_head_dim Dv (default: head_dim). With config.pool == "linear"
    the compression's learned weights are a parameter `cmp_weights`
    [2, H, l] (float32, for keys and values), initialized to the mean.
    cu_seqlens (int32 [S + 1], B = 1) packs sequences in forward.
    """

    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim,
                 v_head_dim=None, config=None, bias=False, device=None,
                 dtype=None):
        super().__init__()
        config = NSAConfig() if config is None else config
        if not isinstance(config, NSAConfig):
            raise TypeError(f"config must be an nsa.NSAConfig, found "
                            f"{type(config).__name__}")
        for name, value in (("hidden_size", hidden_size),
                            ("num_heads", num_heads),
                            ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, found "
                                 f"{value!r}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of "
                             f"num_kv_heads ({num_kv_heads})")
        self.config = config
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, **kw)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, **kw)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.v_head_dim,
                                **kw)
        self.g_proj = nn.Linear(hidden_size, num_heads * 3, **kw)
        self.o_proj = nn.Linear(num_heads * self.v_head_dim, hidden_size,
                                **kw)
        if config.pool == "linear":
            l = config.cmp_block
            self.cmp_weights = nn.Parameter(torch.full(
                (2, num_kv_heads, l), 1.0 / l, device=device,
                dtype=torch.float64 if dtype == torch.float64 else
                torch.float32))
        else:
            self.register_parameter("cmp_weights", None)

    def forward(self, x, cu_seqlens=None):
        if x.dim() != 3:
            raise ValueError(f"x must be [B, T, hidden], found shape "
                             f"{tuple(x.shape)}")
        B, T, _ = x.shape
        HQ, H = self.num_heads, self.num_kv_heads

        def heads(t, n, d):
            return t.reshape(B, T, n, d).contiguous()
        q = heads(self.q_proj(x), HQ, self.head_dim)
        k = heads(self.k_proj(x), H, self.head_dim)
        v = heads(self.v_proj(x), H, self.v_head_dim)
        g = heads(self.g_proj(x), HQ, 3)
        w = self.cmp_weights
        if w is not None:  # the layer takes them in f32 (f64 with f64 q)
            w = w.to(torch.float64 if q.dtype == torch.float64 else
                     torch.float32)
        o = sparse_attention(q, k, v, g, self.config, cu_seqlens=cu_seqlens,
                             cmp_weights=w)
        return self.o_proj(o.reshape(B, T, HQ * self.v_head_dim))

    def extra_repr(self):
        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, v_head_dim={self.v_head_dim}, "
                f"config={self.config}")
