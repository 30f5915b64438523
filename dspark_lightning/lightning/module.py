"""DSparkModule: the LightningModule that trains a DSpark drafter against a frozen Hugging Face target.

The step: docs/design/training_step.md §1; anchors and the teacher: docs/design/design.md §3, metrics: §7 there;
cache mode: docs/design/data.md §6.2; FSDP wrapping: docs/guides/scaling_up.md; the non-finite guard and the skipped
records: docs/guides/reliability.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import warnings

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from dspark_lightning.data.cache import TEACHER_STAT_FIELDS, load_cache_indexes
from dspark_lightning.decoding.modes import supported_modes
from dspark_lightning.dtypes import DTYPES, torch_dtype
from dspark_lightning.errors import OptionError, UnsupportedError
from dspark_lightning.lightning.config import GROUPS, LossArgs, TargetArgs, TrainingArgs, as_group, as_hparams
from dspark_lightning.lightning.frozen_state import TrainableStateCheckpoints
from dspark_lightning.lightning.guards import NonFiniteGuard
from dspark_lightning.lightning.optim import default_optimizer, warmup_cosine_schedule
from dspark_lightning.lightning.step import AnchorCoverage, StepOutput, flatten_metrics, step_output
from dspark_lightning.losses import validate_spec
from dspark_lightning.metrics import AcceptanceMetrics, ConfidenceCalibration
from dspark_lightning.models import DrafterConfig, DrafterOutput, DSparkDrafter, FrozenTarget, TeacherStats
from dspark_lightning.models.anchors import anchor_coverage_counts, evaluation_anchors, sample_anchors
from dspark_lightning.models.error_replay import probe_rejections, replay_anchors
from dspark_lightning.models.target import TargetHeads
from dspark_lightning.models.vocab import load_draft_vocab

log = logging.getLogger(__name__)


def stream_seed(seed: int, step: int, rank: int) -> int:
    """The 64-bit seed of rank ``rank``'s anchor generator at global step ``step``: a BLAKE2b hash of the three.

    An affine mix such as ``(seed * 1_000_003 + step) * 64 + rank`` collides once there are more ranks than its
    multiplier (rank 64 at step s drew rank 0's anchors at step s + 1); a hash has no such structure, and 64 bits
    make a chance collision among a million (step, rank) pairs about 3e-8 likely."""
    digest = hashlib.blake2b(f"{seed},{step},{rank}".encode(), digest_size=8, person=b"dspark-anchors").digest()
    return int.from_bytes(digest, "little")


class DSparkModule(TrainableStateCheckpoints, NonFiniteGuard, L.LightningModule):
    """The LightningModule that trains a ``DSparkDrafter`` against a frozen target: anchors sampled per row, the
    teacher's targets, the compound loss, validation acceptance metrics (its options: ``__init__`` below)."""

    def __init__(
        self,
        target: TargetArgs = TargetArgs(),
        drafter: DrafterConfig = DrafterConfig(),
        loss: LossArgs = LossArgs(),
        training: TrainingArgs = TrainingArgs(),
        optimizer: OptimizerCallable = default_optimizer,
        scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        """
        Args:
            target: the frozen target model (``lightning/config.py: TargetArgs``).
            drafter: the drafter: block size, layers, Markov and confidence heads, draft vocabulary
                (``models.DrafterConfig``); ``mask_token_id`` is linked from the data module's tokenizer.
            loss: the loss weights and options (``lightning/config.py: LossArgs``).
            training: anchor sampling, seed and schedule (``lightning/config.py: TrainingArgs``).
            optimizer: optimizer factory (default AdamW, lr 6e-4).
            scheduler: LR scheduler factory (default: warm-up + cosine over the run's total steps).
        """
        super().__init__()
        target, loss, training = (
            as_group(TargetArgs, target),
            as_group(LossArgs, loss),
            as_group(TrainingArgs, training),
        )
        drafter = as_group(DrafterConfig, drafter)
        # plain dicts, so checkpoints load with torch.load(weights_only=True) and load_checkpoint_module rebuilds them
        self.save_hyperparameters(
            {name: as_hparams(group) for name, group in zip(GROUPS, (target, drafter, loss, training), strict=True)}
        )
        self.loss_spec = validate_spec(dict(loss.weights))  # canonical order (the group checked it when built)
        self.target_args, self.loss_args, self.training_args = target, loss, training
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.strict_loading = False

        # "auto": the checkpoint's own dtype, which from_pretrained reads
        dtype = "auto" if target.dtype == "auto" else torch_dtype(target.dtype, (*DTYPES, "auto"), what="target.dtype")
        # built here, frozen and in eval mode for good: the drafter's shape depends on it
        target_class = TargetHeads if target.features == "cache" else FrozenTarget
        self.target = target_class.from_pretrained(
            target.path,
            drafter.target_layer_ids,
            drafter.num_layers,
            dtype=dtype,
            trust_remote_code=target.trust_remote_code,
        )
        # the target resolves the default layer ids; a copy, so a shared default config is never changed
        self.drafter_config = dataclasses.replace(drafter, target_layer_ids=self.target.target_layer_ids)
        vocab = load_draft_vocab(drafter.draft_vocab, self.target.vocab_size) if drafter.draft_vocab else None
        self.drafter = DSparkDrafter.for_target(self.drafter_config, self.target, vocab)
        if training.compile:
            self.drafter.backbone.compile()

        self.metric_block_size = self.drafter_config.trained_block_size
        self.val_acceptance = AcceptanceMetrics(self.metric_block_size)
        self.val_calibration = ConfidenceCalibration(self.metric_block_size)
        self.val_coverage = AnchorCoverage()
        self.last_validation: dict[str, torch.Tensor] = {}  # the last computed values, for callbacks that draw charts
        if loss.candidate_weight > 0 and "selector" not in supported_modes(self.drafter.markov_head):
            raise OptionError(
                "model.loss.candidate_weight > 0 needs a vanilla or gated Markov head (the Selector form)"
            )

    def setup(self, stage: str) -> None:
        """Check that the data module's feature cache (if any) was written for this target and these layers; load
        ``training.init_weights`` before fitting."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        device = self.trainer.strategy.root_device if self._trainer is not None else self.device
        if stage == "fit" and self.drafter_config.attention_backend == "flex" and device.type == "cpu":
            raise OptionError(  # torch's own error comes at the first backward, from deep inside autograd
                "model.drafter.attention_backend flex has no backward on CPU: train with sdpa (or auto, which picks "
                "flex on CUDA and sdpa elsewhere); decoding and validation may use flex on CPU"
            )
        if stage == "fit" and self.training_args.init_weights:  # a resumed run's --ckpt_path is restored after this
            self.load_initial_weights(self.training_args.init_weights)
        cache_for = getattr(datamodule, "cache_for", None)
        caches = [c for c in ((cache_for("train"), cache_for("validation")) if cache_for else ()) if c is not None]
        if self.target_args.features == "cache" and datamodule is not None and cache_for and not caches:
            raise OptionError("model.target.features is 'cache' but the data module has no data.train_cache/val_cache")
        if not caches:
            return
        for cache in caches:
            meta = load_cache_indexes(cache)[0].meta
            if meta["target_layer_ids"] != self.target.target_layer_ids:
                raise OptionError(
                    f"cache {cache} holds target layers {meta['target_layer_ids']} but the drafter reads "
                    f"{self.target.target_layer_ids}: set model.drafter.target_layer_ids {meta['target_layer_ids']}"
                )
            if meta["hidden_size"] != self.target.hidden_size:
                raise OptionError(f"cache {cache} was written for hidden size {meta['hidden_size']}, not this target")
        if self.target_args.features == "online":
            log.warning("training from a feature cache with the full target loaded: set model.target.features=cache")

    def on_fit_start(self) -> None:
        # Lightning warns about every module in eval mode when training starts: the frozen target's are, on purpose.
        # Only that exact count is silenced, so a drafter module left in eval mode still warns
        in_eval = [name for name, module in self.named_modules() if not module.training]
        if in_eval and all(name.startswith("target.") or name == "target" for name in in_eval):
            warnings.filterwarnings("ignore", message=rf"Found {len(in_eval)} module\(s\) in eval mode at the start")

    def configure_model(self) -> None:
        """FSDP: each target decoder layer and each draft layer becomes its own unit (no-op for other strategies).

        A target that runs packed documents one at a time (recurrent layers, ``FrozenTarget.features``) makes as many
        forwards as a batch has document lengths, a different number on each rank, and a sharded target gathers its
        weights in every forward: refused here, before the first step, rather than left to hang."""
        from lightning.pytorch.strategies import FSDPStrategy
        from torch.distributed.fsdp.wrap import wrap

        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, FSDPStrategy) and getattr(self.target, "per_document", False):
            raise UnsupportedError(
                f"--trainer.strategy fsdp cannot shard target model type {self.target.config.model_type!r}: its "
                "recurrent layers make it run each packed document alone, a different number of forwards per rank; "
                "train with ddp, or from a feature cache (dspark-lightning cache, then model.target.features=cache)"
            )
        model = getattr(self.target, "model", None)  # None for TargetHeads (cache mode): nothing to shard there
        decoder = getattr(model, model.base_model_prefix, None) if model is not None else None
        for layers in (getattr(decoder, "layers", None), self.drafter.backbone.layers):
            if isinstance(layers, torch.nn.ModuleList):
                for i, layer in enumerate(layers):
                    layers[i] = wrap(layer)

    # ------------------------------------------------------------------ steps
    def _generator(self) -> torch.Generator:
        seed = stream_seed(self.training_args.seed, self.global_step, self.global_rank)
        return torch.Generator().manual_seed(seed)

    def target_features(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(context_features, final_hidden): from the batch (offline cache) or by running the target."""
        if "context_features" in batch:  # a batch that carries features is used as it is, in online mode too
            return batch["context_features"], batch["final_hidden"].to(self.drafter.lm_head.weight.dtype)
        features = self.target.features(batch["input_ids"], batch["position_ids"])
        return features.context_features, features.final_hidden

    def teacher_stats(self, batch: dict[str, torch.Tensor]) -> TeacherStats | None:
        """The full-vocabulary logsumexp and argmax per position when the batch carries them (a feature cache of
        format 2, ``data/cache.py``): the teacher then runs the LM head over the draft rows only. None otherwise
        (online features, older caches): the full-vocabulary head at the teacher positions (docs/design/design.md §3.6)."""
        if TEACHER_STAT_FIELDS[0] not in batch or "final_hidden" not in batch:
            return None
        return TeacherStats(*(batch[name] for name in TEACHER_STAT_FIELDS))

    def training_anchors(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None):
        cfg = self.drafter_config
        return sample_anchors(
            batch["loss_mask"],
            batch["document_ids"],
            cfg.block_size,
            cfg.max_anchors,
            cfg.sample_from_anchor,
            generator,
            budget=self.training_args.anchor_budget,
        )

    def shared_step(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None, anchors=None, noise_std=0.0
    ) -> StepOutput:
        """The drafter's forward and losses on one batch; ``noise_std`` > 0 (training steps only) adds Gaussian noise
        of that std to the target's context features, drawn from ``generator``.

        Without ``anchors`` this is a training step: anchors are sampled (and moved to error positions with
        ``training.error_replay``) and the Markov head reads ``training.markov_prev``."""
        context_features, final_hidden = self.target_features(batch)
        stats, markov_prev = self.teacher_stats(batch), "teacher"
        if anchors is None:
            anchors, markov_prev = self.training_anchors(batch, generator), self.training_args.markov_prev
            if self.training_args.error_replay > 0:  # the probe sees clean features, as decoding does
                anchors = self.replayed_anchors(batch, anchors, context_features, final_hidden, stats, generator)
        if noise_std > 0:  # drawn after the anchors: the same anchors with and without noise
            noise = torch.randn(context_features.shape, generator=generator, dtype=torch.float32)
            context_features = context_features + noise.to(context_features) * noise_std
        out = self.draft(batch, context_features, final_hidden, anchors, markov_prev, stats)
        return step_output(out, self.loss_args, self.loss_spec, self.drafter)

    def draft(self, batch, context_features, final_hidden, anchors, markov_prev, stats) -> DrafterOutput:
        """The drafter's training-form forward on ``batch`` at ``anchors``."""
        return self.drafter(
            batch["input_ids"],
            batch["loss_mask"],
            batch["document_ids"],
            batch["position_ids"],
            context_features,
            final_hidden,
            anchors=anchors,
            markov_prev=markov_prev,
            teacher_stats=stats,
        )

    @torch.no_grad()
    def replayed_anchors(self, batch, anchors, context_features, final_hidden, stats, generator):
        """``anchors`` with ``training.error_replay`` of them moved to where the drafter's own greedy blocks are
        first rejected (``models/error_replay.py``): a probe forward without gradients, Markov head on its own
        choices, as in decoding."""
        probe = self.draft(batch, context_features, final_hidden, anchors, "own", stats)
        rejections, found = probe_rejections(probe, self.drafter.draft_vocab)
        cfg = self.drafter_config
        return replay_anchors(
            anchors,
            rejections,
            found,
            batch["loss_mask"],
            batch["document_ids"],
            cfg.block_size,
            cfg.sample_from_anchor,
            round(self.training_args.error_replay * anchors.positions.shape[1]),
            generator,
        )

    def coverage_counts(self, batch, anchors) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.drafter_config
        return anchor_coverage_counts(anchors, batch["loss_mask"], cfg.block_size, cfg.sample_from_anchor)

    def training_step(self, batch, batch_idx):
        step = self.shared_step(batch, self._generator(), noise_std=self.training_args.feature_noise_std)
        with torch.no_grad():
            stats = AcceptanceMetrics(self.metric_block_size).to(self.device)
            stats.update(step.alpha, step.greedy_match, step.valid)
            values = stats.compute()
            covered, supervised = self.coverage_counts(batch, step.drafter_output.anchors)
        batch_size = batch["input_ids"].shape[0]
        self.log("train/anchor_coverage", covered.float() / supervised.clamp(min=1).float(), batch_size=batch_size)
        self.log_dict({f"train/{k}": v for k, v in step.losses.items()}, prog_bar=False, batch_size=batch_size)
        self.log("train/tau", values["tau"], prog_bar=True, batch_size=batch_size)
        self.log("train/accept_rate", values["accept_rate"], batch_size=batch_size)
        self.log("train/supervised_slots", step.valid.sum().float(), reduce_fx="sum", batch_size=batch_size)
        return step.loss

    def validation_step(self, batch, batch_idx):
        return self._evaluation_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        return self._evaluation_step(batch, batch_idx, "test")

    def evaluation_anchors(self, batch: dict[str, torch.Tensor]):
        """The deterministic per-document anchors every evaluation uses (validation, test, decode tools)."""
        cfg = self.drafter_config
        return evaluation_anchors(
            batch["loss_mask"],
            batch["document_ids"],
            batch["position_ids"],
            cfg.block_size,
            self.training_args.val_anchor_stride or cfg.block_size,
            cfg.sample_from_anchor,
            pad_to=cfg.max_anchors,
        )

    def _evaluation_step(self, batch, batch_idx, stage: str):
        # deterministic, per-document anchors: identical blocks in every validation, for any packing or world size
        anchors = self.evaluation_anchors(batch)
        step = self.shared_step(batch, anchors=anchors)
        self.last_eval_output = step.drafter_output  # read by evaluation callbacks in on_validation_batch_end
        self.val_acceptance.update(step.alpha, step.greedy_match, step.valid)
        self.val_coverage.update(*self.coverage_counts(batch, anchors))
        if step.confidence is not None:
            self.val_calibration.update(step.confidence, step.alpha, step.valid)
        batch_size = batch["input_ids"].shape[0]
        self.log_dict({f"{stage}/{k}": v for k, v in step.losses.items()}, sync_dist=True, batch_size=batch_size)
        return step.loss

    def on_validation_epoch_end(self) -> None:
        values = {f"acceptance/{k}": v for k, v in self.val_acceptance.compute().items()}
        self.val_acceptance.reset()
        if self.drafter.confidence_head is not None and self.val_calibration.update_count:
            values |= {f"confidence/{k}": v for k, v in self.val_calibration.compute().items()}
            self.val_calibration.reset()
        self.last_validation = values
        stage = "test" if self.trainer.testing else "val"
        self.log_dict(flatten_metrics(values, stage), sync_dist=False)
        self.log(f"{stage}/anchor_coverage", self.val_coverage.compute())
        self.val_coverage.reset()

    def on_test_epoch_end(self) -> None:
        self.on_validation_epoch_end()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        counts = getattr(datamodule, "bad_record_counts", None)
        if counts is None:
            return
        skipped = {f"data/skipped/{reason}": float(count) for reason, count in counts("train").items()}
        skipped["data/skipped/total"] = sum(skipped.values())
        # per rank (keys differ between ranks, so no sync); cumulative over the current pass
        self.log_dict(skipped, on_step=True, on_epoch=False, batch_size=1)

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        # named (torch optimizers take (name, parameter) pairs): MuonAdamW splits the parameters by name
        params = [(name, p) for name, p in self.drafter.named_parameters() if p.requires_grad]
        try:  # torch checks the values (a negative lr, betas outside [0, 1)) only here, at the first step
            optimizer = self.optimizer_factory(params)
        except ValueError as error:
            raise OptionError(f"model.optimizer: {error}") from None
        if self.scheduler_factory is not None:
            scheduler = self.scheduler_factory(optimizer)
        else:
            total = self.trainer.estimated_stepping_batches
            if not math.isfinite(total):
                raise OptionError("set trainer.max_steps (the data stream has no length) or give model.scheduler")
            scheduler = warmup_cosine_schedule(optimizer, self.training_args.lr_warmup_steps, int(total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train(self, mode: bool = True):
        super().train(mode)
        self.target.train(False)
        return self
