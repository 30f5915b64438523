"""``export --format dflash``: the fields vLLM's DFlash reader (``update_dflash`` and ``build_vllm_speculative_config``
of ``transformers_utils/configs/speculators``, 0.32, restated below as the engine applies them) reads from the
file, the tensors its ``DFlashQwen3ForCausalLM.load_weights`` takes, the drafters refused, and ``auto``."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.export import B, draft_vocab, make_drafter, outputs
from safetensors.torch import load_file

from dspark_lightning.errors import UnsupportedError
from dspark_lightning.interop import export_drafter, load_exported
from dspark_lightning.interop.dflash_format import resolve_format

DFLASH = dict(markov_head=None, confidence_head=False, confidence_with_markov=False, sample_from_anchor=False)


def vllm_dflash_reading(config: dict) -> tuple[dict, dict]:
    """(hf config, speculative config) vLLM 0.32 builds from a speculators DFlash config.json."""
    assert config["speculators_model_type"] in ("dflash", "dflash2", "dspark")  # SUPPORTED_SPECULATORS_TYPES
    spec = config["speculators_config"]
    assert spec["verifier"]["name_or_path"] and "transformer_layer_config" in config  # validate_speculators_config
    hf = dict(config["transformer_layer_config"])
    hf["architectures"] = ["DFlashDraftModel"]
    hf["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        hf["target_hidden_size"] = config["target_hidden_size"]
    aux = config["aux_hidden_state_layer_ids"]
    hf["eagle_aux_hidden_state_layer_ids"] = aux
    hf["dflash_config"] = {
        "mask_token_id": config["mask_token_id"],
        "target_layer_ids": [i - 1 for i in aux],
        "sample_from_anchor": config.get("sample_from_anchor", False),
        "causal": not config.get("sliding_window_non_causal", True),
    }
    method = {"method": config["speculators_model_type"]}
    return hf, method | {"num_speculative_tokens": spec["proposal_methods"][0]["speculative_tokens"]}


@pytest.mark.parametrize("with_vocab", [False, True], ids=["full_vocab", "draft_vocab"])
def test_a_dflash_export_reads_in_vllm_as_our_drafter(tmp_path, target, verifier_dir, with_vocab):
    drafter = make_drafter(target, "none", draft_vocab() if with_vocab else None, **DFLASH)
    out = export_drafter(drafter, tmp_path, verifier_name_or_path=str(verifier_dir), dtype="float32", format="dflash")
    config = json.loads((out / "config.json").read_text())
    hf, method = vllm_dflash_reading(config)
    assert method == {"method": "dflash", "num_speculative_tokens": B - 1}
    assert config["architectures"] == hf["architectures"] == ["DFlashDraftModel"]  # nothing vLLM rewrites
    assert config["speculators_config"]["algorithm"] == "dflash"
    assert hf["dflash_config"] == {
        "mask_token_id": drafter.config.mask_token_id,
        "target_layer_ids": drafter.config.target_layer_ids,
        "sample_from_anchor": False,
        "causal": False,
    }
    assert hf["is_causal"] is False  # _dflash_layer_causal reads it first, for every layer
    assert hf["draft_vocab_size"] == drafter.draft_vocab_size and hf["target_hidden_size"] == target.hidden_size
    assert not [key for key in config if key.startswith(("markov", "confidence", "enable_confidence"))]
    tensors = load_file(str(out / "model.safetensors"))
    assert not [key for key in tensors if key.startswith(("markov_head.", "confidence_head."))]
    # DFlashQwen3ForCausalLM.load_weights: d2t as offsets, t2d skipped, lm_head only for a draft vocabulary
    assert ("d2t" in tensors) == ("lm_head.weight" in tensors) == with_vocab
    if with_vocab:
        assert torch.equal(tensors["d2t"] + torch.arange(drafter.draft_vocab_size), drafter.draft_vocab.d2t)
    loaded = load_exported(out, target)
    assert loaded.markov_head is None and loaded.confidence_head is None and not loaded.config.sample_from_anchor
    ours, theirs = outputs(drafter, target), outputs(loaded, target)
    assert ours["confidence"] is None and theirs["confidence"] is None
    assert torch.equal(ours["logits"], theirs["logits"]) and torch.equal(ours["base"], theirs["base"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(DFLASH, markov_head=None, sample_from_anchor=True), "sample_from_anchor: true"),
        ({"sample_from_anchor": False}, "vanilla Markov head"),
    ],
)
def test_what_dflash_cannot_hold_is_refused_before_anything_is_written(tmp_path, target, fields, message):
    head = "none" if "markov_head" in fields else "vanilla"
    drafter = make_drafter(target, head, **fields)
    with pytest.raises(UnsupportedError, match=f"--format dflash: .*{message}"):
        export_drafter(drafter, tmp_path / "out", verifier_name_or_path="org/x", format="dflash")
    assert not (tmp_path / "out").exists()


def test_auto_is_dflash_only_when_nothing_is_dropped(target):
    assert resolve_format(make_drafter(target, "none", **DFLASH), "auto") == "dflash"
    with_confidence = make_drafter(target, "none", **(DFLASH | {"confidence_head": True}))
    assert resolve_format(with_confidence, "auto") == "dspark"
    assert resolve_format(with_confidence, "dflash") == "dflash"  # asked for: the confidence head only schedules
    assert resolve_format(make_drafter(target, "vanilla"), "auto") == "dspark"
    assert resolve_format(make_drafter(target, "none", **(DFLASH | {"sample_from_anchor": True})), "auto") == "dspark"
