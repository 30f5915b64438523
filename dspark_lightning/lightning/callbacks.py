"""Callbacks that turn validation metrics into charts and tables.

The LightningModule computes and logs the scalar metrics itself (``val/tau``, ``val/accept_rate/slot_3`` ...) and
keeps the last computed values on ``pl_module.last_validation``; these callbacks only *draw* from that, in
``on_validation_end`` (which runs after the module's epoch-end hook, unlike the callbacks' own epoch-end hook).

Images go to W&B when a ``WandbLogger`` is attached, and are always saved as PNG under ``<log_dir>/plots`` so a
run directory is self-contained (the analysis notebooks read them from there).
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger

from dspark_lightning import plotting


def run_directory(trainer: L.Trainer) -> Path:
    return Path(trainer.log_dir or trainer.default_root_dir)


def publish_figure(trainer: L.Trainer, fig, key: str) -> str:
    """Save ``fig`` as ``<log_dir>/plots/<key>_step<global_step>.png`` and log it to W&B if present."""
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
    """Reliability diagram of the confidence head's prefix survival, with its ECE in the title."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        values = getattr(pl_module, "last_validation", {})
        if trainer.sanity_checking or "confidence/reliability_confidence" not in values or not trainer.is_global_zero:
            return
        fig = plotting.reliability_diagram(
            values["confidence/reliability_confidence"],
            values["confidence/reliability_observed"],
            values["confidence/reliability_count"],
            title=f"prefix survival calibration (ECE {float(values['confidence/prefix_ece']):.3f})",
        )
        publish_figure(trainer, fig, "val/confidence_reliability")


class ValidationSummary(L.Callback):
    """A rich table of the last validation metrics when ``fit`` ends."""

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        values = getattr(pl_module, "last_validation", {})
        if not values or not trainer.is_global_zero:
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"validation after {trainer.global_step} steps")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key in ("acceptance/tau", "acceptance/greedy_tau", "acceptance/accept_rate", "confidence/ece"):
            if key in values:
                table.add_row(key.split("/", 1)[1], f"{float(values[key]):.4f}")
        per_slot = {
            "accept_rate": values.get("acceptance/accept_rate_per_slot"),
            "greedy_acc": values.get("acceptance/greedy_acc_per_slot"),
        }
        for name, tensor in per_slot.items():
            if isinstance(tensor, torch.Tensor):
                cells = " ".join("  -  " if math.isnan(v) else f"{v:.3f}" for v in tensor.tolist())
                table.add_row(f"{name} per slot", cells)
        Console().print(table)
