"""nsa from PyTorch: a layer on CPU tensors (JIT-compiled by nsa-to-cpu)
and, where a GPU is, the paper's layer on CUDA tensors (compiled ahead of
time, libnsa_layers), each against the float64 reference.

    PYTHONPATH=build/lib/python python3 examples/embedding/torch_example.py
"""

import torch

import nsa


def rel_l2(got, want):
    got = got.double().cpu()
    return ((got - want).norm() / want.norm()).item()


def main():
    torch.manual_seed(0)
    # CPU tensors, [B, T, heads, dim]: 4 query heads sharing 1 KV head.
    config = nsa.NSAConfig(cmp_block=16, cmp_stride=8, slc_block=32,
                           num_selected=4, window=64)
    q = torch.randn(1, 300, 4, 64)
    k = torch.randn(1, 300, 1, 64)
    v = torch.randn(1, 300, 1, 64)
    gates = torch.randn(1, 300, 4, 3)
    out = nsa.sparse_attention(q, k, v, gates, config)
    err = rel_l2(out, nsa.reference(q, k, v, gates, config))
    print(f"CPU, float32, T 300: relative L2 error {err:.2e}")
    assert err < 1e-5

    if not torch.cuda.is_available():
        print("no CUDA device: the GPU part is skipped")
        return
    # The paper's layer on the GPU: 64 query heads, 4 KV heads, 192/128.
    T = 1024
    q, k, v, gates = (torch.randn(1, T, h, d, dtype=torch.bfloat16,
                                  device="cuda")
                      for h, d in ((64, 192), (4, 192), (4, 128), (64, 3)))
    out = nsa.sparse_attention(q, k, v, gates)  # nsa.NSAConfig(): the paper's
    err = rel_l2(out, nsa.reference(q, k, v, gates))
    print(f"CUDA, bfloat16, paper layer, T {T}: relative L2 error {err:.2e}")
    assert err < 1e-2


if __name__ == "__main__":
    main()
