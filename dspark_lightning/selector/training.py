"""The DFlash-2 candidate loss: train the Selector directly on top-k candidate sets (docs/design/losses.md §9)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dspark_lightning.models.markov import MarkovHead
from dspark_lightning.selector.topk import candidate_topk

CANDIDATE_LOSS_RULES = ("replace_kth", "exclude")


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
