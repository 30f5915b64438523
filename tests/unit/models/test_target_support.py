"""Targets the loop cannot serve are refused in one line before any forward; recurrent targets keep packed documents
apart (each document run alone, checked against running it by hand)."""

from __future__ import annotations

import pytest
import torch
from helpers.drafters import packed_batch
from helpers.targets import make_tiny_qwen3, make_tiny_qwen3_next

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.errors import UnsupportedError
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget
from dspark_lightning.models.architectures import unsupported_reason


def _tiny_mamba():
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    config = MambaConfig(vocab_size=64, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4)
    return MambaForCausalLM(config).eval()


def _refused_before_any_forward(model, match: str) -> None:
    """``speculative_generate`` raises a one-line UnsupportedError matching ``match`` and never runs the target (the
    drafter is one for a tiny Qwen3 of the same widths: a Mamba config has no attention heads to build one from)."""
    shaped = FrozenTarget(make_tiny_qwen3(), target_layer_ids=[0])
    drafter = DSparkDrafter.for_target(DrafterConfig(block_size=4, mask_token_id=63), shaped).eval()
    ran = []
    model.register_forward_pre_hook(lambda *_: ran.append(1))
    with pytest.raises(UnsupportedError, match=match) as refusal:
        speculative_generate(model, drafter, torch.tensor([[1, 2, 3]]), 8, mode="parallel")
    assert "\n" not in str(refusal.value) and not ran


def test_a_mamba_target_is_refused_before_decoding():
    _refused_before_any_forward(
        _tiny_mamba(),
        r"^target model type 'mamba' \(MambaForCausalLM\) is not supported: its forward takes no position_ids",
    )


def test_a_cache_layer_type_the_loop_does_not_know_is_refused(monkeypatch):
    from transformers import cache_utils

    class FancyLayer(cache_utils.DynamicLayer):  # a layer type a future transformers might add
        pass

    monkeypatch.setitem(cache_utils.DYNAMIC_LAYER_TYPE_MAPPING, "fancy_attention", FancyLayer)
    model = make_tiny_qwen3()
    model.config.layer_types = ["fancy_attention"] * model.config.num_hidden_layers
    _refused_before_any_forward(model, r"'qwen3' \(Qwen3ForCausalLM\) .*its cache has FancyLayer layers, which the")


@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        ("rwkv", "it keeps its own cache class, not transformers' DynamicCache"),
        ("jamba", "the rollback of its recurrent layers is untested here"),
        ("recurrent_gemma", "its recurrent layers keep no per-token states"),
        ("deepseek_v32", "its cache has DynamicIndexedLayer layers"),
        ("qwen3_next", None),
        ("qwen3_5_moe", None),  # a Qwen3.5 MoE checkpoint with its vision config: its decoder is the tested one
        ("gemma2", None),
    ],
)
def test_the_reason_of_each_refusal_comes_from_class_and_config_alone(model_type, reason):
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    found = unsupported_reason(model_class, AutoConfig.for_model(model_type))
    assert found == reason if reason is None else found.startswith(reason)


def test_packed_documents_stay_apart_in_linear_attention_layers():
    model = make_tiny_qwen3_next()
    target = FrozenTarget(model, target_layer_ids=[0, 2])
    ids, _, documents, positions = packed_batch(lengths=(13, 7, 9), pad=3)
    packed = target.features(ids, positions)
    body = model.model
    for row in range(ids.shape[0]):
        for doc in range(3):
            span = (documents[row] == doc).nonzero().flatten()
            alone = body(input_ids=ids[row, span][None], output_hidden_states=True)  # positions 0.. by default
            expected = torch.cat([alone.hidden_states[1], alone.hidden_states[3]], dim=-1)[0]
            torch.testing.assert_close(packed.context_features[row, span], expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(packed.final_hidden[row, span], alone.last_hidden_state[0], rtol=1e-5, atol=1e-5)
    # why: a packed forward lets the first document's recurrent state run on into the second one
    leaked = body(input_ids=ids, position_ids=positions, output_hidden_states=True).last_hidden_state
    second = (documents[0] == 1).nonzero().flatten()
    assert (leaked[0, second] - packed.final_hidden[0, second]).abs().max() > 1e-2


def test_attention_only_targets_keep_the_single_packed_forward():
    assert not FrozenTarget(make_tiny_qwen3()).per_document
    assert FrozenTarget(make_tiny_qwen3_next()).per_document
