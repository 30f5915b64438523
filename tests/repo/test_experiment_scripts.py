"""The experiments' ``run.sh`` scripts: each parses, and refuses an unknown stage with a line naming it (exit 2)
before running anything; the Draft-OPD stages refuse a missing start checkpoint, and the sampled-regeneration runs
a missing greedy run, and the more-data run a missing base, the same way."""

from __future__ import annotations

import importlib.util
import json
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


def test_more_data_run_refuses_a_missing_base(tmp_path):
    env = dict(os.environ, MIXED_LONG=str(tmp_path / "mixed_long"), STUDY_OUT=str(tmp_path / "study"))
    refused = run("experiments/smollm2_more_data/run.sh", "train", "mixed", env=env)
    assert refused.returncode == 2 and "mixed_long/budget.json does not exist" in refused.stderr, refused.stderr


def test_recipe_report_pairs_a_run_with_its_own_base():
    """``report.py --pair RUN=BASE``: RUN's difference is against BASE on the same prompts (the page names BASE); the
    rest stay paired with --base, and BASE itself gets no difference."""
    spec = importlib.util.spec_from_file_location("report", ROOT / "experiments/smollm2_recipe_choices/report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)

    def point(run, counts):  # counts: (emitted tokens, target forwards) per prompt
        emitted, forwards = sum(c[0] for c in counts), sum(c[1] for c in counts)
        return dict(run=run, eval_set="sharegpt_heldout", prompt_counts=counts, measured_tau=emitted / forwards,
                    fit_wall_seconds=100.0)  # fmt: skip

    points = [point("short", [[10, 8], [12, 8]]), point("long", [[14, 8], [16, 8]]), point("other", [[11, 8], [13, 8]]),
              point("other_long", [[18, 8], [20, 8]])]  # fmt: skip
    trend = {"sharegpt_heldout": {"slope_per_decade": 0.17}}
    report.paired_differences(points, trend, "short", {"other_long": "long"})
    by_run = {p["run"]: p for p in points}
    assert by_run["other"]["delta_vs_base"] == pytest.approx(24 / 16 - 22 / 16)
    assert by_run["other_long"]["delta_vs_base"] == pytest.approx(38 / 16 - 30 / 16)
    assert by_run["other_long"]["paired_with"] == "long" and "paired_with" not in by_run["other"]
    assert "delta_vs_base" not in by_run["long"] and "delta_vs_base" not in by_run["short"]
    assert "vs long |" in report.table([{**p, "markov_head": "vanilla", "optimizer": "AdamW", "feature_noise_std": 0.0,
        "draft_vocab": "full", "block_size": 8, "steps": 1, "probe_seconds_per_step": 1.0, "num_prompts": 2,
        "measured_tau_ci": [1.0, 2.0], "tf_greedy_tau": None} for p in points])  # fmt: skip
    with pytest.raises(SystemExit, match="no measured run missing"):
        report.paired_differences(points, trend, "short", {"other": "missing"})


def test_recipe_report_sums_the_training_caches_a_run_read(tmp_path):
    """``report.py`` records the records, packed rows and supervised tokens of every cache a run trained on (summed
    from their index.json), and None for all three when one cache is not on this machine."""
    spec = importlib.util.spec_from_file_location("report", ROOT / "experiments/smollm2_recipe_choices/report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    for name, (records, rows, tokens) in {"a": (951, 203, 127399), "b": (333, 69, 43360)}.items():
        (tmp_path / name).mkdir()
        stats = dict(records=records, rows=rows, supervised_tokens=tokens, no_anchor_room=0)
        (tmp_path / name / "index.json").write_text(json.dumps(dict(complete=True, data_stats=stats)))
    both = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert report.train_size(both) == dict(train_records=1284, train_rows=272, train_supervised_tokens=170759)
    assert report.train_size(str(tmp_path / "a"))["train_rows"] == 203
    assert set(report.train_size([*both, str(tmp_path / "missing")]).values()) == {None}


def test_the_per_benchmark_measurement_refuses_a_missing_drafter(tmp_path):
    refused = run("experiments/per_benchmark/run.sh", "measure", "no_target", "0")
    assert refused.returncode == 2 and "unknown target no_target" in refused.stderr, refused.stderr
