"""Trainer flags users flip on the shipped quickstart config: each builds a working trainer (a callback that has
nothing to do steps aside with one line) or fails in one line naming ``--trainer``, never with Lightning's traceback."""

from __future__ import annotations

import pytest
from helpers.paths import ROOT
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import OptionError

QUICKSTART = ["--config", str(ROOT / "configs/quickstart.yaml"), "--data.seq_len=128", "--data.batch_size=1"]


def built(*flags: str):
    return cli_main([*QUICKSTART, *flags], run=False).trainer


@pytest.mark.parametrize(
    ("flags", "gone", "line"),
    [
        (["--trainer.logger=false"], LearningRateMonitor, "LearningRateMonitor is off: --trainer.logger false"),
        (["--trainer.enable_progress_bar=false"], ProgressBar, "StepProgressBar is off: --trainer.enable_progress_bar"),
    ],
)
def test_a_callback_with_nothing_to_do_steps_aside_in_one_line(flags, gone, line, capsys):
    trainer = built(*flags)
    assert not [c for c in trainer.callbacks if isinstance(c, gone)]
    assert line in capsys.readouterr().out


def test_both_flags_together_keep_the_other_callbacks(capsys):
    trainer = built("--trainer.logger=false", "--trainer.enable_progress_bar=false")
    names = {type(c).__name__ for c in trainer.callbacks}
    assert {"AcceptanceCurves", "SpeculativeDecodingCallback", "ModelCheckpoint"} <= names
    assert not names & {"LearningRateMonitor", "StepProgressBar"}


@pytest.mark.parametrize("flag", ["--trainer.max_steps=-5", "--trainer.max_epochs=-5"])
def test_a_trainer_value_lightning_refuses_is_one_line(flag):
    with pytest.raises(OptionError) as refused:
        built("--trainer.logger=false", flag)
    message = str(refused.value)
    assert message.startswith("--trainer options: ") and "\n" not in message


def test_a_refused_trainer_value_leaves_no_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptionError):
        built("--trainer.max_steps=-5")  # the quickstart's CSV logger would write runs/quickstart/version_0
    assert not list(tmp_path.rglob("version_*"))
