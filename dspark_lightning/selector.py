"""The Selector view of the Markov head: top-k candidate sets, k x k pair scores, and a cheap walk.

A DFlash-2 Selector is a gated Markov head executed on top-k candidate sets, and any trained vanilla or gated head can
be executed the same way without retraining (docs/design.md §6): candidates C_t = top-k(U_t), pair scores
S_t(a, b) = U_t(b) + u(a, h_t) . W2[b] for all slots at once (``pair_scores``, one batched matmul, no Python loop over
slots or candidates), then a walk over the B slots (``walk_pair_scores``). ``sequential_decode`` is the reference
(full vocabulary, ``head.step_bias``); with k = Vd both agree, and ``equivalence_report`` measures the gap for k < Vd.

Conventions: candidates and returned tokens are draft indices; predecessors fed to the head are target ids (through
``d2t``, ``None`` = identity). ``head=None`` (pure DFlash) is allowed everywhere; the path-dependent rnn head has no
pair scores (``pair_scores`` raises; use ``sequential_decode``). Walks return their draft distribution q (one-hot when
greedy) for lossless rejection sampling. ``candidate_loss`` trains the Selector directly (docs/losses.md §9); weight
conversion to and from the CandidateSelector layout lives in ``dspark_lightning.selector_convert`` and is re-exported
here.
Speed at batch: candidates come from ``candidate_topk`` (exact top-k, searched in stages over strided groups for
large vocabularies), and the ``hidden+prev`` gate reads a cached [V, r] previous-token table whenever autograd is off
(``precompute_prev_gate_table``; equal to the per-predecessor product up to summation order).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dspark_lightning.metrics import block_tau, greedy_block_tau, prefix_length
from dspark_lightning.models.markov import MarkovHead
from dspark_lightning.selector_convert import (
    candidate_selector_scores,
    from_candidate_selector,
    to_candidate_selector,
)

__all__ = [
    "CandidateLossStats",
    "EquivalenceReport",
    "SelectorWalk",
    "SequentialWalk",
    "candidate_loss",
    "candidate_selector_scores",
    "candidate_topk",
    "equivalence_report",
    "from_candidate_selector",
    "pair_scores",
    "precompute_prev_gate_table",
    "selector_decode",
    "selector_walk",
    "sequential_decode",
    "sequential_walk",
    "teacher_acceptance",
    "to_candidate_selector",
    "walk_pair_scores",
]

CANDIDATE_LOSS_RULES = ("replace_kth", "exclude")


# ---------------------------------------------------------------------------------------------------- checks
def _check_inputs(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    d2t: torch.Tensor | None,
) -> None:
    if base_logits.dim() != 3:
        raise ValueError(f"base_logits must be [N, B, Vd], got shape {tuple(base_logits.shape)}")
    n_rows, block, vocab = base_logits.shape
    if first_prev.shape != (n_rows,):
        raise ValueError(f"first_prev must be [N] = [{n_rows}], got shape {tuple(first_prev.shape)}")
    if d2t is not None and d2t.shape != (vocab,):
        raise ValueError(
            f"d2t must map every draft index to a target id: expected shape [{vocab}], got {tuple(d2t.shape)}"
        )
    if head is None:
        return
    if head.draft_vocab_size != vocab:
        raise ValueError(f"base_logits have {vocab} draft-vocab entries but the head has {head.draft_vocab_size}")
    if d2t is None and head.verifier_vocab_size != head.draft_vocab_size:
        raise ValueError(
            "the head has a draft vocab smaller than its target vocab: pass d2t (draft index -> target id)"
        )
    needs_hidden = head.head_type != "vanilla"
    if needs_hidden and (hidden is None or hidden.shape != (n_rows, block, head.hidden_size)):
        got = None if hidden is None else tuple(hidden.shape)
        raise ValueError(f"hidden must be [N, B, H] = [{n_rows}, {block}, {head.hidden_size}], got {got}")


def _to_target_ids(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    return draft_ids if d2t is None else d2t[draft_ids]


def _check_temperature(temperature: float) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")


# ---------------------------------------------------------------------------------------------------- top-k
def _topk_chunk_size(vocab: int, k: int) -> int | None:
    """Power-of-two chunk (dividing Vd) for the contiguous-chunk search, or None to use ``torch.topk``."""
    target = 2.0 * math.sqrt(vocab / k)  # minimises ~ Vd / c + k * c scanned by the two small top-k calls
    chunk = 1
    while chunk * 2 <= target and vocab % (chunk * 2) == 0:
        chunk *= 2
    return chunk if chunk >= 8 and vocab // chunk >= 2 * k else None


def _topk_plan(vocab: int, k: int) -> tuple[str, int, int] | None:
    """How ``candidate_topk`` searches a row: ``("strided", c1, c2)``, ``("chunks", c, 1)`` or None (``torch.topk``).

    Strided groups of c1 = 16 entries (G1 = Vd / 16 group maxima, then G2 = G1 / c2 supergroups) when G1 <= 4096:
    their maxima are one vectorised elementwise max and the final gather touches only k * 16 scattered entries. Larger
    vocabularies use contiguous chunks (maxima of c neighbours, then the best k chunks): a strided final gather of
    k * c entries there costs more in cache misses than it saves (measured at Vd = 152k vs 32k, batch 32).
    """
    if vocab < 8192:
        return None
    c1 = 16
    if vocab % c1 == 0 and vocab // c1 <= 4096:
        groups, best = vocab // c1, None
        c2 = 1
        while groups % c2 == 0 and groups // c2 >= 2 * k:
            cost = groups // c2 + k * c2  # entries scanned by the two top-k calls before the final one
            if best is None or cost < best[0]:
                best = (cost, c2)
            c2 *= 2
        if best is not None:
            return ("strided", c1, best[1])
    chunk = _topk_chunk_size(vocab, k)
    return ("chunks", chunk, 1) if chunk is not None else None


def candidate_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k along the last dim, (values, indices) sorted by decreasing value, like ``torch.topk``.

    For large vocabularies it searches in stages over a partition of the row: the k groups with the largest maxima
    hold every top-k value (a group holding a top-k entry has a maximum at least as large, and at most k groups can),
    so the top-k of their entries is the answer. Groups are strided (group g = entries g, g + G, g + 2G, ...: their
    maxima are an elementwise max over c contiguous rows of G entries, one vectorised pass, and the same argument is
    applied again to supergroups of group maxima) or, for the largest vocabularies, contiguous chunks (see
    ``_topk_plan``). Either way the row is scanned once by a cheap max instead of the (much slower per element on
    CPU) top-k over all of Vd. Values equal ``torch.topk``'s; among exactly tied values the chosen indices may differ (``torch.topk`` leaves
    tie order unspecified as well).
    """
    vocab = logits.shape[-1]
    k = min(int(k), vocab)
    plan = _topk_plan(vocab, k)
    if plan is None:
        return logits.topk(k, dim=-1)
    kind, c1, c2 = plan
    lead = logits.shape[:-1]
    if kind == "chunks":  # contiguous chunks of c1 neighbours
        maxima = logits.reshape(*lead, vocab // c1, c1).amax(dim=-1)
        top_chunks = maxima.topk(k, dim=-1, sorted=False).indices
        indices = (top_chunks[..., None] * c1 + torch.arange(c1, device=logits.device)).reshape(*lead, k * c1)
        values, order = logits.gather(-1, indices).topk(k, dim=-1)
        return values, indices.gather(-1, order)
    groups = vocab // c1
    maxima = logits.reshape(*lead, c1, groups).amax(dim=-2)  # [..., G1]: group g = {g + G1 * j}
    if c2 > 1:
        supergroups = groups // c2
        top_super = maxima.reshape(*lead, c2, supergroups).amax(dim=-2).topk(k, dim=-1, sorted=False).indices
        group_ids = (top_super[..., None] + torch.arange(0, groups, supergroups, device=logits.device)).flatten(-2)
        top_groups = group_ids.gather(-1, maxima.gather(-1, group_ids).topk(k, dim=-1, sorted=False).indices)
    else:
        top_groups = maxima.topk(k, dim=-1, sorted=False).indices
    indices = (top_groups[..., None] + torch.arange(0, vocab, groups, device=logits.device)).flatten(-2)
    values, order = logits.gather(-1, indices).topk(k, dim=-1)
    return values, indices.gather(-1, order)


# ---------------------------------------------------------------------------------------------------- pair scores
def precompute_prev_gate_table(head: MarkovHead) -> torch.Tensor:
    """[V, r] table of the previous-token part of a ``hidden+prev`` gate: row a = W1[a] @ Wg[:, H:]^T.

    Passing it to ``pair_scores(..., prev_gate_table=...)`` replaces the per-predecessor r x r product by a gather.
    Recompute it whenever the head's weights change (it is a cache, not a parameter).
    """
    if head.head_type != "gated" or head.gate_input != "hidden+prev":
        raise ValueError("a previous-token gate table exists only for a gated head with gate_input='hidden+prev'")
    with torch.no_grad():
        return F.linear(head.markov_w1.weight, head.gate_proj.weight[:, head.hidden_size :])


def _cached_prev_gate_table(head: MarkovHead) -> torch.Tensor | None:
    """``precompute_prev_gate_table(head)``, kept on the head and rebuilt when W1 or the gate weight change.

    Inference (no autograd) uses it by default: the same products W1[a] . Wg[:, H:] as the per-predecessor matmul,
    computed once per token instead of once per (row, slot, candidate).
    """
    w1, gate = head.markov_w1.weight, head.gate_proj.weight
    if w1.is_inference() or gate.is_inference():
        return None  # inference tensors have no version counter: no safe cache key, use the per-predecessor product
    key = (w1.data_ptr(), w1._version, gate.data_ptr(), gate._version, w1.dtype, w1.device)
    cached = head.__dict__.get("_prev_gate_table_cache")
    if cached is None or cached[0] != key:
        with torch.inference_mode(False), torch.no_grad():
            cached = (key, precompute_prev_gate_table(head))
        head.__dict__["_prev_gate_table_cache"] = cached
    return cached[1]


def _pair_transition_features(
    head: MarkovHead,
    prev_ids: torch.Tensor,
    hidden: torch.Tensor | None,
    prev_gate_table: torch.Tensor | None | bool = None,
) -> torch.Tensor:
    """u(a, h_t) for predecessors prev_ids [N, B, k] (target ids) against hidden [N, B, H] -> [N, B, k, r]."""
    if head.is_path_dependent:
        raise ValueError(
            "the rnn Markov head is path dependent: its bias depends on the whole drafted prefix through a carried "
            "state, so no k x k pair-score precompute exists; decode it with sequential_decode instead"
        )
    prev_embedding = head.markov_w1(prev_ids)
    if head.head_type == "vanilla":
        return prev_embedding
    if head.gate_input == "hidden":  # the gate depends on the slot only: one evaluation per slot
        return prev_embedding * head.gate(hidden[:, :, None, :], prev_embedding)
    weight = head.gate_proj.weight  # [r, H + r], input order [h ; W1[a]]
    if prev_gate_table is None and not torch.is_grad_enabled():
        prev_gate_table = _cached_prev_gate_table(head)
    elif prev_gate_table is False:  # the caller asked for the per-predecessor product
        prev_gate_table = None
    if prev_gate_table is not None:
        pre = F.embedding(prev_ids, prev_gate_table)  # [N, B, k, r], a fresh tensor: safe to add into in place
    else:
        pre = F.linear(prev_embedding, weight[:, head.hidden_size :])
    pre += F.linear(hidden, weight[:, : head.hidden_size], head.gate_proj.bias)[:, :, None, :]
    if torch.is_grad_enabled() and (pre.requires_grad or prev_embedding.requires_grad):
        gate = torch.sigmoid(pre) if head.gate_activation == "sigmoid" else pre
        return prev_embedding * gate
    # no autograd graph: reuse the [N, B, k, r] buffer (saves two large allocations per call on CPU)
    gate = pre.sigmoid_() if head.gate_activation == "sigmoid" else pre
    return gate.mul_(prev_embedding)


def pair_scores(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    k: int,
    *,
    d2t: torch.Tensor | None = None,
    prev_gate_table: torch.Tensor | None | bool = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k candidates per slot and the scores of every adjacent (predecessor, candidate) pair.

    Args:
        base_logits: [N, B, Vd] base logits U of the draft backbone.
        head: a vanilla or gated ``MarkovHead``, or ``None`` (scores are then the base logits broadcast).
        first_prev: [N] target-vocab id of slot 0's previous token (the anchor).
        hidden: [N, B, H] draft hidden states (unused by vanilla heads and ``None``; may be ``None`` there).
        k: candidates per slot; clamped to Vd.
        d2t: optional [Vd] draft index -> target id map for the predecessor candidates (``None``: identity).
        prev_gate_table: ``precompute_prev_gate_table(head)`` for gated ``hidden+prev`` heads; ``None`` (default)
            uses one cached on the head whenever autograd is off (a [V, r] tensor, rebuilt when the weights change),
            ``False`` the per-predecessor r x r product.

    Returns:
        candidates [N, B, k] (draft indices, ordered by decreasing base logit) and scores [N, B, k, k] with
        ``scores[n, t, i, j] = U_t(c_{t,j}) + u(c_{t-1,i}, h_t) . W2[c_{t,j}]``; for t = 0 every row i uses
        ``first_prev``.
    """
    _check_inputs(base_logits, head, first_prev, hidden, d2t)
    n_rows, block, vocab = base_logits.shape
    k = min(int(k), vocab)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    candidate_logits, candidates = candidate_topk(base_logits, k)
    if head is None:
        return candidates, candidate_logits[:, :, None, :].expand(n_rows, block, k, k)
    predecessors = torch.cat(
        (first_prev[:, None, None].expand(n_rows, 1, k), _to_target_ids(candidates[:, :-1], d2t)), dim=1
    )
    features = _pair_transition_features(head, predecessors, hidden, prev_gate_table)  # [N, B, k, r]
    successor_rows = F.embedding(candidates, head.markov_w2.weight)  # [N, B, k, r] (index_select: fast gather)
    bias = torch.matmul(features, successor_rows.transpose(-1, -2))  # [N, B, k(pred), k(cand)]
    return candidates, candidate_logits[:, :, None, :] + bias


# ---------------------------------------------------------------------------------------------------- walks
def _choose(row_logits: torch.Tensor, temperature: float, generator: torch.Generator | None):
    """Greedy (T = 0) or sampled choice along the last dim -> (index [N], sampling distribution [N, m] or None).

    Greedy choices return ``None`` for the distribution: callers build the one-hot q once, after the loop.
    """
    if temperature == 0:
        return row_logits.argmax(dim=-1), None
    probs = torch.softmax(row_logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1), probs


def _distributions(choices: torch.Tensor, probs: list[torch.Tensor], size: int, dtype: torch.dtype) -> torch.Tensor:
    """Stack per-slot sampling distributions, or the one-hot of greedy choices [N, B] -> [N, B, size]."""
    if probs:
        return torch.stack(probs, dim=1)
    return F.one_hot(choices, size).to(dtype)


@dataclass
class SelectorWalk:
    """What the Selector walk drafted.

    tokens [N, B]: draft-vocab indices; choices [N, B]: index of the chosen candidate in ``candidates``;
    candidates [N, B, k]; path_scores [N, B, k]: S_t(x_{t-1}, .) along the walked path (logits over C_t);
    probs [N, B, k]: the draft distribution q over C_t actually used (one-hot when greedy, else
    softmax(path_scores / T)); vocab_size: Vd.
    """

    tokens: torch.Tensor
    choices: torch.Tensor
    candidates: torch.Tensor
    path_scores: torch.Tensor
    probs: torch.Tensor
    vocab_size: int

    def full_probs(self) -> torch.Tensor:
        """q scattered over the whole draft vocabulary: [N, B, Vd], zero outside the candidate sets."""
        shape = (*self.candidates.shape[:2], self.vocab_size)
        return self.probs.new_zeros(shape).scatter_(-1, self.candidates, self.probs)


def walk_pair_scores(
    candidates: torch.Tensor,
    scores: torch.Tensor,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> SelectorWalk:
    """The sequential part of the Selector: walk precomputed ``pair_scores`` slot by slot (B cheap gathers)."""
    _check_temperature(temperature)
    n_rows, block, k = candidates.shape
    choices, path_scores, probs = [], [], []
    previous = torch.zeros(n_rows, dtype=torch.long, device=candidates.device)  # slot 0: all rows are equal
    rows = torch.arange(n_rows, device=candidates.device)
    for slot in range(block):
        # advanced indexing, not gather: on CPU a gather over the strided [N, k, k] slice is ~10x slower
        row = scores[rows, slot, previous]
        previous, slot_probs = _choose(row, temperature, generator)
        choices.append(previous)
        path_scores.append(row)
        if slot_probs is not None:
            probs.append(slot_probs)
    choices_t = torch.stack(choices, dim=1)
    return SelectorWalk(
        tokens=candidates.gather(-1, choices_t[..., None]).squeeze(-1),
        choices=choices_t,
        candidates=candidates,
        path_scores=torch.stack(path_scores, dim=1),
        probs=_distributions(choices_t, probs, k, scores.dtype),
        vocab_size=int(vocab_size if vocab_size is not None else candidates.max().item() + 1),
    )


def selector_walk(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    k: int,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    d2t: torch.Tensor | None = None,
    prev_gate_table: torch.Tensor | None | bool = None,
) -> SelectorWalk:
    """``pair_scores`` then the walk; returns tokens plus the per-slot draft distributions over the candidates."""
    candidates, scores = pair_scores(base_logits, head, first_prev, hidden, k, d2t=d2t, prev_gate_table=prev_gate_table)
    return walk_pair_scores(
        candidates, scores, temperature=temperature, generator=generator, vocab_size=base_logits.shape[-1]
    )


def selector_decode(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    k: int,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    d2t: torch.Tensor | None = None,
    prev_gate_table: torch.Tensor | None | bool = None,
) -> torch.Tensor:
    """Selector decode of a block: tokens [N, B] (draft-vocab indices). See ``selector_walk`` for the details."""
    return selector_walk(
        base_logits,
        head,
        first_prev,
        hidden,
        k,
        temperature=temperature,
        generator=generator,
        d2t=d2t,
        prev_gate_table=prev_gate_table,
    ).tokens


@dataclass
class SequentialWalk:
    """What the sequential (full-vocabulary) Markov decode drafted.

    tokens [N, B] (draft indices); logits [N, B, Vd]: U_t + bias_t(x_{t-1}) along the decoded path; probs [N, B, Vd]:
    the draft distribution q used at each slot (one-hot when greedy, else softmax(logits / T)).
    """

    tokens: torch.Tensor
    logits: torch.Tensor
    probs: torch.Tensor


def _sequential(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None,
    d2t: torch.Tensor | None,
    keep_distributions: bool,
) -> torch.Tensor | SequentialWalk:
    _check_temperature(temperature)
    _check_inputs(base_logits, head, first_prev, hidden, d2t)
    state = None
    prev = first_prev
    tokens, logits_per_slot, probs_per_slot = [], [], []
    for slot in range(base_logits.shape[1]):
        logits = base_logits[:, slot]
        if head is not None:
            bias, state = head.step_bias(prev, None if hidden is None else hidden[:, slot], state)
            logits = logits + bias
        token, probs = _choose(logits, temperature, generator)
        tokens.append(token)
        if keep_distributions:
            logits_per_slot.append(logits)
            if probs is not None:
                probs_per_slot.append(probs)
        prev = _to_target_ids(token, d2t)
    tokens_t = torch.stack(tokens, dim=1)
    if not keep_distributions:
        return tokens_t
    logits_t = torch.stack(logits_per_slot, dim=1)
    return SequentialWalk(
        tokens_t, logits_t, _distributions(tokens_t, probs_per_slot, logits_t.shape[-1], logits_t.dtype)
    )


def sequential_decode(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    d2t: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference decode: slot by slot, x_t = argmax (or a sample at T > 0) of U_t + bias_t(x_{t-1}) over all of Vd.

    Works for every head type (the rnn state is carried across slots) and ``head=None``. Returns tokens [N, B]
    (draft indices); ``first_prev`` is a target id and drafted tokens are fed back through ``d2t``.
    """
    return _sequential(base_logits, head, first_prev, hidden, temperature, generator, d2t, keep_distributions=False)


def sequential_walk(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    d2t: torch.Tensor | None = None,
) -> SequentialWalk:
    """``sequential_decode`` that also returns the calibrated logits and the draft distribution q per slot."""
    return _sequential(base_logits, head, first_prev, hidden, temperature, generator, d2t, keep_distributions=True)


# ---------------------------------------------------------------------------------------------------- diagnostics
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
) -> EquivalenceReport:
    """Measure how close the top-k Selector walk is to the sequential Markov decode (both greedy).

    Runs the sequential decode once and ``selector_walk`` once per k (k > Vd is clamped to Vd), under
    ``torch.no_grad``. ``valid_mask`` [N, B] (default all valid) restricts every statistic to valid slots; a
    prefix stops at the first invalid slot. With ``teacher_logprobs`` ([N, B, Vd] or [N, B, V]) it adds tau and
    greedy_tau of both decodes (see ``teacher_acceptance``). Raises for the rnn head (no walk exists for it).
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
        for k in report.ks:
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


# ---------------------------------------------------------------------------------------------------- training
@dataclass
class CandidateLossStats:
    """Counts behind ``candidate_loss`` (sums, so that distributed reduction is exact).

    recall = num_in_topk / num_valid is candidate_recall@k: the fraction of valid slots whose true token is among
    the top-k of the base logits. num_trained: slots that contributed to the loss.
    """

    recall: torch.Tensor
    num_valid: torch.Tensor
    num_in_topk: torch.Tensor
    num_trained: torch.Tensor


def candidate_loss(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    prev_tokens: torch.Tensor,
    hidden: torch.Tensor | None,
    target_tokens: torch.Tensor,
    k: int,
    valid_mask: torch.Tensor | None = None,
    rule: str = "replace_kth",
) -> tuple[torch.Tensor, CandidateLossStats]:
    """DFlash-2 candidate loss: cross-entropy over each slot's top-k candidates scored with the true previous token.

    Scores are U_t(c) + u(prev_true_t, h_t) . W2[c] for c in C_t = top-k(U_t) (teacher forcing, so no walk and no
    k x k matrix are needed). Gradients reach the base logits and the head; the candidate *selection* is discrete.

    Args:
        base_logits: [N, B, Vd]; prev_tokens: [N, B] true previous tokens (target ids); hidden: [N, B, H];
        target_tokens: [N, B] true tokens (draft indices; -1 = outside a reduced draft vocabulary, never trained);
            valid_mask: [N, B] (default all valid).
        rule: what to do where the true token is not in the top-k.
            ``"replace_kth"`` (default, the DFlash-2 reference behaviour): the true token takes the place of the
            k-th (lowest) candidate, so every valid slot is trained and the loss keeps pulling a missed token's
            base logit and transition score up — which is what raises the recall the walk depends on.
            ``"exclude"``: such slots are masked out; the loss then only covers slots the Selector can actually get
            right at inference, but a missed token gets no learning signal from this loss.

    Returns:
        (mean CE over trained slots — 0 with a graph when none is trained, CandidateLossStats with
        candidate_recall@k counted over valid slots either way).
    """
    if rule not in CANDIDATE_LOSS_RULES:
        raise ValueError(f"unknown candidate loss rule {rule!r}; expected one of {CANDIDATE_LOSS_RULES}")
    n_rows, block, vocab = base_logits.shape
    if prev_tokens.shape != (n_rows, block) or target_tokens.shape != (n_rows, block):
        raise ValueError(
            f"prev_tokens {tuple(prev_tokens.shape)} and target_tokens {tuple(target_tokens.shape)} must be [N, B]"
        )
    if head is not None and head.is_path_dependent:
        raise ValueError("the candidate loss scores single transitions; the path-dependent rnn head has none")
    k = min(int(k), vocab)
    valid = (
        torch.ones(n_rows, block, dtype=torch.bool, device=base_logits.device)
        if valid_mask is None
        else valid_mask.to(torch.bool)
    )
    # A true token outside a reduced draft vocabulary (draft index -1) can never be a candidate: its slot is not
    # trained, and it counts as a miss in the recall.
    in_vocab = target_tokens >= 0
    target_tokens = target_tokens.clamp(min=0)
    with torch.no_grad():
        candidates = candidate_topk(base_logits, k)[1]
        hit = (candidates == target_tokens[..., None]) & in_vocab[..., None]
        in_topk = hit.any(dim=-1)
        if rule == "replace_kth":
            candidates[..., -1] = torch.where(in_topk | ~in_vocab, candidates[..., -1], target_tokens)
            hit = (candidates == target_tokens[..., None]) & in_vocab[..., None]
            trained = valid & in_vocab
        else:
            trained = valid & in_topk
        target_index = hit.to(torch.long).argmax(dim=-1)  # 0 where the slot is not trained (masked below)
    scores = base_logits.gather(-1, candidates)
    if head is not None:
        features = head.transition_features(prev_tokens, hidden)  # [N, B, r]
        scores = scores + torch.einsum("nbr,nbjr->nbj", features, F.embedding(candidates, head.markov_w2.weight))
    per_slot = F.cross_entropy(scores.reshape(-1, k), target_index.reshape(-1), reduction="none").view(n_rows, block)
    weights = trained.to(per_slot.dtype)
    loss = (per_slot * weights).sum() / weights.sum().clamp(min=1.0)
    num_valid = valid.sum()
    num_in_topk = (in_topk & valid).sum()
    stats = CandidateLossStats(
        recall=num_in_topk.to(torch.float32) / num_valid.clamp(min=1).to(torch.float32),
        num_valid=num_valid,
        num_in_topk=num_in_topk,
        num_trained=trained.sum(),
    )
    return loss, stats
