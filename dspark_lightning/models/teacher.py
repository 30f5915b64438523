"""The teacher: the target's next-token log-probabilities over the draft vocabulary, and its full-vocabulary argmax.

Design: docs/design/design.md §3.6 (numbers and tiles), §11 (cost at large V); docs/design/training_step.md §3."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# fp32 logits per tile of the full-vocabulary pass (16 MiB): bounds its memory for any number of positions
STATS_CHUNK_ELEMENTS = 1 << 22
# positions per tile: the LM head is read once per this many positions (each tile then spans >= 4096 vocabulary rows)
MAX_TILE_ROWS = STATS_CHUNK_ELEMENTS >> 12


@dataclass
class TeacherStats:
    """Per position of ``final_hidden`` [b, S, H]: the full-vocabulary log-normaliser and argmax of its logits."""

    logsumexp: torch.Tensor  # [b, S] float32 (float64 for an fp64 head)
    argmax: torch.Tensor  # [b, S] long, target ids

    def take(self, flat_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logsumexp, argmax) at positions of the flattened [b * S] layout."""
        return self.logsumexp.reshape(-1)[flat_positions], self.argmax.reshape(-1)[flat_positions].long()


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the teacher's log-probabilities are computed in: fp64 for an fp64 head, else fp32."""
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


def soft_cap(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """c·tanh(logits / c) in place (Gemma 2's final logit soft-cap), or ``logits`` unchanged when ``softcap`` is None."""
    return logits if softcap is None else logits.div_(softcap).tanh_().mul_(softcap)


@torch.no_grad()
def full_vocab_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    chunk_elements: int = STATS_CHUNK_ELEMENTS,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logsumexp and argmax over V of ``hidden [..., H] @ weight[V, H].T``: ([...] float, [...] long)."""
    lse, argmax, _ = _full_vocab_pass(hidden, weight, None, chunk_elements, softcap=softcap)
    return lse, argmax


@torch.no_grad()
def full_vocab_teacher(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    d2t: torch.Tensor | None,
    chunk_elements: int = STATS_CHUNK_ELEMENTS,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p at the draft ids ``d2t`` (all V ids when None) [..., Vd], the full-vocabulary argmax [...]) of rows
    ``hidden [..., H]``, one pass over the full logits tile by tile: the teacher without stored stats."""
    lse, argmax, logprobs = _full_vocab_pass(hidden, weight, d2t, chunk_elements, gather=True, softcap=softcap)
    return logprobs, argmax


def _full_vocab_pass(hidden, weight, d2t, chunk_elements, gather: bool = False, softcap: float | None = None):
    lead, rows = hidden.shape[:-1], hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype)
    cd, n, vocab = compute_dtype(weight), rows.shape[0], weight.shape[0]
    lse = torch.empty(n, dtype=cd, device=rows.device)
    argmax = torch.empty(n, dtype=torch.long, device=rows.device)
    tile_rows = max(1, min(n, chunk_elements >> 12, MAX_TILE_ROWS))
    tile_vocab = max(1, chunk_elements // tile_rows)
    starts = list(range(0, vocab, tile_vocab))
    if gather:  # the draft ids in ascending order, where each one's column goes, and which of them each tile holds
        ids = torch.arange(vocab, device=rows.device) if d2t is None else d2t.to(rows.device)
        columns, slot = ids.sort()
        in_order = bool(torch.equal(slot, torch.arange(ids.numel(), device=slot.device)))  # a DraftVocab's d2t is
        # ascending, so its columns go to contiguous slices; any other order is scattered into place
        edges = torch.tensor([*starts, vocab], device=columns.device)
        bounds = torch.searchsorted(columns, edges).tolist()
        logprobs = torch.empty(n, ids.numel(), dtype=cd, device=rows.device)
    for r0 in range(0, n, tile_rows):
        block, r1 = rows[r0 : r0 + tile_rows], min(r0 + tile_rows, n)
        top = torch.full((r1 - r0,), float("-inf"), dtype=cd, device=rows.device)
        total = torch.zeros_like(top)
        for tile, v0 in enumerate(starts):
            logits = soft_cap(F.linear(block, weight[v0 : v0 + tile_vocab]).to(cd), softcap)
            tile_top, tile_arg = logits.max(dim=-1)
            better = tile_top > top  # strictly: an equal maximum in a later tile keeps the first index
            argmax[r0:r1] = torch.where(better, tile_arg + v0, argmax[r0:r1]) if tile else tile_arg
            if gather:  # this tile's draft columns, before the exp below reuses the logits' storage
                lo, hi = bounds[tile], bounds[tile + 1]
                picked = logits if d2t is None else logits.index_select(-1, columns[lo:hi] - v0)
                if in_order:
                    logprobs[r0:r1, lo:hi] = picked
                else:
                    logprobs[r0:r1, slot[lo:hi]] = picked
            new_top = torch.maximum(top, tile_top)
            total = total * (top - new_top).exp() + logits.sub_(new_top[:, None]).exp_().sum(-1)
            top = new_top
        lse[r0:r1] = total.log_().add_(top)
        if gather:
            logprobs[r0:r1] -= lse[r0:r1, None]
    return lse.view(lead), argmax.view(lead), (logprobs.view(*lead, -1) if gather else None)


def expand_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``table [U, Vd]`` read at ``rows [...]`` (indices into it): [..., Vd], whole rows copied by ``index_select``
    (advanced indexing gathers element by element on CPU, about ten times slower)."""
    return table.index_select(0, rows.flatten()).view(*rows.shape, -1)


def draft_logprobs(
    rows: torch.Tensor, draft_rows: torch.Tensor, logsumexp: torch.Tensor, softcap: float | None = None
) -> torch.Tensor:
    """log p at the draft ids from stored stats: ``rows [n, H] @ draft_rows[Vd, H].T − logsumexp[n]`` [n, Vd]."""
    cd = compute_dtype(draft_rows)
    logits = soft_cap(F.linear(rows.to(draft_rows.dtype), draft_rows).to(cd), softcap)
    return logits.sub_(logsumexp.to(cd)[:, None])


__all__ = [
    "MAX_TILE_ROWS",
    "STATS_CHUNK_ELEMENTS",
    "TeacherStats",
    "compute_dtype",
    "draft_logprobs",
    "expand_rows",
    "full_vocab_stats",
    "full_vocab_teacher",
    "soft_cap",
]
