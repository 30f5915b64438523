"""experiments/tools/study_report.py: which points are the base configuration, and the tau-vs-tokens extrapolation."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
from helpers.paths import ROOT

spec = importlib.util.spec_from_file_location("study_report", ROOT / "experiments" / "tools" / "study_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def point(run, step, tau, eval_set="sharegpt_heldout", max_steps=600, **settings):
    config = dict(num_layers=1, max_anchors=32, lr=1e-3, conversations=1284) | settings
    return dict(
        run=run, step=step, max_steps=max_steps, **config, seq_len=1024, batch_size=1, training_tokens=step * 1024,
        seconds_per_step=0.5, tf_greedy_tau=None, eval_set=eval_set, num_prompts=16, measured_tau=tau, measured_tau_ci=[tau - 0.1, tau + 0.1],
        prompt_counts=[[round(tau * 10), 10], [round(tau * 20), 20]],
    )  # fmt: skip


POINTS = [
    point("base", 300, 1.20),
    point("base", 600, 1.31),
    point("base1200", 900, 1.36, max_steps=1200),
    point("base1200", 1200, 1.40, max_steps=1200),
    point("anchors128", 600, 1.50, max_anchors=128),  # another configuration: not on the base trend
    point("data3000", 600, 1.33, conversations=3000),
    point("base", 600, 1.25, eval_set="humaneval"),
]


def test_base_points_are_the_runs_that_differ_from_base_only_in_length():
    assert [(p["run"], p["step"], p["eval_set"]) for p in report.base_points(POINTS)] == [
        ("base", 300, "sharegpt_heldout"), ("base", 600, "sharegpt_heldout"),
        ("base1200", 900, "sharegpt_heldout"), ("base1200", 1200, "sharegpt_heldout"), ("base", 600, "humaneval"),
    ]  # fmt: skip


def test_extrapolation_is_the_least_squares_line_in_log_tokens_solved_for_the_target():
    fit = report.extrapolate(POINTS)
    base = [p for p in POINTS[:4]]
    slope, intercept = np.polyfit(
        [math.log10(p["training_tokens"]) for p in base], [p["measured_tau"] for p in base], 1
    )
    got = fit["sharegpt_heldout"]
    assert got["slope_per_decade"] == pytest.approx(slope) and got["intercept"] == pytest.approx(intercept)
    tokens = 10 ** ((2.0 - intercept) / slope)
    assert got["tokens_for_target"] == pytest.approx(tokens)
    assert got["cpu_hours_for_target"] == pytest.approx(tokens / 1024 * 0.5 / 3600)
    assert "humaneval" not in fit  # one point: no line


def test_the_last_validation_of_a_fit_log_is_its_teacher_forced_number(tmp_path):
    log = tmp_path / "run.fit.log"
    log.write_text(
        "│ tau (teacher-forced)  │  1.2000 │\n│ greedy_tau (teacher-forced)  │  1.3000 │\n"
        "noise\n│ greedy_tau (teacher-forced)  │  1.3250 │\n"
    )
    assert report.final_tf_greedy_tau(log) == 1.325
    assert report.final_tf_greedy_tau(tmp_path / "missing.log") is None


def test_table_and_plot(tmp_path):
    text = report.table(POINTS)
    assert (
        "| anchors128 | 600 | 614,400 | 1 | 128 | 0.001 | 1,284 | 0.50 | sharegpt_heldout | 16 | 1.500 [1.400, 1.600] | - | - |"
        in text
    )
    report.plot(POINTS, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_each_variant_is_compared_with_the_base_at_the_same_step_on_the_same_prompts():
    def at(run, step, per_prompt_tau, max_steps=600, **settings):
        counts = [[tau * forwards, forwards] for tau, forwards in zip(per_prompt_tau, (10, 20, 40), strict=True)]
        tau = sum(e for e, _ in counts) / sum(f for _, f in counts)
        return point(run, step, tau, max_steps=max_steps, **settings) | {"prompt_counts": counts}

    base, early = at("base", 600, [1.25, 1.5, 1.0]), at("base", 300, [1.0, 1.25, 1.0])
    wider = at("anchors128", 600, [1.5, 1.75, 1.25], max_anchors=128)  # +0.25 tau on every prompt
    longer = at("combined", 1200, [2.0, 2.0, 2.0], max_steps=1200, max_anchors=128)  # no base run of its length
    points = [early, base, wider, longer]
    report.paired_differences(points)
    assert wider["reference"] == "base@600" and wider["delta_vs_base"] == pytest.approx(0.25)
    assert wider["delta_vs_base_ci"] == pytest.approx([0.25, 0.25])  # a constant gain leaves nothing to resample
    assert "delta_vs_base" not in base and "delta_vs_base" not in early and "delta_vs_base" not in longer
