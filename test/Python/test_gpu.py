"""nsa.sparse_attention on CUDA tensors: the layers of libnsa_layers run
through the nsa runtime, against the float64 reference (outputs poisoned
first, T no tile multiple) and against PyTorch's own SDPA where NSA reduces
to dense causal attention. Needs a GPU (bench/run.sh tests runs it on the
GPU machine); exits 77 elsewhere."""

import os
import sys
import time
import unittest

import torch

from common import SMALL, SMALL_PACKED, inputs, judge, nsa, rel_l2

PAPER = nsa.NSAConfig()


def packed_pool(H):
    """cu_seqlens (three sequences of 1000 tokens, one of them 1 long) and
    learned pool weights (rows summing to 1) of the small_packed layer."""
    l = SMALL_PACKED.cmp_block
    w = torch.rand(2, H, l, generator=torch.Generator().manual_seed(3))
    return dict(cu_seqlens=torch.tensor([0, 300, 301, 1000],
                                        dtype=torch.int32),
                cmp_weights=(w / w.sum(-1, keepdim=True)).float())


def poisoned(q, v):
    return torch.full((*q.shape[:3], v.shape[3]), float("nan"),
                      dtype=q.dtype, device=q.device)


class SmallLayers:
    """The small layers' cases (libnsa_layers' small and small_packed), run
    by each class's own check."""

    def test_small(self):
        self.check(2, 1000, 4, 1, 64, 64, SMALL)

    def test_small_one_token(self):
        self.check(1, 1, 4, 1, 64, 64, SMALL)

    def test_packed_learned_pool(self):
        self.check(1, 1000, 8, 4, 64, 32, SMALL_PACKED, **packed_pool(4))


class GpuAgainstReference(SmallLayers, unittest.TestCase):
    def check(self, B, T, HQ, H, Dqk, Dv, config, tol=1e-2, **kw):
        q, k, v, g = inputs(B, T, HQ, H, Dqk, Dv, torch.bfloat16, "cuda",
                            seed=T)
        kw = {key: (t.cuda() if isinstance(t, torch.Tensor) else t)
              for key, t in kw.items()}
        out = poisoned(q, v)
        got = nsa.sparse_attention(q, k, v, g, config, out=out, **kw)
        self.assertIs(got, out)
        start = time.time()
        want, margins = nsa.reference(q, k, v, g, config, return_margins=True,
                                      **kw)
        err, ties, rows = judge(out, want, margins, HQ // H)
        print(f"  B {B} T {T} HQ {HQ} H {H} {Dqk}/{Dv}: rel. L2 {err:.2e}, "
              f"all rows {rel_l2(out, want):.2e} ({ties} of {rows} (token, "
              f"KV head) rows near a selection tie; reference "
              f"{time.time() - start:.1f} s)", flush=True)
        self.assertLessEqual(err, tol)
        # The rows left out come from the reference alone; most must count.
        self.assertLessEqual(ties, max(2, rows // 4))

    def test_paper(self):
        # The paper's layer (64 query heads, 4 KV heads, 192/128).
        self.check(1, 777, 64, 4, 192, 128, PAPER)

    def test_paper_d128(self):
        self.check(1, 530, 64, 4, 128, 128, PAPER)

    @unittest.skipIf(os.environ.get("NSA_GPU_TESTS_QUICK"),
                     "NSA_GPU_TESTS_QUICK (the sanitizer runs)")
    def test_paper_512k(self):
        """The paper's layer at T = 2^19: q alone has 6.4e9 elements, so
        every offset past row 174762 needs 64 bits. The output is poisoned
        first and must be finite everywhere; sampled rows (the first, the
        last, around 2^17 and 2^18, and random ones) are checked against the
        PyTorch row reference (rowref.py, float64 on the GPU).

        Uniform random inputs make every block score a near-tie at this
        length (softmax over 32767 compressed blocks), so the inputs carry
        needles: every query leans along one direction u, and 16 selection
        blocks of the first quarter hold keys along u of distinct strengths.
        Rows past the needles then select them by clear margins."""
        from rowref import reference_rows
        T, HQ, H, Dqk, Dv = 1 << 19, 64, 4, 192, 128
        gen = torch.Generator(device="cuda").manual_seed(19)

        def rand(*shape):
            return torch.rand(*shape, device="cuda", generator=gen) * 2 - 1
        u = torch.nn.functional.normalize(rand(Dqk), dim=0)
        q = rand(1, T, HQ, Dqk) + 6.0 * u
        k = rand(1, T, H, Dqk)
        lp = PAPER.slc_block
        needles = torch.randperm(T // lp // 4, generator=torch.Generator()
                                 .manual_seed(7))[:16].tolist()
        for i, j in enumerate(needles):
            k[0, j * lp:(j + 1) * lp] += (26.0 + 0.3 * i) * u
        q, k = q.to(torch.bfloat16), k.to(torch.bfloat16)
        v = rand(1, T, H, Dv).to(torch.bfloat16)
        g = rand(1, T, HQ, 3).to(torch.bfloat16)
        out = poisoned(q, v)
        torch.cuda.synchronize()
        start = time.time()
        nsa.sparse_attention(q, k, v, g, PAPER, out=out)
        seconds = time.time() - start
        self.assertTrue(torch.isfinite(out).all().item())
        picks = torch.randint(T // 4, T, (24,), generator=torch.Generator()
                              .manual_seed(5)).tolist()
        rows = sorted(set([0, 31, 511, 512, 65535, 174762, 174763,
                           (1 << 17) + 7, (1 << 18) - 1, 1 << 18,
                           3 * (1 << 17) + 5, T - 65, T - 2, T - 1] + picks))
        start = time.time()
        want, margins = reference_rows(q, k, v, g, PAPER, rows)
        ref_seconds = time.time() - start
        got = out[0, rows].double().cpu()
        keep = (margins >= 1e-3).repeat_interleave(HQ // H, dim=1)
        err = rel_l2(got[keep], want[keep])
        ties = int((margins < 1e-3).sum())
        print(f"  T {T} paper layer: {seconds:.2f} s on the GPU (first "
              f"call); {len(rows)} rows: rel. L2 {err:.2e}, all "
              f"{rel_l2(got, want):.2e} ({ties} of {margins.numel()} "
              f"(row, KV head) near a selection tie; row reference "
              f"{ref_seconds:.1f} s)", flush=True)
        self.assertLessEqual(err, 1e-2)
        self.assertLessEqual(ties, margins.numel() // 4)

    def test_nan_in_nan_out(self):
        """Spec section 14 on the small_packed layer (learned pool, three
        sequences): every row the reference makes non-finite is non-finite
        on the GPU (the output is poisoned first, so a row left unwritten
        counts as non-finite); with a NaN, exactly those rows; the rows
        finite in both agree as test_packed_learned_pool's do."""
        H, T = 4, 1000
        pp = {key: t.cuda() for key, t in packed_pool(H).items()}
        # (input, index, value, whether it may spread to other rows)
        cases = (("k", 1, (0, 400, 2, 5), "nan", False),
                 ("q", 0, (0, 700, 3, 3), "nan", False),
                 ("key pool", 4, (0, 2, 3), "nan", False),
                 ("value pool", 4, (1, 1, 2), "nan", True),
                 ("v", 2, (0, 900, 1, 2), "inf", True))
        for name, which, at, value, spreads in cases:
            with self.subTest(name):
                args = list(inputs(1, T, 8, H, 64, 32, torch.bfloat16,
                                   "cuda", seed=5))
                args.append(pp["cmp_weights"].clone())
                args[which][at] = float(value)
                q, k, v, g, pool = args
                kw = dict(cu_seqlens=pp["cu_seqlens"], cmp_weights=pool)
                out = poisoned(q, v)
                nsa.sparse_attention(q, k, v, g, SMALL_PACKED, out=out, **kw)
                want, margins = nsa.reference(q, k, v, g, SMALL_PACKED,
                                              return_margins=True, **kw)
                got = out.double().cpu()
                bad = ~torch.isfinite(want).all(-1)      # [1, T, HQ]
                got_bad = ~torch.isfinite(got).all(-1)
                self.assertTrue(bad.any())
                self.assertFalse((bad & ~got_bad).any())
                if not spreads:
                    self.assertTrue(torch.equal(bad, got_bad))
                keep = (~bad & ~got_bad &
                        (margins >= 1e-3).repeat_interleave(2, dim=2))
                print(f"  {name} = {value}: {int(bad.sum())} rows "
                      f"non-finite, {int(got_bad.sum())} on the GPU; "
                      f"rel. L2 of {int(keep.sum())} others "
                      f"{rel_l2(got[keep], want[keep]):.2e}", flush=True)
                self.assertGreater(int(keep.sum()), T)
                self.assertLessEqual(rel_l2(got[keep], want[keep]), 1e-2)

    def test_empty_sequence(self):
        q, k, v, g = inputs(1, 0, 4, 1, 64, 64, torch.bfloat16, "cuda")
        self.assertEqual(nsa.sparse_attention(q, k, v, g, SMALL).numel(), 0)


def grad_error(got, want):
    """rel_l2, or the absolute L2 norm where the reference is exactly zero
    (T = 1: one visible key a branch, so dq = dk = 0); inf for NaN."""
    if want.abs().max() > 0:
        return rel_l2(got, want)
    got = got.detach().double().cpu()
    return got.norm().item() if torch.isfinite(got).all() else float("inf")


class GpuTraining(SmallLayers, unittest.TestCase):
    """The layer's backward through PyTorch autograd (layers compiled with
    --gradient: nsaLayerForwardTrain saves the state, nsaLayerBackward takes
    it): every gradient against the float64 reference backward on the
    blocks the GPU forward selected (its saved indices), and the training
    forward's output equal to the plain forward's."""

    def check(self, B, T, HQ, H, Dqk, Dv, config, tol=1e-2, cu_seqlens=None,
              cmp_weights=None):
        q, k, v, g = inputs(B, T, HQ, H, Dqk, Dv, torch.bfloat16, "cuda",
                            seed=T + 1)
        leaves = [q, k, v, g]
        if cmp_weights is not None:
            cmp_weights = cmp_weights.cuda()
            leaves.append(cmp_weights)
        for t in leaves:
            t.requires_grad_()
        kw = dict(cu_seqlens=None if cu_seqlens is None else
                  cu_seqlens.cuda(), cmp_weights=cmp_weights)
        out = nsa.sparse_attention(q, k, v, g, config, **kw)
        with torch.no_grad():
            plain = nsa.sparse_attention(q, k, v, g, config, **kw)
        # The plain forward gates the window branch's f32 output in the
        # window kernel's epilogue; the training forward saves that output
        # in bf16 first: the two differ by that rounding at most.
        self.assertLessEqual(rel_l2(out, plain.double().cpu()), 5e-3)
        # The saved state (nsa/_library.py): q, k, v, gates, cmp_weights,
        # cu_seqlens, then Spec 9.1's seven tensors (the indices third).
        indices = out.grad_fn.saved_tensors[8]
        dout = torch.rand(out.shape, generator=torch.Generator()
                          .manual_seed(T)).sub(0.5).to(out)
        torch.cuda.synchronize()
        start = time.time()
        out.backward(dout)
        torch.cuda.synchronize()
        seconds = time.time() - start
        want = nsa.reference_backward(q, k, v, g, dout, config,
                                      indices=indices, **kw)
        errors = []
        for name, t, w in zip(("dq", "dk", "dv", "dgates", "dweights"),
                              leaves, want):
            err = grad_error(t.grad, w)
            errors.append(f"{name} {err:.1e}")
            self.assertLessEqual(err, tol, name)
        print(f"  B {B} T {T} HQ {HQ} H {H} {Dqk}/{Dv}: {', '.join(errors)}"
              f" (backward {seconds * 1e3:.1f} ms)", flush=True)

    def test_paper(self):
        self.check(1, 1000, 64, 4, 192, 128, PAPER)

    def test_layer_without_gradient(self):
        # paper_d128 is compiled without its training entries.
        q, k, v, g = inputs(1, 64, 64, 4, 128, 128, torch.bfloat16, "cuda")
        with self.assertRaisesRegex(nsa.NSAError, "without its training"):
            nsa.sparse_attention(q.requires_grad_(), k, v, g, PAPER)

    def test_out_is_refused_with_grad(self):
        q, k, v, g = inputs(1, 64, 4, 1, 64, 64, torch.bfloat16, "cuda")
        with self.assertRaisesRegex(ValueError, "not differentiable"):
            nsa.sparse_attention(q.requires_grad_(), k, v, g, SMALL,
                                 out=poisoned(q, v))


class GpuAgainstSDPA(unittest.TestCase):
    """With the window covering the whole sequence and the gates open on
    the window branch alone, NSA is dense causal GQA attention: the same
    tensors in SDPA's [B, H, T, D] layout go through
    torch.nn.functional.scaled_dot_product_attention."""

    def test_window_branch_is_causal_sdpa(self):
        for HQ, H, Dqk, Dv, T, config in ((64, 4, 192, 128, 512, PAPER),
                                          (4, 1, 64, 64, 64, SMALL)):
            q, k, v, g = inputs(2, T, HQ, H, Dqk, Dv, torch.bfloat16, "cuda",
                                seed=HQ)
            g = torch.tensor([-40.0, -40.0, 40.0], dtype=torch.bfloat16,
                             device="cuda").expand(2, T, HQ, 3).contiguous()
            out = nsa.sparse_attention(q, k, v, g, config)
            dense = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                is_causal=True, enable_gqa=True).transpose(1, 2)
            err = rel_l2(out, dense.double().cpu())
            print(f"  HQ {HQ} T {T}: against SDPA rel. L2 {err:.2e}",
                  flush=True)
            self.assertLessEqual(err, 1e-2)

    def test_sdpa_layout_is_refused(self):
        q, k, v, g = inputs(1, 64, 4, 1, 64, 64, torch.bfloat16, "cuda")
        with self.assertRaisesRegex(ValueError, "contiguous"):
            nsa.sparse_attention(q.transpose(1, 2).contiguous()
                                 .transpose(1, 2), k, v, g, SMALL)

    def test_cpu_and_cuda_mixed(self):
        q, k, v, g = inputs(1, 64, 4, 1, 64, 64, torch.bfloat16, "cuda")
        with self.assertRaisesRegex(ValueError, "one device"):
            nsa.sparse_attention(q, k.cpu(), v, g, SMALL)

    def test_layers_listed(self):
        names = [name for name, _, _ in nsa.gpu_layers()]
        for name in ("paper", "paper_d128", "small", "small_packed"):
            self.assertIn(name, names)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        sys.exit(77)
    unittest.main(verbosity=2)
