"""Every export reads in vLLM as written: its registry's architecture name, bidirectional layers, no nulls, no path
of the exporting machine (vLLM's rules, from ``transformers_utils/configs/speculators/algos.py`` and
``models/qwen3_dflash.py`` 0.32, restated here as the engine applies them)."""

from __future__ import annotations

import pytest
from helpers.export import HEADS, make_drafter

from dspark_lightning.interop import build_config

VLLM_DSPARK_ARCHITECTURES = {"Qwen3DSparkModel", "Qwen3OmniDSparkModel"}  # update_dspark keeps these, rewrites others


def leaves(value, path=""):
    """(path, value) of every non-container value of a JSON document."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def vllm_layer_causal(config: dict, kind: str, layer: int) -> bool:
    """vLLM's ``_dflash_layer_causal`` on the config ``kind`` (dspark | dflash) builds from ``config``."""
    hf = config["transformer_layer_config"]
    if hf.get("is_causal") is not None:
        return bool(hf["is_causal"])
    if kind == "dflash":  # update_dflash: causal = not sliding_window_non_causal (default True)
        return not config.get("sliding_window_non_causal", True)
    return (hf.get("layer_types") or ["full_attention"] * 99)[layer] == "sliding_attention"


@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("sliding", [False, True])
def test_every_field_reads_in_vllm_as_written(target, verifier_dir, tmp_path, head, sliding):
    overrides = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"]) if sliding else {}
    drafter = make_drafter(target, head, **overrides)
    config = build_config(drafter, verifier_name_or_path=str(verifier_dir), candidate_selector=head == "selector")
    assert config["architectures"][0] in VLLM_DSPARK_ARCHITECTURES
    nulls = [path for path, value in leaves(config) if value is None]
    assert nulls == []
    local = [path for path, value in leaves(config) if isinstance(value, str) and str(tmp_path.parent) in value]
    assert local == [] and str(verifier_dir) not in str(config)
    layers = config["transformer_layer_config"]["num_hidden_layers"]
    for kind in ("dspark", "dflash"):
        assert [vllm_layer_causal(config, kind, i) for i in range(layers)] == [False] * layers, kind
    # update_dspark: target layers = aux - 1 = ours; fc input = target_hidden_size x layers
    assert [i - 1 for i in config["aux_hidden_state_layer_ids"]] == drafter.config.target_layer_ids
    assert config["target_hidden_size"] == config["transformer_layer_config"]["hidden_size"] == target.hidden_size


def test_a_hub_verifier_is_recorded_as_its_id_only(target):
    config = build_config(make_drafter(target, "vanilla"), verifier_name_or_path="Qwen/Qwen3-0.6B")
    assert config["speculators_config"]["verifier"] == {"name_or_path": "Qwen/Qwen3-0.6B", "architectures": []}
