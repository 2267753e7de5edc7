"""nsa.sparse_attention called from PyTorch (the Python package on CUDA
tensors: argument checks, stream sync, the runtime's checked launch) next
to PyTorch SDPA's cuDNN dense causal attention, in one process on the same
GPU. Not a test: it reports.

    PYTHONPATH=build/lib/python python3 bench/torch_op.py 8192 65536

Prints one JSON record a line (bench/run.sh's `torch` step tabulates them).
ms: median of CUDA-event timings of whole calls after warm-up. TF/s count
useful FLOPs as nsa-bench does: 2 (Dqk + Dv) per (query head, attended key)
over the three branches for nsa, the dense causal pairs for SDPA.
"""

import argparse
import ctypes
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import nsa
from nsa import _library, _native, ops
from sdpa import median_ms  # bench/sdpa.py, beside this file

CONFIGS = [("paper (HQ64 H4 Dqk192 Dv128)", 64, 4, 192, 128),
           ("D128 (HQ64 H4 D128)", 64, 4, 128, 128)]


def attended_keys(c, T):
    """Keys a query head attends to over T tokens, per branch (Spec)."""
    t = torch.arange(T, dtype=torch.float64)
    cmp = torch.clamp(torch.div(t + 1 - c.cmp_block, c.cmp_stride,
                                rounding_mode="floor") + 1, min=0)
    slc = torch.where(torch.div(t, c.slc_block, rounding_mode="floor") <
                      c.num_selected, t + 1,
                      (c.num_selected - 1) * c.slc_block + t % c.slc_block + 1)
    win = torch.clamp(t + 1, max=c.window)
    return (cmp + slc + win).sum().item()


def calls(q, k, v, gates, out, config, reps):
    """The same layer call three ways: the C entry (nsaLayerForward through
    ctypes, its arguments made once), the eager package call writing `out`,
    and the torch operator (torch.ops.nsa.sparse_attention, a new output);
    the difference to the first is the Python side's overhead."""
    desc, blocks = ops._check_inputs(q, k, v, gates, config, None, None)
    layer = ops._gpu_entry(desc).contents.layer
    c_args = ops._layer_args(desc, q, k, v, gates, None, None, out)
    rt = _native.runtime()

    def c_call():
        ops._check_status(rt.nsaLayerForward(ctypes.byref(layer),
                                             ctypes.byref(c_args)))
    ints = _library.config_ints(config)
    yield "nsaLayerForward (C, through ctypes)", median_ms(c_call, reps=reps)
    yield "nsa.sparse_attention(out=) (eager)", median_ms(
        lambda: nsa.sparse_attention(q, k, v, gates, config, out=out),
        reps=reps)
    yield "torch.ops.nsa.sparse_attention (PyTorch op)", median_ms(
        lambda: torch.ops.nsa.sparse_attention(q, k, v, gates, None, None,
                                               ints, 0.0), reps=reps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("tokens", type=int, nargs="+")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    config = nsa.NSAConfig()
    for name, hq, h, dqk, dv in CONFIGS:
        for T in args.tokens:
            g = torch.Generator(device="cuda").manual_seed(T)

            def rand(*shape):
                return (torch.rand(*shape, device="cuda", generator=g) * 2 -
                        1).to(torch.bfloat16)
            q, k, v, gates = (rand(1, T, hq, dqk), rand(1, T, h, dqk),
                              rand(1, T, h, dv), rand(1, T, hq, 3))
            out = torch.empty(1, T, hq, dv, device="cuda",
                              dtype=torch.bfloat16)
            flops = 2.0 * (dqk + dv) * hq * attended_keys(config, T)
            for impl, ms in calls(q, k, v, gates, out, config, args.reps):
                print(json.dumps({"impl": impl, "config": name, "T": T,
                                  "ms": round(ms, 4),
                                  "tflops": round(flops / ms / 1e9, 2)}),
                      flush=True)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def sdpa():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=True, enable_gqa=True)
            ms = median_ms(sdpa, reps=args.reps)
            flops = 2.0 * (dqk + dv) * hq * T * (T + 1) / 2
            print(json.dumps({"impl": "torch SDPA cuDNN (dense causal)",
                              "config": name, "T": T, "ms": round(ms, 3),
                              "tflops": round(flops / ms / 1e9, 2)}),
                  flush=True)
            del q, k, v, gates, out, qt, kt, vt
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
