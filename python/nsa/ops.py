"""nsa.sparse_attention on PyTorch tensors, and the float64 reference."""

import ctypes
import math
import os
import threading

import torch

from . import _native
from .config import NSAConfig

_DTYPES = {torch.bfloat16: _native.BF16, torch.float16: _native.F16,
           torch.float32: _native.F32}


class NSAError(RuntimeError):
    """A failure reported by nsa's libraries (the message says which)."""


def _check_inputs(q, k, v, gates, config, cu_seqlens, cmp_weights):
    """Checks every argument before anything runs; returns the layer's
    description (a ctypes LayerDesc) and its blocks array."""
    config = _check_tensors(q, k, v, gates, config, cu_seqlens, cmp_weights)
    return _describe(q, k, v, config, cu_seqlens)


def _check_tensors(q, k, v, gates, config, cu_seqlens, cmp_weights):
    """The checks on the tensors' types, shapes, dtypes and devices, in
    Python's terms (what torch.compile traces); returns the config."""
    if config is None:
        config = NSAConfig()
    if not isinstance(config, NSAConfig):
        raise TypeError(f"config must be an nsa.NSAConfig, found "
                        f"{type(config).__name__}")
    named = {"q": q, "k": k, "v": v, "gates": gates}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, found "
                            f"{type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions [B, T, heads, "
                             f"dim], found shape {tuple(t.shape)}")
    if q.dtype not in _DTYPES and not (q.dtype == torch.float64 and
                                       q.device.type == "cpu"):
        raise TypeError(f"q must be bfloat16, float16 or float32 (or "
                        f"float64 on the CPU), found {q.dtype}")
    for name, t in named.items():
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, q has {q.dtype}: "
                            f"q, k, v and gates must share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: "
                             f"all tensors must be on one device")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"tensors must be on the CPU or a CUDA device, "
                         f"found {q.device}")
    B, T, HQ, Dqk = q.shape
    H = k.shape[2]
    Dv = v.shape[3]
    # SDPA's [B, heads, T, dim] layout: T where nsa expects the heads.
    if (k.shape[1] != T and k.shape[2] == HQ) or (
            T != HQ and tuple(gates.shape[1:3]) == (HQ, T)):
        raise ValueError(f"q {list(q.shape)}, k {list(k.shape)} and gates "
                         f"{list(gates.shape)} look like [B, heads, T, "
                         f"dim]; nsa takes [B, T, heads, dim]: pass "
                         f"x.transpose(1, 2).contiguous() for each")
    want = {"k": (B, T, H, Dqk), "v": (B, T, H, Dv), "gates": (B, T, HQ, 3)}
    for name, shape in want.items():
        if tuple(named[name].shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)} for q of "
                             f"shape {list(q.shape)} and k with {H} heads, "
                             f"found {list(named[name].shape)}")
    if min(Dqk, Dv, HQ) == 0:
        raise ValueError(f"heads and head dims must be positive, found q "
                         f"{list(q.shape)} and v {list(v.shape)}")
    if H == 0 or HQ % H:
        raise ValueError(f"the query heads ({HQ}) must be a multiple of the "
                         f"KV heads ({H})")
    for name, t in named.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (strides "
                             f"{t.stride()} for shape {tuple(t.shape)}); "
                             f"call .contiguous()")
    if config.pool == "linear":
        if not isinstance(cmp_weights, torch.Tensor):
            raise TypeError("pool='linear' needs cmp_weights, a float32 "
                            f"tensor [2, {H}, {config.cmp_block}]")
        wdtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        if (cmp_weights.dtype != wdtype or
                tuple(cmp_weights.shape) != (2, H, config.cmp_block) or
                not cmp_weights.is_contiguous() or
                cmp_weights.device != q.device):
            raise ValueError(f"cmp_weights must be a contiguous {wdtype} "
                             f"tensor [2, {H}, {config.cmp_block}] on "
                             f"{q.device}, found {cmp_weights.dtype} "
                             f"{list(cmp_weights.shape)} on "
                             f"{cmp_weights.device}")
    elif cmp_weights is not None:
        raise ValueError("cmp_weights is only taken with pool='linear'")
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError("cu_seqlens must be a torch.Tensor")
        if (cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or
                not cu_seqlens.is_contiguous() or
                cu_seqlens.device != q.device):
            raise ValueError(f"cu_seqlens must be a contiguous 1-D int32 "
                             f"tensor on {q.device}, found "
                             f"{cu_seqlens.dtype} {list(cu_seqlens.shape)} "
                             f"on {cu_seqlens.device}")
        if B != 1:
            raise ValueError(f"packed sequences (cu_seqlens) need batch 1, "
                             f"found {B}")
    return config


def _describe(q, k, v, config, cu_seqlens):
    """The ctypes LayerDesc of checked tensors, and its blocks array."""
    HQ, Dqk, H, Dv = q.shape[2], q.shape[3], k.shape[2], v.shape[3]
    blocks = (ctypes.c_int64 * max(len(config.blocks), 1))(*config.blocks)
    c = _native.LayerConfig(
        cmpBlock=config.cmp_block, cmpStride=config.cmp_stride,
        slcBlock=config.slc_block, numSelected=config.num_selected,
        window=config.window, scale=float(config.scale or 0.0),
        linearPool=int(config.pool == "linear"), reserved=0,
        initialBlocks=config.initial, localBlocks=config.local,
        logLevels=config.log_levels, hubStride=config.hub_stride,
        blocks=ctypes.cast(blocks, ctypes.POINTER(ctypes.c_int64)),
        numBlocks=len(config.blocks), maxTokens=config.max_tokens)
    # float64 CPU tensors run the f32 layer (the JIT has no f64 kernels):
    # what torch.autograd.gradcheck needs, at f32's precision.
    desc = _native.LayerDesc(qHeads=HQ, kvHeads=H, qkDim=Dqk, vDim=Dv,
                             dtype=_DTYPES.get(q.dtype, _native.F32),
                             packed=int(cu_seqlens is not None), config=c)
    return desc, blocks


def _desc_key(d):
    """What identifies a compiled layer: every field of the description,
    the scale exactly (its default resolved as C resolves it, 1/sqrt(Dqk)
    in double precision)."""
    c = d.config
    blocks = tuple(c.blocks[i] for i in range(c.numBlocks))
    scale = c.scale if c.scale > 0 else 1.0 / math.sqrt(d.qkDim)
    return (d.qHeads, d.kvHeads, d.qkDim, d.vDim, d.dtype, d.packed,
            c.cmpBlock, c.cmpStride, c.slcBlock, c.numSelected, c.window,
            scale, c.linearPool, c.initialBlocks, c.localBlocks,
            c.logLevels, c.hubStride, blocks, c.maxTokens)


def _ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _f64(t):
    return None if t is None else t.detach().to(torch.float64).contiguous()


# CPU: one JIT-compiled layer per description, kept for the process.
_cpu_layers = {}
_cpu_lock = threading.Lock()


def _cpu_layer(desc, trainable=False):
    key = (_desc_key(desc), trainable)
    with _cpu_lock:
        if key not in _cpu_layers:
            lib = _native.capi()
            create = (lib.nsaCpuLayerCreateTrainable if trainable else
                      lib.nsaCpuLayerCreate)
            handle = create(ctypes.byref(desc))
            if not handle:
                raise NSAError(_native.last_error())
            _cpu_layers[key] = handle
        return _cpu_layers[key]


def _forward_cpu(desc, q, k, v, gates, cu_seqlens, cmp_weights, result):
    if q.shape[1] == 0:
        return result
    lib = _native.capi()
    handle = _cpu_layer(desc)
    B, T, HQ, _ = q.shape
    out = torch.full((B, T, HQ, v.shape[3]), float("nan"), dtype=torch.float64)
    ins = [_f64(t) for t in (q, k, v, gates, cmp_weights)]
    cu = cu_seqlens.contiguous() if cu_seqlens is not None else None
    rc = lib.nsaCpuLayerForward(
        handle, B, T, *[_ptr(t) for t in ins], _ptr(cu),
        0 if cu is None else cu.numel(), _ptr(out))
    if rc:
        raise NSAError(_native.last_error())
    result.copy_(out)
    return result


def _layer_libraries():
    paths = [p for p in os.environ.get("NSA_LAYER_LIBRARIES", "").split(":")
             if p]
    default = os.path.join(_native.library_dir(), "libnsa_layers.so")
    if os.path.exists(default):
        paths.append(default)
    return paths


def gpu_layers():
    """The layers compiled ahead of time that CUDA tensors can run: a list
    of (name, description dict, nsa-to-ptx options)."""
    result = []
    for path in _layer_libraries():
        lib = _native.layer_library(path)
        for i in range(lib.nsaLayerLibraryCount()):
            e = lib.nsaLayerLibraryGet(i).contents
            d, c = e.desc, e.desc.config
            result.append((e.layer.name.decode(), {
                "q_heads": d.qHeads, "kv_heads": d.kvHeads,
                "qk_dim": d.qkDim, "v_dim": d.vDim,
                "dtype": {v: k for k, v in _DTYPES.items()}[d.dtype],
                "packed": bool(d.packed),
                "config": NSAConfig(
                    cmp_block=c.cmpBlock, cmp_stride=c.cmpStride,
                    slc_block=c.slcBlock, num_selected=c.numSelected,
                    window=c.window, scale=c.scale or None,
                    pool="linear" if c.linearPool else "mean",
                    initial=c.initialBlocks, local=c.localBlocks,
                    log_levels=c.logLevels, hub_stride=c.hubStride,
                    blocks=tuple(c.blocks[j] for j in range(c.numBlocks)),
                    max_tokens=c.maxTokens)},
                e.pipeline.decode()))
    return result


# The entry found for a layer key and the libraries searched, kept for the
# process (the libraries stay loaded): later calls skip the search.
_gpu_entries = {}


def _gpu_entry(desc):
    key = (_desc_key(desc), os.environ.get("NSA_LAYER_LIBRARIES", ""))
    entry = _gpu_entries.get(key)
    if entry is None:
        entry = _gpu_entries[key] = _find_gpu_entry(desc)
    return entry


def _find_gpu_entry(desc):
    key = _desc_key(desc)
    names = []
    for path in _layer_libraries():
        lib = _native.layer_library(path)
        for i in range(lib.nsaLayerLibraryCount()):
            e = lib.nsaLayerLibraryGet(i)
            if _desc_key(e.contents.desc) == key:
                return e
            names.append(e.contents.layer.name.decode())
    raise NSAError(
        "no layer compiled ahead of time matches these tensors and config "
        f"(heads {desc.qHeads}/{desc.kvHeads}, dims {desc.qkDim}/"
        f"{desc.vDim}, packed {bool(desc.packed)}); available: "
        f"{', '.join(names) or 'none'} (nsa.gpu_layers() describes them). "
        "Compile one with nsa_add_gpu_layer + nsa_add_layer_library and "
        "name its library in NSA_LAYER_LIBRARIES (docs/Embedding.md)")


def _check_status(rc):
    if rc:
        raise NSAError(_native.last_error())


def _layer_args(desc, q, k, v, gates, cu_seqlens, cmp_weights, out):
    B, T = q.shape[0], q.shape[1]
    return _native.LayerArgs(
        batch=B, tokens=T, dtype=desc.dtype, q=q.data_ptr(), k=k.data_ptr(),
        v=v.data_ptr(), gates=gates.data_ptr(),
        cmpWeights=None if cmp_weights is None else cmp_weights.data_ptr(),
        cuSeqlens=None if cu_seqlens is None else cu_seqlens.data_ptr(),
        numSeqlens=0 if cu_seqlens is None else cu_seqlens.numel(),
        out=None if out is None else out.data_ptr())


def _wait_for_inputs(device):
    # The runtime launches on the device's legacy stream and returns once
    # the layer is done: order it after the work that made the inputs.
    torch.cuda.current_stream(device).synchronize()


def _forward_cuda(desc, q, k, v, gates, cu_seqlens, cmp_weights, out):
    entry = _gpu_entry(desc)
    rt = _native.runtime()
    _check_status(rt.nsaInit(q.device.index or 0))
    if q.shape[1] == 0:
        return out
    args = _layer_args(desc, q, k, v, gates, cu_seqlens, cmp_weights, out)
    _wait_for_inputs(q.device)
    _check_status(rt.nsaLayerForward(ctypes.byref(entry.contents.layer),
                                     ctypes.byref(args)))
    return out


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors)


def _train_entry(desc):
    entry = _gpu_entry(desc)
    layer = entry.contents.layer
    if not layer.train or not layer.backward:
        raise NSAError(
            f"layer {layer.name.decode()} was compiled without its training "
            "entries: compile it with nsa_add_gpu_layer(... --gradient) to "
            "differentiate it, or run it under torch.no_grad()")
    return entry


def _forward_train_cuda(desc, q, k, v, gates, cu_seqlens, cmp_weights, out,
                        saved):
    """nsaLayerForwardTrain: the output (into `out`, or a scratch tensor)
    and the saved state (into the 7 tensors of `saved`)."""
    layer = _train_entry(desc).contents.layer
    if out is None:
        out = torch.empty((*q.shape[:3], v.shape[3]), dtype=q.dtype,
                          device=q.device)
    if q.shape[1] == 0:
        return out
    rt = _native.runtime()
    _check_status(rt.nsaInit(q.device.index or 0))
    args = _layer_args(desc, q, k, v, gates, cu_seqlens, cmp_weights, out)
    state = _native.LayerSaved(*[t.data_ptr() for t in saved])
    _wait_for_inputs(q.device)
    _check_status(rt.nsaLayerForwardTrain(
        ctypes.byref(layer), ctypes.byref(args), ctypes.byref(state)))
    return out


def _zero_grads(q, k, v, gates, cmp_weights):
    return [torch.zeros_like(t) if t is not None else None
            for t in (q, k, v, gates, cmp_weights)]


def _backward_cuda(desc, q, k, v, gates, cu_seqlens, cmp_weights, saved,
                   dout):
    """nsaLayerBackward from the saved state: [dq, dk, dv, dgates,
    dcmp_weights or None]."""
    if q.shape[1] == 0:
        return _zero_grads(q, k, v, gates, cmp_weights)
    layer = _train_entry(desc).contents.layer
    dq, dk, dv, dg = (torch.empty_like(t) for t in (q, k, v, gates))
    dw = None if cmp_weights is None else torch.empty_like(cmp_weights)
    rt = _native.runtime()
    _check_status(rt.nsaInit(q.device.index or 0))
    args = _layer_args(desc, q, k, v, gates, cu_seqlens, cmp_weights, None)
    state = _native.LayerSaved(*[t.data_ptr() for t in saved])
    grads = _native.LayerGrads(
        dout=dout.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(),
        dv=dv.data_ptr(), dgates=dg.data_ptr(),
        dcmpWeights=None if dw is None else dw.data_ptr())
    _wait_for_inputs(q.device)
    _check_status(rt.nsaLayerBackward(
        ctypes.byref(layer), ctypes.byref(args), ctypes.byref(state),
        ctypes.byref(grads)))
    return [dq, dk, dv, dg, dw]


def _backward_cpu(desc, q, k, v, gates, cu_seqlens, cmp_weights, dout):
    """The JIT-compiled layer gradient (nsa.sparse_attention_grad, the
    selected blocks those its forward selects): [dq, dk, dv, dgates,
    dcmp_weights or None] in the inputs' dtypes."""
    if q.shape[1] == 0:
        return _zero_grads(q, k, v, gates, cmp_weights)
    lib = _native.capi()
    handle = _cpu_layer(desc, trainable=True)
    ins = [_f64(t) for t in (q, k, v, gates, cmp_weights, dout)]
    grads = [torch.full(t.shape, float("nan"), dtype=torch.float64)
             if t is not None else None
             for t in (q, k, v, gates, cmp_weights)]
    cu = cu_seqlens.contiguous() if cu_seqlens is not None else None
    B, T = q.shape[0], q.shape[1]
    rc = lib.nsaCpuLayerBackward(
        handle, B, T, *[_ptr(t) for t in ins[:5]], _ptr(cu),
        0 if cu is None else cu.numel(), _ptr(ins[5]),
        *[_ptr(g) for g in grads])
    if rc:
        raise NSAError(_native.last_error())
    return [g.to(t.dtype) if g is not None else None
            for g, t in zip(grads, (q, k, v, gates, cmp_weights))]


def _output(q, v, out):
    B, T, HQ, _ = q.shape
    shape = (B, T, HQ, v.shape[3])
    if out is None:
        return torch.empty(shape, dtype=q.dtype, device=q.device)
    if (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or
            out.dtype != q.dtype or out.device != q.device or
            not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {q.dtype} tensor "
                         f"{list(shape)} on {q.device}")
    return out


def sparse_attention(q, k, v, gates, config=None, *, cu_seqlens=None,
                     cmp_weights=None, out=None, gate_activation="sigmoid"):
    """One NSA layer (Spec section 8): gated compressed, selected and
    sliding-window attention.

    q [B, T, HQ, Dqk], k [B, T, H, Dqk], v [B, T, H, Dv] and gates
    [B, T, HQ, 3] share one dtype (bfloat16, float16, float32; float64 on
    the CPU runs the float32 layer) and device; cu_seqlens (int32 [S + 1],
    batch 1) packs S sequences; cmp_weights (float32 [2, H, l]) with
    config.pool == "linear". Returns [B, T, HQ, Dv] in q's dtype, written
    into `out` where given. Every argument is checked before anything runs.

    gates are logits, the layer takes their sigmoid (gate_activation
    "sigmoid", the default); with gate_activation "none" they are gate
    values in [0, 1] already (as fla's NSA takes them), turned into logits
    here (clamped to [1e-6, 1 - 1e-6]).

    Differentiable (torch.ops.nsa.sparse_attention, nsa/_library.py): on
    CUDA tensors (layers compiled with --gradient) the forward saves each
    branch's output and lse and the selected indices and the backward
    starts from them; on CPU tensors the backward is the JIT-compiled
    layer gradient. Either way the selected blocks are held fixed (Spec
    section 9). torch.compile traces it without graph breaks.
    """
    from . import _library
    if gate_activation == "none":
        if isinstance(gates, torch.Tensor):
            gates = torch.logit(gates.float(), eps=1e-6).to(gates.dtype)
    elif gate_activation != "sigmoid":
        raise ValueError(f"gate_activation must be 'sigmoid' (gates are "
                         f"logits) or 'none' (gates are in [0, 1]), found "
                         f"{gate_activation!r}")
    config = _check_tensors(q, k, v, gates, config, cu_seqlens, cmp_weights)
    ints, scale = _library.config_ints(config), float(config.scale or 0.0)
    if _needs_grad(q, k, v, gates, cmp_weights):
        if out is not None:
            raise ValueError("out= is not differentiable: leave it out when "
                             "an input requires grad")
        if q.device.type == "cuda":
            return torch.ops.nsa.sparse_attention_train(
                q, k, v, gates, cmp_weights, cu_seqlens, ints, scale)[0]
        return torch.ops.nsa.sparse_attention(q, k, v, gates, cmp_weights,
                                              cu_seqlens, ints, scale)
    if out is None or torch.compiler.is_compiling():
        result = torch.ops.nsa.sparse_attention(q, k, v, gates, cmp_weights,
                                                cu_seqlens, ints, scale)
        return result if out is None else out.copy_(result)
    # Eager with out=: the layer writes `out` itself.
    desc, _ = _describe(q, k, v, config, cu_seqlens)
    out = _output(q, v, out)
    if q.device.type == "cuda":
        return _forward_cuda(desc, q, k, v, gates, cu_seqlens, cmp_weights,
                             out)
    return _forward_cpu(desc, q, k, v, gates, cu_seqlens, cmp_weights, out)


def reference_backward(q, k, v, gates, dout, config=None, *,
                       cu_seqlens=None, cmp_weights=None, indices=None):
    """The float64 reference backward (Spec section 9) on the host: the
    gradients of sum(out * dout) with respect to q, k, v, gates and (learned
    pool) cmp_weights, the selected blocks held fixed: `indices`
    [B, T, H, n] int32 (those a compiled forward chose) or, when None, the
    reference's own. Returns float64 (dq, dk, dv, dgates, dcmp_weights or
    None)."""
    with torch.no_grad():
        desc, blocks = _check_inputs(q, k, v, gates, config, cu_seqlens,
                                     cmp_weights)
        lib = _native.reference_lib()
        ins = [_f64(None if t is None else t.cpu())
               for t in (q, k, v, gates, cmp_weights)]
        d = _f64(dout.cpu())
        if d.shape != (*q.shape[:3], v.shape[3]):
            raise ValueError(f"dout must be [B, T, HQ, Dv] = "
                             f"{[*q.shape[:3], v.shape[3]]}, found "
                             f"{list(d.shape)}")
        idx = None
        if indices is not None:
            idx = indices.detach().cpu().to(torch.int32).contiguous()
            want = (*q.shape[:2], k.shape[2], desc.config.numSelected)
            if tuple(idx.shape) != want:
                raise ValueError(f"indices must be [B, T, H, n] = "
                                 f"{list(want)}, found {list(idx.shape)}")
        grads = [torch.empty(t.shape, dtype=torch.float64)
                 for t in (q, k, v, gates)]
        dw = (None if cmp_weights is None else
              torch.empty(cmp_weights.shape, dtype=torch.float64))
        cu = None if cu_seqlens is None else cu_seqlens.cpu().contiguous()
        B, T = q.shape[0], q.shape[1]
        rc = lib.nsaReferenceBackward(
            ctypes.byref(desc), B, T, *[_ptr(t) for t in ins], _ptr(cu),
            0 if cu is None else cu.numel(), _ptr(idx), _ptr(d),
            *[_ptr(t) for t in grads], _ptr(dw))
        if rc:
            raise NSAError(_native.last_error())
        return (*grads, dw)


def reference(q, k, v, gates, config=None, *, cu_seqlens=None,
              cmp_weights=None, return_indices=False, return_margins=False):
    """The float64 reference of the layer on the host (what every kernel is
    tested against), on the values of the given tensors as they are.

    Returns float64 [B, T, HQ, Dv]; with return_indices also the selected
    blocks [B, T, H, n] (int32, increasing, -1 padded); with return_margins
    also the selection margins [B, T, H] (float64): how far the lowest
    block score the top-n picked lies above the highest it left out,
    relative (+inf when nothing was left out). A 16-bit kernel may pick
    another block where the margin is below its rounding."""
    with torch.no_grad():
        desc, blocks = _check_inputs(q, k, v, gates, config, cu_seqlens,
                                     cmp_weights)
        lib = _native.reference_lib()
        B, T, HQ, _ = q.shape
        H, n = k.shape[2], desc.config.numSelected
        out = torch.full((B, T, HQ, v.shape[3]), float("nan"),
                         dtype=torch.float64)
        # Only what is asked for: the indices grow with n, which a valid
        # config may make large.
        idx = (torch.empty((B, T, H, n), dtype=torch.int32)
               if return_indices else None)
        margins = (torch.empty((B, T, H), dtype=torch.float64)
                   if return_margins else None)
        ins = [_f64(None if t is None else t.cpu())
               for t in (q, k, v, gates, cmp_weights)]
        cu = None if cu_seqlens is None else cu_seqlens.cpu().contiguous()
        rc = lib.nsaReferenceForwardWithMargins(
            ctypes.byref(desc), B, T, *[_ptr(t) for t in ins], _ptr(cu),
            0 if cu is None else cu.numel(), _ptr(out), _ptr(idx),
            _ptr(margins))
        if rc:
            raise NSAError(_native.last_error())
        result = (out,)
        if return_indices:
            result += (idx,)
        if return_margins:
            result += (margins,)
        return result if len(result) > 1 else out
