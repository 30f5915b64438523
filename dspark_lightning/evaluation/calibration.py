"""Sequential temperature scaling (STS) of the confidence head: per-slot temperatures fitted left to right.

Why the prefix survival is what must be calibrated, the fit and its grid: docs/design/design.md §5, §9."""

from __future__ import annotations

import torch

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
