"""nsa.sparse_attention on CPU tensors (the JIT path) against the float64
reference, and the argument checks, which run before anything is compiled
or launched. Run by ctest (test/CMakeLists.txt); exits 77 without torch."""

import math
import unittest

import torch

from common import (SMALL, SMALL_PACKED, inputs, judge, nsa, random_cu_seqlens,
                    rel_l2)


class CpuAgainstReference(unittest.TestCase):
    def check(self, dtype, tol, B, T, HQ, H, Dqk, Dv, config, **kw):
        q, k, v, g = inputs(B, T, HQ, H, Dqk, Dv, dtype)
        out = nsa.sparse_attention(q, k, v, g, config, **kw)
        self.assertEqual(out.dtype, dtype)
        self.assertEqual(tuple(out.shape), (B, T, HQ, Dv))
        want, margins = nsa.reference(q, k, v, g, config, return_margins=True,
                                      **kw)
        if dtype == torch.float32:
            # Exact selection: every row counts.
            err, ties, rows = rel_l2(out, want), 0, margins.numel()
        else:
            err, ties, rows = judge(out, want, margins, HQ // H)
        print(f"  {dtype} B {B} T {T} HQ {HQ} H {H} {Dqk}/{Dv}: rel. L2 "
              f"{err:.2e} ({ties} of {rows} rows near a selection tie)")
        self.assertLessEqual(err, tol)
        # The rows left out come from the reference alone; most must count.
        self.assertLessEqual(ties, max(2, rows // 4))

    def test_f32_gqa(self):
        # T = 131: not a multiple of any block or tile.
        self.check(torch.float32, 1e-5, 2, 131, 4, 2, 32, 16, SMALL)

    def test_bf16(self):
        self.check(torch.bfloat16, 1e-2, 1, 200, 4, 1, 64, 64, SMALL)

    def test_paper_config_f16(self):
        self.check(torch.float16, 1e-2, 1, 600, 4, 1, 32, 32,
                   nsa.NSAConfig())

    def test_packed_linear_pool(self):
        H, l = 2, SMALL_PACKED.cmp_block
        w = torch.rand(2, H, l, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(5))
        w = (w / w.sum(-1, keepdim=True)).float()
        cu = torch.tensor([0, 50, 51, 170], dtype=torch.int32)
        self.check(torch.float32, 1e-5, 1, 170, 4, H, 32, 16, SMALL_PACKED,
                   cu_seqlens=cu, cmp_weights=w)

    def test_many_packed_sequences(self):
        # 120 sequences of 0 to 13 tokens (empty ones too): the tiles of
        # every sequence are numbered in one grid, found by a binary
        # search of cu_seqlens.
        cu = random_cu_seqlens(120, 13, seed=3)
        config = nsa.NSAConfig(cmp_block=4, cmp_stride=2, slc_block=4,
                               num_selected=3, window=5, initial=1, local=1)
        self.check(torch.float32, 1e-5, 1, int(cu[-1]), 4, 2, 16, 8, config,
                   cu_seqlens=cu)

    def test_more_selected_than_blocks(self):
        # n = 1024 against at most 25 causal blocks: every token keeps all
        # of its blocks.
        config = nsa.NSAConfig(cmp_block=8, cmp_stride=4, slc_block=8,
                               num_selected=1024, window=16)
        self.check(torch.float32, 1e-5, 1, 197, 2, 1, 16, 16, config)

    def test_explicit_scale_and_backbone(self):
        config = nsa.NSAConfig(cmp_block=16, cmp_stride=8, slc_block=32,
                               num_selected=6, window=40, scale=0.3,
                               log_levels=2, blocks=(3,))
        self.check(torch.float32, 1e-5, 1, 150, 2, 1, 16, 16, config)

    def test_forced_blocks_counted_at_max_tokens(self):
        # Spec section 11's example: 12 forced blocks of n = 16 at
        # max_tokens = 65536 (17 without it).
        config = nsa.NSAConfig(log_levels=15, max_tokens=65536)
        self.check(torch.float32, 1e-5, 1, 300, 2, 1, 16, 16, config)

    def test_local_blocks_win_past_max_tokens(self):
        # Hubs every 2 blocks, n = 4, max_tokens = 16: past it a token has
        # more forced blocks than n and keeps its 2 local blocks, then the
        # lowest others (Spec 5.4).
        config = nsa.NSAConfig(cmp_block=8, cmp_stride=4, slc_block=8,
                               num_selected=4, window=8, hub_stride=2,
                               max_tokens=16)
        q, k, v, g = inputs(1, 120, 2, 1, 16, 16, torch.float32)
        _, idx = nsa.reference(q, k, v, g, config, return_indices=True)
        self.assertEqual(idx[0, 119, 0].tolist(), [0, 2, 13, 14])
        self.assertEqual(idx[0, 60, 0].tolist(), [0, 2, 6, 7])
        self.check(torch.float32, 1e-5, 1, 120, 2, 1, 16, 16, config)

    def test_out_argument(self):
        q, k, v, g = inputs(1, 70, 2, 1, 16, 16, torch.float32)
        out = torch.full((1, 70, 2, 16), float("nan"))
        got = nsa.sparse_attention(q, k, v, g, SMALL, out=out)
        self.assertIs(got, out)
        self.assertLessEqual(rel_l2(out, nsa.reference(q, k, v, g, SMALL)),
                             1e-5)

    def test_reference_indices(self):
        q, k, v, g = inputs(1, 100, 2, 1, 16, 16, torch.float32)
        out, idx = nsa.reference(q, k, v, g, SMALL, return_indices=True)
        self.assertEqual(tuple(idx.shape), (1, 100, 1, SMALL.num_selected))
        # Token 99 is in selection block 3: it sees blocks 0..3, all chosen.
        self.assertEqual(idx[0, 99, 0].tolist(), [0, 1, 2, 3])
        self.assertTrue(torch.isfinite(out).all())

    def test_nan_in_nan_out(self):
        # Spec section 14: every row the reference makes non-finite is
        # non-finite in the JIT too; the rows finite in both agree (a NaN
        # importance ranks as the largest finite score in both, so the
        # group's other heads choose the same blocks). Only a non-finite
        # value (v, a value pool weight) may spread to rows that do not
        # read it (0 * NaN in a tile).
        H, l = 2, SMALL_PACKED.cmp_block
        w = torch.rand(2, H, l, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(7))
        w = (w / w.sum(-1, keepdim=True)).float()
        # (input, index, value, whether it may spread to other rows)
        cases = {"k": (1, (0, 40, 0, 5), "nan", False),
                 "q": (0, (0, 70, 1, 3), "nan", False),
                 "gates": (3, (0, 30, 2, 1), "nan", False),
                 "key pool": (4, (0, 0, 3), "nan", False),
                 "value pool": (4, (1, 1, 2), "nan", True),
                 "v": (2, (0, 90, 1, 2), "inf", True)}
        for name, (which, at, value, spreads) in cases.items():
            with self.subTest(name):
                args = list(inputs(1, 150, 4, H, 32, 16, torch.float32,
                                   seed=11)) + [w.clone()]
                args[which][at] = float(value)
                q, k, v, g, pool = args
                out = nsa.sparse_attention(q, k, v, g, SMALL_PACKED,
                                           cmp_weights=pool)
                want = nsa.reference(q, k, v, g, SMALL_PACKED,
                                     cmp_weights=pool)
                bad = ~torch.isfinite(want).all(-1)    # [1, T, HQ]
                got_bad = ~torch.isfinite(out).all(-1)
                self.assertTrue(bad.any())
                self.assertFalse((bad & ~got_bad).any(),
                                 "a row reading the non-finite value is "
                                 "finite")
                if not spreads:
                    self.assertTrue(torch.equal(bad, got_bad))
                both = ~bad & ~got_bad
                self.assertGreater(int(both.sum()), 0)
                self.assertLessEqual(rel_l2(out[both], want[both]), 1e-5)


class TwoReferences(unittest.TestCase):
    """test/Python/rowref.py (PyTorch, written from docs/Spec.md) against
    runtime/reference (C++): the same rows, outputs and selection margins,
    to float64 rounding. The GPU tests use the first on 512k tokens."""

    def test_rows_agree(self):
        from rowref import reference_rows
        backbone = nsa.NSAConfig(cmp_block=16, cmp_stride=8, slc_block=32,
                                 num_selected=6, window=40, initial=1,
                                 local=1, log_levels=2, blocks=(3,))
        for T, HQ, H, config in ((700, 4, 1, SMALL),
                                 (1300, 8, 2, nsa.NSAConfig()),
                                 (500, 4, 2, backbone)):
            q, k, v, g = inputs(1, T, HQ, H, 16, 8, torch.float32, seed=T)
            want, margins = nsa.reference(q, k, v, g, config,
                                          return_margins=True)
            rows = [0, 1, 30, 31, 47, 63, 64, 100, T // 2, T - 2, T - 1]
            got, got_margins = reference_rows(q, k, v, g, config, rows)
            self.assertLessEqual(rel_l2(got, want[0, rows]), 1e-12)
            finite = torch.isfinite(margins[0, rows])
            self.assertTrue(torch.equal(finite, torch.isfinite(got_margins)))
            self.assertLessEqual(
                (got_margins - margins[0, rows])[finite].abs().max().item(),
                1e-12)


class ReferenceBackward(unittest.TestCase):
    """nsa.reference_backward (the C reference's backward through the
    package) against central differences of nsa.reference: the directional
    derivative of sum(out * dout) along a random direction of each input
    equals the gradient's dot product with it (float32 inputs, the
    reference in float64, no selection tie near)."""

    def test_directional_derivatives(self):
        H, l = 2, SMALL_PACKED.cmp_block
        for config, cu, w in (
                (SMALL, None, None),
                (SMALL_PACKED, torch.tensor([0, 37, 90], dtype=torch.int32),
                 torch.rand(2, H, l, generator=torch.Generator().manual_seed(
                     5)) / l)):
            q, k, v, g = inputs(1, 90, 4, H, 16, 8, torch.float32, seed=11)
            dout = torch.rand(1, 90, 4, 8, dtype=torch.float64,
                              generator=torch.Generator().manual_seed(6)) - .5
            kw = dict(cu_seqlens=cu, cmp_weights=w)
            _, idx = nsa.reference(q, k, v, g, config, return_indices=True,
                                   **kw)
            grads = nsa.reference_backward(q, k, v, g, dout, config, **kw)
            # The reference's own selection and the same blocks given.
            again = nsa.reference_backward(q, k, v, g, dout, config,
                                           indices=idx, **kw)
            for a, b in zip(grads, again):
                if a is not None:
                    self.assertTrue(torch.equal(a, b))
            names = ["q", "k", "v", "gates"] + (["cmp_weights"] if w is not
                                                None else [])
            for i, name in enumerate(names):
                args = [q, k, v, g, w]
                d = torch.rand(args[i].shape, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(i))
                # The inputs are float32: the steps taken (after rounding)
                # on both sides.
                eps = 1e-3
                moved = [(args[i] + sign * eps * d).to(args[i].dtype)
                         for sign in (1, -1)]

                def loss(x):
                    a = list(args)
                    a[i] = x
                    out = nsa.reference(*a[:4], config, cu_seqlens=cu,
                                        cmp_weights=a[4])
                    return (out * dout).sum().item()
                numeric = loss(moved[0]) - loss(moved[1])
                analytic = (grads[i] * (moved[0].double() -
                                        moved[1].double())).sum().item()
                self.assertAlmostEqual(numeric, analytic,
                                       delta=1e-3 * abs(analytic) + 1e-9,
                                       msg=f"{name} ({config.pool} pool)")

    def test_bad_indices(self):
        q, k, v, g = inputs(1, 70, 4, 1, 16, 8, torch.float32, seed=3)
        dout = torch.ones(1, 70, 4, 8)
        idx = torch.full((1, 70, 1, SMALL.num_selected), -1,
                         dtype=torch.int32)
        idx[0, 5, 0, 0] = 3  # T = 70 has blocks 0 .. 2 of 32 tokens
        with self.assertRaisesRegex(nsa.NSAError, "neither -1 nor a block"):
            nsa.reference_backward(q, k, v, g, dout, SMALL, indices=idx)


class ArgumentChecks(unittest.TestCase):
    def setUp(self):
        self.t = inputs(1, 40, 4, 2, 16, 16, torch.float32)

    def raises(self, exc, pattern, *args, **kw):
        with self.assertRaisesRegex(exc, pattern):
            nsa.sparse_attention(*args, **kw)

    def test_dtype(self):
        q, k, v, g = self.t
        self.raises(TypeError, "bfloat16, float16 or float32",
                    q.int(), k, v, g)
        self.raises(TypeError, "share one dtype", q, k.half(), v, g)

    def test_shapes(self):
        q, k, v, g = self.t
        self.raises(ValueError, "4 dimensions", q[0], k, v, g)
        self.raises(ValueError, "k must have shape", q, k[:, :39], v, g)
        self.raises(ValueError, "gates must have shape", q, k, v,
                    g[..., :2].contiguous())
        q3, k3, v3, g3 = inputs(1, 40, 3, 2, 16, 16, torch.float32)
        self.raises(ValueError, "multiple of the KV heads", q3, k3, v3, g3)

    def test_strides(self):
        q, k, v, g = self.t
        # SDPA's [B, H, T, D] layout transposed to [B, T, H, D] is a view.
        sdpa_q = q.transpose(1, 2).contiguous()
        self.raises(ValueError, "must be contiguous", sdpa_q.transpose(1, 2),
                    k, v, g)

    def test_types(self):
        q, k, v, g = self.t
        self.raises(TypeError, "must be a torch.Tensor", q.numpy(), k, v, g)
        self.raises(TypeError, "nsa.NSAConfig", q, k, v, g, {"window": 3})

    def test_config(self):
        q, k, v, g = self.t
        self.raises(nsa.NSAError, "cmpStride .* must divide", q, k, v, g,
                    nsa.NSAConfig(cmp_block=16, cmp_stride=5, slc_block=32))
        self.raises(nsa.NSAError, "number of forced blocks", q, k, v, g,
                    nsa.NSAConfig(num_selected=2, initial=2, local=2))
        with self.assertRaisesRegex(ValueError, "pool"):
            nsa.NSAConfig(pool="max")
        with self.assertRaisesRegex(TypeError, "window must be an int"):
            nsa.NSAConfig(window=3.5)
        # Python ints are unbounded; the C layer's are 64-bit.
        with self.assertRaisesRegex(ValueError, "cmp_block must fit in 64"):
            nsa.NSAConfig(cmp_block=2**64 + 8)
        with self.assertRaisesRegex(ValueError, "blocks must fit in 64"):
            nsa.NSAConfig(blocks=(2**63,))
        # Legal NSA beyond the lowering's supported sizes (Spec 13).
        self.raises(nsa.NSAError, "num_selected = 4096 is above 1024", q, k,
                    v, g, nsa.NSAConfig(num_selected=4096))
        q0 = torch.zeros(1, 40, 4, 0)
        self.raises(ValueError, "head dims must be positive", q0,
                    torch.zeros(1, 40, 2, 0), v, g)

    def test_packed_and_pool_arguments(self):
        q, k, v, g = self.t
        cu = torch.tensor([0, 40], dtype=torch.int32)
        self.raises(ValueError, "int32", q, k, v, g, SMALL,
                    cu_seqlens=cu.long())
        q2, k2, v2, g2 = inputs(2, 40, 4, 2, 16, 16, torch.float32)
        self.raises(ValueError, "batch 1", q2, k2, v2, g2, SMALL,
                    cu_seqlens=cu)
        self.raises(nsa.NSAError, "end at tokens", q, k, v, g, SMALL,
                    cu_seqlens=torch.tensor([0, 39], dtype=torch.int32))
        self.raises(TypeError, "needs cmp_weights", q, k, v, g, SMALL_PACKED)
        self.raises(ValueError, "only taken with pool='linear'", q, k, v, g,
                    SMALL, cmp_weights=torch.zeros(2, 2, 16))
        self.raises(ValueError, r"\[2, 2, 16\]", q, k, v, g, SMALL_PACKED,
                    cmp_weights=torch.zeros(2, 2, 8))

    def test_out(self):
        q, k, v, g = self.t
        self.raises(ValueError, "out must be", q, k, v, g, SMALL,
                    out=torch.empty(1, 40, 4, 15))

    def test_layout_hint(self):
        q, k, v, g = self.t  # [B, T, heads, dim]
        self.raises(ValueError, r"look like \[B, heads, T, dim\]",
                    q.transpose(1, 2).contiguous(),
                    k.transpose(1, 2).contiguous(),
                    v.transpose(1, 2).contiguous(), g)

    def test_gate_activation(self):
        q, k, v, g = self.t
        want = nsa.sparse_attention(q, k, v, g, SMALL)
        got = nsa.sparse_attention(q, k, v, torch.sigmoid(g), SMALL,
                                   gate_activation="none")
        self.assertLessEqual(rel_l2(got, want.double()), 1e-5)
        self.raises(ValueError, "gate_activation", q, k, v, g, SMALL,
                    gate_activation="softmax")

    def test_cuda_without_matching_layer(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device")
        q, k, v, g = (t.cuda() for t in self.t)
        self.raises(nsa.NSAError, "no layer compiled ahead of time", q, k, v,
                    g, SMALL)


if __name__ == "__main__":
    unittest.main(verbosity=2)
