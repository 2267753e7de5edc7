"""Shared helpers of the Python package's tests (CPU and GPU)."""

import os
import sys

import torch

# The package as built (<build>/lib/python) or as NSA_PYTHON_DIR says.
sys.path.insert(0, os.environ.get("NSA_PYTHON_DIR", ""))
import nsa  # noqa: E402

SMALL = nsa.NSAConfig(cmp_block=16, cmp_stride=8, slc_block=32,
                      num_selected=4, window=64)
SMALL_PACKED = nsa.NSAConfig(cmp_block=16, cmp_stride=8, slc_block=32,
                             num_selected=6, window=100, pool="linear")


def inputs(B, T, HQ, H, Dqk, Dv, dtype, device="cpu", seed=0):
    """Random (never zero) q, k, v, gates in [-1, 1)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 -
                1).to(dtype).to(device)
    return (rand(B, T, HQ, Dqk), rand(B, T, H, Dqk), rand(B, T, H, Dv),
            rand(B, T, HQ, 3))


def random_cu_seqlens(sequences, max_len, seed):
    """cu_seqlens (int32) of `sequences` sequences of 0 to max_len tokens
    (empty ones too)."""
    lengths = torch.randint(0, max_len + 1, (sequences,),
                            generator=torch.Generator().manual_seed(seed))
    return torch.cat([torch.zeros(1, dtype=torch.int64),
                      lengths.cumsum(0)]).int()


def rel_l2(got, want):
    """||got - want|| / ||want||; inf where got has a NaN or inf."""
    got = got.detach().to("cpu", torch.float64)
    want = want.to(torch.float64)
    if not torch.isfinite(got).all():
        return float("inf")
    return (torch.linalg.vector_norm(got - want) /
            torch.linalg.vector_norm(want)).item()


def judge(got, want, margins, group, tie=1e-3):
    """The error of a 16-bit layer as the GPU tests judge it: (token, KV
    head) rows whose reference selection margin is below `tie` may pick
    another block, so their heads are left out of the relative L2 error;
    returns (error over the rest, the number left out, the rows). Which
    rows are left out depends on the reference alone, not on `got`; the
    tests require that most rows count."""
    got = got.detach().to("cpu", torch.float64)
    if not torch.isfinite(got).all():
        return float("inf"), 0, 0
    B, T, HQ, Dv = got.shape
    keep = (margins >= tie).repeat_interleave(group, dim=2)  # [B, T, HQ]
    diff = (got - want)[keep]
    err = (torch.linalg.vector_norm(diff) /
           torch.linalg.vector_norm(want[keep])).item()
    return err, int((margins < tie).sum()), margins.numel()
