"""A hybrid linear-attention target (tiny random Qwen3-Next) decodes exactly as its own ``generate``, every mode."""

import pytest
import torch
from helpers.targets import greedy_reference, make_tiny_qwen3_next

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig

MASK_ID = 63


@pytest.mark.parametrize("mode", ["parallel", "markov", "selector"])
def test_qwen3_next_decodes_equal_to_generate(mode):
    model = make_tiny_qwen3_next()
    target = FrozenTarget(model, num_draft_layers=1)
    config = DrafterConfig(
        block_size=4, num_layers=1, max_anchors=4, mask_token_id=MASK_ID,
        markov_head=MarkovHeadConfig(kind="gated", rank=8), confidence_with_markov=True,
    )  # fmt: skip
    torch.manual_seed(1)
    drafter = DSparkDrafter.for_target(config, target).eval()
    for p in drafter.parameters():  # random drafts: most are rejected, so the rollback runs at almost every step
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.3)
    prompt = torch.tensor([[1, 5, 9, 3, 7, 2]])
    expected = greedy_reference(model, prompt, 24, eos=None)
    out, stats = speculative_generate(target, drafter, prompt, 24, mode=mode, k=4, eos_token_id=[])
    assert out.tolist() == expected.tolist()


def test_the_identity_check_text_of_a_hybrid_target_is_its_greedy_generate():
    """``greedy_continuation`` (what fit's validation decode checks against) builds generate's cache layout: a bare
    DynamicCache has no linear-attention layers and Qwen3-Next crashed there (IndexError) at the first validation."""
    from dspark_lightning.measuring.identity import greedy_continuation

    model = make_tiny_qwen3_next()
    prompt = [1, 5, 9, 3, 7, 2]
    expected = greedy_reference(model, torch.tensor([prompt]), 12, eos=None)
    assert greedy_continuation(FrozenTarget(model), prompt, 12) == expected[0].tolist()
