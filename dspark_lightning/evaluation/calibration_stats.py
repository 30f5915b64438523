"""Calibration statistics of the confidence head: reliability bins and the held-out prefix-survival ECE."""

from __future__ import annotations

import torch

from dspark_lightning.evaluation.calibration import fit_sequential_temperatures, prefix_ece, prefix_quantities
from dspark_lightning.evaluation.validation_blocks import ValidationBlocks
from dspark_lightning.metrics import bin_sums


def reliability_bins(predicted: torch.Tensor, observed: torch.Tensor, valid: torch.Tensor, n_bins: int = 10):
    """(mean predicted, mean observed, count) per equal-width bin of ``predicted`` (NaN for empty bins), as
    ``plotting.reliability_diagram`` draws them."""
    counts, pred_sum, obs_sum = bin_sums(predicted[valid].double(), observed[valid].double(), n_bins)
    counts = counts.double()
    return (pred_sum / counts).tolist(), (obs_sum / counts).tolist(), counts.tolist()


def heldout_calibration(blocks: ValidationBlocks, n_bins: int = 10) -> dict:
    """Sequential temperature scaling fitted on the even blocks, scored on the odd ones (fitting and scoring on the
    same blocks flatters it).

    Returns ``temperatures`` [B'], ``ece_before`` / ``ece_after`` (prefix-survival ECE on the held-out half) and the
    reliability bins before and after (``bins_before`` / ``bins_after``: (predicted, observed, counts)).
    """
    if blocks.confidence_logits is None:
        raise ValueError("this drafter has no confidence head")
    fit_half, test_half = slice(0, None, 2), slice(1, None, 2)
    logits, alpha, valid = blocks.confidence_logits, blocks.alpha, blocks.valid
    temperatures, _ = fit_sequential_temperatures(logits[fit_half], alpha[fit_half], valid[fit_half], n_bins)
    ones = torch.ones_like(temperatures)
    result = {"temperatures": temperatures.tolist(), "heldout_blocks": int(valid[test_half].shape[0])}
    for name, temps in (("before", ones), ("after", temperatures)):
        args = (logits[test_half], alpha[test_half], valid[test_half], temps)
        result[f"ece_{name}"] = float(prefix_ece(*args, n_bins=n_bins))
        result[f"bins_{name}"] = reliability_bins(*prefix_quantities(*args), n_bins=n_bins)
    return result
