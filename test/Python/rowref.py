"""A second float64 reference, for sampled rows of long sequences: written
from docs/Spec.md sections 3-8 in PyTorch (on the tensors' device), not
from runtime/reference, so that the two check each other (test_cpu.py) and
so that a 512k-token layer can be checked row by row where the full
reference would take hours (test_gpu.py). Batch 1, mean pooling."""

import math

import torch


def _forced(j, c, cfg):
    """Spec 5.4: whether selection block j is always on for block c."""
    back = c - j
    return (j < cfg.initial or back < cfg.local or
            (back > 0 and back & (back - 1) == 0 and
             back < (1 << cfg.log_levels)) or
            (cfg.hub_stride > 0 and j % cfg.hub_stride == 0) or
            j in cfg.blocks)


def _attend(qt, keys, values, group, scale):
    """Softmax attention of the heads qt [HQ, D] over keys [N, H, D]."""
    kg = keys.repeat_interleave(group, dim=1)    # [N, HQ, D]
    vg = values.repeat_interleave(group, dim=1)  # [N, HQ, Dv]
    s = torch.einsum("hd,nhd->hn", qt, kg) * scale
    lse = torch.logsumexp(s, dim=1, keepdim=True)
    p = torch.exp(s - lse)
    return torch.einsum("hn,nhd->hd", p, vg), p


def reference_rows(q, k, v, gates, cfg, rows):
    """The layer's float64 output at token rows `rows` ([R, HQ, Dv]) and the
    selection margins there ([R, H], as nsa.reference's return_margins)."""
    assert q.shape[0] == 1 and cfg.pool == "mean"
    _, T, HQ, Dqk = q.shape
    H, Dv = k.shape[2], v.shape[3]
    G = HQ // H
    l, d, lp, n, w = (cfg.cmp_block, cfg.cmp_stride, cfg.slc_block,
                      cfg.num_selected, cfg.window)
    scale = cfg.scale or 1.0 / math.sqrt(Dqk)
    kf, vf = k[0].double(), v[0].double()
    # Spec 3: kc[i] = mean of tokens [i d, i d + l), by prefix sums.
    nc = 0 if T < l else (T - l) // d + 1
    zero = lambda x: torch.zeros_like(x[:1])
    ck = torch.cat([zero(kf), kf.cumsum(0)])
    cv = torch.cat([zero(vf), vf.cumsum(0)])
    starts = torch.arange(nc, device=q.device) * d
    kc = (ck[starts + l] - ck[starts]) / l
    vc = (cv[starts + l] - cv[starts]) / l
    outs, margins = [], []
    for t in rows:
        qt = q[0, t].double()
        c = t // lp
        # Spec 4: the compressed blocks that end at or before t.
        visible = 0 if t + 1 < l else (t + 1 - l) // d + 1
        o_cmp = torch.zeros(HQ, Dv, dtype=torch.float64, device=q.device)
        score = torch.zeros(H, c + 1, dtype=torch.float64, device=q.device)
        if visible:
            o_cmp, p = _attend(qt, kc[:visible], vc[:visible], G, scale)
            # Spec 5.2-5.3: overlap weights, summed over the group's heads.
            pg = p.view(H, G, visible).sum(1)
            for m in range(l // d):
                sub = torch.arange(visible, device=q.device) + m
                score.index_add_(1, sub // (lp // d), pg)
        # Spec 5.4: forced blocks, then the best others (ties: lower index).
        row_margins, keys = [], []
        scores = score.cpu().tolist()
        forced = [j for j in range(c + 1) if _forced(j, c, cfg)][:n]
        is_forced = set(forced)
        for h in range(H):
            sc = scores[h]
            others = sorted((j for j in range(c + 1) if j not in is_forced),
                            key=lambda j: (-sc[j], j))
            free = min(n, c + 1) - len(forced)
            chosen, left = others[:max(free, 0)], others[max(free, 0):]
            lo = min((sc[j] for j in chosen), default=math.inf)
            hi = max((sc[j] for j in left), default=-math.inf)
            row_margins.append(math.inf if hi == -math.inf else
                               (lo - hi) / max(1.0, abs(hi)))
            keys.append(sorted(kk for j in forced + chosen
                               for kk in range(j * lp, min((j + 1) * lp,
                                                           t + 1))))
        # Spec 6: selected attention, per group (its own key set).
        o_slc = torch.empty(HQ, Dv, dtype=torch.float64, device=q.device)
        for h in range(H):
            idx = torch.tensor(keys[h], device=q.device)
            o, _ = _attend(qt[h * G:(h + 1) * G], kf[idx][:, h:h + 1],
                           vf[idx][:, h:h + 1], G, scale)
            o_slc[h * G:(h + 1) * G] = o
        # Spec 7: the window (t - w, t].
        lo_k = max(0, t - w + 1)
        o_win, _ = _attend(qt, kf[lo_k:t + 1], vf[lo_k:t + 1], G, scale)
        # Spec 8: sigmoid gates.
        s = torch.sigmoid(gates[0, t].double())
        outs.append(s[:, 0:1] * o_cmp + s[:, 1:2] * o_slc + s[:, 2:3] * o_win)
        margins.append(row_margins)
    return (torch.stack(outs).cpu(),
            torch.tensor(margins, dtype=torch.float64))
