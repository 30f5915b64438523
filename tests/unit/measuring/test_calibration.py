"""Sequential temperature scaling against hand computations and on a synthetic miscalibrated head."""

from __future__ import annotations

import torch

from dspark_lightning.measuring.calibration import expected_calibration_error, fit_sequential_temperatures, prefix_ece


def test_ece_by_hand():
    predicted = torch.tensor([0.05, 0.15, 0.12, 0.95])
    observed = torch.tensor([0.0, 0.5, 0.1, 1.0])
    valid = torch.tensor([True, True, True, True])
    # bins: 0 -> {0.05 | 0.0}; 1 -> {0.15, 0.12 | 0.5, 0.1}; 9 -> {0.95 | 1.0}
    expected = (abs(0.05 - 0.0) + abs(0.27 - 0.6) + abs(0.95 - 1.0)) / 4
    assert abs(float(expected_calibration_error(predicted, observed, valid)) - expected) < 1e-7
    valid[1] = False
    expected = (0.05 + abs(0.12 - 0.1) + 0.05) / 3
    assert abs(float(expected_calibration_error(predicted, observed, valid)) - expected) < 1e-7


def test_sts_lowers_ece_on_an_overconfident_head():
    g = torch.Generator().manual_seed(0)
    blocks, B = 4000, 6
    true_logit = torch.randn(blocks, B, generator=g) * 1.5 + 0.5
    alpha = torch.sigmoid(true_logit)  # the real per-slot acceptance
    slot_scale = torch.tensor([3.0, 2.5, 2.0, 1.5, 0.5, 0.3])  # over- then under-confident logits
    confidence_logits = true_logit * slot_scale
    valid = torch.rand(blocks, B, generator=g) > 0.05
    temperatures, ece = fit_sequential_temperatures(confidence_logits, alpha, valid)
    assert ece["ece_after"] < 0.5 * ece["ece_before"], ece
    # the fitted temperatures undo the scaling (T ~ scale) on the well-populated early slots
    assert torch.allclose(temperatures[:3], slot_scale[:3], rtol=0.35), temperatures
    assert abs(ece["ece_after"] - float(prefix_ece(confidence_logits, alpha, valid, temperatures))) < 1e-9


def test_already_calibrated_head_keeps_its_ece():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3000, 4, generator=g)
    alpha = torch.sigmoid(logits)
    valid = torch.ones_like(alpha, dtype=torch.bool)
    _, ece = fit_sequential_temperatures(logits, alpha, valid)
    assert ece["ece_after"] <= ece["ece_before"] + 1e-12
    assert ece["ece_before"] < 0.01
