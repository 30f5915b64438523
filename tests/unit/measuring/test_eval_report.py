"""An evaluation set's summary: pooled ratios of sums, per-slot acceptance, optional speedup, JSON-ready values."""

from __future__ import annotations

import json

import pytest

from dspark_lightning.decoding.stats import DecodeStats, PromptDecodeRecord
from dspark_lightning.measuring.eval_set_summary import summarize_eval_set
from dspark_lightning.measuring.results import EvalSetSummary, from_json, to_json


def run(accepted: list[int], verified: int = 4, last_emitted: int | None = None) -> DecodeStats:
    """One prompt's stats: every step emits its accepted tokens plus the target's own token (the last step maybe
    fewer, as when max_new_tokens cuts it)."""
    stats = DecodeStats("markov", verified, 0.0, None)
    stats.accepted_per_step = list(accepted)
    stats.verified_per_step = [verified] * len(accepted)
    stats.emitted_per_step = [a + 1 for a in accepted]
    if last_emitted is not None:
        stats.emitted_per_step[-1] = last_emitted
    stats.new_tokens = sum(stats.emitted_per_step)
    return stats


def test_a_record_from_decode_stats_counts_accepted_steps_per_slot():
    record = PromptDecodeRecord.from_stats(run([3, 0, 1, 4]), baseline_seconds=2.0, speculative_seconds=1.0)
    assert record.emitted_tokens == 12 and record.target_forwards == 4
    assert record.accepted_per_slot == [3, 2, 2, 1]  # slot k accepted in the steps that accepted more than k
    assert record.has_timing


def test_measured_tau_is_a_ratio_of_sums_and_matches_merged_decode_stats():
    runs = [run([4, 4, 4, 4, 4]), run([0, 1], last_emitted=1), run([2, 0, 3])]
    summary = summarize_eval_set("tiny", [PromptDecodeRecord.from_stats(r) for r in runs])
    assert summary.measured_tau == pytest.approx(DecodeStats.merge(runs).tau)
    assert summary.measured_tau == pytest.approx((25 + 2 + 8) / (5 + 2 + 3))  # not the mean of 5, 1, 2.67
    low, high = summary.measured_tau_ci
    assert low < summary.measured_tau < high
    # a step that accepted a drafted tokens accepted slots 0..a-1: slot 0 in 5 + 1 + 2 of the 10 steps, and so on
    assert summary.acceptance_per_slot == pytest.approx([8 / 10, 7 / 10, 6 / 10, 5 / 10])
    assert summary.num_prompts == 3 and summary.eval_set == "tiny"


def test_without_timing_the_speedup_keys_are_null_and_the_summary_is_strict_json():
    records = [
        dict(emitted_tokens=9, target_forwards=3, accepted_per_slot=[3, 3]),
        dict(emitted_tokens=4, target_forwards=4),
    ]
    summary = summarize_eval_set("no-baseline", records)
    assert summary.speedup is None and summary.speedup_ci is None and summary.outputs_equal is None
    assert summary.acceptance_per_slot == pytest.approx([3 / 7, 3 / 7])
    assert from_json(EvalSetSummary, json.loads(json.dumps(to_json(summary), allow_nan=False))) == summary
    assert all(type(x) is float for x in [summary.measured_tau, *summary.measured_tau_ci])


def test_speedup_pools_seconds_and_outputs_equal_needs_every_prompt():
    records = [
        PromptDecodeRecord(10, 4, [4, 2], baseline_seconds=3.0, speculative_seconds=1.0, outputs_equal=True),
        PromptDecodeRecord(8, 4, [2], baseline_seconds=1.0, speculative_seconds=1.0, outputs_equal=True),
    ]
    summary = summarize_eval_set("timed", records)
    assert summary.speedup == pytest.approx(4.0 / 2.0)  # total over total, not the mean of 3 and 1
    low, high = summary.speedup_ci
    assert low <= summary.speedup <= high and {low, high} <= {1.0, 2.0, 3.0}  # 2 prompts: 3 possible resamples
    assert summary.outputs_equal is True
    mismatch = PromptDecodeRecord(5, 5, [], baseline_seconds=1.0, speculative_seconds=2.0, outputs_equal=False)
    assert summarize_eval_set("timed", [*records, mismatch]).outputs_equal is False
    assert json.dumps(to_json(summary), allow_nan=False)


def test_one_prompt_gives_point_intervals():
    summary = summarize_eval_set(
        "one", [PromptDecodeRecord(7, 2, [2, 1], baseline_seconds=1.0, speculative_seconds=0.5)]
    )
    assert summary.measured_tau_ci == [3.5, 3.5] and summary.speedup_ci == [2.0, 2.0]


@pytest.mark.parametrize(
    "records, message",
    [
        ([], "'bad': no per-prompt records"),
        (
            [
                dict(emitted_tokens=3, target_forwards=1, baseline_seconds=1.0, speculative_seconds=1.0),
                dict(emitted_tokens=3, target_forwards=1),
            ],
            "1 of 2 prompts have no timing",
        ),  # fmt: skip
        ([dict(emitted_tokens=3, target_forwards=0)], "target_forwards >= 1"),
        ([dict(emitted_tokens=3, target_forwards=2, accepted_per_slot=[3])], r"\[0, target_forwards\]"),
        ([dict(emitted_tokens=3, target_forwards=2, baseline_seconds=1.0)], "both baseline_seconds and"),
    ],
)
def test_bad_records_are_clear_errors(records, message):
    with pytest.raises(ValueError, match=message):
        summarize_eval_set("bad", records)


def test_the_packed_generate_baseline_pools_its_own_seconds():
    records = [
        PromptDecodeRecord(10, 4, [4], baseline_seconds=3.0, speculative_seconds=1.0, packed_generate_seconds=2.0),
        PromptDecodeRecord(8, 4, [2], baseline_seconds=1.0, speculative_seconds=2.0, packed_generate_seconds=1.0),
    ]
    summary = summarize_eval_set("packed", records)
    assert summary.speedup == pytest.approx(4.0 / 3.0)
    assert summary.speedup_vs_packed_generate == pytest.approx(3.0 / 3.0)  # (2 + 1) / (1 + 2)
    low, high = summary.speedup_vs_packed_generate_ci
    assert {low, high} <= {2.0, 1.0, 0.5} and low <= 1.0 <= high  # resamples: both of prompt 0, both of 1, or one each
    unpacked = summarize_eval_set("default", [PromptDecodeRecord(3, 1, baseline_seconds=1.0, speculative_seconds=1.0)])
    assert unpacked.speedup_vs_packed_generate is None and unpacked.speedup_vs_packed_generate_ci is None
    with pytest.raises(ValueError, match="some prompts have packed_generate_seconds and some do not"):
        summarize_eval_set("mixed", [*records, PromptDecodeRecord(3, 1, baseline_seconds=1.0, speculative_seconds=1.0)])
    with pytest.raises(ValueError, match="packed_generate_seconds needs the speculative_seconds"):
        PromptDecodeRecord(3, 1, packed_generate_seconds=1.0)
