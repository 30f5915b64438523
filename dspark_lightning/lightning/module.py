"""DSparkModule: the LightningModule that trains a DSpark drafter against a frozen Hugging Face target.

One training step: target features for the packed batch (no grad) -> drafter forward over sampled blocks ->
compound loss + confidence BCE (+ optional Selector candidate loss; ``lightning/step.py``) -> metrics. Every
constructor argument is a LightningCLI option (``model.<name>``).

Design choices:
- The target is built in ``__init__`` (the drafter's shape depends on it) and is frozen and in eval mode forever.
  Checkpoints hold only the trainable drafter state (``lightning/frozen_state.py``).
- Training anchors come from a generator seeded by (seed, global step, rank), so a resumed run draws the same
  anchors as an uninterrupted one. Evaluation anchors are deterministic per document (``evaluation_anchors``), so
  validation metrics do not depend on packing, batch order or the number of DDP ranks.
- Metrics are torchmetrics classes (sum/count states), computed and logged once per validation epoch; the last
  computed values stay on ``self.last_validation`` for callbacks that draw charts.
- In the DFlash convention (``sample_from_anchor=False``) slot 0 is never trained, so metrics see slots 1..B-1.
- ``target_features: cache`` trains from an offline target cache (``dspark_lightning.data.cache``): only the target's
  config, input embedding and LM head are loaded (``TargetHeads``), and every batch must carry ``context_features``
  and ``final_hidden``. Checkpoints are the same in both modes (the frozen tensors are dropped either way). A batch
  that carries features is used as it is in online mode too (the target is then not run).
- ``anchor_budget`` (``uniform`` | ``per_document``, see ``models/backbone.py``) chooses how training anchors are
  shared between the documents of a packed row; ``train/anchor_coverage`` (per step) and ``val/anchor_coverage``
  (sum states over the epoch) report the fraction of supervised tokens that some block predicts.
- Sharded training (``configs/strategy/fsdp.yaml``): ``configure_model`` wraps every target decoder layer and every
  draft layer as its own FSDP unit when the strategy provides a wrapping context (and does nothing otherwise), so the
  frozen target is sharded layer by layer and the drafter's layers train sharded; the embedding / LM head shared by
  target and drafter stay in the root unit.
- Non-finite guard (``lightning/guards.py``): a NaN/inf loss or gradient raises before the update is applied.
- Skipped training records (the data module's ``bad_record_counts``) are logged as ``data/skipped/<reason>`` and
  ``data/skipped/total`` (this rank, current pass) at every log step.
"""

from __future__ import annotations

import logging
import math

import lightning as L
import torch
from jsonargparse import lazy_instance
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from dspark_lightning.data.cache import load_cache_indexes
from dspark_lightning.decoding.modes import supported_modes
from dspark_lightning.dtypes import DTYPES, torch_dtype
from dspark_lightning.lightning.frozen_state import TrainableStateCheckpoints
from dspark_lightning.lightning.guards import NonFiniteGuard
from dspark_lightning.lightning.optim import default_optimizer, warmup_cosine_schedule
from dspark_lightning.lightning.step import AnchorCoverage, StepOutput, flatten_metrics, step_output
from dspark_lightning.losses import (
    DEFAULT_LK_ETA,
    DEFAULT_NLA_ALPHA_MIN,
    validate_loss_options,
    validate_spec,
)
from dspark_lightning.metrics import AcceptanceMetrics, ConfidenceCalibration
from dspark_lightning.models import (
    DrafterConfig,
    DSparkDrafter,
    FrozenTarget,
    MarkovHeadConfig,
)
from dspark_lightning.models.backbone import (
    ANCHOR_BUDGETS,
    anchor_coverage_counts,
    evaluation_anchors,
    sample_anchors,
)
from dspark_lightning.models.markov import VanillaMarkov, markov_config_from, markov_config_to_dict
from dspark_lightning.models.target import TargetHeads
from dspark_lightning.models.vocab import load_draft_vocab

log = logging.getLogger(__name__)

TARGET_FEATURES = ("online", "cache")


class DSparkModule(TrainableStateCheckpoints, NonFiniteGuard, L.LightningModule):
    def __init__(
        self,
        target: str = "assets/demo-target",
        target_layer_ids: list[int] | None = None,
        target_dtype: str = "auto",
        trust_remote_code: bool = False,
        target_features: str = "online",
        block_size: int = 8,
        num_layers: int = 1,
        max_anchors: int = 64,
        anchor_budget: str = "uniform",
        sample_from_anchor: bool = True,
        mask_token_id: int | None = None,
        markov_head: MarkovHeadConfig | None = lazy_instance(VanillaMarkov, rank=256),
        confidence_head: bool = True,
        confidence_with_markov: bool = True,
        confidence_alpha: float = 1.0,
        loss: dict[str, float] | None = None,
        position_weighting: str = "exp",
        gamma: float = 4.0,
        lk_eta: float = DEFAULT_LK_ETA,
        nla_alpha_min: float = DEFAULT_NLA_ALPHA_MIN,
        loss_chunk_size: int | None = None,
        candidate_loss_weight: float = 0.0,
        candidate_k: int = 16,
        candidate_rule: str = "replace_kth",
        draft_vocab: str | None = None,
        train_lm_head: bool = False,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        intermediate_size: int | None = None,
        attention_backend: str = "auto",
        sliding_window: int | None = None,
        layer_types: list[str] | None = None,
        seed: int = 0,
        val_anchor_stride: int | None = None,
        lr_warmup_steps: int = 50,
        compile: bool = False,
        optimizer: OptimizerCallable = default_optimizer,
        scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        """
        Args:
            target: the frozen target model, a Hugging Face hub id or a local directory.
            target_layer_ids: target decoder layers whose outputs feed the drafter (None = spread over depth).
            target_dtype: ``auto`` (the checkpoint's dtype), ``float32``, ``bfloat16`` or ``float16``.
            trust_remote_code: allow custom modelling code from the target's repository (off by default).
            target_features: ``online`` (run the target every step) or ``cache`` (features come with the batch from
                an offline cache: ``data.train_cache``; only the target's embedding and LM head are loaded).
            block_size: draft block size B (tokens drafted per target forward).
            num_layers: draft decoder layers.
            max_anchors: blocks sampled per packed sequence in each training step.
            anchor_budget: ``uniform`` over the row's valid positions, or ``per_document`` (each packed document
                gets a share proportional to its supervised tokens, at least one).
            sample_from_anchor: DSpark convention (slot k predicts p+k+1) or DFlash (slot 0 is the bonus token).
            mask_token_id: token id filling slots 1..B-1 (linked from the data module's tokenizer).
            markov_head: Markov head by class_path (``dspark_lightning.models.VanillaMarkov`` ...), null = pure DFlash.
            confidence_head: attach the per-slot acceptance predictor.
            confidence_with_markov: feed the Markov previous-token embedding to the confidence head.
            confidence_alpha: weight of the confidence BCE term.
            loss: compound loss weights over ``kl``, ``tv``, ``ce``, ``rkl``, ``js``, ``nla``, ``lk_hybrid``
                (``dspark_lightning.loss_terms``); default ``{"ce": 0.1, "tv": 0.9}``.
            position_weighting: ``exp`` (exp(-k/gamma)), ``uniform`` or ``dpace``.
            gamma: decay of the ``exp`` position weights.
            lk_eta: eta of the ``lk_hybrid`` weight lambda = exp(-eta * sg[alpha]) (>= 0; 0 = pure KL).
            nla_alpha_min: clamp eps of ``nla`` = -log max(alpha, eps), in (0, 1).
            loss_chunk_size: rows per loss chunk (None = automatic).
            candidate_loss_weight: weight of the Selector candidate loss (DFlash-2 training); 0 = off.
            candidate_k: candidates per slot for the candidate loss and its recall metric.
            candidate_rule: ``replace_kth`` or ``exclude`` for slots whose true token is outside the top-k.
            draft_vocab: path of a ``.safetensors`` file holding ``d2t`` (a reduced draft vocabulary), or null.
            train_lm_head: with a draft vocabulary, train a draft LM head instead of reusing target rows.
            num_heads: draft attention heads (None = the target's); likewise num_kv_heads, head_dim,
                intermediate_size.
            attention_backend: ``auto`` (flex on CUDA, sdpa on CPU), ``sdpa`` or ``flex``.
            sliding_window: context window of the sliding draft layers (None = full attention).
            layer_types: ``full_attention`` / ``sliding_attention`` per draft layer (None = all sliding when
                sliding_window is set).
            seed: seed of the training anchor sampler (combined with the global step and the rank).
            val_anchor_stride: evaluation anchors sit at in-document positions that are multiples of this
                (None = block_size: non-overlapping blocks tiling every supervised stretch).
            lr_warmup_steps: warm-up steps of the default warm-up + cosine schedule.
            compile: ``torch.compile`` the draft backbone.
            optimizer: optimizer factory (default AdamW, lr 6e-4).
            scheduler: LR scheduler factory (default: warm-up + cosine over the run's total steps).
        """
        super().__init__()
        markov_head = markov_config_from(markov_head)
        self.save_hyperparameters(ignore=["optimizer", "scheduler", "markov_head"])
        # plain-dict form, so checkpoints load with torch.load(weights_only=True) and load_from_checkpoint works
        self.hparams["markov_head"] = markov_config_to_dict(markov_head)
        # bad specs and options fail here, before the target is loaded
        self.loss_spec = validate_spec(dict(loss or {"ce": 0.1, "tv": 0.9}))
        validate_loss_options(lk_eta, nla_alpha_min)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.strict_loading = False

        # "auto": the checkpoint's own dtype, which from_pretrained reads
        dtype = "auto" if target_dtype == "auto" else torch_dtype(target_dtype, (*DTYPES, "auto"), what="target_dtype")
        if target_features not in TARGET_FEATURES:
            raise ValueError(f"target_features must be one of {TARGET_FEATURES}, got {target_features!r}")
        if anchor_budget not in ANCHOR_BUDGETS:
            raise ValueError(f"anchor_budget must be one of {ANCHOR_BUDGETS}, got {anchor_budget!r}")
        target_class = TargetHeads if target_features == "cache" else FrozenTarget
        self.target = target_class.from_pretrained(
            target, target_layer_ids, num_layers, dtype=dtype, trust_remote_code=trust_remote_code
        )
        self.drafter_config = DrafterConfig(
            block_size=block_size,
            num_layers=num_layers,
            max_anchors=max_anchors,
            sample_from_anchor=sample_from_anchor,
            mask_token_id=mask_token_id,
            target_layer_ids=self.target.target_layer_ids,
            markov_head=markov_head,
            confidence_head=confidence_head,
            confidence_with_markov=confidence_with_markov,
            train_lm_head=train_lm_head,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate_size,
            attention_backend=attention_backend,
            sliding_window=sliding_window,
            layer_types=layer_types,
        )
        vocab = load_draft_vocab(draft_vocab, self.target.vocab_size) if draft_vocab else None
        self.drafter = DSparkDrafter.for_target(self.drafter_config, self.target, vocab)
        if compile:
            self.drafter.backbone.compile()

        first = self.drafter_config.first_trained_slot
        self.metric_block_size = block_size - first
        self.val_acceptance = AcceptanceMetrics(self.metric_block_size)
        self.val_calibration = ConfidenceCalibration(self.metric_block_size)
        self.val_coverage = AnchorCoverage()
        self.last_validation: dict[str, torch.Tensor] = {}
        if candidate_loss_weight > 0 and "selector" not in supported_modes(self.drafter.markov_head):
            raise ValueError("candidate_loss_weight > 0 needs a vanilla or gated Markov head (the Selector form)")

    def setup(self, stage: str) -> None:
        """Check that the data module's feature cache (if any) was written for this target and these layers."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        cache_for = getattr(datamodule, "cache_for", None)
        caches = [c for c in ((cache_for("train"), cache_for("validation")) if cache_for else ()) if c is not None]
        if self.hparams.target_features == "cache" and datamodule is not None and cache_for and not caches:
            raise ValueError("model.target_features is 'cache' but the data module has no data.train_cache/val_cache")
        if not caches:
            return
        for cache in caches:
            meta = load_cache_indexes(cache)[0].meta
            if meta["target_layer_ids"] != self.target.target_layer_ids:
                raise ValueError(
                    f"cache {cache} holds target layers {meta['target_layer_ids']} but the drafter reads "
                    f"{self.target.target_layer_ids}: set model.target_layer_ids {meta['target_layer_ids']}"
                )
            if meta["hidden_size"] != self.target.hidden_size:
                raise ValueError(f"cache {cache} was written for hidden size {meta['hidden_size']}, not this target")
        if self.hparams.target_features == "online":
            log.warning("training from a feature cache with the full target loaded: set model.target_features=cache")

    def configure_model(self) -> None:
        """FSDP: each target decoder layer and each draft layer becomes its own unit (no-op for other strategies)."""
        from torch.distributed.fsdp.wrap import wrap

        model = getattr(self.target, "model", None)  # None for TargetHeads (cache mode): nothing to shard there
        decoder = getattr(model, model.base_model_prefix, None) if model is not None else None
        for layers in (getattr(decoder, "layers", None), self.drafter.backbone.layers):
            if isinstance(layers, torch.nn.ModuleList):
                for i, layer in enumerate(layers):
                    layers[i] = wrap(layer)

    # ------------------------------------------------------------------ steps
    def _generator(self) -> torch.Generator:
        seed = (self.hparams.seed * 1_000_003 + self.global_step) * 64 + self.global_rank
        return torch.Generator().manual_seed(seed)

    def target_features(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(context_features, final_hidden): from the batch (offline cache) or by running the target."""
        if "context_features" in batch:
            return batch["context_features"], batch["final_hidden"].to(self.drafter.lm_head.weight.dtype)
        features = self.target.features(batch["input_ids"], batch["position_ids"])
        return features.context_features, features.final_hidden

    def training_anchors(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None):
        hp = self.hparams
        return sample_anchors(
            batch["loss_mask"],
            batch["document_ids"],
            hp.block_size,
            hp.max_anchors,
            hp.sample_from_anchor,
            generator,
            budget=hp.anchor_budget,
        )

    def shared_step(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None, anchors=None
    ) -> StepOutput:
        context_features, final_hidden = self.target_features(batch)
        if anchors is None:
            anchors = self.training_anchors(batch, generator)
        out = self.drafter(
            batch["input_ids"],
            batch["loss_mask"],
            batch["document_ids"],
            batch["position_ids"],
            context_features,
            final_hidden,
            anchors=anchors,
        )
        return step_output(out, self.hparams, self.loss_spec, self.drafter, self.drafter_config.first_trained_slot)

    def coverage_counts(self, batch, anchors) -> tuple[torch.Tensor, torch.Tensor]:
        hp = self.hparams
        return anchor_coverage_counts(anchors, batch["loss_mask"], hp.block_size, hp.sample_from_anchor)

    def training_step(self, batch, batch_idx):
        step = self.shared_step(batch, self._generator())
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
        hp = self.hparams
        return evaluation_anchors(
            batch["loss_mask"],
            batch["document_ids"],
            batch["position_ids"],
            hp.block_size,
            hp.val_anchor_stride or hp.block_size,
            hp.sample_from_anchor,
            pad_to=hp.max_anchors,
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
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params)
        if self.scheduler_factory is not None:
            scheduler = self.scheduler_factory(optimizer)
        else:
            total = self.trainer.estimated_stepping_batches
            if not math.isfinite(total):
                raise ValueError("set trainer.max_steps (the data stream has no length) or give model.scheduler")
            scheduler = warmup_cosine_schedule(optimizer, self.hparams.lr_warmup_steps, int(total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train(self, mode: bool = True):
        super().train(mode)
        self.target.train(False)
        return self
