"""The export's fields a serving engine sizes itself by, against the drafter they describe: the two vocabularies,
the draft vocabulary's maps and head rows, the sliding window, and how many tokens a step proposes."""

from __future__ import annotations

import pytest
import torch
from helpers.export import B, V, draft_vocab, make_drafter

from dspark_lightning.interop import build_config, exported_tensors


def found(config: dict, key: str) -> list:
    """Every value of ``key`` anywhere in a JSON document."""
    if isinstance(config, dict):
        return [v for k, item in config.items() for v in ([item] if k == key else []) + found(item, key)]
    if isinstance(config, list):
        return [v for item in config for v in found(item, key)]
    return []


def test_a_draft_vocabulary_is_exported_with_both_sizes_and_its_maps(target, verifier_dir):
    vocab = draft_vocab(40)
    drafter = make_drafter(target, "vanilla", vocab)
    config = build_config(drafter, verifier_name_or_path=str(verifier_dir))
    assert config["draft_vocab_size"] == 40
    assert config["transformer_layer_config"]["vocab_size"] == V  # the verifier's, not the draft's
    tensors = exported_tensors(drafter, "float32")
    # d2t holds offsets: draft index i is target id i + d2t[i]
    assert torch.equal(tensors["d2t"] + torch.arange(40), vocab.d2t)
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].nonzero().flatten().tolist() == sorted(
        vocab.d2t.tolist()
    )
    assert torch.equal(tensors["lm_head.weight"], target.lm_head.weight.detach()[vocab.d2t].float())


@pytest.mark.parametrize("window", [None, 8])
def test_the_sliding_window_is_exported_when_the_drafter_has_one(target, verifier_dir, window):
    overrides = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"]) if window else {}
    drafter = make_drafter(target, "vanilla", **overrides)
    layer = build_config(drafter, verifier_name_or_path=str(verifier_dir))["transformer_layer_config"]
    assert layer.get("sliding_window") == window and layer["use_sliding_window"] == (window is not None)


@pytest.mark.parametrize("sample_from_anchor, proposed", [(True, B), (False, B - 1)])
def test_a_step_proposes_the_trained_slots_only(target, verifier_dir, sample_from_anchor, proposed):
    """DSpark form: B drafted tokens; DFlash form: slot 0 is the bonus token, so B - 1."""
    drafter = make_drafter(target, "vanilla", sample_from_anchor=sample_from_anchor)
    config = build_config(drafter, verifier_name_or_path=str(verifier_dir))
    assert found(config, "speculative_tokens") == [proposed] and config["block_size"] == B
