"""Callbacks that turn validation metrics into charts and tables (decoding measured during training:
``measuring/callback.py``).

What they log and draw: docs/design/design.md §7.6-§7.8. Figures go to W&B when a ``WandbLogger`` is attached and are
always saved under ``<log_dir>/plots`` (``publish_figure``).
"""

# Hook order. The LightningModule computes and logs the scalar metrics itself (``val/tau``,
# ``val/accept_rate/slot_3`` ...) and keeps the last computed values on ``pl_module.last_validation``; the chart
# callbacks only *draw* from that, in ``on_validation_end`` (which runs after the module's epoch-end hook, unlike the
# callbacks' own epoch-end hook). Callbacks that log must do it in ``on_validation_epoch_end``, before the module's
# hook: they read this validation's numbers from the metric itself (``this_validation_tau``), and check for SIGTERM
# between units of work (``stop_requested``).

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

from dspark_lightning import plotting
from dspark_lightning.decoding import supported_modes
from dspark_lightning.progress import stop_requested
from dspark_lightning.selector import equivalence_report

log = logging.getLogger(__name__)


def run_directory(trainer: L.Trainer) -> Path:
    """``trainer.log_dir`` computed locally. That property broadcasts (a collective) and figures are drawn on global
    rank 0 only, so calling it here would deadlock DDP: rank 0 waits in the broadcast while the other ranks have
    moved on to the metrics' all-gather."""
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    path = logger.log_dir if isinstance(logger, TensorBoardLogger | CSVLogger) else logger.save_dir
    return Path(path or trainer.default_root_dir)


def parameters_sharded(trainer: L.Trainer) -> bool:
    """Under FSDP the parameters are sharded outside the module's forward, so callbacks that run parts of the model
    on their own (the Selector report, speculative decoding on rank 0) cannot run and are skipped."""
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(trainer.strategy, FSDPStrategy)


def publish_figure(trainer: L.Trainer, fig, key: str) -> str:
    """Save ``fig`` as ``<log_dir>/plots/<key>_step<global_step>.png`` and log it to W&B if present.

    Always saved as PNG, so a run directory is self-contained (the analysis notebooks read the plots from there).
    """
    name = key.replace("/", "_")
    path = plotting.save(fig, run_directory(trainer) / "plots" / f"{name}_step{trainer.global_step:06d}.png")
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key=key, images=[path], step=trainer.global_step)
    return path


class AcceptanceCurves(L.Callback):
    """Per-slot accept_rate and greedy_acc chart after every validation."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        values = getattr(pl_module, "last_validation", {})
        if trainer.sanity_checking or "acceptance/accept_rate_per_slot" not in values or not trainer.is_global_zero:
            return
        fig = plotting.per_slot_chart(
            {
                "accept_rate": values["acceptance/accept_rate_per_slot"],
                "greedy_acc": values["acceptance/greedy_acc_per_slot"],
            },
            title=f"per-slot acceptance (tau {float(values['acceptance/tau']):.3f}, step {trainer.global_step})",
        )
        publish_figure(trainer, fig, "val/acceptance_per_slot")


class CalibrationDiagram(L.Callback):
    """Reliability diagram of the confidence head's prefix survival, with its prefix ECE in the title."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        values = getattr(pl_module, "last_validation", {})
        if trainer.sanity_checking or "confidence/reliability_confidence" not in values or not trainer.is_global_zero:
            return
        fig = plotting.reliability_diagram(
            values["confidence/reliability_confidence"],
            values["confidence/reliability_observed"],
            values["confidence/reliability_count"],
            title=f"prefix survival calibration (prefix ECE {float(values['confidence/prefix_ece']):.3f})",
        )
        publish_figure(trainer, fig, "val/confidence_reliability")


class ValidationSummary(L.Callback):
    """A rich table of the last validation metrics when ``fit`` ends, with the measured decoding tau of each mode
    when ``SpeculativeDecodingCallback`` logged one (and of each eval set, with its 95% interval). The two
    calibration errors are named apart: ``slot_ece`` (each slot's confidence c_k against its acceptance) and
    ``prefix_ece`` (the prefix survival, what schedules verification and what ``calibrate`` and the reliability
    diagram report)."""

    ROWS = {
        "acceptance/tau": "tau (teacher-forced)",
        "acceptance/greedy_tau": "greedy_tau (teacher-forced)",
        "acceptance/accept_rate": "accept_rate",
        "confidence/slot_ece": "slot_ece (c_k vs alpha_k)",
        "confidence/prefix_ece": "prefix_ece (prefix survival)",
    }

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        values = getattr(pl_module, "last_validation", {})
        if not values or not trainer.is_global_zero:
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"validation after {trainer.global_step} steps")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, name in self.ROWS.items():
            if key in values:
                table.add_row(name, f"{float(values[key]):.4f}")
        metrics = trainer.callback_metrics
        for key, value in sorted(metrics.items()):
            mode = re.fullmatch(r"val/decode/(\w+)/tau", key)
            if mode:
                table.add_row(f"tau measured ({mode[1]} decoding)", f"{float(value):.4f}")
            per_set = re.fullmatch(r"val/decode/(\w+)/(\w+)/tau", key)
            if per_set and f"{key}_ci_low" in metrics and f"{key}_ci_high" in metrics:
                low, high = float(metrics[f"{key}_ci_low"]), float(metrics[f"{key}_ci_high"])
                cell = f"{float(value):.4f} [{low:.3f}, {high:.3f}]"
                table.add_row(f"tau measured on {per_set[1]} ({per_set[2]})", cell)
        per_slot = {
            "accept_rate": values.get("acceptance/accept_rate_per_slot"),
            "greedy_acc": values.get("acceptance/greedy_acc_per_slot"),
        }
        for name, tensor in per_slot.items():
            if isinstance(tensor, torch.Tensor):
                cells = " ".join("  - " if math.isnan(v) else f"{v:.2f}" for v in tensor.tolist())  # 80 columns
                table.add_row(f"{name} per slot", cells)
        Console().print(table)


class SelectorEquivalenceCallback(L.Callback):
    """How far the top-k Selector walk agrees with the sequential Markov decode, on validation blocks.

    Collects up to ``max_blocks`` validation blocks (base logits, hidden states, teacher) per validation and runs
    ``selector.equivalence_report`` for each k: coverage@k, agreement@k, agreed prefix, tau of walk vs sequential
    against the teacher, and their wall times; plus a coverage/agreement-vs-k chart. Cost: one sequential decode and
    one walk per k over ``max_blocks`` blocks (B x Vd x r multiply-adds per block for the sequential decode) — with
    the defaults a fraction of a second on the demo, a few seconds for Vd = 152k on CPU, negligible on GPU.
    Skipped (with a warning once) for the rnn head and for drafters without a Markov head.
    """

    def __init__(self, ks: tuple[int, ...] = (1, 4, 16, 64), max_blocks: int = 256) -> None:
        self.ks = list(ks)
        self.max_blocks = max_blocks
        self._buffers: list = []
        self._warned = False

    def _applicable(self, pl_module) -> bool:
        head = pl_module.drafter.markov_head
        ok = "selector" in supported_modes(head)
        if pl_module._trainer is not None and parameters_sharded(pl_module.trainer):
            ok = False  # FSDP: the Markov head's weights are sharded outside forward
        if not ok and not self._warned:
            log.warning(
                "SelectorEquivalenceCallback: needs a vanilla/gated Markov head and unsharded weights (not FSDP); skipping"
            )
            self._warned = True
        return ok

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._buffers = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        out = getattr(pl_module, "last_eval_output", None)
        if out is None or not self._applicable(pl_module):
            return
        have = sum(b[0].shape[0] for b in self._buffers)
        if have >= self.max_blocks:
            return
        valid = out.trained_slots(out.slot_valid)
        keep = valid.any(dim=1)
        take = lambda t: out.trained_slots(t)[keep][: self.max_blocks - have].detach()  # noqa: E731
        self._buffers.append(
            (
                take(out.base_logits),
                take(out.hidden),
                take(out.prev_tokens)[:, 0],  # the first drafted slot's previous token: where the walks start
                take(out.teacher_logprobs),
                valid[keep][: self.max_blocks - have],
            )
        )

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not self._buffers or trainer.sanity_checking:
            return
        base, hidden, first_prev, teacher, valid = (torch.cat(parts) for parts in zip(*self._buffers))
        self._buffers = []
        # on SIGTERM, stop between the walks (one per k) and log what is done; with several processes every rank must
        # log the same keys (they are synced), and SIGTERM may reach them at different walks, so there it runs whole
        alone = trainer.world_size == 1
        report = equivalence_report(
            base, pl_module.drafter.markov_head, first_prev, hidden, teacher, self.ks, valid, pl_module.drafter.d2t,
            stop=(lambda: stop_requested(trainer)) if alone else None,
        )  # fmt: skip
        values = report.to_flat_dict(prefix="val/selector/")
        pl_module.log_dict({k: float(v) for k, v in values.items()}, sync_dist=True)
        pl_module.last_selector_report = report
        if trainer.is_global_zero:
            fig = plotting.xy_chart(
                report.ks,
                {
                    "coverage@k": [report.coverage[k] for k in report.ks],
                    "agreement@k": [report.agreement[k] for k in report.ks],
                },
                title=f"Selector vs sequential Markov decode ({report.num_blocks} blocks)",
                xlabel="k (candidates per slot)",
                ylabel="fraction of slots",
                logx=True,
            )
            publish_figure(trainer, fig, "val/selector_coverage")


def this_validation_tau(pl_module) -> float | None:
    """The teacher-forced tau (``val/tau``) of the validation that is ending, read from the module's metric.

    Lightning runs the callbacks' ``on_validation_epoch_end`` before the module's, so ``pl_module.last_validation``
    still holds the previous validation's numbers here. Computing the metric now gives this validation's value, and
    the module's own ``compute()`` right after returns the same cached result (no second sync). None before any
    validation batch."""
    metric = getattr(pl_module, "val_acceptance", None)
    if metric is None or not metric.update_count:
        return None
    return float(metric.compute()["tau"])
