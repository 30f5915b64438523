"""Position weights and D-PACE weights (``dspark_lightning.losses.position_weighting``) against hand formulas and brute force."""

from __future__ import annotations

import math

import pytest
import torch

from dspark_lightning.losses import dpace_weights, position_weights, row_weights_for_blocks


def test_position_weights_both_conventions():
    w = position_weights(5, gamma=2.0)
    assert torch.allclose(w, torch.tensor([math.exp(-k / 2.0) for k in range(5)]))
    w = position_weights(5, gamma=2.0, sample_from_anchor=False)
    assert torch.allclose(w, torch.tensor([0.0] + [math.exp(-(k - 1) / 2.0) for k in range(1, 5)]))
    assert torch.equal(position_weights(4, position_weighting="uniform"), torch.ones(4))
    assert torch.equal(
        position_weights(4, position_weighting="uniform", sample_from_anchor=False), torch.tensor([0.0, 1, 1, 1])
    )
    assert torch.equal(
        position_weights(4, position_weighting="dpace", sample_from_anchor=False), torch.tensor([0.0, 1, 1, 1])
    )
    assert torch.equal(
        row_weights_for_blocks(3, 4, position_weighting="uniform", sample_from_anchor=False).view(3, 4)[:, 0],
        torch.zeros(3),
    )
    for kwargs in ({"position_weighting": "linear"}, {"gamma": 0.0}, {"gamma": -1.0}):
        with pytest.raises(ValueError):
            position_weights(4, **kwargs)
    with pytest.raises(ValueError):
        position_weights(0)


def test_dpace_weights_brute_force():
    g = torch.Generator().manual_seed(1)
    alpha = torch.rand(4, 6, generator=g, dtype=torch.float64)
    trained = torch.rand(4, 6, generator=g) > 0.25
    trained[:, 0] = False  # DFlash form
    lam = 0.3
    w = dpace_weights(alpha, trained, smoothing=lam, normalize=False)
    for i in range(4):
        for k in range(6):
            expect = 0.0
            if trained[i, k]:
                for m in range(k, 6):
                    if trained[i, m]:
                        prod = 1.0
                        for j in range(m + 1):
                            prod *= (1 - lam) * alpha[i, j].item() + lam if trained[i, j] else 1.0
                        expect += prod
            assert w[i, k].item() == pytest.approx(expect, rel=1e-12)
    wn = dpace_weights(alpha, trained, smoothing=lam)
    assert wn[trained].mean().item() == pytest.approx(1.0)
    assert torch.allclose(wn / w.clamp_min(1e-30), (wn / w.clamp_min(1e-30))[trained][0].expand_as(w) * trained)
    # earlier slots never get less weight than later ones in the same block (suffix sums of positive terms)
    full = dpace_weights(alpha, torch.ones_like(trained))
    assert (full[:, :-1] >= full[:, 1:]).all()
    with pytest.raises(ValueError):
        dpace_weights(alpha, trained, smoothing=1.5)
