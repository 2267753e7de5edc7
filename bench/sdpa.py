"""PyTorch SDPA (cuDNN backend) causal GQA attention, the dense baseline.

Prints one JSON object per line, like nsa-bench: ms is the median of CUDA
event timings after warm-up; TF/s count dense causal FLOPs,
2 * (Dqk + Dv) * HQ * T * (T + 1) / 2 forward, 3.5 times that for forward +
backward (--backward: also time the forward with the backward of a random
output gradient; --decode: one new query token per batch row over a cache of
T keys, not causal, at B = 1 and 64, in microseconds; the bytes of K and V
it reads give its fraction of 4.3 TB/s).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CONFIGS = [("paper (HQ64 H4 Dqk192 Dv128)", 64, 4, 192, 128),
           ("D128 (HQ64 H4 D128)", 64, 4, 128, 128)]


def median_ms(fn, reps=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def attention(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=True)


def main(lengths, backward):
    for name, hq, h, dqk, dv in CONFIGS:
        for t in lengths:
            grad = backward
            q = torch.randn(1, hq, t, dqk, device="cuda", dtype=torch.bfloat16,
                            requires_grad=grad)
            k = torch.randn(1, h, t, dqk, device="cuda", dtype=torch.bfloat16,
                            requires_grad=grad)
            v = torch.randn(1, h, t, dv, device="cuda", dtype=torch.bfloat16,
                            requires_grad=grad)
            d_out = torch.randn(1, hq, t, dv, device="cuda",
                                dtype=torch.bfloat16)
            impl = "torch SDPA cuDNN (dense causal)"
            if backward:
                impl += ", forward + backward"
            record = {"impl": impl, "config": name, "T": t}
            try:
                def run():
                    out = attention(q, k, v)
                    if backward:
                        torch.autograd.backward(out, d_out)
                        q.grad = k.grad = v.grad = None
                ms = median_ms(run)
                flops = 2.0 * (dqk + dv) * hq * t * (t + 1) / 2
                if backward:
                    flops *= 3.5
                record.update(ms=round(ms, 3),
                              tflops=round(flops / (ms * 1e-3) / 1e12, 2))
            except Exception as e:  # unsupported shape: say so
                record["error"] = str(e).splitlines()[0][:200]
            print(json.dumps(record), flush=True)
            del q, k, v, d_out
            torch.cuda.empty_cache()


def decode(lengths):
    """Dense decode: q [B, HQ, 1, D] over the whole cache [B, H, T, D]."""
    for name, hq, h, dqk, dv in CONFIGS:
        for t in lengths:
            for b in (1, 64):
                record = {"impl": "torch SDPA (dense decode)", "config": name,
                          "B": b, "L": t}
                try:
                    q = torch.randn(b, hq, 1, dqk, device="cuda",
                                    dtype=torch.bfloat16)
                    k = torch.randn(b, h, t, dqk, device="cuda",
                                    dtype=torch.bfloat16)
                    v = torch.randn(b, h, t, dv, device="cuda",
                                    dtype=torch.bfloat16)

                    def run():
                        F.scaled_dot_product_attention(q, k, v,
                                                       enable_gqa=True)
                    us = median_ms(run, reps=20) * 1e3
                    nbytes = 2.0 * b * h * t * (dqk + dv)
                    tbps = nbytes / (us * 1e-6) / 1e12
                    record.update(us=round(us, 1), bytes=nbytes,
                                  tbps=round(tbps, 3),
                                  hbm_fraction=round(tbps / 4.3, 4))
                    del q, k, v
                except Exception as e:  # unsupported shape: say so
                    record["error"] = str(e).splitlines()[0][:200]
                print(json.dumps(record), flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    args = sys.argv[1:]
    lengths = [int(a) for a in args if not a.startswith("--")]
    if "--decode" in args:
        decode(lengths)
    else:
        main(lengths, "--backward" in args)
