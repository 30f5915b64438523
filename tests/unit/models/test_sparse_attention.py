"""The training forward's grouped attention (each group of blocks reads only the context stretch it can see, unseen
context positions are not projected) equals the dense-mask attention, outputs and gradients, in float64."""

from __future__ import annotations

import pytest
import torch
from helpers.drafters import build, packed_batch

import dspark_lightning.models.sparse_attention as sparse_attention
from dspark_lightning.models import MarkovHeadConfig
from dspark_lightning.models.anchors import block_visibility, sample_anchors
from dspark_lightning.models.attention import resolve_backend


def hidden_and_grads(drafter, features, batch, anchors, sparse: bool):
    ids, _, doc, pos = batch
    drafter.zero_grad(set_to_none=True)
    hidden = drafter._run_backbone(
        ids.gather(1, anchors.positions), pos.gather(1, anchors.positions), features, pos,
        block_visibility(anchors, doc, drafter.block_size), sparse=sparse,
    )  # fmt: skip
    weights = torch.linspace(-1, 1, hidden.numel(), dtype=hidden.dtype).view(hidden.shape)
    (hidden * weights).sum().backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layers", ["full", "full+sliding"])
def test_grouped_attention_equals_dense_attention(layers, monkeypatch):
    monkeypatch.setattr(sparse_attention, "GROUP_QUERIES", 8)  # groups of 2 blocks: several groups per row
    sliding = {"sliding_window": 6, "layer_types": ["full_attention", "sliding_attention"]} if layers != "full" else {}
    target, drafter = build(markov=MarkovHeadConfig(rank=4), num_layers=2, **sliding)
    target.model.double()
    drafter.double()
    batch = packed_batch(seed=5, lengths=(30, 9, 24), batch=2, pad=7)  # documents, padding, an uncovered tail
    ids, loss_mask, doc, pos = batch
    features = target.features(ids, pos).context_features
    anchors = sample_anchors(loss_mask, doc, drafter.block_size, 10, True, torch.Generator().manual_seed(2))
    anchors.valid[1, -1] = False  # an invalid anchor sees only its own block
    assert resolve_backend(drafter.backbone.config.attention_backend, features.device) == "sdpa"
    dense, dense_grads = hidden_and_grads(drafter, features, batch, anchors, sparse=False)
    grouped, grouped_grads = hidden_and_grads(drafter, features, batch, anchors, sparse=True)
    torch.testing.assert_close(grouped, dense, rtol=1e-12, atol=1e-12)
    assert grouped_grads.keys() == dense_grads.keys() and "backbone.fc.weight" in grouped_grads
    for name, grad in grouped_grads.items():
        torch.testing.assert_close(grad, dense_grads[name], rtol=1e-10, atol=1e-12, msg=name)

    # the work it skips: fewer context positions projected, each group a narrower stretch than the context
    mask = block_visibility(anchors, doc, drafter.block_size).dense()
    kept, _, grouped_mask = sparse_attention.grouped_context(mask, features, pos, drafter.block_size)
    assert kept.shape[1] < features.shape[1]
    assert len(grouped_mask.groups) == mask.shape[-2] // 8
    assert all(c1 - c0 < kept.shape[1] for _, _, c0, c1 in grouped_mask.groups)
