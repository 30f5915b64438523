"""Error-position replay (models/error_replay.py) against brute force: the first rejected slot of each block, and
the anchors moved there."""

from __future__ import annotations

import itertools

import pytest
import torch

from dspark_lightning.models.anchors import Anchors, sample_anchors, valid_anchor_mask
from dspark_lightning.models.error_replay import first_rejections, replay_anchors


def brute_first_rejection(predicted, accepted, supervised):
    for slot in range(len(predicted)):
        if not supervised[slot]:
            return 0, False
        if not accepted[slot]:
            return predicted[slot], True
    return 0, False


@pytest.mark.parametrize("seed", range(4))
def test_first_rejections_scan_each_block_in_order(seed):
    g = torch.Generator().manual_seed(seed)
    b, A, K = 3, 6, 5
    predicted = torch.randint(0, 100, (b, A, K), generator=g)
    accepted = torch.rand((b, A, K), generator=g) < 0.6
    supervised = torch.rand((b, A, K), generator=g) < 0.85
    positions, found = first_rejections(predicted, accepted, supervised)
    for i, a in itertools.product(range(b), range(A)):
        want = brute_first_rejection(predicted[i, a].tolist(), accepted[i, a].tolist(), supervised[i, a].tolist())
        assert (int(positions[i, a]), bool(found[i, a])) == want


def test_a_block_accepted_whole_or_cut_by_unsupervised_text_has_no_rejection():
    predicted = torch.tensor([[[5, 6, 7], [9, 10, 11], [12, 13, 14]]])
    accepted = torch.tensor([[[True, True, True], [True, False, False], [True, True, False]]])
    supervised = torch.tensor([[[True, True, True], [True, True, True], [True, False, True]]])
    positions, found = first_rejections(predicted, accepted, supervised)
    assert found.tolist() == [[False, True, False]] and positions.tolist() == [[0, 10, 0]]


def example(seed: int, S: int = 48, A: int = 10):
    g = torch.Generator().manual_seed(seed)
    loss_mask = torch.ones(2, S, dtype=torch.long)
    loss_mask[:, :6] = 0  # a prompt
    document_ids = torch.zeros(2, S, dtype=torch.long)
    document_ids[1, 30:] = 1  # a second packed document in row 1
    anchors = sample_anchors(loss_mask, document_ids, 4, A, True, g)
    rejections = torch.randint(0, S, (2, A), generator=g)
    found = torch.rand((2, A), generator=g) < 0.7
    return loss_mask, document_ids, anchors, rejections, found, g


@pytest.mark.parametrize(("seed", "replay"), [(0, 5), (1, 10), (2, 3), (3, 0)])
def test_replayed_anchors_hold_the_error_positions_then_sampled_ones(seed, replay):
    loss_mask, document_ids, anchors, rejections, found, g = example(seed)
    moved = replay_anchors(anchors, rejections, found, loss_mask, document_ids, 4, True, replay, g)
    candidates = valid_anchor_mask(loss_mask, document_ids, 4, True)
    for row in range(2):
        sampled = set(anchors.positions[row][anchors.valid[row]].tolist())
        errors = {int(p) for p, f in zip(rejections[row], found[row], strict=True) if f and candidates[row, p]}
        got = moved.positions[row][moved.valid[row]].tolist()
        assert got == sorted(set(got))  # ascending, distinct
        assert len(got) == len(sampled)  # the row's anchor count is kept
        assert set(got) <= sampled | errors
        assert len(set(got) & errors) >= min(replay, len(errors))  # the replayed share (sampled ones may be errors)
        assert all(candidates[row, p] for p in got)
        assert (moved.positions[row][~moved.valid[row]] == 0).all()
    if replay == 0:
        assert torch.equal(moved.positions, anchors.positions) and torch.equal(moved.valid, anchors.valid)


def test_every_error_position_is_taken_when_the_share_allows():
    loss_mask, document_ids, anchors, rejections, found, g = example(5)
    found[:] = True
    moved = replay_anchors(anchors, rejections, found, loss_mask, document_ids, 4, True, 10, g)
    candidates = valid_anchor_mask(loss_mask, document_ids, 4, True)
    for row in range(2):
        errors = {int(p) for p in rejections[row] if candidates[row, p]}
        assert errors <= set(moved.positions[row][moved.valid[row]].tolist())


def test_a_row_with_fewer_anchors_keeps_its_count():
    loss_mask = torch.zeros(1, 20, dtype=torch.long)
    loss_mask[0, 10:] = 1
    document_ids = torch.zeros(1, 20, dtype=torch.long)
    anchors = Anchors(positions=torch.tensor([[11, 12, 0, 0]]), valid=torch.tensor([[True, True, False, False]]))
    moved = replay_anchors(
        anchors,
        torch.tensor([[13, 14, 0, 0]]),
        torch.tensor([[True, True, False, False]]),
        loss_mask,
        document_ids,
        4,
        True,
        2,
        torch.Generator().manual_seed(0),
    )
    assert moved.positions.tolist() == [[13, 14, 0, 0]] and moved.valid.tolist() == [[True, True, False, False]]
