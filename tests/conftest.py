"""Shared fixtures: a tiny random Qwen3 target built in memory (no files, no downloads)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
# The test models are tiny: one thread avoids oversubscription stalls when several processes share 2 cores.
torch.set_num_threads(1)


def make_tiny_qwen3(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 4, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config).eval()
    return model


@pytest.fixture
def tiny_qwen3():
    return make_tiny_qwen3()
