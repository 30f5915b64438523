"""A run without a logger claims its folder: a second ``fit`` there is the one-line error, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.hostile import DEADLINE_S, ROOT, fit_args

from dspark_lightning.cli import cli_main


def _no_logger_args(folder) -> list[str]:
    args = [a for a in fit_args(folder, 1) if not a.startswith("--trainer.logger")]
    return [*args, "--trainer.logger=false", f"--trainer.default_root_dir={folder}"]


def test_a_second_fit_without_a_logger_in_the_same_folder_is_one_line_and_leaves_the_first_run_alone(tmp_path):
    folder = tmp_path / "run"
    cli_main(["fit", *_no_logger_args(folder)])
    config = folder / "config.yaml"
    first = config.read_text()
    assert "max_steps: 1" in first and (folder / "checkpoints" / "last.ckpt").is_file()

    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("DSPARK_DEBUG", None)
    command = [sys.executable, "-m", "dspark_lightning", "fit", *_no_logger_args(folder)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("dspark-lightning: error:")]
    assert len(errors) == 1 and str(folder) in errors[0] and "config.yaml" in errors[0], result.stderr[-3000:]
    assert config.read_text() == first  # the first run's config is neither overwritten nor removed
