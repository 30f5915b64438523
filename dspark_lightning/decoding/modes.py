"""Which decode modes a drafter supports, decided by its Markov head alone."""

from __future__ import annotations

from dspark_lightning.decoding.loop import MODES
from dspark_lightning.models.markov import MarkovHead


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
