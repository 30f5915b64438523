"""The configuration groups of ``DSparkModule``: the target, the loss and the training schedule (the drafter's own
group is ``models.DrafterConfig``). Each field is documented once, here, and LightningCLI shows it as
``--model.<group>.<field>`` (YAML ``model: {loss: {gamma: 4.0}}``).

Checkpoints store the groups as plain dicts (``as_hparams``); ``migrate_hparams`` is the one place that reads the
flat hyper-parameters written before the groups existed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from dspark_lightning.errors import OptionError
from dspark_lightning.losses import (
    DEFAULT_LK_ETA,
    DEFAULT_NLA_ALPHA_MIN,
    POSITION_WEIGHTINGS,
    validate_loss_options,
    validate_spec,
)
from dspark_lightning.models import DrafterConfig, MarkovHeadConfig
from dspark_lightning.models.anchors import ANCHOR_BUDGETS
from dspark_lightning.models.drafter import MARKOV_PREV
from dspark_lightning.selector.training import CANDIDATE_LOSS_RULES

TARGET_FEATURES = ("online", "cache")


def _check_choice(group: str, name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise OptionError(f"model.{group}.{name} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class TargetArgs:
    """The frozen target model the drafter is trained against."""

    path: str = "assets/demo-target"
    """A Hugging Face hub id or a local directory."""
    dtype: str = "auto"
    """``auto`` (the checkpoint's dtype), ``float32``, ``bfloat16`` or ``float16``."""
    trust_remote_code: bool = False
    """Allow custom modelling code from the target's repository (off by default)."""
    features: Literal["online", "cache"] = "online"
    """``online``: run the target every step; ``cache``: features come with the batch from an offline cache
    (``data.train_cache``), and only the target's embedding and LM head are loaded."""

    def __post_init__(self) -> None:
        _check_choice("target", "features", self.features, TARGET_FEATURES)


@dataclass(frozen=True)
class LossArgs:
    """The training loss: the compound distillation loss, the confidence BCE and the Selector candidate loss."""

    weights: dict[str, float] = field(default_factory=lambda: {"ce": 0.1, "tv": 0.9})
    """Compound loss weights over ``kl``, ``tv``, ``ce``, ``rkl``, ``js``, ``nla``, ``lk_hybrid`` (docs/design/losses.md)."""
    position_weighting: str = "exp"
    """Per-slot weights: ``exp`` (decay ``gamma``), ``uniform`` or ``dpace`` (from the detached acceptance)."""
    gamma: float = 4.0
    """Decay of the ``exp`` position weights."""
    lk_eta: float = DEFAULT_LK_ETA
    """Eta of the ``lk_hybrid`` weight lambda = exp(-eta * sg[alpha]) (>= 0; 0 = pure KL)."""
    nla_alpha_min: float = DEFAULT_NLA_ALPHA_MIN
    """Clamp eps of ``nla`` = -log max(alpha, eps), in (0, 1)."""
    chunk_size: int | None = None
    """Rows per loss chunk (None = automatic)."""
    confidence_alpha: float = 1.0
    """Weight of the confidence BCE term."""
    candidate_weight: float = 0.0
    """Weight of the Selector candidate loss (DFlash-2 training); 0 = off."""
    candidate_k: int = 16
    """Candidates per slot for the candidate loss and its recall metric."""
    candidate_rule: str = "replace_kth"
    """``replace_kth`` or ``exclude``: what the candidate loss does when the true token is outside the top-k."""

    def __post_init__(self) -> None:
        # a bad loss fails when the group is built (the model instantiation, a checkpoint load), before any target is read
        validate_spec(dict(self.weights))
        validate_loss_options(self.lk_eta, self.nla_alpha_min)
        _check_choice("loss", "position_weighting", self.position_weighting, POSITION_WEIGHTINGS)
        _check_choice("loss", "candidate_rule", self.candidate_rule, CANDIDATE_LOSS_RULES)
        if self.candidate_weight < 0 or self.candidate_k < 1:
            raise OptionError(
                f"model.loss.candidate_weight must be >= 0 and candidate_k >= 1, got {self.candidate_weight!r} "
                f"and {self.candidate_k!r}"
            )


@dataclass(frozen=True)
class TrainingArgs:
    """How training anchors are drawn and how the run is scheduled."""

    anchor_budget: str = "uniform"
    """``uniform`` over the row's valid positions, or ``per_document`` (each packed document gets a share
    proportional to its supervised tokens, at least one)."""
    seed: int = 0
    """Seed of the training anchor sampler (combined with the global step and the rank)."""
    val_anchor_stride: int | None = None
    """Evaluation anchors sit at in-document positions that are multiples of this (None = block_size:
    non-overlapping blocks tiling every supervised stretch)."""
    lr_warmup_steps: int = 50
    """Warm-up steps of the default warm-up + cosine schedule."""
    compile: bool = False
    """``torch.compile`` the draft backbone."""
    feature_noise_std: float = 0.0
    """Std of Gaussian noise added to the target's context features in training steps only (speculators'
    ``--noise-std 0.05``); never in validation, test or decoding. 0 = off."""
    error_replay: float = 0.0
    """Share of each row's training anchors moved to draft-induced error positions (Draft-OPD's error-position
    replay): a no-grad probe forward drafts the sampled blocks greedily, and the positions where verification
    first rejects them become anchors, as the next block of a decode is anchored there. Costs one extra forward
    without gradients per step. 0 = off (uniformly sampled anchors only)."""
    markov_prev: Literal["teacher", "own"] = "teacher"
    """What the Markov head reads as a training slot's previous token: ``teacher`` (the text) or ``own`` (the
    drafter's own greedy choice at the slot before, as in decoding: the draft-induced in-block state)."""
    init_weights: str | None = None
    """A checkpoint written by ``fit`` whose drafter weights this run starts from, as a new stage: fresh optimizer,
    schedule and step count (``--ckpt_path`` resumes a run instead, and wins over this). The drafter options
    must describe the same tensors. None = the usual initialization."""

    def __post_init__(self) -> None:
        _check_choice("training", "anchor_budget", self.anchor_budget, ANCHOR_BUDGETS)
        _check_choice("training", "markov_prev", self.markov_prev, MARKOV_PREV)
        if not 0 <= self.error_replay <= 1:
            raise OptionError(f"model.training.error_replay must be a share in [0, 1], got {self.error_replay!r}")
        if not 0 <= self.feature_noise_std < float("inf"):
            raise OptionError(
                f"model.training.feature_noise_std must be a finite number >= 0, got {self.feature_noise_std}"
            )
        if self.lr_warmup_steps < 0:
            raise OptionError(f"model.training.lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")
        if self.val_anchor_stride is not None and self.val_anchor_stride < 1:
            raise OptionError(f"model.training.val_anchor_stride must be >= 1 (or null), got {self.val_anchor_stride}")


GROUPS = {"target": TargetArgs, "drafter": DrafterConfig, "loss": LossArgs, "training": TrainingArgs}


def as_group(cls: type, value: Any):
    """``value`` as a ``cls`` instance: given as one, or as a dict (a checkpoint's plain form, a parsed group)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, dict) or hasattr(value, "as_dict"):
        return cls(**(value if isinstance(value, dict) else value.as_dict()))
    raise TypeError(f"expected a {cls.__name__} or a dict of its fields, got {value!r}")


def as_hparams(group) -> dict:
    """The checkpoint form of a group: plain data only, so checkpoints load with ``torch.load(weights_only=True)``."""
    return dataclasses.asdict(group)


# Flat hyper-parameters of checkpoints written before the groups, where the old name is not the field's own:
# old name -> (group, field). Every other loss, training and drafter field keeps its name (``migrate_hparams``).
_RENAMED = {
    "target": ("target", "path"),
    "target_dtype": ("target", "dtype"),
    "trust_remote_code": ("target", "trust_remote_code"),
    "target_features": ("target", "features"),
    "loss": ("loss", "weights"),
    "loss_chunk_size": ("loss", "chunk_size"),
    "candidate_loss_weight": ("loss", "candidate_weight"),
}


def migrate_hparams(hparams: dict) -> dict:
    """A checkpoint's hyper-parameters (or a run's saved ``model:`` config) as ``DSparkModule`` arguments, grouped;
    LightningCLI bookkeeping dropped.

    Checkpoints written before the config groups hold flat names (``block_size``, ``target_dtype``, ``loss``, ...,
    and the Markov head as ``{"class_path", "init_args"}``): they are moved into their groups here, the one place
    that knows the old layout. Grouped checkpoints pass through unchanged.
    """
    hparams = {k: v for k, v in hparams.items() if not k.startswith("_")}
    loss_fields = {f.name for f in dataclasses.fields(LossArgs)}
    grouped = (
        set(hparams) <= {*GROUPS, "optimizer", "scheduler"}
        and not isinstance(hparams.get("target"), str)  # the old target path
        and set(hparams.get("loss") or {}) <= loss_fields  # not the old loss weights {"ce": 0.1, ...}
    )
    if grouped:
        return hparams
    groups: dict[str, dict] = {name: {} for name in GROUPS}
    same_name = {  # a field added to a group later is found here without a table entry
        f.name: (group, f.name)
        for group, fields in (("loss", LossArgs), ("training", TrainingArgs), ("drafter", DrafterConfig))
        for f in dataclasses.fields(fields)
    }
    for name, value in hparams.items():
        if name in ("optimizer", "scheduler"):  # a config.yaml's model section: the callables stay as they are
            groups[name] = value
        elif name in _RENAMED or name in same_name:
            group, key = _RENAMED.get(name) or same_name[name]
            groups[group][key] = value
        else:
            raise OptionError(f"checkpoint hyper-parameter {name!r} has no place in the config groups")
    if groups["loss"].get("weights", ...) is None:
        groups["loss"]["weights"] = {"ce": 0.1, "tv": 0.9}  # the old default spelled "no loss given" as null
    head = groups["drafter"].get("markov_head")
    groups["drafter"]["markov_head"] = None if head is None else dataclasses.asdict(MarkovHeadConfig.coerce(head))
    return groups
