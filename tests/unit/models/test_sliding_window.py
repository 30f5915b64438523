"""Sliding-window draft layers: the mask rule, SDPA = flex, inference = the window's tokens only, the context cache,
and the speculators export."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.drafters import build, decode_cached_and_uncached, packed_batch, random_gated_drafter, run
from helpers.export import make_drafter, outputs

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.interop import export_drafter, load_exported
from dspark_lightning.models import BackboneConfig, MarkovHeadConfig
from dspark_lightning.models.attention import BlockVisibility


def test_config_validation_names_the_option():
    assert BackboneConfig(hidden_size=8, num_layers=2).layer_types == ["full_attention"] * 2
    assert BackboneConfig(hidden_size=8, num_layers=2, sliding_window=4).layer_types == ["sliding_attention"] * 2
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        BackboneConfig(hidden_size=8, sliding_window=0)
    with pytest.raises(ValueError, match="layer_types has 1 entries"):
        BackboneConfig(hidden_size=8, num_layers=2, sliding_window=4, layer_types=["sliding_attention"])
    with pytest.raises(ValueError, match="unknown"):
        BackboneConfig(hidden_size=8, num_layers=1, sliding_window=4, layer_types=["local"])
    with pytest.raises(ValueError, match="sliding_window is not set"):
        BackboneConfig(hidden_size=8, num_layers=1, layer_types=["sliding_attention"])


def test_window_mask_matches_the_rule():
    documents = torch.tensor([[0] * 12 + [1] * 8])
    anchors, valid = torch.tensor([[3, 9, 15]]), torch.ones(1, 3, dtype=torch.bool)
    anchor_documents = documents.gather(1, anchors).masked_fill(~valid, -2)
    window, B = 4, 2
    mask = BlockVisibility(anchors, anchor_documents, documents, B, window=window).dense()[0, 0]
    for q in range(3 * B):
        p = int(anchors[0, q // B])
        for i in range(20):
            expected = documents[0, i] == documents[0, p] and p - window <= i < p
            assert bool(mask[q, i]) == bool(expected), (q, i)
        assert mask[q, 20:].tolist() == [q // B == j // B for j in range(3 * B)]  # own block, bidirectional


def test_flex_and_sdpa_agree_with_sliding_and_full_layers():
    kwargs = dict(
        markov=MarkovHeadConfig(rank=8, kind="gated"),
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
    )
    ids, loss_mask, doc, pos = packed_batch(seed=3, pad=4)
    target, sdpa = build(backend="sdpa", **kwargs)
    _, flex = build(backend="flex", **kwargs)
    flex.load_state_dict(sdpa.state_dict())
    _, full = build(backend="sdpa", markov=kwargs["markov"])
    full.load_state_dict(sdpa.state_dict())
    with torch.no_grad():  # FlexAttention has no backward on CPU; the forward is what must agree
        a = run(target, sdpa, ids, loss_mask, doc, pos)
        b = run(target, flex, ids, loss_mask, doc, pos, anchors=a.anchors)
        c = run(target, full, ids, loss_mask, doc, pos, anchors=a.anchors)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a.confidence_logits, b.confidence_logits, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(a.logits, c.logits, atol=1e-4)  # the window changes what far-anchored blocks see
    trained = run(target, sdpa, ids, loss_mask, doc, pos, anchors=a.anchors)  # SDPA trains on CPU: a backward
    trained.logits.float().pow(2).mean().backward()
    assert all(layer.self_attn.k_proj.weight.grad.abs().sum() > 0 for layer in sdpa.backbone.layers)


def test_inference_sees_only_the_window():
    _, target, drafter = random_gated_drafter(num_layers=2)
    window = 6
    sliding = type(drafter)(
        type(drafter.config)(**{**drafter.config.__dict__, "sliding_window": window}),
        BackboneConfig(**{**drafter.backbone.config.__dict__, "sliding_window": window, "layer_types": None}),
        drafter.embed_tokens,
        drafter.lm_head,
    ).eval()
    sliding.load_state_dict(drafter.state_dict())
    features = torch.randn(1, 30, drafter.backbone.fc.in_features, generator=torch.Generator().manual_seed(0))
    anchor, at = torch.tensor([4]), torch.tensor([30])
    windowed = sliding.draft(features, torch.arange(30)[None], anchor, at)
    reference = drafter.draft(features[:, -window:], torch.arange(24, 30)[None], anchor, at)
    for got, want in zip(windowed, reference):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    cache = sliding.new_context_cache()
    cache.extend(features)
    for got, want in zip(sliding.draft_cached(cache, anchor, at), reference):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["markov", "selector"])
def test_cached_decoding_equals_uncached_with_mixed_layers(mode):
    model, target, full = random_gated_drafter(num_layers=2)
    config = type(full.config)(
        **{**full.config.__dict__, "sliding_window": 7, "layer_types": ["sliding_attention", "full_attention"]}
    )
    drafter = type(full).for_target(config, target).eval()
    drafter.load_state_dict(full.state_dict())
    prompt = torch.tensor([[5, 9, 2, 33, 4, 7, 7, 1, 30, 12]])
    for temperature in (0.0, 1.0):
        runs = decode_cached_and_uncached(target, drafter, prompt, mode, temperature)
        assert torch.equal(*runs)
    greedy = model.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=[], pad_token_id=0)
    assert torch.equal(speculative_generate(target, drafter, prompt, 30, mode=mode, eos_token_id=[])[0], greedy)


def test_export_round_trip_keeps_the_window(tmp_path):
    from helpers.export import save_verifier

    from dspark_lightning.models import FrozenTarget

    verifier = save_verifier(tmp_path / "verifier")
    target = FrozenTarget.from_pretrained(str(verifier), num_draft_layers=2)
    drafter = make_drafter(target, "gated", sliding_window=3, layer_types=["full_attention", "sliding_attention"])
    export_drafter(drafter, tmp_path / "out", verifier_name_or_path=str(verifier), dtype="float32")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    layer = config["transformer_layer_config"]
    assert layer["layer_types"] == ["full_attention", "sliding_attention"] and layer["sliding_window"] == 3
    assert layer["use_sliding_window"] and config["sliding_window_non_causal"]  # our blocks are bidirectional
    loaded = load_exported(tmp_path / "out", target)
    assert loaded.backbone.config.layer_types == ["full_attention", "sliding_attention"]
    for key, value in outputs(drafter, target).items():
        assert torch.equal(value, outputs(loaded, target)[key]), key
    (tmp_path / "out" / "config.json").write_text(json.dumps(config | {"sliding_window_non_causal": False}))
    with pytest.raises(NotImplementedError, match="causal blocks"):
        load_exported(tmp_path / "out", target)
