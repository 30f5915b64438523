"""Speculative decoding with a DSpark drafter: the measured loop, its statistics, the step cost model and the
wall-clock comparison with the target generating alone."""

from dspark_lightning.decoding.cost import best_verify_length, measure_verify_cost
from dspark_lightning.decoding.loop import speculative_generate
from dspark_lightning.decoding.modes import MODES, draft_block, supported_modes
from dspark_lightning.decoding.schedule import prefix_survival, scheduled_length
from dspark_lightning.decoding.speedup import measure_speedup
from dspark_lightning.decoding.stats import PHASES, DecodeStats
from dspark_lightning.decoding.verify import verify_block

__all__ = [
    "MODES",
    "PHASES",
    "DecodeStats",
    "best_verify_length",
    "draft_block",
    "measure_speedup",
    "measure_verify_cost",
    "prefix_survival",
    "scheduled_length",
    "speculative_generate",
    "supported_modes",
    "verify_block",
]
