"""The teacher: the target's next-token log-probabilities over the draft vocabulary, and its full-vocabulary argmax.

docs/design.md §3.6. For a final hidden state h and the target's LM head W [V, H],

    log p(v) = h·W_v − logZ(h),   logZ(h) = logsumexp_{u < V} h·W_u,

so the loss, which reads p only at the Vd draft ids, needs the V-wide head for two numbers per position: logZ and the
target's argmax (what greedy verification accepts). ``full_vocab_stats`` computes both from the full logits;
``TeacherStats`` carries them per position of ``final_hidden``, as an offline cache stores them (its writer runs the
target anyway), so that training from the cache evaluates the head on the Vd draft rows only — the same numbers,
about V / Vd times fewer multiply-adds. Without stats (online features, caches written before the stats existed)
the head runs over V at the distinct teacher positions only, and logZ and the argmax come from that one pass.

Numbers: logits are computed in the LM head's dtype (as ``lm_head(h)`` computes them) and reduced in fp32 (fp64 for
an fp64 head); logZ = m + log Σ exp(logit − m) with m the row maximum, and the argmax is the first index of m
(``torch.max`` over the row, the convention of ``argmax``). A target with a final logit soft-cap c (Gemma 2) has the
logits c·tanh(h·W / c); every function here takes it as ``softcap`` and applies it before anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# fp32 logits per chunk of the full-vocabulary pass (16 MiB): bounds its memory for any number of positions
STATS_CHUNK_ELEMENTS = 1 << 22


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


def _chunk_rows(vocab_size: int, chunk_elements: int) -> int:
    return max(1, chunk_elements // max(vocab_size, 1))


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
    ``hidden [..., H]``, one pass over the full logits chunk by chunk: the teacher without stored stats."""
    lse, argmax, logprobs = _full_vocab_pass(hidden, weight, d2t, chunk_elements, gather=True, softcap=softcap)
    return logprobs, argmax


def _full_vocab_pass(hidden, weight, d2t, chunk_elements, gather: bool = False, softcap: float | None = None):
    lead, rows = hidden.shape[:-1], hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype)
    cd, n, vocab = compute_dtype(weight), rows.shape[0], weight.shape[0]
    lse = torch.empty(n, dtype=cd, device=rows.device)
    argmax = torch.empty(n, dtype=torch.long, device=rows.device)
    width = (vocab if d2t is None else d2t.numel()) if gather else 0
    logprobs = torch.empty(n, width, dtype=cd, device=rows.device) if gather else None
    step = _chunk_rows(vocab, chunk_elements)
    for start in range(0, n, step):
        stop = min(start + step, n)
        logits = soft_cap(F.linear(rows[start:stop], weight).to(cd), softcap)
        top, argmax[start:stop] = logits.max(dim=-1)
        if gather:  # the draft columns, before the exp below reuses the logits' storage
            picked = logits if d2t is None else logits.index_select(-1, d2t)
            logprobs[start:stop] = picked
        lse[start:stop] = logits.sub_(top[:, None]).exp_().sum(-1).log_().add_(top)
        if gather:
            logprobs[start:stop] -= lse[start:stop, None]
    return lse.view(lead), argmax.view(lead), (None if logprobs is None else logprobs.view(*lead, width))


def draft_logprobs(
    rows: torch.Tensor, draft_rows: torch.Tensor, logsumexp: torch.Tensor, softcap: float | None = None
) -> torch.Tensor:
    """log p at the draft ids from stored stats: ``rows [n, H] @ draft_rows[Vd, H].T − logsumexp[n]`` [n, Vd]."""
    cd = compute_dtype(draft_rows)
    logits = soft_cap(F.linear(rows.to(draft_rows.dtype), draft_rows).to(cd), softcap)
    return logits.sub_(logsumexp.to(cd)[:, None])


__all__ = [
    "STATS_CHUNK_ELEMENTS",
    "TeacherStats",
    "compute_dtype",
    "draft_logprobs",
    "full_vocab_stats",
    "full_vocab_teacher",
    "soft_cap",
]
