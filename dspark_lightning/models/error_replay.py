"""Error-position replay (Draft-OPD, arXiv 2605.29343): where greedy verification first rejects each drafted block,
and training anchors moved to those positions, the states a speculative decode starts its next block from.

In a greedy decode the block after a rejection is anchored at the rejected position (its token is the target's
correction), so those positions are the draft-induced states that limit acceptance; uniform anchors visit them only
in proportion to their share of the text (docs/design/error_replay.md §1, §2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dspark_lightning.models.anchors import Anchors, predicted_offsets, valid_anchor_mask

if TYPE_CHECKING:
    from dspark_lightning.models.drafter import DrafterOutput
    from dspark_lightning.models.vocab import DraftVocab


def first_rejections(
    predicted: torch.Tensor, accepted: torch.Tensor, supervised: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [b, A], found [b, A]): the position of each block's first drafted slot that greedy verification
    rejects, scanning the drafted slots in order.

    ``predicted`` [b, A, K]: the position each drafted slot predicts; ``accepted`` [b, A, K]: the drafter's token is
    the target's argmax there; ``supervised`` [b, A, K]: the slot lies in the supervised text. The scan stops at the
    first unsupervised slot (the text a decode would be writing ends there), so such a block has no rejection, and
    neither has a block accepted whole. Positions are 0 where nothing was found.
    """
    rejected = supervised & ~accepted
    stop = rejected | ~supervised
    first = stop.int().argmax(dim=2, keepdim=True)  # the first True (0 when there is none: masked by ``found``)
    found = (stop.any(dim=2, keepdim=True) & rejected.gather(2, first)).squeeze(2)
    positions = predicted.gather(2, first).squeeze(2)
    return positions.masked_fill(~found, 0), found


def replay_anchors(
    anchors: Anchors,
    rejections: torch.Tensor,
    found: torch.Tensor,
    loss_mask: torch.Tensor,
    document_ids: torch.Tensor,
    block_size: int,
    sample_from_anchor: bool,
    replay: int,
    generator: torch.Generator | None = None,
) -> Anchors:
    """``anchors`` with up to ``replay`` per row moved to first-rejection positions, the same count per row.

    The rejection positions that are valid anchors (``valid_anchor_mask``) are deduplicated; ``replay`` of them are
    drawn at random (all, if fewer), then the row is filled from the sampled anchors not already chosen, in random
    order, up to the row's original anchor count. The result is ascending, like ``sample_anchors``'s.
    """
    b, S = loss_mask.shape
    A = anchors.positions.shape[1]
    candidates = valid_anchor_mask(loss_mask, document_ids, block_size, sample_from_anchor)
    column = torch.where(found, rejections, S)  # S: a discard column
    at_error = torch.zeros(b, S + 1, dtype=torch.bool, device=loss_mask.device).scatter_(1, column, True)[:, :S]
    at_error &= candidates
    sampled = torch.zeros(b, S + 1, dtype=torch.bool, device=loss_mask.device)
    sampled = sampled.scatter_(1, torch.where(anchors.valid, anchors.positions, S), True)[:, :S]
    error_keys = torch.rand((b, S), generator=generator, device="cpu").to(loss_mask.device)
    fill_keys = torch.rand((b, S), generator=generator, device="cpu").to(loss_mask.device)
    keep = min(replay, S)
    top = error_keys.masked_fill(~at_error, -1.0).topk(keep, dim=1)
    replayed = torch.zeros_like(at_error).scatter_(1, top.indices, top.values >= 0)
    # priority: replayed error positions (2..3), then the other sampled anchors (1..2), never the rest (-1)
    priority = torch.where(replayed, 2 + fill_keys, torch.where(sampled, 1 + fill_keys, -1.0))
    count = anchors.valid.sum(dim=1, keepdim=True)  # each row keeps its own anchor count
    chosen_scores, chosen = priority.topk(A, dim=1)
    rank = torch.arange(A, device=loss_mask.device).expand(b, A)
    keep_chosen = (chosen_scores >= 0) & (rank < count)
    picked = torch.zeros_like(at_error).scatter_(1, chosen, keep_chosen)
    order = torch.sort((~picked).to(torch.int8), dim=1, stable=True).indices[:, :A]
    valid = picked.gather(1, order)
    return Anchors(positions=order.masked_fill(~valid, 0), valid=valid)


def probe_rejections(out: DrafterOutput, draft_vocab: DraftVocab | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``first_rejections`` of a drafter forward's blocks: greedy verification accepts a slot whose drafted argmax
    (as a target id) is the target's argmax there. Run the probe with ``markov_prev="own"`` so that each slot's
    Markov bias reads the drafter's own previous choice, as in decoding."""
    cfg = out.config
    drafted = out.logits.argmax(dim=-1)
    if draft_vocab is not None:
        drafted = draft_vocab.to_target(drafted)
    offsets = torch.tensor(list(predicted_offsets(cfg.block_size, cfg.sample_from_anchor)), device=drafted.device)
    predicted = out.anchors.positions[:, :, None] + offsets
    trained = lambda t: cfg.trained_slots(t, dim=2)  # noqa: E731
    return first_rejections(predicted, trained(drafted == out.teacher_argmax), trained(out.slot_valid))
