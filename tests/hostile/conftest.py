"""Hostile-input suite (issue #17): a SIGALRM deadline on every test, and one small trained checkpoint.

Every case ends in a clear error or documented behaviour, never a hang. The deadline only turns a hang into a
failure instead of blocking CI; it is generous because nothing here measures time.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from hostile_helpers import DEADLINE_S, fit_args

from dspark_lightning.cli import cli_main


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
