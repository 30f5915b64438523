"""The DFlash backbone, anchors, target wrapper and drafter against independent references."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.drafters import MASK_ID, build, packed_batch, run
from helpers.targets import make_tiny_qwen3

from dspark_lightning.models import (
    DrafterConfig,
    DraftVocab,
    DSparkDrafter,
    FrozenTarget,
    MarkovHeadConfig,
    default_target_layer_ids,
)
from dspark_lightning.models.anchors import Anchors, sample_anchors, valid_anchor_mask


# ---------------------------------------------------------------- independent float64 reference
def reference_block_hidden(drafter, context_features, positions, documents, anchor_pos, anchor_token):
    """One block, written out with explicit loops over heads and keys in float64."""
    bb = drafter.backbone
    cfg = bb.config
    B, H = drafter.block_size, cfg.hidden_size
    dd = lambda t: t.detach().double()  # noqa: E731

    def rms(x, w, eps=cfg.rms_norm_eps):
        return dd(w) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def rope(x, position):
        d = x.shape[-1]
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = position * inv
        x1, x2 = x[: d // 2], x[d // 2 :]
        return torch.cat((x1 * torch.cos(ang) - x2 * torch.sin(ang), x2 * torch.cos(ang) + x1 * torch.sin(ang)))

    ctx = rms(context_features.double() @ dd(bb.fc.weight).T, bb.hidden_norm.weight)
    visible = [i for i in range(len(documents)) if documents[i] == documents[anchor_pos] and i < anchor_pos]
    tokens = [anchor_token] + [MASK_ID] * (B - 1)
    x = dd(drafter.embed_tokens.weight)[tokens]
    block_rot = [int(positions[anchor_pos]) + k for k in range(B)]
    keys_rot = [int(positions[i]) for i in visible] + block_rot
    for layer in bb.layers:
        att = layer.self_attn
        xin = rms(x, layer.input_layernorm.weight)
        kv_in = torch.cat((ctx[visible], xin))
        group = cfg.num_heads // cfg.num_kv_heads
        out = torch.zeros(B, cfg.num_heads * cfg.head_dim, dtype=torch.float64)
        for h in range(cfg.num_heads):
            hk = h // group
            sl = slice(h * cfg.head_dim, (h + 1) * cfg.head_dim)
            skv = slice(hk * cfg.head_dim, (hk + 1) * cfg.head_dim)
            for q in range(B):
                qv = rope(rms((xin[q] @ dd(att.q_proj.weight).T)[sl], att.q_norm.weight), block_rot[q])
                scores, values = [], []
                for j in range(kv_in.shape[0]):
                    kvec = rope(rms((kv_in[j] @ dd(att.k_proj.weight).T)[skv], att.k_norm.weight), keys_rot[j])
                    scores.append(float(qv @ kvec) / math.sqrt(cfg.head_dim))
                    values.append((kv_in[j] @ dd(att.v_proj.weight).T)[skv])
                w = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
                out[q, sl] = sum(wi * vi for wi, vi in zip(w, values))
        x = x + out @ dd(att.o_proj.weight).T
        mlp_in = rms(x, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        gate = mlp_in @ dd(mlp.gate_proj.weight).T
        x = x + (gate * torch.sigmoid(gate) * (mlp_in @ dd(mlp.up_proj.weight).T)) @ dd(mlp.down_proj.weight).T
    return rms(x, bb.norm.weight)[:, :H]


def test_backbone_matches_loop_reference_and_rank0_is_pure_dflash():
    target, drafter = build(markov=None)
    ids, loss_mask, doc, pos = packed_batch(pad=3)
    out = run(target, drafter, ids, loss_mask, doc, pos)
    assert torch.equal(out.logits, out.base_logits)  # no Markov head: logits are the pure DFlash logits
    features = target.features(ids, pos).context_features
    for row in range(ids.shape[0]):
        for a in range(out.anchors.positions.shape[1]):
            if not out.anchors.valid[row, a]:
                continue
            p = int(out.anchors.positions[row, a])
            ref = reference_block_hidden(drafter, features[row], pos[row], doc[row], p, int(ids[row, p]))
            torch.testing.assert_close(out.hidden[row, a].double(), ref, rtol=1e-4, atol=1e-4)
            ref_logits = ref @ drafter.lm_head.weight.double().T
            torch.testing.assert_close(out.logits[row, a].double(), ref_logits, rtol=1e-4, atol=1e-4)


def test_rank_zero_config_means_no_head():
    cfg = DrafterConfig(mask_token_id=1, markov_head=MarkovHeadConfig(rank=0), confidence_with_markov=False)
    assert cfg.markov_head is None


def test_flex_and_sdpa_give_the_same_forward_on_cpu():
    ids, loss_mask, doc, pos = packed_batch(seed=3, pad=4)
    target, sdpa = build(markov=MarkovHeadConfig(rank=8, kind="gated"), backend="sdpa")
    _, flex = build(markov=MarkovHeadConfig(rank=8, kind="gated"), backend="flex")
    flex.load_state_dict(sdpa.state_dict())
    with torch.no_grad():  # FlexAttention has no backward on CPU; the forward is what must agree
        a = run(target, sdpa, ids, loss_mask, doc, pos)
        b = run(target, flex, ids, loss_mask, doc, pos, anchors=a.anchors)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a.confidence_logits, b.confidence_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sample_from_anchor", [True, False])
def test_no_leakage_from_future_or_other_documents(sample_from_anchor):
    target, drafter = build(markov=None, sample_from_anchor=sample_from_anchor)
    ids, loss_mask, doc, pos = packed_batch(seed=5, lengths=(20, 24), batch=1)
    features = target.features(ids, pos)
    anchors = Anchors(positions=torch.tensor([[10, 30]]), valid=torch.tensor([[True, True]]))
    base = run(target, drafter, ids, loss_mask, doc, pos, anchors=anchors, features=features).base_logits
    ctx = features.context_features

    def logits_with(new_ctx):
        f = type(features)(new_ctx, features.final_hidden)
        return run(target, drafter, ids, loss_mask, doc, pos, anchors=anchors, features=f).base_logits

    # block 0 is anchored at 10 in document 0: positions >= 10 and all of document 1 are invisible to it
    changed = ctx.clone()
    changed[:, 10:] += torch.randn_like(changed[:, 10:])
    torch.testing.assert_close(logits_with(changed)[:, 0], base[:, 0], rtol=0, atol=0)
    assert not torch.allclose(logits_with(changed)[:, 1], base[:, 1])
    # block 1 is anchored at 30 in document 1 (starts at 20): document 0 is invisible, 20..29 visible
    changed = ctx.clone()
    changed[:, :20] += torch.randn_like(changed[:, :20])
    torch.testing.assert_close(logits_with(changed)[:, 1], base[:, 1], rtol=0, atol=0)
    for visible in (0, 9):  # a context position before p_0 changes block 0
        changed = ctx.clone()
        changed[:, visible] += 1.0
        assert not torch.allclose(logits_with(changed)[:, 0], base[:, 0])
    changed = ctx.clone()
    changed[:, 29] += 1.0
    assert not torch.allclose(logits_with(changed)[:, 1], base[:, 1])
    # end to end through the target: tokens after the anchor never reach the block's base logits
    ids2 = ids.clone()
    ids2[:, 11:20] = (ids2[:, 11:20] + 7) % 60
    after = run(target, drafter, ids2, loss_mask, doc, pos, anchors=anchors).base_logits
    torch.testing.assert_close(after[:, 0], base[:, 0], rtol=1e-5, atol=1e-5)


def test_packed_target_features_equal_each_document_alone():
    target = FrozenTarget(make_tiny_qwen3(), target_layer_ids=[0, 2])
    ids, _, doc, pos = packed_batch(seed=1, lengths=(11, 9, 7), batch=1, pad=2)
    packed = target.features(ids, pos)
    start = 0
    for n in (11, 9, 7):
        alone = target.features(ids[:, start : start + n], torch.arange(n)[None])
        torch.testing.assert_close(packed.context_features[:, start : start + n], alone.context_features)
        torch.testing.assert_close(packed.final_hidden[:, start : start + n], alone.final_hidden)
        start += n


@pytest.mark.parametrize("sample_from_anchor", [True, False])
def test_teacher_is_the_targets_next_token_distribution(sample_from_anchor):
    target, drafter = build(markov=MarkovHeadConfig(rank=4), sample_from_anchor=sample_from_anchor)
    ids, loss_mask, doc, pos = packed_batch(seed=2, lengths=(30,), batch=1)
    out = run(target, drafter, ids, loss_mask, doc, pos)
    full = torch.log_softmax(target.model(ids).logits, -1)[0]
    shift = 1 if sample_from_anchor else 0
    for a, p in enumerate(out.anchors.positions[0].tolist()):
        if not out.anchors.valid[0, a]:
            continue
        for k in range(drafter.block_size):
            t = p + k + shift  # predicted position
            torch.testing.assert_close(out.teacher_logprobs[0, a, k], full[t - 1], rtol=1e-5, atol=1e-5)
            assert out.target_tokens[0, a, k] == ids[0, t]
            assert out.prev_tokens[0, a, k] == ids[0, t - 1]
            expected_valid = bool(loss_mask[0, t]) and (sample_from_anchor or k > 0)
            assert bool(out.slot_valid[0, a, k]) == expected_valid


def test_anchor_sampling_is_uniform_distinct_and_respects_documents():
    ids, loss_mask, doc, pos = packed_batch(seed=4, lengths=(12, 3, 20), batch=3, pad=5)
    for sfa in (True, False):
        allowed = valid_anchor_mask(loss_mask, doc, 4, sfa)
        last = 4 if sfa else 3
        for r in range(3):  # brute force: supervised, and the whole block inside the same document
            for p in range(ids.shape[1]):
                ok = bool(loss_mask[r, p]) and p + last < ids.shape[1] and doc[r, p] >= 0
                ok = ok and bool(doc[r, p] == doc[r, min(p + last, ids.shape[1] - 1)])
                assert bool(allowed[r, p]) == ok
        anchors = sample_anchors(loss_mask, doc, 4, 100, sfa, torch.Generator().manual_seed(0))
        for r in range(3):
            chosen = anchors.positions[r][anchors.valid[r]]
            assert chosen.tolist() == sorted(set(chosen.tolist()))
            assert set(chosen.tolist()) == set(allowed[r].nonzero().flatten().tolist())
    # uniformity: each of 10 valid positions is drawn ~ A/10 of the time
    loss_mask = torch.zeros(1, 30, dtype=torch.bool)
    loss_mask[0, :10] = True
    doc = torch.zeros(1, 30, dtype=torch.long)
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(30)
    for _ in range(2000):
        a = sample_anchors(loss_mask, doc, 4, 3, True, g)
        counts[a.positions[a.valid]] += 1
    assert counts[10:].sum() == 0
    assert (counts[:10] / 2000 - 0.3).abs().max() < 0.04


def test_default_target_layer_ids_spread_over_depth():
    assert default_target_layer_ids(28, 1) == [14]
    assert default_target_layer_ids(28, 5) == [1, 7, 13, 19, 25]
    assert default_target_layer_ids(36, 3) == [1, 17, 33]
    ids = default_target_layer_ids(4, 2)
    assert len(set(ids)) == 2 and all(0 <= i < 4 for i in ids)


def test_draft_vocab_plumbs_through_lm_head_and_teacher():
    counts = torch.arange(64, dtype=torch.float)  # high ids are the most frequent
    vocab = DraftVocab.from_counts(counts, 16, always_include=[MASK_ID, 3])
    assert vocab.draft_vocab_size == 16 and 3 in vocab.d2t.tolist()
    assert torch.equal(vocab.to_target(vocab.to_draft(vocab.d2t)), vocab.d2t)
    target, drafter = build(markov=MarkovHeadConfig(rank=4, kind="gated"), vocab=vocab)
    ids, loss_mask, doc, pos = packed_batch(seed=6)
    features = target.features(ids, pos)
    out = run(target, drafter, ids, loss_mask, doc, pos, features=features)
    assert out.logits.shape[-1] == 16 and out.teacher_logprobs.shape[-1] == 16
    full = drafter.lm_head(out.hidden)
    torch.testing.assert_close(out.base_logits, full[..., vocab.d2t])
    # teacher: float64 log-softmax over the FULL target vocabulary of lm_head(final_hidden) at the position before
    # the predicted token (slot k of the block anchored at p predicts token p + k + 1, so the teacher reads p + k),
    # then the draft columns d2t
    assert drafter.logit_softcap is None  # a tiny Qwen3 target: plain lm_head logits
    head = drafter.lm_head.weight.detach().double()
    checked = 0
    for r in range(ids.shape[0]):
        for a in range(out.anchors.positions.shape[1]):
            if not out.anchors.valid[r, a]:
                continue
            p = int(out.anchors.positions[r, a])
            for k in range(drafter.block_size):
                h = features.final_hidden[r, p + k].detach().double()
                ref = torch.log_softmax(head @ h, -1)
                torch.testing.assert_close(out.teacher_logprobs[r, a, k].double(), ref[vocab.d2t], rtol=1e-5, atol=1e-5)
                assert int(out.teacher_argmax[r, a, k]) == int(ref.argmax())
                assert int(out.target_tokens[r, a, k]) == int(ids[r, p + k + 1])
                checked += 1
    assert checked >= 8


def test_inference_draft_equals_training_block_at_the_end_of_a_document():
    target, drafter = build(markov=None)
    ids, loss_mask, doc, pos = packed_batch(seed=7, lengths=(20,), batch=1)
    p = 13
    anchors = Anchors(torch.tensor([[p]]), torch.tensor([[True]]))
    out = run(target, drafter, ids, loss_mask, doc, pos, anchors=anchors)
    feats = target.features(ids[:, :p], pos[:, :p])
    base, hidden = drafter.draft(feats.context_features, pos[:, :p], ids[:, p], pos[:, p])
    torch.testing.assert_close(base, out.base_logits[:, 0], rtol=1e-5, atol=1e-5)
    # left padding is masked out
    padded_feats = torch.cat((torch.randn(1, 3, feats.context_features.shape[-1]), feats.context_features), 1)
    padded_pos = torch.cat((torch.zeros(1, 3, dtype=torch.long), pos[:, :p]), 1)
    valid = torch.cat((torch.zeros(1, 3, dtype=torch.bool), torch.ones(1, p, dtype=torch.bool)), 1)
    base_padded, _ = drafter.draft(padded_feats, padded_pos, ids[:, p], pos[:, p], context_valid=valid)
    torch.testing.assert_close(base_padded, base, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(block_size=1), "block_size"),
        (dict(markov_head={"rank": -2}), "rank"),
        (dict(markov_head={"kind": "lstm"}), "kind"),
        (dict(markov_head=None, confidence_with_markov=True), "confidence_with_markov"),
        (dict(max_anchors=0), "max_anchors"),
    ],
)
def test_invalid_configs_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cfg = DrafterConfig(mask_token_id=MASK_ID, **kwargs)
        DSparkDrafter.for_target(cfg, FrozenTarget(make_tiny_qwen3()))


def test_target_layer_and_mask_id_out_of_range():
    with pytest.raises(ValueError, match="target layer id 4 out of range"):
        FrozenTarget(make_tiny_qwen3(), target_layer_ids=[1, 4])
    with pytest.raises(ValueError, match="mask_token_id"):
        DSparkDrafter.for_target(DrafterConfig(mask_token_id=64), FrozenTarget(make_tiny_qwen3()))


def test_target_is_frozen_and_stays_in_eval_mode():
    target = FrozenTarget(make_tiny_qwen3())
    target.train()
    assert not target.training and not target.model.training
    assert not any(p.requires_grad for p in target.parameters())
