"""Anchors: where the draft blocks start. Anchor validity, sampling with the ``uniform`` / ``per_document`` budgets
(Sainte-Lague shares), deterministic evaluation anchors, coverage, and the attention rule of a set of anchors
(docs/design/design.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark_lightning.models.attention import BlockVisibility


@dataclass
class Anchors:
    """Sampled anchors: ``positions`` [b, A] (packed positions, ascending; 0 where invalid), ``valid`` [b, A]."""

    positions: torch.Tensor
    valid: torch.Tensor


def valid_anchor_mask(
    loss_mask: torch.Tensor, document_ids: torch.Tensor, block_size: int, sample_from_anchor: bool
) -> torch.Tensor:
    """[b, S] bool: supervised positions p whose whole block of predicted tokens stays in p's document.

    With ``sample_from_anchor`` the block predicts p+1..p+B, otherwise p+1..p+B-1 (slot 0 is the bonus token).
    """
    last_offset = block_size if sample_from_anchor else block_size - 1
    S = loss_mask.shape[1]
    valid = loss_mask.bool() & (document_ids >= 0)
    if last_offset >= S:
        return torch.zeros_like(valid)
    same_doc = torch.zeros_like(valid)
    same_doc[:, : S - last_offset] = document_ids[:, : S - last_offset] == document_ids[:, last_offset:]
    return valid & same_doc


ANCHOR_BUDGETS = ("uniform", "per_document")


def sample_anchors(
    loss_mask: torch.Tensor,
    document_ids: torch.Tensor,
    block_size: int,
    max_anchors: int,
    sample_from_anchor: bool = True,
    generator: torch.Generator | None = None,
    budget: str = "uniform",
) -> Anchors:
    """Draw up to ``max_anchors`` distinct valid anchors per row (``budget``: docs/design/design.md §3.3)."""
    if budget not in ANCHOR_BUDGETS:
        raise ValueError(f"unknown anchor budget {budget!r}; expected one of {ANCHOR_BUDGETS}")
    candidates = valid_anchor_mask(loss_mask, document_ids, block_size, sample_from_anchor)
    num = min(max_anchors, candidates.shape[1])
    scores = torch.rand(candidates.shape, generator=generator, device="cpu").to(candidates.device)
    if budget == "per_document":
        document_keys = torch.rand(candidates.shape, generator=generator, device="cpu").to(candidates.device)
        chosen = _per_document_choice(candidates, loss_mask, document_ids, scores, document_keys, num)
        return _anchors_from_choice(chosen, num)
    scores = scores.masked_fill(~candidates, -1.0)
    top_scores, top_positions = scores.topk(num, dim=1)
    valid = top_scores >= 0
    positions = torch.where(valid, top_positions, torch.full_like(top_positions, candidates.shape[1]))
    positions, order = positions.sort(dim=1)
    valid = valid.gather(1, order)
    positions = positions.masked_fill(~valid, 0)
    return Anchors(positions=positions, valid=valid)


def _per_document_choice(
    candidates: torch.Tensor,
    loss_mask: torch.Tensor,
    document_ids: torch.Tensor,
    scores: torch.Tensor,
    document_keys: torch.Tensor,
    num: int,
) -> torch.Tensor:
    """[b, S] bool: the ``num`` (at most) candidates picked by the per-document Sainte-Lague budget."""
    b, S = candidates.shape
    documents = document_ids.clamp(min=-1) + 1  # 0 = padding, documents 1..D
    width = int(documents.max()) + 1 if documents.numel() else 1
    # supervised tokens per document, read back at every position
    supervised = torch.zeros(b, width, device=candidates.device).scatter_add_(1, documents, loss_mask.float())
    weight = supervised.gather(1, documents)
    # rank of each candidate inside its document, by descending random score
    key = torch.where(candidates, documents.double() * 2 + (1 - scores.double()), torch.inf)
    order = key.argsort(dim=1, stable=True)
    sorted_documents = documents.gather(1, order)
    index = torch.arange(S, device=candidates.device).expand(b, S)
    starts = torch.ones_like(candidates)
    starts[:, 1:] = sorted_documents[:, 1:] != sorted_documents[:, :-1]
    run_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    rank = torch.empty_like(index).scatter_(1, order, index - run_start)
    # first anchor of each document: guaranteed tier, ordered by Efraimidis-Spirakis keys log(u) / w
    first = candidates & (rank == 0)
    priority = torch.where(
        first,
        document_keys.clamp(min=1e-12).log() / weight.clamp(min=1e-12),
        weight / (rank.float() + 0.5),
    )
    priority = priority.masked_fill(~candidates, -torch.inf)
    # lexicographic (tier, priority, random) descending: stable sorts from the last key to the first
    order = scores.argsort(dim=1, descending=True, stable=True)
    order = order.gather(1, priority.gather(1, order).argsort(dim=1, descending=True, stable=True))
    tier = (first.long() + candidates.long()).gather(1, order)  # 2 = first anchor, 1 = later, 0 = not a candidate
    order = order.gather(1, tier.argsort(dim=1, descending=True, stable=True))
    picked = torch.zeros_like(candidates)
    picked.scatter_(1, order[:, :num], True)
    return picked & candidates


def _anchors_from_choice(chosen: torch.Tensor, num: int) -> Anchors:
    """[b, S] bool (at most ``num`` per row) -> ascending ``Anchors`` of width ``num``."""
    order = torch.sort((~chosen).to(torch.int8), dim=1, stable=True).indices[:, :num]
    valid = chosen.gather(1, order)
    return Anchors(positions=order.masked_fill(~valid, 0), valid=valid)


def predicted_offsets(block_size: int, sample_from_anchor: bool) -> range:
    """Offsets from the anchor of the positions a block is trained to predict."""
    return range(1, block_size + 1) if sample_from_anchor else range(1, block_size)


def anchor_coverage_counts(
    anchors: Anchors, loss_mask: torch.Tensor, block_size: int, sample_from_anchor: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(covered, supervised) counts over the batch: supervised positions predicted by some valid block, and all
    supervised positions. ``covered / supervised`` is the anchor coverage."""
    b, S = loss_mask.shape
    offsets = torch.tensor(list(predicted_offsets(block_size, sample_from_anchor)), device=loss_mask.device)
    predicted = anchors.positions[:, :, None] + offsets  # [b, A, K]
    predicted = torch.where(anchors.valid[:, :, None] & (predicted < S), predicted, S)  # S = discard column
    hit = torch.zeros(b, S + 1, dtype=torch.bool, device=loss_mask.device)
    hit.scatter_(1, predicted.flatten(1), True)
    supervised = loss_mask.bool()
    return (hit[:, :S] & supervised).sum(), supervised.sum()


def evaluation_anchors(
    loss_mask: torch.Tensor,
    document_ids: torch.Tensor,
    position_ids: torch.Tensor,
    block_size: int,
    stride: int,
    sample_from_anchor: bool = True,
    pad_to: int = 1,
) -> Anchors:
    """Deterministic anchors for evaluation: every valid position whose in-document position is a multiple of
    ``stride``. The choice depends on each document alone, not on how documents were packed, batched or split
    across ranks, so evaluation metrics are identical for 1 process and for N (and across repeated validations).

    The anchor count is padded (with invalid anchors) to at least ``pad_to`` and then to a multiple of 64, so that
    compiled FlexAttention sees a handful of query lengths instead of recompiling for every batch.
    """
    candidates = valid_anchor_mask(loss_mask, document_ids, block_size, sample_from_anchor)
    candidates &= position_ids % stride == 0
    count = int(candidates.sum(dim=1).max()) if candidates.numel() else 0
    if count > pad_to:
        count = -(-count // 64) * 64
    count = max(1, min(max(count, pad_to), candidates.shape[1]))
    # stable sort puts the chosen positions first, in ascending order
    order = torch.sort((~candidates).to(torch.int8), dim=1, stable=True).indices[:, :count]
    valid = candidates.gather(1, order)
    return Anchors(positions=order.masked_fill(~valid, 0), valid=valid)


def block_visibility(anchors: Anchors, document_ids: torch.Tensor, block_size: int) -> BlockVisibility:
    """The attention rule for these anchors (invalid anchors see only their own block)."""
    anchor_documents = document_ids.gather(1, anchors.positions).masked_fill(~anchors.valid, -2)
    return BlockVisibility(anchors.positions, anchor_documents, document_ids, block_size)


def padded_prefix_visibility(context_valid: torch.Tensor, block_size: int) -> BlockVisibility:
    """One block per row after a left-padded prefix [b, S] (False on padding): the block sees the valid prefix."""
    b, S = context_valid.shape
    documents = torch.where(context_valid, 0, -1)  # padding is its own "document", invisible to the block
    return BlockVisibility(
        anchor_positions=torch.full((b, 1), S, device=documents.device),
        anchor_documents=torch.zeros((b, 1), dtype=documents.dtype, device=documents.device),
        context_documents=documents,
        block_size=block_size,
    )
