"""Rows outside the loss (masked or weight 0) leave no trace: not even a NaN or an infinite term in such a row (an
invalid anchor's garbage logits) reaches the loss, its components or the gradient."""

from __future__ import annotations

import pytest
import torch

from dspark_lightning.losses import compound_loss

SPEC = {"kl": 0.3, "tv": 0.4, "ce": 0.1, "rkl": 0.2}


def case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(2, 3, 7, generator=g, dtype=torch.float64) * 2
    lp = torch.log_softmax(torch.randn(2, 3, 7, generator=g, dtype=torch.float64) * 2, -1)
    return z, lp


@pytest.mark.parametrize("weighting", ["exp", "dpace"])
def test_non_finite_terms_in_rows_outside_the_loss_are_ignored(weighting):
    z, lp = case()
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    kept = z[mask].clone().requires_grad_()
    clean = compound_loss(kept, lp[mask], None, None, SPEC, position_weighting="exp")
    # the masked rows get NaN draft logits and a teacher with -inf where the draft has mass (rkl = inf there)
    dirty_z, dirty_lp = z.clone(), lp.clone()
    dirty_z[~mask] = float("nan")
    dirty_lp[0, 2, :3] = float("-inf")
    dirty_z = dirty_z.requires_grad_()
    out = compound_loss(dirty_z, dirty_lp, torch.ones(3), mask, SPEC, position_weighting=weighting)
    assert torch.isfinite(out.loss) and all(torch.isfinite(c) for c in out.components.values())
    if weighting == "exp":  # the same rows, the same unit weights: the same loss as without the masked rows
        torch.testing.assert_close(out.loss, clean.loss, rtol=1e-10, atol=0)
    out.loss.backward()
    assert torch.isfinite(dirty_z.grad).all() and (dirty_z.grad[~mask] == 0).all()
