"""Shared pieces of the hostile-input suite (issue #17): a SIGALRM deadline on every test, one small trained
checkpoint, a few-step fit command line and a small data module on the demo target.

Every case ends in a clear error or documented behaviour, never a hang. The deadline only turns a hang into a
failure instead of blocking CI; it is generous because nothing here measures time. (The fixtures live here and are
bound in both test modules: a ``conftest.py`` would impose the deadline on every test.)
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from dspark_lightning.cli import cli_main
from dspark_lightning.data.datamodule import ShareGPTDataModule
from helpers.paths import ROOT

TARGET = str(ROOT / "assets/demo-target")
TRAIN = ROOT / "assets/data/sharegpt/train-00000.jsonl"
VAL = str(ROOT / "assets/data/sharegpt/validation-00000.jsonl")
DEADLINE_S = 600
ONLY_CHECKPOINT = json.dumps(
    [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True, "save_top_k": 0}}]
)


def good_lines(count: int = 40) -> list[str]:
    return TRAIN.read_text().splitlines()[:count]


def fit_args(run_dir: Path, steps: int = 2, train: str | Path = TRAIN, extra: tuple[str, ...] = ()) -> list[str]:
    """A few steps of the quickstart on the demo target, only a last.ckpt callback, CSV logger into ``run_dir``."""
    return [
        "--config",
        str(ROOT / "configs/quickstart.yaml"),
        f"--model.target.path={TARGET}",
        f"--data.train_files={train}",
        f"--data.val_files={VAL}",
        "--data.seq_len=128",
        "--data.batch_size=2",
        "--data.limit_val_samples=8",
        "--model.drafter.max_anchors=8",
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={steps}",
        "--trainer.limit_val_batches=1",
        f"--trainer.callbacks={ONLY_CHECKPOINT}",
        "--trainer.enable_progress_bar=false",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={run_dir}",
        "--trainer.logger.name=run",
        *extra,
    ]


def datamodule(train, **kwargs) -> ShareGPTDataModule:
    settings = dict(seq_len=128, batch_size=2, shuffle_buffer=0, block_size=8)
    return ShareGPTDataModule(TARGET, str(train), VAL, **(settings | kwargs))


class Hang(Exception):
    pass


@pytest.fixture(autouse=True)
def deadline():
    def expire(signum, frame):
        raise Hang(f"no result after {DEADLINE_S} s: treated as a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(DEADLINE_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained")
    cli_main(["fit", *fit_args(run_dir)])
    return run_dir / "run" / "version_0" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="session")
def diverged_checkpoint(checkpoint, tmp_path_factory) -> Path:
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state["state_dict"]["drafter.backbone.fc.weight"][0, 0] = float("nan")
    path = tmp_path_factory.mktemp("diverged") / "nan.ckpt"
    torch.save(state, path)
    return path
