"""The Selector view of the Markov head: top-k candidate sets, k x k pair scores, and a cheap walk.

Design, the package's modules and its conventions (draft indices, target-id predecessors, ``head=None``):
docs/design/design.md §6."""

from dspark_lightning.selector.convert import candidate_selector_scores, from_candidate_selector, to_candidate_selector
from dspark_lightning.selector.diagnostics import EquivalenceReport, equivalence_report, teacher_acceptance
from dspark_lightning.selector.pairs import pair_scores, precompute_prev_gate_table
from dspark_lightning.selector.topk import candidate_topk
from dspark_lightning.selector.training import CandidateLossStats, candidate_loss
from dspark_lightning.selector.walks import (
    SelectorWalk,
    SequentialWalk,
    selector_decode,
    selector_walk,
    sequential_decode,
    sequential_walk,
    walk_pair_scores,
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
