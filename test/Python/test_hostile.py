"""Hostile arguments at the Python package's entry points (NSAConfig,
nsa.sparse_attention, nsa.reference, nsa.reference_backward) on CPU
tensors. hypothesis draws each call from a valid one with some arguments
replaced by hostile values (zero, negative, 2^63 and 2^64 + 8, floats,
strings, None, NaN, wrong dtypes, shapes, strides, devices, cu_seqlens).
Every call must return a finite result of the right shape or raise
ValueError, TypeError or nsa.NSAError with a message: never crash the
interpreter, raise anything else, or return NaN for finite inputs.
NSA_HOSTILE_EXAMPLES (default 300) sets the examples per entry point."""

import os
import unittest

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import inputs, nsa

EXAMPLES = int(os.environ.get("NSA_HOSTILE_EXAMPLES", "300"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
REFUSALS = (ValueError, TypeError, nsa.NSAError)

HOSTILE_INTS = [0, -1, -2**63, 2**63 - 1, 2**63, 2**64 + 8, 2**31, 5000,
                3.5, "8", None, True]
# Two valid configs (few distinct layers to JIT-compile) and, per field,
# the hostile values that replace it.
BASES = [dict(cmp_block=8, cmp_stride=4, slc_block=16, num_selected=4,
              window=24),
         dict(cmp_block=16, cmp_stride=8, slc_block=32, num_selected=3,
              window=40, pool="linear", initial=1, local=1, blocks=(2,))]
HOSTILE_FIELDS = {
    "cmp_block": HOSTILE_INTS, "cmp_stride": HOSTILE_INTS,
    "slc_block": HOSTILE_INTS, "num_selected": HOSTILE_INTS,
    "window": HOSTILE_INTS, "initial": HOSTILE_INTS, "local": HOSTILE_INTS,
    "log_levels": HOSTILE_INTS, "hub_stride": HOSTILE_INTS,
    "max_tokens": HOSTILE_INTS,
    "scale": [0.0, -1.0, float("nan"), float("inf"), 1e300, 1e-300, "x",
              True],
    "pool": ["max", 3, None, ""],
    "blocks": [(5, 2), (-1,), (2**64,), (3.7,), ("a",), 5, None, (2, 2)],
}


@st.composite
def config_kwargs(draw):
    kw = dict(draw(st.sampled_from(BASES)))
    for field in draw(st.lists(st.sampled_from(sorted(HOSTILE_FIELDS)),
                               max_size=2, unique=True)):
        kw[field] = draw(st.sampled_from(HOSTILE_FIELDS[field]))
    return kw


@st.composite
def layer_call(draw):
    """(args, kwargs) of one nsa.sparse_attention / nsa.reference call."""
    try:
        config = nsa.NSAConfig(**draw(config_kwargs()))
    except REFUSALS:
        config = draw(st.sampled_from([None, "paper", 3]))
    B = draw(st.sampled_from([1, 2, 0]))
    T = draw(st.sampled_from([1, 37, 0]))
    HQ, H = draw(st.sampled_from([(4, 2), (2, 1), (3, 2), (2, 4), (0, 1)]))
    Dqk, Dv = draw(st.sampled_from([(16, 8), (8, 16), (0, 8), (16, 0)]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16,
                                  torch.float64, torch.int32]))
    make = torch.float32 if dtype == torch.int32 else dtype
    q, k, v, g = inputs(B, T, HQ, H, max(Dqk, 1), max(Dv, 1), make)
    q, k, v = q[..., :Dqk], k[..., :Dqk], v[..., :Dv]
    if dtype == torch.int32:
        q = q.to(torch.int32)
    change = draw(st.sampled_from(["none", "none", "gates", "strides", "rank",
                                   "kdtype", "nan", "layout"]))
    if change == "gates":
        g = g[..., :2]
    elif change == "strides":
        q = q.transpose(0, 1)
    elif change == "rank":
        k = k.flatten(0, 1)
    elif change == "kdtype":
        k = k.to(torch.float16)
    elif change == "nan" and q.numel() and q.is_floating_point():
        q = q.clone()
        q.view(-1)[0] = float("nan")
    elif change == "layout":
        q, k, v, g = (t.transpose(1, 2) for t in (q, k, v, g))
    kw = {}
    cu = draw(st.sampled_from([None, None, "valid", "decreasing", "int64",
                               "short", "2d"]))
    if cu == "valid":
        kw["cu_seqlens"] = torch.tensor([0, T // 2, T], dtype=torch.int32)
    elif cu == "decreasing":
        kw["cu_seqlens"] = torch.tensor([0, T, T // 2], dtype=torch.int32)
    elif cu == "int64":
        kw["cu_seqlens"] = torch.tensor([0, T])
    elif cu == "short":
        kw["cu_seqlens"] = torch.tensor([0], dtype=torch.int32)
    elif cu == "2d":
        kw["cu_seqlens"] = torch.zeros(2, 2, dtype=torch.int32)
    w = draw(st.sampled_from([None, None, "valid", "shape", "dtype"]))
    l = getattr(config, "cmp_block", 8) if isinstance(config, nsa.NSAConfig) \
        else 8
    if w == "valid" and 0 < l <= 64:
        kw["cmp_weights"] = torch.full((2, H, l), 1.0 / l)
    elif w == "shape":
        kw["cmp_weights"] = torch.ones(2, H + 1, 3)
    elif w == "dtype":
        kw["cmp_weights"] = torch.ones(2, H, 4, dtype=torch.int64)
    return (q, k, v, g, config), kw, change == "nan" and q.is_floating_point()


def check_result(test, out, shape, nan_inputs):
    test.assertEqual(tuple(out.shape), shape)
    if not nan_inputs and out.numel():
        test.assertTrue(bool(torch.isfinite(out.double()).all()),
                        "NaN or inf for finite inputs")


def check_refusal(test, error):
    test.assertIsInstance(error, REFUSALS)
    test.assertTrue(str(error).strip(), f"{type(error).__name__} without "
                    "a message")


class Hostile(unittest.TestCase):
    @SETTINGS
    @given(config_kwargs())
    def test_config(self, kw):
        try:
            config = nsa.NSAConfig(**kw)
        except REFUSALS as e:
            return check_refusal(self, e)
        for name, value in kw.items():
            if name == "blocks":
                self.assertEqual(config.blocks, tuple(value))
            else:
                self.assertEqual(getattr(config, name), value)

    @SETTINGS
    @given(layer_call(), st.sampled_from(["sigmoid", "none", "tanh", 1]))
    def test_sparse_attention(self, call, activation):
        (q, k, v, g, config), kw, nan = call
        try:
            out = nsa.sparse_attention(q, k, v, g, config,
                                       gate_activation=activation, **kw)
        except REFUSALS as e:
            return check_refusal(self, e)
        check_result(self, out, (*q.shape[:3], v.shape[3]), nan)

    @SETTINGS
    @given(layer_call())
    def test_reference(self, call):
        (q, k, v, g, config), kw, nan = call
        try:
            out = nsa.reference(q, k, v, g, config, **kw)
        except REFUSALS as e:
            return check_refusal(self, e)
        check_result(self, out, (*q.shape[:3], v.shape[3]), nan)

    @SETTINGS
    @given(layer_call(), st.sampled_from(["valid", "shape", "indices"]))
    def test_reference_backward(self, call, dout_kind):
        (q, k, v, g, config), kw, nan = call
        dout = torch.ones(*q.shape[:3], v.shape[3] if v.dim() == 4 else 1)
        extra = {}
        if dout_kind == "shape":
            dout = dout[..., :1]
        elif dout_kind == "indices":
            extra["indices"] = torch.full((1, 1, 1, 1), 99, dtype=torch.int32)
        try:
            grads = nsa.reference_backward(q, k, v, g, dout, config, **kw,
                                           **extra)
        except REFUSALS as e:
            return check_refusal(self, e)
        check_result(self, grads[0], tuple(q.shape), nan)


if __name__ == "__main__":
    unittest.main(verbosity=2)
