"""Metrics: brute-force loops, hand-computed ECE, DDP exactness by merging per-rank states, acceptance_stats."""

from __future__ import annotations

import math

import pytest
import torch

from dspark_lightning.losses import compound_loss
from dspark_lightning.metrics import AcceptanceMetrics, ConfidenceCalibration, acceptance_stats


def random_blocks(nb=9, b=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    alpha = torch.rand(nb, b, generator=g)
    match = torch.rand(nb, b, generator=g) > 0.3
    valid = torch.rand(nb, b, generator=g) > 0.2
    valid[0] = False  # a block with no valid slot
    valid[1] = True
    match[1] = True
    conf = torch.rand(nb, b, generator=g)
    return alpha, match, valid, conf


def loop_acceptance(alpha, match, valid):
    nb, b = alpha.shape
    taus, gtaus = [], []
    for i in range(nb):
        if not any(valid[i].tolist()):
            continue
        tau, prod = 1.0, 1.0
        for k in range(b):
            prod *= alpha[i, k].item() if valid[i, k] else 0.0
            tau += prod
        taus.append(tau)
        n = 0
        while n < b and valid[i, n] and match[i, n]:
            n += 1
        gtaus.append(1.0 + n)
    v = [(alpha[i, k].item(), bool(match[i, k])) for i in range(nb) for k in range(b) if valid[i, k]]
    return {
        "tau": sum(taus) / len(taus),
        "greedy_tau": sum(gtaus) / len(gtaus),
        "accept_rate": sum(a for a, _ in v) / len(v),
        "greedy_acc": sum(m for _, m in v) / len(v),
        "num_blocks": len(taus),
    }


def test_acceptance_against_loops():
    alpha, match, valid, _ = random_blocks()
    m = AcceptanceMetrics(5)
    m.update(alpha[:4], match[:4], valid[:4])
    m.update(alpha[4:].reshape(-1), match[4:].reshape(-1), valid[4:].reshape(-1))  # flat input too
    out = m.compute()
    ref = loop_acceptance(alpha, match, valid)
    for k in ("tau", "greedy_tau", "accept_rate", "greedy_acc"):
        assert out[k].item() == pytest.approx(ref[k], rel=1e-5), k
    assert out["num_blocks"].item() == ref["num_blocks"]
    for k in range(5):
        sel = valid[:, k]
        assert out["accept_rate_per_slot"][k].item() == pytest.approx(alpha[sel, k].mean().item(), rel=1e-5)
        assert out["greedy_acc_per_slot"][k].item() == pytest.approx(match[sel, k].float().mean().item(), rel=1e-5)


def test_perfect_blocks_and_empty_slots():
    m = AcceptanceMetrics(4)
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    m.update(torch.ones(2, 4), torch.ones(2, 4, dtype=torch.bool), valid)
    out = m.compute()
    assert out["tau"].item() == 4.0 and out["greedy_tau"].item() == 4.0
    assert math.isnan(out["accept_rate_per_slot"][3].item())  # no data for slot 3
    m.update(torch.ones(1, 4), torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool))
    assert m.compute()["tau"].item() == pytest.approx((4 + 4 + 5) / 3)
    with pytest.raises(ValueError):
        m.update(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3))


def _merged(cls, args, split, **kw):
    a, b, full = cls(**kw), cls(**kw), cls(**kw)
    a.update(*(x[:split] for x in args))
    b.update(*(x[split:] for x in args))
    full.update(*args)
    a.merge_state(b)
    return a.compute(), full.compute(), a, b


@pytest.mark.parametrize("cls", [AcceptanceMetrics, ConfidenceCalibration])
def test_ddp_exactness(cls):
    alpha, match, valid, conf = random_blocks(nb=20, seed=3)
    args = (alpha, match, valid) if cls is AcceptanceMetrics else (conf, alpha, valid)
    merged, full, _, _ = _merged(cls, args, 7, block_size=5)
    assert merged.keys() == full.keys()
    for k in full:
        torch.testing.assert_close(merged[k], full[k], rtol=1e-6, atol=1e-7, equal_nan=True)
    # the same by summing the two "ranks'" states by hand (what dist_reduce_fx="sum" does)
    r0, r1, full_m = cls(block_size=5), cls(block_size=5), cls(block_size=5)
    r0.update(*(x[:11] for x in args))
    r1.update(*(x[11:] for x in args))
    full_m.update(*args)
    for name, fx in r0._reductions.items():
        assert fx is not None and r0._defaults[name] is not None
        setattr(r0, name, getattr(r0, name) + getattr(r1, name))
    for k, v in full_m.compute().items():
        torch.testing.assert_close(r0.compute()[k], v, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_ece_and_prefix_by_hand():
    m = ConfidenceCalibration(block_size=3, n_bins=10)
    conf = torch.tensor([[0.95, 0.55, 0.15], [0.52, 0.9, 0.5]])
    alpha = torch.tensor([[0.75, 0.45, 0.35], [0.58, 0.6, 0.2]])
    valid = torch.tensor([[1, 1, 1], [1, 0, 1]], dtype=torch.bool)
    m.update(conf, alpha, valid)
    out = m.compute()
    # valid pairs (c, α): (.95,.75) (.55,.45) (.15,.35) (.52,.58) (.5,.2)
    pairs = [(0.95, 0.75), (0.55, 0.45), (0.15, 0.35), (0.52, 0.58), (0.5, 0.2)]
    assert out["mean_abs_error"].item() == pytest.approx(sum(abs(c - a) for c, a in pairs) / 5)
    assert out["mean_confidence"].item() == pytest.approx(sum(c for c, _ in pairs) / 5)
    assert out["mean_alpha"].item() == pytest.approx(sum(a for _, a in pairs) / 5)
    # bins: 9 → {.95}; 5 → {.55, .52, .5}; 1 → {.15}
    ece = (1 / 5) * abs(0.95 - 0.75) + (3 / 5) * abs((0.55 + 0.52 + 0.5) / 3 - (0.45 + 0.58 + 0.2) / 3)
    ece += (1 / 5) * abs(0.15 - 0.35)
    assert out["slot_ece"].item() == pytest.approx(ece, rel=1e-5)
    # prefixes: block 0 all three slots; block 1 only slot 0 (slot 1 invalid ends the prefix)
    pc = [0.95, 0.95 * 0.55, 0.95 * 0.55 * 0.15, 0.52]
    pa = [0.75, 0.75 * 0.45, 0.75 * 0.45 * 0.35, 0.58]
    assert out["prefix_survival_bias"].item() == pytest.approx(sum(c - a for c, a in zip(pc, pa)) / 4, rel=1e-5)
    # prefix bins: .95 → 9; .5225 → 5; .078375 → 0; .52 → 5
    pece = abs(pc[0] - pa[0]) + abs(pc[1] + pc[3] - pa[1] - pa[3]) + abs(pc[2] - pa[2])
    assert out["prefix_ece"].item() == pytest.approx(pece / 4, rel=1e-5)
    cnt = out["reliability_count"]
    assert cnt.tolist() == [1, 0, 0, 0, 0, 2, 0, 0, 0, 1]
    assert out["reliability_confidence"][5].item() == pytest.approx((pc[1] + pc[3]) / 2, rel=1e-5)
    assert out["reliability_observed"][5].item() == pytest.approx((pa[1] + pa[3]) / 2, rel=1e-5)
    assert math.isnan(out["reliability_confidence"][3].item())
    assert out["mean_confidence_per_slot"].tolist() == pytest.approx([(0.95 + 0.52) / 2, 0.55, (0.15 + 0.5) / 2])


def test_calibration_perfect_and_edge_bins():
    m = ConfidenceCalibration(block_size=2)
    a = torch.tensor([[1.0, 0.0], [0.3, 0.7]])
    m.update(a, a, torch.ones(2, 2, dtype=torch.bool))
    out = m.compute()
    for k in ("mean_abs_error", "slot_ece", "prefix_ece", "prefix_survival_bias"):
        assert out[k].item() == pytest.approx(0.0, abs=1e-7), k
    assert out["reliability_count"].sum().item() == 4 and out["reliability_count"][9].item() == 1  # c = 1 → last bin


def test_acceptance_stats_perfect_and_consistent():
    g = torch.Generator().manual_seed(4)
    n, b, vd = 6, 4, 30
    t = torch.randn(n, b, vd, generator=g) * 3
    mask = torch.ones(n, b, dtype=torch.bool)
    s = acceptance_stats(t, t, mask)
    assert s["accept_rate"].item() > 0.99 and s["tau"].item() == pytest.approx(b + 1, abs=1e-4)
    assert s["greedy_acc"].item() == 1.0 and s["accept_rate_per_slot"].shape == (b,)
    d = torch.randn(n, b, vd, generator=g) * 3
    mask[0, 2] = False
    mask[3] = False
    s = acceptance_stats(d, t, mask, chunk_rows=4)
    out = compound_loss(d, torch.log_softmax(t, -1), None, None, {"tv": 1.0})
    ref = loop_acceptance(out.alpha, out.greedy_match, mask)
    for k in ("accept_rate", "tau", "greedy_acc", "greedy_tau"):
        assert s[k].item() == pytest.approx(ref[k], rel=1e-5), k
    am = AcceptanceMetrics(b)
    am.update(out.alpha, out.greedy_match, mask)
    torch.testing.assert_close(s["accept_rate_per_slot"], am.compute()["accept_rate_per_slot"])
    with pytest.raises(ValueError):
        acceptance_stats(d, t[..., :5], mask)
