"""Calibration of the confidence head: sequential temperature scaling (STS, per-slot temperatures fitted left to
right), its prefix-survival ECE and the reliability bins, and the held-out fit the reports and ``calibrate`` quote.

Why the prefix survival is what must be calibrated, the fit and its grid: docs/design/design.md §5, §9."""

from __future__ import annotations

import torch

from dspark_lightning.measuring.validation_blocks import ValidationBlocks
from dspark_lightning.metrics import bin_sums


def expected_calibration_error(
    predicted: torch.Tensor, observed: torch.Tensor, valid: torch.Tensor, n_bins: int = 10
) -> torch.Tensor:
    """sum_b (n_b / n) |mean predicted_b - mean observed_b| over equal-width bins of ``predicted`` in [0, 1]."""
    predicted, observed = predicted[valid].double(), observed[valid].double()
    if predicted.numel() == 0:
        return torch.tensor(float("nan"))
    _, pred_sum, obs_sum = bin_sums(predicted, observed, n_bins)
    return (pred_sum - obs_sum).abs().sum() / predicted.numel()


def prefix_quantities(
    confidence_logits: torch.Tensor, alpha: torch.Tensor, valid: torch.Tensor, temperatures: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(predicted prefix survival, observed prefix acceptance, prefix validity), each [Nb, B]."""
    survival = torch.cumprod(torch.sigmoid(confidence_logits.double() / temperatures.double()), dim=-1)
    observed = torch.cumprod(alpha.double(), dim=-1)
    prefix_valid = torch.cumprod(valid.long(), dim=-1).bool()
    return survival, observed, prefix_valid


def prefix_ece(confidence_logits, alpha, valid, temperatures, n_bins: int = 10) -> torch.Tensor:
    survival, observed, prefix_valid = prefix_quantities(confidence_logits, alpha, valid, temperatures)
    return expected_calibration_error(survival, observed, prefix_valid, n_bins)


def fit_sequential_temperatures(
    confidence_logits: torch.Tensor,
    alpha: torch.Tensor,
    valid: torch.Tensor,
    n_bins: int = 10,
    grid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Fit T [B] left to right; returns (temperatures, {"ece_before", "ece_after"}) for the prefix survival."""
    if confidence_logits.shape != alpha.shape or alpha.shape != valid.shape or alpha.ndim != 2:
        raise ValueError("confidence_logits, alpha and valid must all be [num_blocks, block_size]")
    grid = torch.logspace(-1.5, 1.5, 121, dtype=torch.float64) if grid is None else grid.double()
    block = alpha.shape[1]
    logits, alpha, valid = confidence_logits.double(), alpha.double(), valid.bool()
    prefix_valid = torch.cumprod(valid.long(), dim=-1).bool()
    observed = torch.cumprod(alpha, dim=-1)
    temperatures = torch.ones(block, dtype=torch.float64)
    survival_before = torch.ones(alpha.shape[0], dtype=torch.float64)
    for slot in range(block):
        mask = prefix_valid[:, slot]
        if not mask.any():
            break
        best_t, best_ece = 1.0, float("inf")
        for t in grid.tolist():
            candidate = survival_before * torch.sigmoid(logits[:, slot] / t)
            ece = float(expected_calibration_error(candidate, observed[:, slot], mask, n_bins))
            if ece < best_ece - 1e-12:
                best_t, best_ece = t, ece
        temperatures[slot] = best_t
        survival_before = survival_before * torch.sigmoid(logits[:, slot] / best_t)
    before = float(prefix_ece(logits, alpha, valid, torch.ones(block, dtype=torch.float64), n_bins))
    after = float(prefix_ece(logits, alpha, valid, temperatures, n_bins))
    return temperatures.float(), {"ece_before": before, "ece_after": after}


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
