"""Draft-model losses: ``compound`` (the chunked compound loss, confidence BCE), ``terms`` (the per-term formulas and
gradients), ``position_weighting`` (static per-slot weights and D-PACE). The maths: docs/design/losses.md."""

from dspark_lightning.losses.compound import LossOutput, compound_loss, compound_loss_reference, confidence_loss
from dspark_lightning.losses.position_weighting import (
    POSITION_WEIGHTINGS,
    dpace_weights,
    position_weights,
    row_weights_for_blocks,
)
from dspark_lightning.losses.terms import (
    DEFAULT_LK_ETA,
    DEFAULT_NLA_ALPHA_MIN,
    LOSS_NAMES,
    validate_loss_options,
    validate_spec,
)

__all__ = [
    "DEFAULT_LK_ETA",
    "DEFAULT_NLA_ALPHA_MIN",
    "LOSS_NAMES",
    "POSITION_WEIGHTINGS",
    "LossOutput",
    "compound_loss",
    "compound_loss_reference",
    "confidence_loss",
    "dpace_weights",
    "position_weights",
    "row_weights_for_blocks",
    "validate_loss_options",
    "validate_spec",
]
