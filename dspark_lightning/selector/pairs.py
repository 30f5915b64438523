"""Pair scores S_t(a, b) = U_t(b) + u(a, h_t) . W2[b] over top-k candidates, for all slots in one batched matmul.

The ``hidden+prev`` gate reads a cached [V, r] previous-token table whenever autograd is off
(``precompute_prev_gate_table``; equal to the per-predecessor product up to summation order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dspark_lightning.models.markov import MarkovHead
from dspark_lightning.selector.scratch import gather_rows
from dspark_lightning.selector.topk import candidate_topk


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
    needs_hidden = head.config.kind != "vanilla"
    if needs_hidden and (hidden is None or hidden.shape != (n_rows, block, head.hidden_size)):
        got = None if hidden is None else tuple(hidden.shape)
        raise ValueError(f"hidden must be [N, B, H] = [{n_rows}, {block}, {head.hidden_size}], got {got}")


def _to_target_ids(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    return draft_ids if d2t is None else d2t[draft_ids]


def precompute_prev_gate_table(head: MarkovHead) -> torch.Tensor:
    """[V, r] table of the previous-token part of a ``hidden+prev`` gate: row a = W1[a] @ Wg[:, H:]^T.

    Passing it to ``pair_scores(..., prev_gate_table=...)`` replaces the per-predecessor r x r product by a gather.
    Recompute it whenever the head's weights change (it is a cache, not a parameter).
    """
    if head.config.kind != "gated" or head.config.gate_input != "hidden+prev":
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
    """u(a, h_t) for predecessors prev_ids [N, B, k] (target ids) against hidden [N, B, H] -> [N, B, k, r].

    Without autograd the result may live in a scratch buffer (``selector.scratch``): use it before the next call.
    """
    if head.is_path_dependent:
        raise ValueError(
            "the rnn Markov head is path dependent: its bias depends on the whole drafted prefix through a carried "
            "state, so no k x k pair-score precompute exists; decode it with sequential_decode instead"
        )
    prev_embedding = gather_rows(head.markov_w1.weight, prev_ids, "w1_rows")  # = head.markov_w1(prev_ids)
    if head.config.kind == "vanilla":
        return prev_embedding
    if head.config.gate_input == "hidden":  # the gate depends on the slot only: one evaluation per slot
        return prev_embedding * head.gate(hidden[:, :, None, :], prev_embedding)
    weight = head.gate_proj.weight  # [r, H + r], input order [h ; W1[a]]
    if prev_gate_table is None and not torch.is_grad_enabled():
        prev_gate_table = _cached_prev_gate_table(head)
    elif prev_gate_table is False:  # the caller asked for the per-predecessor product
        prev_gate_table = None
    if prev_gate_table is not None:
        pre = gather_rows(prev_gate_table, prev_ids, "gate_rows")  # [N, B, k, r], not a view of the table: add into
    else:
        pre = F.linear(prev_embedding, weight[:, head.hidden_size :])
    pre += F.linear(hidden, weight[:, : head.hidden_size], head.gate_proj.bias)[:, :, None, :]
    if torch.is_grad_enabled() and (pre.requires_grad or prev_embedding.requires_grad):
        gate = torch.sigmoid(pre) if head.config.gate_activation == "sigmoid" else pre
        return prev_embedding * gate
    # no autograd graph: reuse the [N, B, k, r] buffer (saves two large allocations per call on CPU)
    gate = pre.sigmoid_() if head.config.gate_activation == "sigmoid" else pre
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
    successor_rows = gather_rows(head.markov_w2.weight, candidates, "w2_rows")  # [N, B, k, r]
    bias = torch.matmul(features, successor_rows.transpose(-1, -2))  # [N, B, k(pred), k(cand)]
    return candidates, candidate_logits[:, :, None, :] + bias
