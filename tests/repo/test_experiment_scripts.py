"""The experiments' ``run.sh`` scripts: each parses, and refuses an unknown stage with a line naming it (exit 2)
before running anything; the Draft-OPD stages refuse a missing start checkpoint, and the sampled-regeneration runs
a missing greedy run, the same way."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers.paths import ROOT

SCRIPTS = sorted((ROOT / "experiments").glob("*/run.sh"))


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.parent.name)
def test_script_parses_and_refuses_an_unknown_stage(script, tmp_path):
    assert run("-n", str(script)).returncode == 0
    refused = run(str(script), "no_such_stage", env=dict(os.environ, STUDY_OUT=str(tmp_path)))  # no study/ here
    assert refused.returncode == 2 and "no_such_stage" in refused.stderr, refused.stderr


def test_draft_opd_stage_refuses_a_missing_start(tmp_path):
    env = dict(os.environ, FROM=str(tmp_path / "missing.ckpt"), STUDY_OUT=str(tmp_path / "study"))
    refused = run("experiments/smollm2_draft_opd/run.sh", "train", "opd", env=env)
    assert refused.returncode == 2 and "missing.ckpt does not exist" in refused.stderr, refused.stderr


def test_sampled_regeneration_runs_refuse_a_missing_greedy_run(tmp_path):
    env = dict(os.environ, GREEDY=str(tmp_path / "greedy"), STUDY_OUT=str(tmp_path / "study"))
    refused = run("experiments/smollm2_sampled_regen/run.sh", "train", "sampled", env=env)
    assert refused.returncode == 2 and "greedy/budget.json does not exist" in refused.stderr, refused.stderr
