"""``fit`` with configs/recipe_choices/muon.yaml: Lightning steps, schedules and checkpoints the Muon + AdamW optimizer."""

from __future__ import annotations

import torch
from helpers.hostile import fit_args
from helpers.paths import ROOT

from dspark_lightning.cli import cli_main


def test_fit_with_muon_steps_and_its_checkpoint_holds_both_optimizers(tmp_path):
    cli = cli_main(
        ["fit", *fit_args(tmp_path, steps=2, extra=("--config", str(ROOT / "configs/recipe_choices/muon.yaml")))]
    )
    assert cli.trainer.global_step == 2
    checkpoint = torch.load(tmp_path / "run/version_0/checkpoints/last.ckpt", weights_only=True)
    (state,) = checkpoint["optimizer_states"]
    muon, adamw = state["inner"]
    assert muon["state"] and adamw["state"]  # both inner optimizers stepped and were saved
    assert muon["param_groups"][0]["lr"] < 0.01  # the warm-up schedule scaled Muon's lr too
