"""experiments/tools/eval_set_report.py: rows read from ``decode --json`` files, a head per file, and the break-even tau."""

from __future__ import annotations

import importlib.util
import json

import pytest
from helpers.paths import ROOT

from dspark_lightning.measuring.results import read_eval_set_rows, to_json

spec = importlib.util.spec_from_file_location("eval_set_report", ROOT / "experiments" / "tools" / "eval_set_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def decode_row(eval_set, threshold=None):
    # two prompts: 40 tokens in 20 steps of 0.10 s (baseline 0.05 s per token), 30 in 10 steps of 0.12 s (0.04 s)
    records = [
        dict(emitted_tokens=40, target_forwards=20, speculative_seconds=2.0, baseline_seconds=2.0),
        dict(emitted_tokens=30, target_forwards=10, speculative_seconds=1.2, baseline_seconds=1.2),
    ]
    # a row as decode --json wrote it before schema 1 (flat: the decode row's keys beside the summary's); they load
    return dict(
        eval_set=eval_set, mode="markov", threshold=threshold, num_prompts=2, max_new_tokens=8, measured_tau=70 / 30,
        measured_tau_ci=[2.0, 3.0], speedup=1.0, speedup_ci=[0.9, 1.1], outputs_equal=True, mean_verified=8.0,
        prompt_records=records, acceptance_per_slot=[0.5], ci_confidence=0.95, tau=70 / 30, tokens_per_second=20.0,
        accepted_rate_per_slot=[0.5], phase_ms_per_step={"verify": 1.0},
    )  # fmt: skip


def test_a_schema_1_file_reads_as_its_pre_schema_form(tmp_path):
    flat, typed = tmp_path / "flat.json", tmp_path / "typed.json"
    flat.write_text(json.dumps([decode_row("humaneval"), decode_row("humaneval", [0.1, 0.2])]))
    typed.write_text(json.dumps([to_json(row) for row in read_eval_set_rows(flat)]))  # what decode writes now
    assert json.loads(typed.read_text())[0]["schema"] == 1
    assert report.read_rows(str(typed)) == report.read_rows(str(flat))


def test_a_file_whose_name_holds_an_equals_sign_is_read_with_or_without_a_head(tmp_path):
    path = tmp_path / "step=1200.decode.json"
    path.write_text(json.dumps([decode_row("humaneval"), decode_row("humaneval", [0.1, 0.2])]))
    plain = report.read_rows(str(path))
    named = report.read_rows(f"gated (1,200 steps)={path}")
    assert [r.get("head") for r in plain] == [None, None]
    assert [r["head"] for r in named] == ["gated (1,200 steps)"] * 2
    assert [report.schedule(r) for r in named] == ["whole blocks", "cost model"]
    # seconds per step over seconds per token, each a total over the prompts: (3.2 / 30) / (3.2 / 70) = 70 / 30
    assert named[0]["break_even_tau"] == pytest.approx(70 / 30)
    assert "| gated (1,200 steps) | humaneval | markov | cost model | 2 |" in report.table(named)


def test_paired_differences_are_taken_on_the_same_set_and_schedule(tmp_path):
    base, better = tmp_path / "none.json", tmp_path / "gated.json"
    base.write_text(json.dumps([decode_row("humaneval"), decode_row("humaneval", [0.1, 0.2])]))
    faster = decode_row("humaneval")
    faster["prompt_records"][1]["target_forwards"] = 6  # 30 tokens in 6 steps instead of 10
    faster["measured_tau"] = 70 / 26
    better.write_text(json.dumps([faster, decode_row("humaneval", [0.1, 0.2])]))
    rows = report.read_rows(f"none={base}") + report.read_rows(f"gated={better}")
    (whole, cost) = report.paired_differences(rows, "none")
    assert (whole["eval_set"], whole["schedule"], cost["schedule"]) == ("humaneval", "whole blocks", "cost model")
    assert whole["delta_tau"] == pytest.approx(70 / 26 - 70 / 30)
    # resampled prompt pairs: both prompts -> the whole delta, prompt 1 twice -> 0, prompt 2 twice -> 5 - 3
    low, high = whole["delta_tau_ci"]
    assert 0.0 <= low <= whole["delta_tau"] <= high <= 2.0
    assert cost["delta_tau"] == 0.0 and cost["delta_tau_ci"] == [0.0, 0.0]  # the same runs: no difference at all
    with pytest.raises(SystemExit, match="rnn"):
        report.paired_differences(rows, "rnn")


def test_paired_differences_of_timed_runs_carry_the_speedup_difference(tmp_path):
    one, two = tmp_path / "one_thread.json", tmp_path / "two_threads.json"
    one.write_text(json.dumps([decode_row("sharegpt_heldout")]))  # 3.2 s against generate's 3.2 s
    quicker = decode_row("sharegpt_heldout")
    quicker["prompt_records"][1]["speculative_seconds"] = 0.6  # prompt 2 twice as fast: 3.2 / 2.6
    quicker["speedup"] = 3.2 / 2.6
    two.write_text(json.dumps([quicker]))
    rows = report.read_rows(f"1 thread={one}") + report.read_rows(f"2 threads={two}")
    (difference,) = report.paired_differences(rows, "1 thread")
    assert difference["delta_tau"] == 0.0 and difference["delta_speedup"] == pytest.approx(3.2 / 2.6 - 1.0)
    # resampled prompt pairs: prompt 1 twice -> 1 - 1 = 0, prompt 2 twice -> 1.2 / 0.6 - 1 = 1
    low, high = difference["delta_speedup_ci"]
    assert 0.0 <= low <= difference["delta_speedup"] <= high <= 1.0
    assert "| 2 threads | 1 thread | sharegpt_heldout | whole blocks | +0.000 [+0.000, +0.000] | +0.231 [" in (
        report.difference_table([difference])
    )
    untimed = [dict(r, prompt_records=[dict(p, baseline_seconds=None) for p in r["prompt_records"]]) for r in rows]
    assert "delta_speedup" not in report.paired_differences(untimed, "1 thread")[0]


def test_a_run_timed_on_packed_kernels_adds_its_kernel_matched_speedup_column(tmp_path):
    path = tmp_path / "packed.json"
    packed = dict(
        decode_row("sharegpt_heldout"), speedup_vs_packed_generate=0.95, speedup_vs_packed_generate_ci=[0.8, 1.1]
    )
    path.write_text(json.dumps([packed]))
    other = tmp_path / "default.json"
    other.write_text(json.dumps([decode_row("humaneval")]))
    text = report.table(report.read_rows(str(path)) + report.read_rows(str(other)))
    header, rule, first, second = text.splitlines()
    assert "| vs `generate` on packed kernels [95% CI] |" in header
    assert header.count("|") == rule.count("|") == first.count("|") == second.count("|")
    assert "| 1.000x [0.900, 1.100] | 0.950x [0.800, 1.100] |" in first
    assert "| 1.000x [0.900, 1.100] | - |" in second  # a run timed on the default kernels has no such baseline
    assert "packed kernels" not in report.table(report.read_rows(str(other)))
