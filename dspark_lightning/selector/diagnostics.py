"""How close the top-k Selector walk is to the sequential Markov decode, and the acceptance of drafted tokens
against the teacher."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dspark_lightning.metrics import block_tau, greedy_block_tau, prefix_length
from dspark_lightning.models.markov import MarkovHead
from dspark_lightning.selector.walks import SelectorWalk, selector_walk, sequential_decode


@dataclass
class EquivalenceReport:
    """Selector walk vs sequential Markov decode (greedy) on a set of blocks; see ``equivalence_report``.

    Per requested k (dict keys; ``effective_k[k] = min(k, Vd)``):
    coverage: fraction of valid slots whose sequential token is in C_t = top-k(U_t);
    agreement / agreement_per_slot [B]: fraction of valid slots where walk token == sequential token;
    agreed_prefix: mean (over blocks with a valid slot) length of the leading run of agreeing valid slots;
    tau_walk / greedy_tau_walk: acceptance of the walk's tokens against the teacher (``None`` without teacher);
    time_walk_s: wall time of pair_scores + walk. ``tau_sequential``, ``greedy_tau_sequential`` and
    ``time_sequential_s`` describe the sequential decode once.
    """

    ks: tuple[int, ...]
    effective_k: dict[int, int]
    coverage: dict[int, float]
    agreement: dict[int, float]
    agreement_per_slot: dict[int, torch.Tensor]
    agreed_prefix: dict[int, float]
    time_walk_s: dict[int, float]
    time_sequential_s: float
    num_blocks: int
    num_valid_slots: int
    tau_walk: dict[int, float] = field(default_factory=dict)
    greedy_tau_walk: dict[int, float] = field(default_factory=dict)
    tau_sequential: float | None = None
    greedy_tau_sequential: float | None = None

    def to_flat_dict(self, prefix: str = "") -> dict[str, float]:
        """Scalars keyed like ``coverage@16``, ``tau_walk@16``, ``tau_sequential`` (for loggers)."""
        out: dict[str, float] = {}
        for k in self.ks:
            out[f"{prefix}coverage@{k}"] = self.coverage[k]
            out[f"{prefix}agreement@{k}"] = self.agreement[k]
            out[f"{prefix}agreed_prefix@{k}"] = self.agreed_prefix[k]
            out[f"{prefix}time_walk_s@{k}"] = self.time_walk_s[k]
            if k in self.tau_walk:
                out[f"{prefix}tau_walk@{k}"] = self.tau_walk[k]
                out[f"{prefix}greedy_tau_walk@{k}"] = self.greedy_tau_walk[k]
        out[f"{prefix}time_sequential_s"] = self.time_sequential_s
        if self.tau_sequential is not None:
            out[f"{prefix}tau_sequential"] = self.tau_sequential
            out[f"{prefix}greedy_tau_sequential"] = self.greedy_tau_sequential
        return out


def teacher_acceptance(
    tokens: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    valid_mask: torch.Tensor,
    d2t: torch.Tensor | None = None,
) -> tuple[float, float]:
    """(tau, greedy_tau) of drafted tokens [N, B] (draft indices) against teacher log-probabilities.

    ``teacher_logprobs`` is [N, B, Vd] (indexed by draft index) or, when ``d2t`` is given and its last dimension
    differs from Vd, [N, B, V] (indexed by target id through d2t).
    - tau = 1 + sum_k prod_{j<=k} p_j * m_j with p_j = teacher probability of the drafted token: the expected
      accepted length when a deterministic draft is verified by speculative sampling (accept w.p. min(1, p/q), q = 1).
    - greedy_tau = 1 + length of the leading run of valid slots whose drafted token is the teacher's argmax
      (greedy verification).
    Both are means over blocks with at least one valid slot; as everywhere offline, the teacher at slot j is the
    target's distribution given the ground-truth prefix (exact when the drafted prefix equals it).
    """
    ids = tokens
    if d2t is not None and teacher_logprobs.shape[-1] != d2t.shape[0]:
        ids = d2t[tokens]  # teacher over the target vocabulary
    valid = valid_mask.to(torch.bool)
    p = teacher_logprobs.gather(-1, ids[..., None]).squeeze(-1).exp().to(torch.float64)
    tau = block_tau(p, valid)
    greedy = greedy_block_tau(ids == teacher_logprobs.argmax(dim=-1), valid)
    blocks = valid.any(dim=1)
    n_blocks = max(int(blocks.sum().item()), 1)
    return float(tau[blocks].sum().item() / n_blocks), float(greedy[blocks].sum().item() / n_blocks)


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    if isinstance(result, torch.Tensor) and result.is_cuda:
        torch.cuda.synchronize(result.device)
    elif isinstance(result, SelectorWalk) and result.tokens.is_cuda:
        torch.cuda.synchronize(result.tokens.device)
    return result, time.perf_counter() - start


def equivalence_report(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    teacher_logprobs: torch.Tensor | None = None,
    ks: tuple[int, ...] | list[int] = (1, 4, 16, 64),
    valid_mask: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    stop: Callable[[], bool] | None = None,
) -> EquivalenceReport:
    """Measure how close the top-k Selector walk is to the sequential Markov decode (both greedy).

    Runs the sequential decode once and ``selector_walk`` once per k (k > Vd is clamped to Vd), under
    ``torch.no_grad``. ``valid_mask`` [N, B] (default all valid) restricts every statistic to valid slots; a
    prefix stops at the first invalid slot. With ``teacher_logprobs`` ([N, B, Vd] or [N, B, V]) it adds tau and
    greedy_tau of both decodes (see ``teacher_acceptance``). Raises for the rnn head (no walk exists for it).
    ``stop()`` is checked before each walk: once it is true the report ends there, ``ks`` holding the k measured.
    """
    if head is not None and head.is_path_dependent:
        raise ValueError("equivalence_report needs a Selector walk, which the path-dependent rnn head does not have")
    n_rows, block, vocab = base_logits.shape
    valid = (
        torch.ones(n_rows, block, dtype=torch.bool, device=base_logits.device)
        if valid_mask is None
        else valid_mask.to(device=base_logits.device, dtype=torch.bool)
    )
    n_valid = max(int(valid.sum().item()), 1)
    blocks = valid.any(dim=1)
    n_blocks = max(int(blocks.sum().item()), 1)
    valid_per_slot = valid.sum(dim=0).clamp(min=1)
    with torch.no_grad():
        sequential, time_sequential = _timed(lambda: sequential_decode(base_logits, head, first_prev, hidden, d2t=d2t))
        report = EquivalenceReport(
            ks=tuple(int(k) for k in ks),
            effective_k={},
            coverage={},
            agreement={},
            agreement_per_slot={},
            agreed_prefix={},
            time_walk_s={},
            time_sequential_s=time_sequential,
            num_blocks=int(blocks.sum().item()),
            num_valid_slots=int(valid.sum().item()),
        )
        if teacher_logprobs is not None:
            report.tau_sequential, report.greedy_tau_sequential = teacher_acceptance(
                sequential, teacher_logprobs, valid, d2t
            )
        for index, k in enumerate(report.ks):
            if stop is not None and stop():
                report.ks = report.ks[:index]
                break
            walk, time_walk = _timed(lambda k=k: selector_walk(base_logits, head, first_prev, hidden, k, d2t=d2t))
            covered = (walk.candidates == sequential[..., None]).any(dim=-1) & valid
            agree = (walk.tokens == sequential) & valid
            report.effective_k[k] = walk.candidates.shape[-1]
            report.coverage[k] = float(covered.sum().item() / n_valid)
            report.agreement[k] = float(agree.sum().item() / n_valid)
            report.agreement_per_slot[k] = (agree.sum(dim=0) / valid_per_slot).to(torch.float64).cpu()
            report.agreed_prefix[k] = float(prefix_length(agree)[blocks].sum().item() / n_blocks)
            report.time_walk_s[k] = time_walk
            if teacher_logprobs is not None:
                report.tau_walk[k], report.greedy_tau_walk[k] = teacher_acceptance(
                    walk.tokens, teacher_logprobs, valid, d2t
                )
    return report
