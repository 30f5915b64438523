"""Per-slot weights of the drafter losses: static position weights and D-PACE.

The ``position_weighting`` options (``model.loss.position_weighting``; static part: :func:`position_weights`):
``exp`` w_k = exp(−k/γ) when ``sample_from_anchor`` (all B slots are trained); in the DFlash form slot 0 is the
untrained bonus token: w_0 = 0 and w_k = exp(−(k−1)/γ). ``uniform``: ones (slot 0 zero in the DFlash form).
``dpace``: the same static 0/1 slot mask as ``uniform``; the dynamic part is computed inside the loss
(``compound_loss(..., position_weighting="dpace")``), because it needs the current α.

D-PACE (Wu et al., "D-PACE: Dynamic Position-Aware Cross-Entropy for Parallel Speculative Drafting",
arXiv:2605.18810; reference code github.com/Lucas-TY/D-PACE). The expected accepted length of a block is surrogated by
L = Σ_m Π_{j≤m} a_j with a smoothed per-slot acceptance a_j = (1 − λ)·s_j + λ (λ = ``dpace_smoothing``, 0.5 in the
paper). Since ∂L/∂log a_k = Σ_{m≥k} Π_{j≤m} a_j, slot k's loss is weighted by that suffix sum of prefix products,
detached: w_k = Σ_{m≥k, m trained} Π_{j≤m} a_j, where untrained/invalid slots count as 1 inside the products and 0
in the sums (as in the reference code). The paper's s_j is the draft probability of the data token; with a teacher
distribution available, the matching quantity is the acceptance probability α_j = Σ min(p, q), so we use the detached
α of the current batch. We normalise the weights to mean 1 over trained slots (a constant factor that the masked mean
removes anyway; the reference divides by the batch size instead), so only the relative weighting across slots — which
is what D-PACE defines — matters, and loss magnitudes stay comparable with the static weightings.
"""

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
    """Static per-slot weights ``[block_size]`` (see the module docstring for the two anchor conventions)."""
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
