"""The measured results as types (``measuring/results.py``): one JSON writer and one reader, schema-versioned, and
every raw file the experiments hold, written before the schema, still loads with the numbers it holds."""

from __future__ import annotations

import json
import math

import pytest
from helpers.paths import ROOT

from dspark_lightning.checks import dumps_json
from dspark_lightning.decoding.stats import PromptDecodeRecord
from dspark_lightning.measuring.eval_set_summary import summarize_eval_set
from dspark_lightning.measuring.results import (
    SCHEMA_VERSION,
    EvalSetRow,
    GenerateComparison,
    MeasuredRow,
    PackedBaseline,
    SpeedupResult,
    Spread,
    from_json,
    to_json,
)

RECORDS = [
    PromptDecodeRecord(10, 4, [3, 2], baseline_seconds=2.0, speculative_seconds=1.0, outputs_equal=True),
    PromptDecodeRecord(6, 3, [2], baseline_seconds=1.5, speculative_seconds=1.0, outputs_equal=True),
]
SPREAD = Spread(0.1, 20.0, 1.0, 0.05, False, [1.0, 0.5, 0.25], 2, [2.0, 1.5], [19.0, 21.0])
COMPARISON = GenerateComparison(
    speedup=1.75, median_prompt_speedup=1.75, baseline_tokens_per_second=20.0, outputs_equal=True, mismatches=[],
    ties=[1], differences=[{"prompt": 1, "kind": "tie"}], spread=SPREAD,
    packed=PackedBaseline(packed_generate_seconds=3.0, speedup_vs_packed_generate=1.5, packed_generate_mismatches=[]),
)  # fmt: skip


def measured_row(**changes) -> MeasuredRow:
    row = MeasuredRow(
        mode="markov", threshold=["cost", 0.01, 0.002], tau=16 / 7, tokens_per_second=8.0, mean_verified=7.0,
        accepted_rate_per_slot=[5 / 7, 2 / 7], phase_ms_per_step={"draft_backbone": 1.0, "draft_head": 0.5,
        "verify": 3.0, "bookkeeping": 0.1}, prompt_records=RECORDS, prompts_without_verify=1, comparison=COMPARISON,
        dtype="float32", temperature=0.0, machine={"cpu": "test"},
    )  # fmt: skip
    return MeasuredRow(**{**vars(row), **changes})


def speedup_result() -> SpeedupResult:
    return SpeedupResult(
        mode="markov", k=16, confidence_threshold=None, cost_model=None, drafter_cache=True, prompts=2,
        max_new_tokens=8, new_tokens=16, baseline_new_tokens=16, baseline_seconds=3.5, speculative_seconds=2.0,
        speculative_tokens_per_second=8.0, tau=16 / 7, target_forwards=7, mean_verified=7.0,
        accepted_rate_per_slot=[5 / 7, 2 / 7], phase_ms_per_step={"verify": 3.0}, prefill_seconds=0.2,
        baseline_prompt_seconds=[2.0, 1.5], speculative_prompt_seconds=[1.0, 1.0], comparison=COMPARISON,
        packed_verify=True, dtype="float32", prompt_records=RECORDS,
    )  # fmt: skip


def through_a_file(result):
    return json.loads(dumps_json(to_json(result)))  # what write_json writes and a reader gets back


@pytest.mark.parametrize(
    "result",
    [
        measured_row(),
        measured_row(comparison=None, prompts_without_verify=0, threshold=0.3),
        speedup_result(),
        EvalSetRow(
            summarize_eval_set("tiny", RECORDS, mode="markov", threshold=None, max_new_tokens=8), measured_row()
        ),
    ],
    ids=["timed row", "untimed row", "speedup", "eval-set row"],
)
def test_every_type_comes_back_equal_from_its_json(result):
    written = through_a_file(result)
    assert written["schema"] == SCHEMA_VERSION
    assert from_json(type(result), written) == result


def test_the_merged_stats_object_is_never_written():
    result = speedup_result()
    result.stats = object()  # would fail json.dumps
    assert "stats" not in to_json(result) and from_json(SpeedupResult, through_a_file(result)).stats is None


def test_a_non_finite_float_is_null_on_disk_and_nan_again_when_read():
    written = through_a_file(measured_row(tau=math.nan))
    assert written["tau"] is None and math.isnan(from_json(MeasuredRow, written).tau)


def test_nested_json_is_read_strictly():
    written = through_a_file(measured_row())
    with pytest.raises(ValueError, match=r"decode\.json\.comparison: GenerateComparison has no field 'speed'"):
        from_json(MeasuredRow, {**written, "comparison": {**written["comparison"], "speed": 2.0}}, "decode.json")
    with pytest.raises(ValueError, match="schema 2 .*reads 1"):
        from_json(MeasuredRow, {**written, "schema": 2})
    with pytest.raises(ValueError, match="MeasuredRow needs 'tau', which is missing"):
        from_json(MeasuredRow, {key: value for key, value in written.items() if key != "tau"})
    with pytest.raises(ValueError, match="expected a JSON object for MeasuredRow, got list"):
        from_json(MeasuredRow, [written])


def test_a_flat_pre_schema_row_spreads_into_the_nested_types():
    flat = {  # a decode --json row as written before schema 1: the comparison's and spread's keys beside the row's
        "mode": "markov", "threshold": None, "tau": 2.0, "tokens_per_second": 9.0, "mean_verified": 7.0,
        "accepted_rate_per_slot": [0.5], "phase_ms_per_step": {"verify": 1.0}, "speedup": 1.2,
        "median_prompt_speedup": 1.1, "baseline_tokens_per_second": 7.5, "outputs_equal": True, "mismatches": [],
        "prompt_speedup_iqr": 0.1, "baseline_tokens_per_second_median": 7.4, "baseline_tokens_per_second_iqr": 0.2,
        "baseline_relative_spread": 0.03, "noisy": False, "load_average": None,
    }  # fmt: skip
    row = from_json(MeasuredRow, flat)
    assert row.comparison.speedup == 1.2 and row.comparison.spread.baseline_relative_spread == 0.03
    assert row.comparison.packed is None and row.comparison.ties == []  # never measured: not made up
    untimed = from_json(MeasuredRow, {key: flat[key] for key in list(flat)[:7]})
    assert untimed.comparison is None and untimed.prompt_records == []


def raw_report_rows():
    for path in sorted((ROOT / "experiments").rglob("results.json")):
        data = json.loads(path.read_text())
        for row in data.get("rows", []) if isinstance(data, dict) else []:
            if "wall_clock" in row:
                yield path, row


REPORT_ROWS = list(raw_report_rows())


def test_the_experiments_hold_pre_schema_report_rows():
    assert len({path for path, _ in REPORT_ROWS}) >= 4  # the recipe reports (gemma3_heads, smollm2_heads/*)


@pytest.mark.parametrize("path,row", REPORT_ROWS, ids=[f"{p.parent.name}/{r['head']}" for p, r in REPORT_ROWS])
def test_every_raw_report_row_loads_with_its_numbers(path, row):
    for key in ("wall_clock", "wall_clock_scheduled"):
        if key not in row:
            continue
        raw, timed = row[key], from_json(SpeedupResult, row[key], str(path))
        assert (timed.tau, timed.comparison.speedup, timed.mean_verified) == (
            raw["tau"], raw["speedup"], raw["mean_verified"]
        )  # fmt: skip
        assert timed.comparison.outputs_equal == raw["outputs_equal"] and timed.prompts == raw["prompts"]
        assert (timed.comparison.spread is None) == ("noisy" not in raw)
        assert from_json(SpeedupResult, through_a_file(timed)) == timed  # and it writes back as schema 1
    for raw in row.get("eval_sets", []):
        loaded = from_json(EvalSetRow, raw, str(path))
        assert loaded.summary.measured_tau == raw["measured_tau"] and loaded.summary.speedup == raw["speedup"]
        assert loaded.summary.measured_tau_ci == raw["measured_tau_ci"]
        assert loaded.decoded is None  # the report kept the summary and the records, not the decode row


def test_a_raw_decode_file_loads_row_by_row():
    path = ROOT / "experiments/smollm2_heads/gated_longer/decode.json"
    raw = json.loads(path.read_text())
    rows = [from_json(MeasuredRow, r, str(path)) for r in raw]
    assert [(r.mode, r.tau, r.comparison.speedup) for r in rows] == [(r["mode"], r["tau"], r["speedup"]) for r in raw]


def test_the_guide_s_reading_example_runs(monkeypatch, capsys):
    guide = (ROOT / "docs/guides/measuring_acceptance.md").read_text()
    block = guide.split("**What `--json` holds.**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(ROOT)  # the example reads a raw file by its path in the repository
    exec(compile(block, "measuring_acceptance.md", "exec"), {})
    tau, speedup = map(float, capsys.readouterr().out.split())
    raw = json.loads((ROOT / "experiments/smollm2_heads/gated_longer/decode.json").read_text())[0]
    assert (tau, speedup) == (raw["tau"], raw["speedup"])
