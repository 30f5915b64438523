"""Speculative decoding with a DSpark drafter: the loop (``loop``), how each mode drafts a block (``modes``), the
verify rule (``verify``), the target's forwards and caches, and the statistics one decode records (``stats``).
Measuring what it achieves (speedup, tables, intervals, the gap) lives in ``measuring/``."""

from dspark_lightning.decoding.loop import speculative_generate
from dspark_lightning.decoding.modes import MODES, draft_block, supported_modes
from dspark_lightning.decoding.schedule import prefix_survival, scheduled_length
from dspark_lightning.decoding.stats import PHASES, DecodeStats
from dspark_lightning.decoding.verify import verify_block

__all__ = [
    "MODES",
    "PHASES",
    "DecodeStats",
    "draft_block",
    "prefix_survival",
    "scheduled_length",
    "speculative_generate",
    "supported_modes",
    "verify_block",
]
