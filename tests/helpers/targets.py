"""Tiny random Qwen3 and Gemma 3 targets built in memory (no files, no downloads), and the bigram oracle of the decoding
tests.

A *bigram target* is a random Qwen3 whose attention and MLP outputs are zeroed, so its next-token distribution depends
on the current token only; a vanilla Markov head holding that table is then an exact drafter for it.
"""

from __future__ import annotations

import torch

from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig


def make_tiny_qwen3(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 4, seed: int = 0, head_dim: int = 8):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,  # vLLM's CPU attention needs >= 32
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config).eval()
    return model


def make_tiny_qwen3_next(seed: int = 0):
    """A random ``Qwen3NextForCausalLM``: Gated DeltaNet (linear-attention) layers with full attention on every
    second layer, MoE MLPs, vocabulary 64."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, full_attention_interval=2,
    )  # fmt: skip
    return Qwen3NextForCausalLM(config).eval()


GEMMA3_MASK_ID = 4  # Gemma 3's ``<mask>`` id


def make_tiny_gemma3(
    vocab_size: int = 96,
    num_layers: int = 6,
    sliding_window: int = 8,
    hidden_size: int = 32,
    seed: int = 0,
    final_logit_softcapping: float | None = None,
):
    """A random ``Gemma3ForCausalLM`` shaped like Gemma 3 270M, scaled down: sliding-window layers with full attention
    on every sixth layer (the last one when ``num_layers`` < 6, so there is always one), two rotary bases (10k local,
    1M global), embeddings scaled by sqrt(hidden), tied LM head, no logit soft-capping (Gemma 3 has none; pass
    ``final_logit_softcapping`` for Gemma 2's c·tanh(logits / c)); the window is tiny so that short prompts cross it."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    layer_types = ["sliding_attention"] * num_layers
    for i in range(min(5, num_layers - 1), num_layers, 6):
        layer_types[i] = "full_attention"
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=sliding_window,
        layer_types=layer_types,
        max_position_embeddings=512,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
        tie_word_embeddings=True,
        final_logit_softcapping=final_logit_softcapping,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        attn_implementation="sdpa",
    )
    return Gemma3ForCausalLM(config).eval()


def bigram_setup(
    vocab: int = 12, block_size: int = 4, noise: float = 0.0, temperature_scale: float = 3.0, seed=0, num_layers=4
):
    """A target whose next-token law depends on the current token only (its layers add nothing to the residual
    stream), so its exact law is a bigram table; and a drafter whose Markov head holds that table plus ``noise``."""
    model = make_tiny_qwen3(vocab_size=vocab, seed=seed, num_layers=num_layers)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.mul_(temperature_scale)
        bigram = torch.stack([model(torch.tensor([[a]])).logits[0, 0] for a in range(vocab)])  # L[a, v]
    target = FrozenTarget(model, target_layer_ids=[1])
    cfg = DrafterConfig(
        block_size=block_size, mask_token_id=vocab - 1, markov_head=MarkovHeadConfig(rank=vocab), confidence_head=True
    )
    drafter = DSparkDrafter.for_target(cfg, target).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        drafter.backbone.norm.weight.zero_()
        drafter.markov_head.markov_w1.weight.copy_(torch.eye(vocab))
        drafter.markov_head.markov_w2.weight.copy_(bigram.T + noise * torch.randn(bigram.T.shape, generator=g))
    return model, target, drafter, bigram


def greedy_reference(model, prompt, max_new_tokens, eos):
    # An explicit all-ones mask: without one, generate infers it from pad_token_id and masks every prompt token 0.
    return model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        min_new_tokens=0,
    )
