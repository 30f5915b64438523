"""The decode modes: how a drafted block becomes tokens, and which modes a drafter's Markov head supports."""

from __future__ import annotations

import torch

from dspark_lightning.models.drafter import DSparkDrafter
from dspark_lightning.models.markov import MarkovHead
from dspark_lightning.selector import selector_walk, sequential_walk

MODES = ("parallel", "markov", "selector")
"""``parallel``: argmax / sample of the base logits (pure DFlash); ``markov``: sequential full-vocabulary Markov
decode (the head as trained); ``selector``: top-k walk over precomputed k x k pair scores."""


def supported_modes(head: MarkovHead | None) -> tuple[str, ...]:
    """The subset of ``MODES`` (in that order) that ``speculative_generate`` can run with this head.

    No head (pure DFlash): ``parallel`` only. The path-dependent rnn head has no k x k pair scores, so no Selector
    walk: ``parallel`` and ``markov``. Vanilla and gated heads: all three.
    """
    if head is None:
        return ("parallel",)
    if head.is_path_dependent:
        return tuple(m for m in MODES if m != "selector")
    return MODES


def draft_block(
    drafter: DSparkDrafter,
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchor: torch.Tensor,
    mode: str,
    k: int,
    temperature: float,
    generator: torch.Generator | None,
):
    """Decode one drafted block [1, B', Vd] -> (target ids [B'], q over the draft vocab [B', Vd] or None)."""
    head = drafter.markov_head if mode != "parallel" else None
    d2t = drafter.d2t
    if mode == "selector":
        if drafter.markov_head is not None and drafter.markov_head.is_path_dependent:
            raise ValueError("mode='selector' needs a vanilla or gated Markov head; the rnn head is path dependent")
        walk = selector_walk(
            base_logits, head, anchor, hidden, k, temperature=temperature, generator=generator, d2t=d2t
        )
        tokens, q = walk.tokens, (walk.full_probs() if temperature > 0 else None)
    else:
        walk = sequential_walk(base_logits, head, anchor, hidden, temperature=temperature, generator=generator, d2t=d2t)
        tokens, q = walk.tokens, (walk.probs if temperature > 0 else None)
    target_ids = tokens[0] if d2t is None else d2t[tokens[0]]
    return target_ids, (q[0] if q is not None else None)
