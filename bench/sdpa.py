"""PyTorch SDPA (cuDNN backend) causal GQA attention, the dense baseline.

Prints one JSON object per line, like nsa-bench: ms is the median of CUDA
event timings after warm-up; TF/s count dense causal FLOPs,
2 * (Dqk + Dv) * HQ * T * (T + 1) / 2 forward, 3.5 times that for forward +
backward (--backward: also time the forward with the backward of a random
output gradient).
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


if __name__ == "__main__":
    args = sys.argv[1:]
    main([int(a) for a in args if a != "--backward"], "--backward" in args)
