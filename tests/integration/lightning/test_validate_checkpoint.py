"""``validate --ckpt_path`` without the run's config: model options left at their defaults take the checkpoint's
values, and missing data is one line naming the run's own config.yaml."""

from __future__ import annotations

import pytest
from helpers import hostile
from helpers.hostile import fit_args

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import OptionError

checkpoint = hostile.checkpoint  # a 2-step quickstart fit whose model options differ from the class defaults


def test_validate_with_only_the_checkpoint_and_data_takes_the_checkpoints_model(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Lightning's default logger writes lightning_logs/ here
    cli = cli_main(
        [
            "validate",
            f"--ckpt_path={checkpoint}",
            f"--data.val_files={hostile.VAL}",
            "--data.seq_len=128",
            "--data.batch_size=2",
            "--data.limit_val_samples=8",
            "--trainer.limit_val_batches=1",
            "--trainer.enable_progress_bar=false",
        ]
    )
    drafter = cli.model.drafter_config
    assert (drafter.max_anchors, drafter.markov_head.rank) == (8, 64)  # the checkpoint's, not the defaults (64, 256)
    assert cli.trainer.callback_metrics["val/tau"] >= 1


def test_an_option_given_still_must_match_the_checkpoint(checkpoint, tmp_path):
    with pytest.raises(OptionError, match=r"--model\.drafter\.markov_head\.rank: given 32, checkpoint 64"):
        cli_main(["validate", *fit_args(tmp_path), f"--ckpt_path={checkpoint}", "--model.drafter.markov_head.rank=32"])


@pytest.mark.parametrize(("command", "files"), [("validate", "data.val_files"), ("test", "data.test_files")])
def test_validate_or_test_without_data_names_the_runs_own_config(checkpoint, command, files):
    run_config = checkpoint.parent.parent / "config.yaml"
    assert run_config.is_file()
    with pytest.raises(
        OptionError, match=rf"no {files}.* configured .*pass --config {run_config} \(the run's .* --{files}$"
    ):
        cli_main([command, f"--ckpt_path={checkpoint}"])
