"""decoding/ties.py: a greedy difference from generate is a tie only when the target's top two logits are within the
dtype's resolution at the first differing token, and the two tokens are those two."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dspark_lightning.decoding.ties import TIE_ULPS, classify_difference, first_difference, ulp


class FixedLogits(torch.nn.Module):
    """A causal LM whose next-token logits are always ``logits`` (in ``logits``' dtype)."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.logits.expand(1, input_ids.shape[1], -1))


def test_ulp_is_the_dtype_spacing():
    assert ulp(1.0, torch.bfloat16) == 2**-7 and ulp(10.0, torch.bfloat16) == 2**-4
    assert ulp(1.0, torch.float32) == 2**-23


def test_first_difference():
    a = torch.tensor([[1, 2, 3, 4]])
    assert first_difference(a, torch.tensor([[1, 2, 5, 4]])) == 2
    assert first_difference(a, a) is None and first_difference(a, a[:, :3]) == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_top_two_within_the_resolution_is_a_tie_else_an_error(dtype):
    reference, output = torch.tensor([[7, 7, 1, 2]]), torch.tensor([[7, 7, 1, 3]])  # prompt of 2; differs at 3
    close = torch.tensor([0.0, 0.0, 10.0, 10.0 - ulp(10.0, dtype)]).to(dtype)
    tie = classify_difference(FixedLogits(close), reference, output, prompt_length=2)
    assert tie["kind"] == "tie" and tie["position"] == 1 and 0 < tie["ulps"] <= TIE_ULPS
    apart = torch.tensor([0.0, 0.0, 10.0, 9.0]).to(dtype)  # a whole logit apart: a bug, not rounding
    assert classify_difference(FixedLogits(apart), reference, output, 2)["kind"] == "error"
    third = torch.tensor([0.0, 10.0, 10.0, 10.0 - ulp(10.0, dtype)]).to(dtype)  # speculation chose no top-2 token
    assert classify_difference(FixedLogits(third), reference, torch.tensor([[7, 7, 1, 0]]), 2)["kind"] == "error"


def test_an_output_that_stops_early_is_an_error():
    model = FixedLogits(torch.zeros(4))
    assert classify_difference(model, torch.tensor([[7, 1, 2]]), torch.tensor([[7, 1]]), 1)["kind"] == "error"
