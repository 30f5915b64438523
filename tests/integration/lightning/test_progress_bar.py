"""The training progress bar counts optimizer steps of max_steps across passes over the data, with no bogus bounds.

A real ``Trainer.fit`` of a two-parameter model over a three-batch stream, so a 7-step run makes three passes: the
bar must read 7/7 at the end (Lightning's RichProgressBar restarts each pass and shows ``Epoch 2/-2``), and the
logger's version must not show up as a metric.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import yaml
from helpers.paths import ROOT
from lightning.pytorch.loggers import CSVLogger

from dspark_lightning.lightning.progress_bar import StepProgressBar

STEPS = 7


class Stream(torch.utils.data.IterableDataset):
    """Three batches per pass and no length: like the data module's stream, the run is bounded by max_steps."""

    def __iter__(self):
        return iter(torch.ones(3, 2, 2).unbind())


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2))

    def training_step(self, batch, batch_idx):
        loss = ((batch @ self.weight - 1) ** 2).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_step_progress_bar_counts_max_steps_across_epochs_without_v_num(tmp_path):
    bar = StepProgressBar()
    trainer = L.Trainer(
        max_steps=STEPS,
        callbacks=[bar],
        logger=CSVLogger(tmp_path, name="run"),  # a logger with a version: what used to show as v_num
        enable_checkpointing=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp_path,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(Stream(), batch_size=None))
    assert trainer.global_step == STEPS and trainer.current_epoch >= 2  # three passes over the stream
    task = bar.train_progress_bar
    assert (task.completed, task.total) == (STEPS, STEPS)
    assert "epoch 2" in task.description and "/-" not in task.description
    metrics = bar.get_metrics(trainer, trainer.lightning_module)
    assert "v_num" not in metrics and "train/loss" in metrics


def test_off_a_terminal_fit_writes_a_step_line_with_an_eta(tmp_path, monkeypatch, capsys):
    from dspark_lightning import progress

    now = [0.0]

    def clock():  # 25 s a step: with the clock starting at step 1, lines at steps 4 and 7 (75 s apart)
        now[0] += 25.0
        return now[0]

    monkeypatch.setattr(progress, "monotonic", clock)
    trainer = L.Trainer(
        max_steps=STEPS, callbacks=[StepProgressBar()], logger=False, enable_checkpointing=False,
        enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(Tiny(), torch.utils.data.DataLoader(Stream(), batch_size=None))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fit:")]
    assert [line.split(" | ")[0] for line in lines] == [
        "fit: 4/7 steps, 1:15 elapsed, ETA 1:15",  # 3 steps in 75 s, 3 to go
        "fit: 7/7 steps, 2:30 elapsed, ETA 0:00",
    ]
    assert all("train/loss" in line.split(" | ")[1] for line in lines)


def test_shipped_configs_use_the_step_progress_bar():
    class_paths = []
    for config in sorted((ROOT / "configs").rglob("*.yaml")):
        callbacks = (yaml.safe_load(Path(config).read_text()) or {}).get("trainer", {}).get("callbacks") or []
        class_paths += [c["class_path"] for c in callbacks if "ProgressBar" in c.get("class_path", "")]
    assert class_paths and set(class_paths) == {"dspark_lightning.lightning.progress_bar.StepProgressBar"}
