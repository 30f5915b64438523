"""Plain ``nn.Module`` components of a DSpark drafter and its anchor sampling (no Lightning in this package)."""

from dspark_lightning.models.anchors import Anchors
from dspark_lightning.models.backbone import BackboneConfig, DFlashBackbone, default_target_layer_ids
from dspark_lightning.models.confidence import ConfidenceHead
from dspark_lightning.models.context_cache import DraftContextCache
from dspark_lightning.models.drafter import DrafterOutput, DSparkDrafter
from dspark_lightning.models.drafter_config import DrafterConfig
from dspark_lightning.models.markov import MarkovHead, MarkovHeadConfig
from dspark_lightning.models.target import FrozenTarget, TargetFeatures, load_causal_lm
from dspark_lightning.models.teacher import TeacherStats
from dspark_lightning.models.vocab import DraftVocab

__all__ = [
    "Anchors",
    "BackboneConfig",
    "ConfidenceHead",
    "DFlashBackbone",
    "DSparkDrafter",
    "DraftContextCache",
    "DraftVocab",
    "DrafterConfig",
    "DrafterOutput",
    "FrozenTarget",
    "MarkovHead",
    "MarkovHeadConfig",
    "TargetFeatures",
    "TeacherStats",
    "default_target_layer_ids",
    "load_causal_lm",
]
