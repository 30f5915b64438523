"""DSparkModule: the LightningModule that trains a DSpark drafter against a frozen Hugging Face target.

One training step: target features for the packed batch (no grad) -> drafter forward over sampled blocks ->
compound loss (chunked, analytic gradient) + confidence BCE on the detached acceptance (+ optional Selector candidate
loss) -> metrics. Every constructor argument is a LightningCLI option (``model.<name>``).

Design choices:
- The target is built in ``__init__`` (the drafter's shape depends on it) and is frozen and in eval mode forever.
  Checkpoints hold only the trainable drafter state: the target and the frozen embedding / LM head that the drafter
  shares with it are dropped in ``on_save_checkpoint`` and re-loaded from ``target`` on resume
  (``strict_loading=False``, with our own check that every trainable tensor was restored).
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
- Non-finite guard: a NaN/inf training loss (``on_before_backward``) or gradient (``on_before_optimizer_step``, before
  clipping and the step) raises :class:`NonFiniteError` naming the step, so the weights are never updated with it and
  no checkpoint of the diverged state is written. Under fp16 loss scaling inf gradients are the scaler's business.
- Skipped training records (the data module's ``bad_record_counts``) are logged as ``data/skipped/<reason>`` and
  ``data/skipped/total`` (this rank, current pass) at every log step.
"""

from __future__ import annotations

import logging
import math

import lightning as L
import torch
import torchmetrics
from jsonargparse import lazy_instance
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from dspark_lightning.checks import NonFiniteError
from dspark_lightning.losses import (
    DEFAULT_LK_ETA,
    DEFAULT_NLA_ALPHA_MIN,
    compound_loss,
    confidence_loss,
    position_weights,
    validate_loss_options,
    validate_spec,
)
from dspark_lightning.metrics import AcceptanceMetrics, ConfidenceCalibration
from dspark_lightning.models import DrafterConfig, DraftVocab, DSparkDrafter, FrozenTarget, MarkovHeadConfig
from dspark_lightning.models.backbone import (
    ANCHOR_BUDGETS,
    anchor_coverage_counts,
    evaluation_anchors,
    sample_anchors,
)
from dspark_lightning.models.markov import VanillaMarkov, markov_config_from, markov_config_to_dict
from dspark_lightning.models.target import TargetHeads

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}
TARGET_FEATURES = ("online", "cache")


class AnchorCoverage(torchmetrics.Metric):
    """Supervised positions predicted by some block / all supervised positions (sum states: exact under DDP)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("covered", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("supervised", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, covered: torch.Tensor, supervised: torch.Tensor) -> None:
        self.covered += covered
        self.supervised += supervised

    def compute(self) -> torch.Tensor:
        return self.covered.float() / self.supervised.clamp(min=1).float()


def default_optimizer(params):
    return torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.0)


def warmup_cosine_schedule(optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1):
    """Linear warm-up to the optimizer's lr, then cosine decay to ``min_lr_ratio`` of it at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class DSparkModule(L.LightningModule):
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

        dtype = DTYPES.get(target_dtype)
        if dtype is None:
            raise ValueError(f"target_dtype must be one of {sorted(DTYPES)}, got {target_dtype!r}")
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
        if candidate_loss_weight > 0 and (
            self.drafter.markov_head is None or self.drafter.markov_head.is_path_dependent
        ):
            raise ValueError("candidate_loss_weight > 0 needs a vanilla or gated Markov head (the Selector form)")

    # ------------------------------------------------------------------ checkpoints
    def frozen_state_keys(self) -> set[str]:
        trainable = {name for name, p in self.named_parameters() if p.requires_grad}
        buffers = {name for name, _ in self.named_buffers() if not name.startswith("target.")}
        return set(self.state_dict().keys()) - trainable - buffers

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        for key in self.frozen_state_keys():
            checkpoint["state_dict"].pop(key, None)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state, frozen = self.state_dict(), self.frozen_state_keys()
        missing = sorted(set(state) - frozen - set(checkpoint["state_dict"]))
        if missing:
            raise KeyError(f"checkpoint lacks trainable drafter tensors (different model config?): {missing[:8]}")
        for key in frozen:  # the target's tensors, already loaded from model.target: not "missing" from the checkpoint
            checkpoint["state_dict"].setdefault(key, state[key])

    def setup(self, stage: str) -> None:
        """Check that the data module's feature cache (if any) was written for this target and these layers."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        cache_for = getattr(datamodule, "cache_for", None)
        caches = [c for c in ((cache_for("train"), cache_for("validation")) if cache_for else ()) if c is not None]
        if self.hparams.target_features == "cache" and datamodule is not None and cache_for and not caches:
            raise ValueError("model.target_features is 'cache' but the data module has no data.train_cache/val_cache")
        if not caches:
            return
        from dspark_lightning.data.cache import load_cache_indexes

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

    def shared_step(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None, anchors=None):
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
        hp = self.hparams
        B = hp.block_size
        Nb = out.logits.shape[0] * out.logits.shape[1]
        scheme = "dpace" if hp.position_weighting == "dpace" else "static"
        weights = position_weights(
            B,
            scheme=hp.position_weighting,
            gamma=hp.gamma,
            sample_from_anchor=hp.sample_from_anchor,
            device=self.device,
        )
        valid = out.slot_valid.view(Nb, B)
        loss_out = compound_loss(
            out.logits.reshape(Nb, B, -1),
            out.teacher_logprobs.reshape(Nb, B, -1),
            weights,
            valid,
            self.loss_spec,
            hp.loss_chunk_size,
            weight_scheme=scheme,
            block_size=B,
            lk_eta=hp.lk_eta,
            nla_alpha_min=hp.nla_alpha_min,
        )
        total = loss_out.loss
        # greedy verification accepts the target's own argmax: compare in target ids over the whole vocabulary (with
        # a draft vocabulary, the argmax of the draft-vocab teacher is merely the best draft token)
        greedy_match = (self._target_ids(loss_out.draft_argmax) == out.teacher_argmax.reshape(Nb, B)).view(
            loss_out.greedy_match.shape
        )
        losses = {f"loss_{name}": value for name, value in loss_out.components.items()}
        confidence = None
        if out.confidence_logits is not None:
            conf_logits = out.confidence_logits.reshape(Nb, B)
            conf = confidence_loss(conf_logits, loss_out.alpha, loss_out.weights, valid)
            total = total + hp.confidence_alpha * conf
            losses["loss_confidence"] = conf.detach()
            confidence = torch.sigmoid(conf_logits.detach().float())
        if hp.candidate_loss_weight > 0:
            from dspark_lightning.selector import candidate_loss

            cand, recall = candidate_loss(
                out.base_logits.flatten(0, 1),
                self.drafter.markov_head,
                out.prev_tokens.flatten(0, 1),
                out.hidden.flatten(0, 1),
                self._draft_ids(out.target_tokens.flatten(0, 1)),
                hp.candidate_k,
                valid,
                rule=hp.candidate_rule,
            )
            total = total + hp.candidate_loss_weight * cand
            losses["loss_candidate"] = cand.detach()
            losses[f"candidate_recall@{hp.candidate_k}"] = recall.recall.detach().float()
        losses["loss"] = total.detach()
        first = self.drafter_config.first_trained_slot
        view = lambda t: None if t is None else t[:, first:]  # noqa: E731
        return total, losses, view(loss_out.alpha), view(greedy_match), view(valid), view(confidence), out

    def _target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        vocab = self.drafter.draft_vocab
        return draft_ids if vocab is None else vocab.to_target(draft_ids)

    def _draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        vocab = self.drafter.draft_vocab
        return target_ids if vocab is None else vocab.to_draft(target_ids)

    def coverage_counts(self, batch, anchors) -> tuple[torch.Tensor, torch.Tensor]:
        hp = self.hparams
        return anchor_coverage_counts(anchors, batch["loss_mask"], hp.block_size, hp.sample_from_anchor)

    def training_step(self, batch, batch_idx):
        total, losses, alpha, match, valid, _, out = self.shared_step(batch, self._generator())
        with torch.no_grad():
            stats = AcceptanceMetrics(self.metric_block_size).to(self.device)
            stats.update(alpha, match, valid)
            values = stats.compute()
            covered, supervised = self.coverage_counts(batch, out.anchors)
        batch_size = batch["input_ids"].shape[0]
        self.log("train/anchor_coverage", covered.float() / supervised.clamp(min=1).float(), batch_size=batch_size)
        self.log_dict({f"train/{k}": v for k, v in losses.items()}, prog_bar=False, batch_size=batch_size)
        self.log("train/tau", values["tau"], prog_bar=True, batch_size=batch_size)
        self.log("train/accept_rate", values["accept_rate"], batch_size=batch_size)
        self.log("train/supervised_slots", valid.sum().float(), reduce_fx="sum", batch_size=batch_size)
        return total

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
        total, losses, alpha, match, valid, confidence, out = self.shared_step(batch, anchors=anchors)
        self.last_eval_output = out  # read by evaluation callbacks in on_validation_batch_end
        self.val_acceptance.update(alpha, match, valid)
        self.val_coverage.update(*self.coverage_counts(batch, anchors))
        if confidence is not None:
            self.val_calibration.update(confidence, alpha, valid)
        batch_size = batch["input_ids"].shape[0]
        self.log_dict({f"{stage}/{k}": v for k, v in losses.items()}, sync_dist=True, batch_size=batch_size)
        return total

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

    # ------------------------------------------------------------------ non-finite guard
    def on_before_backward(self, loss: torch.Tensor) -> None:
        if not bool(torch.isfinite(loss.detach()).all()):
            raise NonFiniteError(
                f"training loss is {loss.item()} at step {self.global_step}: the run diverged, training stopped before "
                "this update and no checkpoint of it was written (lower model.optimizer.init_args.lr?)"
            )

    def on_before_optimizer_step(self, optimizer) -> None:
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return  # fp16 loss scaling: inf gradients are expected and skipped by the scaler
        named = [(name, p.grad) for name, p in self.drafter.named_parameters() if p.grad is not None]
        if not named or bool(torch.stack([torch.isfinite(g).all() for _, g in named]).all()):
            return
        bad = [name for name, grad in named if not bool(torch.isfinite(grad).all())]
        raise NonFiniteError(
            f"non-finite gradient at step {self.global_step} in {len(bad)} drafter tensor(s) ({', '.join(bad[:6])}): "
            "training stopped before the optimizer step; no checkpoint of it was written"
        )

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


def flatten_metrics(values: dict[str, torch.Tensor], stage: str) -> dict[str, float]:
    """``acceptance/accept_rate_per_slot`` [B] -> ``val/accept_rate/slot_0`` ...; scalars -> ``val/tau`` ..."""
    flat: dict[str, float] = {}
    for key, value in values.items():
        group, name = key.split("/", 1)
        prefix = f"{stage}/" if group == "acceptance" else f"{stage}/confidence/"
        if name.startswith("reliability_"):
            continue  # curves are drawn by the calibration callback, not logged as scalars
        if value.ndim == 0:
            flat[prefix + name] = float(value)
        elif name.endswith("_per_slot"):
            base = name.removesuffix("_per_slot")
            for slot, v in enumerate(value.tolist()):
                if not math.isnan(v):
                    flat[f"{prefix}{base}/slot_{slot}"] = v
    return flat


def load_draft_vocab(path: str, verifier_vocab_size: int) -> DraftVocab:
    """Read ``d2t`` (absolute target ids) from a safetensors file written by ``dspark-lightning draft-vocab``."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except Exception as error:  # noqa: BLE001 - re-raised with the file name
        raise ValueError(f"could not read draft vocabulary {path!r}: {error}") from error
    if "d2t" not in tensors:
        raise ValueError(f"draft vocabulary file {path!r} has no 'd2t' tensor (found {sorted(tensors)})")
    return DraftVocab(tensors["d2t"], verifier_vocab_size)
