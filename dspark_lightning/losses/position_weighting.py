"""Per-slot weights of the drafter losses: static position weights and D-PACE.

Design: docs/design/losses.md §6 (static weights), §7 (D-PACE, computed inside the loss because it needs the
current α)."""

from __future__ import annotations

import torch

POSITION_WEIGHTINGS = ("exp", "uniform", "dpace")

__all__ = ["POSITION_WEIGHTINGS", "dpace_weights", "position_weights", "row_weights_for_blocks"]


def position_weights(
    block_size: int,
    *,
    position_weighting: str = "exp",
    gamma: float = 4.0,
    sample_from_anchor: bool = True,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Static per-slot weights ``[block_size]`` (the two anchor conventions: docs/design/losses.md §6)."""
    if int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer; got {block_size!r}")
    if position_weighting not in POSITION_WEIGHTINGS:
        raise ValueError(
            f"unknown position weighting {position_weighting!r}; allowed: {', '.join(POSITION_WEIGHTINGS)}"
        )
    k = torch.arange(block_size, dtype=torch.float64)
    if position_weighting == "exp":
        if not gamma > 0:
            raise ValueError(f"gamma must be > 0 for the exp weighting; got {gamma!r}")
        w = torch.exp(-k / gamma) if sample_from_anchor else torch.exp(-(k - 1).clamp_min(0) / gamma)
    else:  # uniform, and the static part of dpace
        w = torch.ones(block_size, dtype=torch.float64)
    if not sample_from_anchor:
        w[0] = 0.0
    return w.to(dtype=dtype, device=device)


def row_weights_for_blocks(num_blocks: int, block_size: int, **kwargs) -> torch.Tensor:
    """:func:`position_weights` tiled over ``num_blocks`` blocks: ``[num_blocks·block_size]`` rows."""
    return position_weights(block_size, **kwargs).repeat(num_blocks)


def dpace_weights(
    alpha: torch.Tensor, trained: torch.Tensor, *, smoothing: float = 0.5, normalize: bool = True
) -> torch.Tensor:
    """D-PACE weights ``[Nb, B]`` from per-slot acceptance ``alpha[Nb, B]`` and the trained-slot mask.

    w_k = Σ_{m≥k, trained} Π_{j≤m} a_j with a_j = (1−λ)·α_j + λ (1 for untrained slots), 0 on untrained slots,
    normalised to mean 1 over trained slots when ``normalize``. Computed without gradient.
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"dpace smoothing must be in [0, 1]; got {smoothing!r}")
    with torch.no_grad():
        trained = trained.bool()
        a = (1.0 - smoothing) * alpha.detach() + smoothing
        a = torch.where(trained, a, torch.ones_like(a))
        prefix = torch.cumprod(a, dim=-1) * trained
        w = prefix.flip(-1).cumsum(-1).flip(-1) * trained
        if normalize:
            n = trained.sum()
            w = w * (n.clamp_min(1) / w.sum().clamp_min(torch.finfo(w.dtype).tiny))
        return w
