"""Weight conversion between a DFlash-2 form Markov head and the DFlash-2 CandidateSelector layout.

Why the two are the same and the state-dict keys: docs/design/design.md §6.4."""

from __future__ import annotations

import torch

from dspark_lightning.models.markov import MarkovHead

DEFAULT_PREFIX = "candidate_selector."
PREDECESSOR_KEY = "predecessor_codebook"
SUCCESSOR_KEY = "successor_codebook"
HIDDEN_PROJECTION_KEY = "hidden_projection.weight"


def _check_dflash2_form(head: MarkovHead) -> None:
    if not head.config.is_selector_form or head.gate_proj.bias is not None:
        raise ValueError(
            "only a MarkovHead(kind='gated', gate_input='hidden', gate_activation='identity') without gate bias "
            f"has the DFlash-2 CandidateSelector form; got kind={head.config.kind!r}, "
            f"gate_input={head.config.gate_input!r}, gate_activation={head.config.gate_activation!r}"
        )


def to_candidate_selector(
    head: MarkovHead, *, prefix: str = DEFAULT_PREFIX, d2t: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Export a DFlash-2 form head as a CandidateSelector state dict (detached copies; docs/design/design.md §6.4)."""
    _check_dflash2_form(head)
    successor = head.markov_w2.weight.detach().clone()
    if d2t is not None:
        if d2t.shape != (head.draft_vocab_size,):
            raise ValueError(f"d2t must have shape [{head.draft_vocab_size}], got {tuple(d2t.shape)}")
        full = successor.new_zeros(head.verifier_vocab_size, head.config.rank)
        successor = full.index_copy_(0, d2t.to(successor.device), successor)
    return {
        prefix + PREDECESSOR_KEY: head.markov_w1.weight.detach().clone(),
        prefix + SUCCESSOR_KEY: successor,
        prefix + HIDDEN_PROJECTION_KEY: head.gate_proj.weight.detach().clone(),
    }


def _find(state: dict[str, torch.Tensor], prefix: str | None, name: str, accept_weight_suffix: bool) -> torch.Tensor:
    suffixes = (name, name + ".weight") if accept_weight_suffix else (name,)
    if prefix is not None:
        for suffix in suffixes:
            if prefix + suffix in state:
                return state[prefix + suffix]
        raise KeyError(f"CandidateSelector state has no {' or '.join(prefix + s for s in suffixes)}")
    matches = [key for key in state if any(key == s or key.endswith("." + s) for s in suffixes)]
    if len(matches) != 1:
        found = "none" if not matches else ", ".join(sorted(matches))
        raise KeyError(f"expected exactly one CandidateSelector key ending in {suffixes[0]!r}; found {found}")
    return state[matches[0]]


def read_candidate_selector(
    state: dict[str, torch.Tensor], *, prefix: str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(predecessor codebook [V, r], successor codebook [V or Vd, r], hidden projection [r, H]) from a state dict."""
    predecessor = _find(state, prefix, PREDECESSOR_KEY, accept_weight_suffix=True)
    successor = _find(state, prefix, SUCCESSOR_KEY, accept_weight_suffix=True)
    projection = _find(state, prefix, HIDDEN_PROJECTION_KEY, accept_weight_suffix=False)
    rank = predecessor.shape[1]
    if predecessor.dim() != 2 or successor.dim() != 2 or projection.dim() != 2:
        raise ValueError("CandidateSelector codebooks and hidden projection must be 2-D")
    if successor.shape[1] != rank or projection.shape[0] != rank:
        raise ValueError(
            f"CandidateSelector ranks disagree: predecessor {tuple(predecessor.shape)}, successor "
            f"{tuple(successor.shape)}, hidden projection {tuple(projection.shape)}"
        )
    return predecessor, successor, projection


def from_candidate_selector(
    state: dict[str, torch.Tensor], *, prefix: str | None = None, d2t: torch.Tensor | None = None
) -> MarkovHead:
    """Build the equivalent ``MarkovHead(gated, gate_input="hidden", gate_activation="identity")``.

    Sizes come from the tensors: V = predecessor rows, r, H = hidden projection columns. The draft vocabulary is
    the successor codebook's rows, or ``len(d2t)`` when ``d2t`` is given (then a [V, r] successor codebook is
    gathered through it; a [Vd, r] one is taken as is). The head has the dtype and device of the state.
    """
    predecessor, successor, projection = read_candidate_selector(state, prefix=prefix)
    verifier_vocab, rank = predecessor.shape
    if d2t is not None and successor.shape[0] != d2t.shape[0]:
        if successor.shape[0] != verifier_vocab:
            raise ValueError(
                f"successor codebook has {successor.shape[0]} rows: expected Vd = {d2t.shape[0]} or V = {verifier_vocab}"
            )
        successor = successor[d2t.to(successor.device)]
    head = MarkovHead(
        verifier_vocab_size=verifier_vocab,
        draft_vocab_size=successor.shape[0],
        rank=rank,
        hidden_size=projection.shape[1],
        kind="gated",
        gate_input="hidden",
        gate_activation="identity",
    ).to(device=predecessor.device, dtype=predecessor.dtype)
    with torch.no_grad():
        head.markov_w1.weight.copy_(predecessor)
        head.markov_w2.weight.copy_(successor)
        head.gate_proj.weight.copy_(projection)
    return head


def candidate_selector_scores(
    state: dict[str, torch.Tensor],
    base_logits: torch.Tensor,
    first_prev: torch.Tensor,
    hidden: torch.Tensor,
    k: int,
    *,
    d2t: torch.Tensor | None = None,
    prefix: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """S_t(a, b) = U_t(b) + <A(a) * H(h_t), B(b)> computed directly from CandidateSelector weights.

    Same contract as ``selector.pair_scores``: candidates [N, B, k] = top-k of base_logits [N, B, Vd] (draft
    indices), scores [N, B, k, k] with predecessors a = first_prev (t = 0) or the previous slot's candidates mapped
    through d2t; a [V, r] successor codebook is indexed through d2t as well.
    """
    predecessor, successor, projection = read_candidate_selector(state, prefix=prefix)
    n_rows, _, vocab = base_logits.shape
    k = min(int(k), vocab)
    unary, candidates = base_logits.topk(k, dim=-1)
    candidate_ids = candidates if d2t is None else d2t[candidates]
    predecessor_ids = torch.cat((first_prev[:, None, None].expand(n_rows, 1, k), candidate_ids[:, :-1]), dim=1)
    successor_rows = successor[candidates] if successor.shape[0] == vocab else successor[candidate_ids]
    context = predecessor[predecessor_ids] * (hidden @ projection.T)[:, :, None, :]  # A(a) * H(h_t)
    return candidates, unary[:, :, None, :] + torch.einsum("nbir,nbjr->nbij", context, successor_rows)
