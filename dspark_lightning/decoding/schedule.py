"""Confidence scheduling: how many drafted slots a step sends to the target.

Prefix survival: docs/design/design.md §5; the threshold and cost-model schedules: §8.3, §8.4."""

from __future__ import annotations

import torch

from dspark_lightning.models.drafter import DSparkDrafter


def prefix_survival(drafter: DSparkDrafter, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor | None:
    """a_n = prod_{j<=n} c_j from the (calibrated) confidence head; hidden [1, B', H], prev [1, B'] -> [B']."""
    logits = drafter.confidence_logits(hidden, prev_tokens)
    if logits is None:
        return None
    temperature = drafter.config.trained_slots(drafter.confidence_temperature, dim=0)
    return torch.cumprod(torch.sigmoid(logits[0].float() / temperature), dim=0)


def scheduled_length(
    survival: torch.Tensor | None,
    block: int,
    threshold: float | None,
    cost_model: tuple[float, float] | None,
) -> int:
    """How many drafted slots to verify: always in [1, block]."""
    if survival is None or (threshold is None and cost_model is None):
        return block
    if cost_model is not None:
        t0, t1 = cost_model
        n = torch.arange(1, block + 1, dtype=torch.float32)
        gain = (1.0 + torch.cumsum(survival[:block], 0)) / (t0 + t1 * n)
        return int(gain.argmax()) + 1
    above = (survival[:block] >= threshold).nonzero()
    return max(1, int(above.max()) + 1) if len(above) else 1


def schedule_block(
    drafter: DSparkDrafter,
    hidden: torch.Tensor,
    anchor: torch.Tensor,
    drafted: torch.Tensor,
    q: torch.Tensor | None,
    threshold: float | None,
    cost_model: tuple[float, float] | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The drafted block (target ids [B'], draft distributions [B', Vd] or None) cut to the scheduled length; whole
    without a threshold or cost model. ``hidden`` [1, B', H]: the block's draft hidden states after ``anchor`` [1]."""
    if threshold is None and cost_model is None:
        return drafted, q
    previous = torch.cat((anchor, drafted[:-1]))[None]  # each slot's previous token, as the confidence head reads it
    n = scheduled_length(prefix_survival(drafter, hidden, previous), drafted.shape[0], threshold, cost_model)
    return drafted[:n], (q[:n] if q is not None else None)
