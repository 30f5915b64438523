"""The confidence head: a per-slot estimate of the probability that the slot's draft token is accepted.

c_k = sigmoid(w . f_k + b) with f_k = h_k (the draft hidden state) or, with ``confidence_with_markov``,
f_k = [h_k ; W1[a]] (the Markov head's embedding of the previous token). It is trained against the detached
analytic acceptance probability alpha_k = sum_v min(q_k(v), p_k(v)) (docs/design/design.md §5, §7.1) and read at
decode time as c_k ~ P(slot k accepted | all earlier slots accepted); the prefix survival a_n = prod_{j<=n} c_j
schedules how many slots are worth verifying.

The module returns *logits* so that the loss can use the numerically stable BCE-with-logits and so that
temperature scaling (dividing the logit by a fitted per-slot temperature) needs no inverse sigmoid.
"""

from __future__ import annotations

import torch
from torch import nn


class ConfidenceHead(nn.Module):
    """Linear acceptance-probability predictor; ``forward(features[..., D]) -> logits[...]``."""

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
