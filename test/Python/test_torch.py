"""The layer as a PyTorch operator on the CPU: torch.library.opcheck of the
three torch.ops.nsa operators, gradcheck through the JIT-compiled gradient,
autograd against the float64 reference backward, and torch.compile
(fullgraph) of a small model's training step. Run by ctest
(test/CMakeLists.txt); exits 77 without torch 2.5."""

import dataclasses
import unittest

import torch

from common import (SMALL, SMALL_PACKED, inputs, nsa, random_cu_seqlens,
                    rel_l2)
from nsa import _library

# Every selection block is chosen (n >= the blocks of T = 40 tokens): the
# layer is smooth in its inputs, so finite differences see no selection
# flip. Blocks and windows are no tile multiples.
SMOOTH = nsa.NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16,
                       num_selected=3, window=12, initial=1, local=1)


def op_args(q, k, v, g, config, cmp_weights=None, cu_seqlens=None):
    return (q, k, v, g, cmp_weights, cu_seqlens,
            _library.config_ints(config), float(config.scale or 0.0))


class Operators(unittest.TestCase):
    def test_opcheck_forward(self):
        for config, cu, w in (
                (SMALL, None, None),
                (SMALL_PACKED, torch.tensor([0, 30, 70], dtype=torch.int32),
                 torch.rand(2, 2, 16) / 16)):
            q, k, v, g = inputs(1, 70, 4, 2, 16, 8, torch.float32)
            for t in (q, k, v, g):
                t.requires_grad_()
            args = op_args(q, k, v, g, config, w, cu)
            for op in (torch.ops.nsa.sparse_attention,
                       torch.ops.nsa.sparse_attention_train):
                torch.library.opcheck(op, args)

    def test_opcheck_backward(self):
        q, k, v, g = inputs(2, 45, 4, 1, 16, 8, torch.float32)
        dout = torch.rand(2, 45, 4, 8) - 0.5
        args = (dout, q, k, v, g, None, None, [],
                _library.config_ints(SMALL), 0.0)
        torch.library.opcheck(torch.ops.nsa.sparse_attention_backward, args)

    def test_config_round_trip(self):
        config = nsa.NSAConfig(cmp_block=16, cmp_stride=8, slc_block=32,
                               num_selected=6, window=40, scale=0.3,
                               log_levels=2, blocks=(3, 7), pool="linear")
        ints = _library.config_ints(config)
        self.assertEqual(_library.config_from(ints, 0.3), config)
        with self.assertRaisesRegex(ValueError, "at least"):
            _library.config_from(ints[:5], 0.0)


class Gradients(unittest.TestCase):
    def test_gradcheck(self):
        # float64 tensors run the f32 layer: steps of 1e-3 and f32's
        # rounding set the tolerance.
        torch.manual_seed(0)
        for config, cu, w in (
                (SMOOTH, None, None),
                (dataclasses.replace(SMOOTH, pool="linear"),
                 torch.tensor([0, 17, 40], dtype=torch.int32),
                 (torch.rand(2, 1, 8, dtype=torch.float64) / 8))):
            q, k, v, g = inputs(1, 40, 2, 1, 8, 4, torch.float64, seed=3)
            tensors = [q, k, v, g] + ([w] if w is not None else [])
            for t in tensors:
                t.requires_grad_()

            def f(*ts):
                return nsa.sparse_attention(
                    *ts[:4], config, cu_seqlens=cu,
                    cmp_weights=ts[4] if len(ts) > 4 else None)
            self.assertTrue(torch.autograd.gradcheck(
                f, tensors, eps=1e-3, atol=2e-3, rtol=2e-2))

    def test_against_reference_backward(self):
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
            q, k, v, g = inputs(1, 131, 4, 2, 16, 8, dtype, seed=7)
            for t in (q, k, v, g):
                t.requires_grad_()
            out = nsa.sparse_attention(q, k, v, g, SMALL)
            dout = torch.rand(out.shape, dtype=torch.float64,
                              generator=torch.Generator().manual_seed(1)) - .5
            out.backward(dout.to(dtype))
            _, idx = nsa.reference(q, k, v, g, SMALL, return_indices=True)
            want = nsa.reference_backward(q, k, v, g, dout.to(dtype)
                                          .double(), SMALL, indices=idx)
            for name, t, w in zip("q k v gates".split(), (q, k, v, g), want):
                self.assertEqual(t.grad.dtype, dtype)
                err = rel_l2(t.grad, w)
                print(f"  {dtype} d{name}: rel. L2 {err:.2e}")
                self.assertLessEqual(err, tol, f"{dtype} d{name}")

    def test_packed_backward_against_reference(self):
        # 40 sequences of 0 to 9 tokens through the JIT gradient.
        cu = random_cu_seqlens(40, 9, seed=4)
        config = nsa.NSAConfig(cmp_block=4, cmp_stride=2, slc_block=4,
                               num_selected=3, window=5, initial=1, local=1)
        q, k, v, g = inputs(1, int(cu[-1]), 4, 2, 16, 8, torch.float32,
                            seed=9)
        for t in (q, k, v, g):
            t.requires_grad_()
        out = nsa.sparse_attention(q, k, v, g, config, cu_seqlens=cu)
        dout = torch.rand(out.shape, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(2)) - .5
        out.backward(dout.float())
        _, idx = nsa.reference(q, k, v, g, config, cu_seqlens=cu,
                               return_indices=True)
        want = nsa.reference_backward(q, k, v, g, dout, config,
                                      cu_seqlens=cu, indices=idx)
        for name, t, w in zip("q k v gates".split(), (q, k, v, g), want):
            err = rel_l2(t.grad, w)
            print(f"  packed d{name}: rel. L2 {err:.2e}")
            self.assertLessEqual(err, 1e-4, f"packed d{name}")

    def test_zero_tokens(self):
        q, k, v, g = inputs(1, 0, 2, 1, 8, 4, torch.float32)
        for t in (q, k, v, g):
            t.requires_grad_()
        out = nsa.sparse_attention(q, k, v, g, SMALL)
        out.sum().backward()
        self.assertEqual(tuple(q.grad.shape), (1, 0, 2, 8))


class Module(unittest.TestCase):
    def test_module_matches_the_function(self):
        torch.manual_seed(1)
        m = nsa.SparseAttention(24, num_heads=4, num_kv_heads=2, head_dim=8,
                                v_head_dim=4, config=SMALL_PACKED)
        self.assertEqual(tuple(m.cmp_weights.shape), (2, 2, 16))
        x = torch.randn(1, 90, 24)
        cu = torch.tensor([0, 33, 90], dtype=torch.int32)
        y = m(x, cu_seqlens=cu)
        self.assertEqual(tuple(y.shape), (1, 90, 24))
        with torch.no_grad():
            q = m.q_proj(x).reshape(1, 90, 4, 8)
            k = m.k_proj(x).reshape(1, 90, 2, 8)
            v = m.v_proj(x).reshape(1, 90, 2, 4)
            g = m.g_proj(x).reshape(1, 90, 4, 3)
            o = nsa.reference(q, k, v, g, SMALL_PACKED, cu_seqlens=cu,
                              cmp_weights=m.cmp_weights.detach())
            want = m.o_proj(o.float().reshape(1, 90, 16))
        self.assertLessEqual(rel_l2(y, want.double()), 1e-5)
        y.square().mean().backward()
        for name, p in m.named_parameters():
            self.assertIsNotNone(p.grad, name)
            self.assertTrue(torch.isfinite(p.grad).all(), name)
            self.assertGreater(p.grad.abs().sum().item(), 0, name)

    def test_module_arguments(self):
        with self.assertRaisesRegex(ValueError, "multiple of num_kv_heads"):
            nsa.SparseAttention(16, num_heads=3, num_kv_heads=2, head_dim=8)
        with self.assertRaisesRegex(TypeError, "nsa.NSAConfig"):
            nsa.SparseAttention(16, 2, 1, 8, config={"window": 3})
        m = nsa.SparseAttention(16, 2, 1, 8, config=SMALL)
        self.assertIsNone(m.cmp_weights)
        with self.assertRaisesRegex(ValueError, r"\[B, T, hidden\]"):
            m(torch.randn(5, 16))


class Compiled(unittest.TestCase):
    def test_compiled_training_step(self):
        """A model (projections around the layer) compiled with
        fullgraph=True: forward, loss, backward, an optimizer step; the
        compiled step's loss and gradients equal eager's."""
        torch.manual_seed(0)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = torch.nn.Linear(32, 4 * 16 + 2 * 2 * 16 + 4 * 3)
                self.out = torch.nn.Linear(4 * 16, 32)

            def forward(self, x):
                B, T, _ = x.shape
                q, k, v, g = self.qkv(x).split([64, 32, 32, 12], dim=-1)
                o = nsa.sparse_attention(
                    q.reshape(B, T, 4, 16).contiguous(),
                    k.reshape(B, T, 2, 16).contiguous(),
                    v.reshape(B, T, 2, 16).contiguous(),
                    g.reshape(B, T, 4, 3).contiguous(), SMALL)
                return self.out(o.reshape(B, T, 64))

        model = Model()
        x = torch.randn(2, 75, 32)

        def step(m):
            loss = m(x).square().mean()
            loss.backward()
            return loss
        eager = step(model)
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        loss = step(compiled)
        self.assertAlmostEqual(loss.item(), eager.item(), places=5)
        for p, want in zip(model.parameters(), grads):
            self.assertLessEqual(rel_l2(p.grad, want.double()), 1e-5)
        torch.optim.SGD(model.parameters(), lr=0.1).step()


if __name__ == "__main__":
    unittest.main(verbosity=2)
