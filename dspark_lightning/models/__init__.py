"""Plain ``nn.Module`` components of a DSpark drafter (no Lightning in this package)."""

from dspark_lightning.models.confidence import ConfidenceHead
from dspark_lightning.models.markov import MarkovHead, MarkovHeadConfig

__all__ = ["ConfidenceHead", "MarkovHead", "MarkovHeadConfig"]
