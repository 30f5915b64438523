"""A hybrid linear-attention target (tiny random Qwen3-Next) decodes exactly as its own ``generate``, every mode."""

import pytest
import torch
from helpers.targets import greedy_reference

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig

MASK_ID = 63


def _hybrid_target():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    config = Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, full_attention_interval=2,
    )  # fmt: skip
    return Qwen3NextForCausalLM(config).eval()


@pytest.mark.parametrize("mode", ["parallel", "markov", "selector"])
def test_qwen3_next_decodes_equal_to_generate(mode):
    model = _hybrid_target()
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
