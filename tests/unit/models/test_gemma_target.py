"""Gemma 3 as a training target (docs/design/design.md §11), on a tiny random Gemma 3 (``helpers/targets.py``): the drafter
embeds its block tokens as the target embeds its input (scaled by sqrt(hidden)) with the full target and with its
heads only (cache mode), its draft layers take the full-attention rotary base, and its teacher is the target's own
next-token law, soft-capped where the target caps its logits (Gemma 2's form, on the same model)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers.targets import GEMMA3_MASK_ID, make_tiny_gemma3

from dspark_lightning.models import DrafterConfig, DraftVocab, DSparkDrafter, FrozenTarget
from dspark_lightning.models.target import TargetHeads, rope_theta
from dspark_lightning.models.teacher import TeacherStats

BLOCK = 4


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """The model and its saved directory (what cache mode loads its embedding and LM head from)."""
    model = make_tiny_gemma3()
    path = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(path)
    return model, path


def drafter_for(target, vocab: DraftVocab | None = None) -> DSparkDrafter:
    cfg = DrafterConfig(block_size=BLOCK, mask_token_id=GEMMA3_MASK_ID, markov_head=None, confidence_head=False)
    return DSparkDrafter.for_target(cfg, target, vocab)


def target_of(mode: str, model, path):
    return FrozenTarget(model, [1, 4]) if mode == "online" else TargetHeads.from_pretrained(str(path), [1, 4])


@pytest.mark.parametrize("mode", ["online", "cache"])
def test_block_embeddings_are_the_targets_scaled_input_embeddings(gemma, mode):
    model, path = gemma
    drafter = drafter_for(target_of(mode, model, path))
    anchors = torch.tensor([[7, 50], [90, 5]])
    ids = torch.full((2, 2, BLOCK), GEMMA3_MASK_ID)
    ids[..., 0] = anchors
    block = drafter._block_embeddings(anchors)
    # independently: the stored weight times sqrt(hidden), and what the target's first decoder layer receives
    weight = model.model.embed_tokens.weight.detach()
    torch.testing.assert_close(block, weight[ids] * math.sqrt(model.config.hidden_size))
    with torch.no_grad():
        received = model(input_ids=ids.flatten(0, 1), use_cache=False, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(block.flatten(0, 1), received)
    assert torch.equal(block, model.get_input_embeddings()(ids))


def test_cache_mode_loads_the_models_own_embedding_module(gemma):
    model, path = gemma
    heads = TargetHeads.from_pretrained(str(path), [1, 4])
    embedding = heads.embed_tokens
    assert type(embedding) is type(model.get_input_embeddings())  # Gemma3TextScaledWordEmbedding
    assert embedding.embed_scale.item() == pytest.approx(math.sqrt(model.config.hidden_size))
    assert torch.equal(embedding.weight, model.get_input_embeddings().weight)
    assert heads.lm_head.weight is embedding.weight and not embedding.weight.requires_grad  # tied, frozen
    assert [name for name, _ in heads.named_parameters()] == ["embed_tokens.weight"]  # nothing else was loaded


@pytest.mark.parametrize("mode", ["online", "cache"])
def test_draft_layers_take_the_full_attention_rotary_base(gemma, mode):
    model, path = gemma
    bases = {kind: p["rope_theta"] for kind, p in model.config.rope_parameters.items()}
    assert bases == {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}
    drafter = drafter_for(target_of(mode, model, path))
    assert drafter.backbone.config.rope_theta == 1_000_000.0
    assert [layer.self_attn.rope_theta for layer in drafter.backbone.layers] == [1_000_000.0]


def test_rope_theta_reads_every_config_form():
    assert rope_theta(SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 5e5})) == 5e5  # Qwen3
    assert rope_theta(SimpleNamespace(rope_theta=1e6, rope_local_base_freq=1e4)) == 1e6  # Gemma 3, transformers 4
    assert rope_theta(SimpleNamespace(rope_parameters={"sliding_attention": {"rope_theta": 2e4}})) == 2e4
    assert rope_theta(SimpleNamespace()) == 10_000.0  # transformers' own default
    ambiguous = {"sliding_attention": {"rope_theta": 1e4}, "chunked_attention": {"rope_theta": 5e5}}
    with pytest.raises(ValueError, match="full_attention"):
        rope_theta(SimpleNamespace(rope_parameters=ambiguous))


@pytest.mark.parametrize("draft_vocab", [False, True], ids=["Vd=V", "Vd<V"])
@pytest.mark.parametrize("softcap", [None, 0.3], ids=["gemma3", "softcapped"])
def test_teacher_is_the_targets_own_next_token_law(softcap, draft_vocab):
    """Float64: the teacher (full-vocabulary pass, and draft rows with the logits' logsumexp and argmax as a cache
    stores them) against log_softmax of the logits the target's own forward returns, which include its soft-cap; the
    LM head on the final hidden state gives those logits."""
    model = make_tiny_gemma3(final_logit_softcapping=softcap).double()
    V = model.config.vocab_size
    vocab = DraftVocab(torch.arange(1, V, 3), V) if draft_vocab else None
    drafter = drafter_for(FrozenTarget(model, [1, 4]), vocab)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (2, 20), generator=g)
    position_ids = torch.arange(20).expand(2, -1)
    features = FrozenTarget(model, [1, 4]).features(ids, position_ids)
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        head = drafter.lm_head(features.final_hidden)
        torch.testing.assert_close(head if softcap is None else softcap * torch.tanh(head / softcap), logits)
    law = torch.log_softmax(logits, -1)
    positions = torch.randint(0, 20, (2, 3, BLOCK), generator=g)
    expected = law.gather(1, positions.flatten(1)[..., None].expand(-1, -1, V)).view(*positions.shape, V)
    stats = TeacherStats(torch.logsumexp(logits, -1), logits.argmax(-1))  # what a cache stores, from the logits
    for path in (None, stats):
        logprobs, argmax = drafter.teacher(features.final_hidden, positions, path)
        torch.testing.assert_close(logprobs, expected if vocab is None else expected[..., vocab.d2t])
        assert torch.equal(argmax, expected.argmax(-1))
    if softcap is not None:  # the cap changes the law here: an uncapped teacher would be wrong
        uncapped = torch.log_softmax(drafter.lm_head(features.final_hidden), -1)
        assert (uncapped - law).abs().max() > 0.1
