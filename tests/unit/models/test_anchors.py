"""Which positions may anchor a block, against brute force over random packed rows with padding: a supervised
position whose predicted tokens all lie inside its own document (and inside the row)."""

from __future__ import annotations

import pytest
import torch

from dspark_lightning.models.anchors import sample_anchors, valid_anchor_mask


def packed_rows(seed: int, batch: int = 3, lengths=(5, 9, 3, 7), pad: int = 4):
    g = torch.Generator().manual_seed(seed)
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)] + [torch.full((pad,), -1)])
    document_ids = doc.repeat(batch, 1)
    loss_mask = torch.rand(document_ids.shape, generator=g) > 0.25  # also True on some padding: the mask is raw
    return loss_mask, document_ids


def brute_force(loss_mask, document_ids, block_size: int, sample_from_anchor: bool) -> torch.Tensor:
    last = block_size if sample_from_anchor else block_size - 1  # the farthest predicted offset
    b, S = loss_mask.shape
    out = torch.zeros(b, S, dtype=torch.bool)
    for r in range(b):
        for p in range(S):
            doc = int(document_ids[r, p])
            inside = p + last < S and all(int(document_ids[r, p + j]) == doc for j in range(1, last + 1))
            out[r, p] = bool(loss_mask[r, p]) and doc >= 0 and inside
    return out


@pytest.mark.parametrize("sample_from_anchor", [True, False])
@pytest.mark.parametrize("block_size", [1, 2, 4, 8, 40])
def test_valid_anchors_equal_brute_force(block_size, sample_from_anchor):
    for seed in range(3):
        loss_mask, document_ids = packed_rows(seed)
        expected = brute_force(loss_mask, document_ids, block_size, sample_from_anchor)
        assert torch.equal(valid_anchor_mask(loss_mask, document_ids, block_size, sample_from_anchor), expected)


@pytest.mark.parametrize("budget", ["uniform", "per_document"])
def test_sampled_anchors_are_distinct_valid_ascending_and_as_many_as_allowed(budget):
    loss_mask, document_ids = packed_rows(4)
    valid = brute_force(loss_mask, document_ids, 3, True)
    for max_anchors in (1, 4, 40):
        anchors = sample_anchors(
            loss_mask, document_ids, 3, max_anchors, True, torch.Generator().manual_seed(0), budget
        )
        for r in range(loss_mask.shape[0]):
            chosen = anchors.positions[r][anchors.valid[r]].tolist()
            assert chosen == sorted(set(chosen)) and all(valid[r, p] for p in chosen)
            assert len(chosen) == min(max_anchors, int(valid[r].sum()))
