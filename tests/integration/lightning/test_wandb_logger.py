"""OfflineFirstWandbLogger: WANDB_MODE=disabled writes nothing; the default is an offline run on disk.

Each case runs in its own process: wandb keeps its settings in a process-wide singleton after the first run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LOG_ONCE = """
import sys
import wandb
from dspark_lightning.lightning.wandb import OfflineFirstWandbLogger
logger = OfflineFirstWandbLogger(save_dir=sys.argv[1], project="dspark-test", name="probe")
logger.log_metrics({"train/loss": 1.0}, step=0)
logger.finalize("success")
wandb.finish()
"""


def _runs_written(tmp_path, mode: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"} | {"WANDB_SILENT": "true"}
    if mode is not None:
        env["WANDB_MODE"] = mode
    result = subprocess.run(
        [sys.executable, "-c", LOG_ONCE, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return sorted(p.name for p in (tmp_path / "wandb").glob("*run-*")) if (tmp_path / "wandb").exists() else []


def test_disabled_mode_writes_no_run(tmp_path):
    assert _runs_written(tmp_path, "disabled") == []
    assert not any(tmp_path.rglob("*.wandb"))


@pytest.mark.parametrize("mode", [None, "offline"])
def test_default_and_offline_write_an_offline_run(tmp_path, mode):
    runs = _runs_written(tmp_path, mode)
    assert len(runs) == 1 and runs[0].startswith("offline-run-"), runs
