"""measuring/ties.py: a greedy difference from generate is a tie only when both tokens' logits are within the dtype's
resolution of the target's top logit at the first differing token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dspark_lightning.measuring.ties import TIE_ULPS, classify_difference, first_difference, ulp


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
    expected_far = torch.tensor([0.0, 10.0, 9.0, 10.0]).to(dtype)  # generate's own token a whole logit below the top
    assert classify_difference(FixedLogits(expected_far), reference, torch.tensor([[7, 7, 1, 1]]), 2)["kind"] == "error"


def test_three_logits_rounded_to_one_bf16_value_tie_whichever_two_tokens_were_chosen():
    """bf16 rounds 10.01, 10.02 and 10.03 to the same value: topk(2) names two of the three arbitrarily, and a
    speculative token that is the third is still a tie (seen on SmolLM2 in bf16, gap 0.0, classified an error)."""
    logits = torch.tensor([10.01, 0.0, 10.02, 10.03]).to(torch.bfloat16)
    assert logits[0] == logits[2] == logits[3]
    reference = torch.tensor([[7, 7, 1, 0]])
    for token in (2, 3):
        tie = classify_difference(FixedLogits(logits), reference, torch.tensor([[7, 7, 1, token]]), 2)
        assert tie["kind"] == "tie" and tie["gap"] == 0.0
    assert classify_difference(FixedLogits(logits), reference, torch.tensor([[7, 7, 1, 1]]), 2)["kind"] == "error"


def test_an_output_that_stops_early_is_an_error():
    model = FixedLogits(torch.zeros(4))
    assert classify_difference(model, torch.tensor([[7, 1, 2]]), torch.tensor([[7, 1]]), 1)["kind"] == "error"
