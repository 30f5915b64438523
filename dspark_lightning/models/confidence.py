"""The confidence head: a per-slot estimate of the probability that the slot's draft token is accepted.

Design: docs/design/design.md §5 (it returns logits: BCE-with-logits, and temperature scaling needs no inverse
sigmoid)."""

from __future__ import annotations

import torch
from torch import nn


class ConfidenceHead(nn.Module):
    """Linear acceptance-probability predictor; ``forward(features[..., D]) -> logits[...]``.

    docs/design/design.md §5; zero-initialised, so every slot starts at c = 0.5.

    Args:
        input_dim: D, the feature width: H, or H + r with ``confidence_with_markov`` (``[h_k ; W1[a]]``).
    """

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        if input_dim < 1:
            raise ValueError(f"ConfidenceHead input_dim must be >= 1, got {input_dim}")
        self.input_dim = input_dim
        self.proj = nn.Linear(input_dim, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.shape[-1] != self.input_dim:
            raise ValueError(
                f"ConfidenceHead expects features with last dim {self.input_dim}, got {features.shape[-1]}"
            )
        return self.proj(features).squeeze(-1)
