"""``dspark-lightning report``: a tiny report end to end, and the studies' helpers (shared with the notebooks)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dspark_lightning.cli import cli_main
from dspark_lightning.measuring.calibration import expected_calibration_error, reliability_bins
from dspark_lightning.shipped import SHIPPED_ROOT
from dspark_lightning.studies import report
from dspark_lightning.studies.command_lines import shell_command
from dspark_lightning.studies.recipes import load_recipe
from dspark_lightning.studies.runs import find_runs, run_label


def test_tiny_report_writes_everything(tmp_path):
    out = tmp_path / "report"
    rows = cli_main(
        [
            "report", "--output", str(out), "--heads", "[none,gated]", "--block_sizes", "[8]",
            "--budget.steps", "20", "--budget.val_samples", "16", "--budget.val_batches", "2",
            "--budget.num_prompts", "2", "--budget.max_new_tokens", "24", "--budget.max_blocks", "64",
        ]
    )  # fmt: skip
    assert {p.name for p in out.iterdir()} == {
        "report.md",
        "results.json",
        "acceptance_per_slot.png",
        "tau.png",
        "selector.png",
    }
    assert [(r["head"], r["block_size"]) for r in rows] == [("none", 8), ("gated", 8)]
    none, gated = rows
    for row in rows:
        assert row["teacher_tau"] >= 1.0 and row["measured_tau"] >= 1.0
        assert len(row["accept_rate_per_slot"]) == 8
        assert 0.0 <= row["ece_before"] <= 1.0 and 0.0 <= row["ece_after"] <= 1.0
        assert row["run_dir"] is None  # runs went to a temporary directory that is gone
    assert none["measured_mode"] == "parallel" and none["agreement_at_k"] is None and none["selector"] is None
    assert gated["measured_mode"] == "markov" and gated["measured_selector_tau"] >= 1.0
    assert 0.0 <= gated["agreement_at_k"] <= gated["coverage_at_k"] <= 1.0
    selector = gated["selector"]
    assert selector["ks"] == sorted(selector["ks"]) and 16 in selector["ks"]
    assert all(b >= a for a, b in zip(selector["coverage"], selector["coverage"][1:]))  # coverage grows with k

    text = (out / "report.md").read_text()
    assert "| none | 8 |" in text and "| gated | 8 |" in text and "![tau](tau.png)" in text
    saved = json.loads((out / "results.json").read_text())
    assert saved["budget"]["steps"] == 20 and len(saved["rows"]) == 2
    assert saved["command"] == (  # the line that makes the report again: only the options that differ from defaults
        f"dspark-lightning report --output {out} --heads '[none,gated]' --block_sizes '[8]' --budget.steps 20 "
        "--budget.val_samples 16 --budget.val_batches 2 --budget.num_prompts 2 --budget.max_new_tokens 24 "
        "--budget.max_blocks 64"
    )


def test_report_keeps_runs_when_asked(tmp_path):
    rows = cli_main(
        [
            "report", "--output", str(tmp_path / "out"), "--runs_dir", str(tmp_path / "runs"), "--heads", "[rnn]",
            "--block_sizes", "[4]", "--budget.steps", "4", "--budget.val_samples", "8", "--budget.val_batches", "1",
            "--budget.num_prompts", "1", "--budget.max_new_tokens", "8", "--budget.max_blocks", "16",
        ]
    )  # fmt: skip
    (row,) = rows
    assert row["head"] == "rnn" and row["selector"] is None and row["measured_mode"] == "markov"
    runs = find_runs(tmp_path / "runs")
    assert [p.relative_to(tmp_path / "runs").as_posix() for p in runs] == ["rnn_b4/version_0"]
    assert (runs[0] / "checkpoints" / "last.ckpt").exists()
    assert not (tmp_path / "out" / "selector.png").exists()  # no Selector-form head, no Selector chart


def test_unknown_head_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown heads"):
        report.run_report(tmp_path, heads=["vanila"])


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({"drafter": {"markov_head": None, "block_size": 16}}, ("none", 16)),
        ({"drafter": {"markov_head": {"kind": "gated", "rank": 8}}, "loss": {"gamma": 4.0}}, ("gated", 8)),
        ({"drafter": {"markov_head": {"kind": "gated", "gate_input": "hidden", "gate_activation": "identity"}}}, ("selector", 8)),
        # runs and checkpoints written before the config groups: flat options, the head as a class_path
        ({"markov_head": None, "block_size": 16}, ("none", 16)),
        ({"markov_head": {"class_path": "dspark_lightning.models.VanillaMarkov", "init_args": {"rank": 64}}}, ("vanilla", 8)),
        ({"markov_head": {"class_path": "dspark_lightning.models.GatedMarkov"}, "block_size": 8}, ("gated", 8)),
        ({"markov_head": {"class_path": "dspark_lightning.models.SelectorMarkov"}}, ("selector", 8)),
        ({"markov_head": {"class_path": "dspark_lightning.models.RnnMarkov"}}, ("rnn", 8)),
        (
            {"markov_head": {"class_path": "dspark_lightning.models.MarkovHeadConfig",
                             "init_args": {"head_type": "gated", "gate_input": "hidden", "gate_activation": "identity"}}},
            ("selector", 8),
        ),
    ],
)  # fmt: skip
def test_run_label(model, expected):
    assert run_label(model) == expected


def test_reliability_bins_reproduce_the_ece():
    generator = torch.Generator().manual_seed(0)
    predicted = torch.rand(500, generator=generator)
    observed = (predicted + 0.2 * torch.randn(500, generator=generator)).clamp(0, 1)
    valid = torch.rand(500, generator=generator) > 0.2
    mean_pred, mean_obs, counts = reliability_bins(predicted, observed, valid)
    assert sum(counts) == int(valid.sum())
    ece = sum(n * abs(p - o) for p, o, n in zip(mean_pred, mean_obs, counts) if n) / sum(counts)
    assert ece == pytest.approx(float(expected_calibration_error(predicted, observed, valid)), rel=1e-9)
    assert all(math.isnan(p) for p, n in zip(mean_pred, counts) if n == 0)


def test_shell_command_quotes_globs():
    command = shell_command(["fit", "--data.train_files=a/*.jsonl", "--model.drafter.block_size=8"])
    assert command.splitlines()[0] == "dspark-lightning fit \\"
    assert "'--data.train_files=a/*.jsonl'" in command


def test_report_is_a_dspark_lightning_command():
    from dspark_lightning.cli import TOOL_COMMANDS

    assert TOOL_COMMANDS["report"] is report.report_command


def test_recipes_load_by_name_or_path_and_name_their_errors(tmp_path):
    by_name = load_recipe("smollm2")
    assert (
        by_name
        == load_recipe("configs/recipes/smollm2.yaml")
        == load_recipe(SHIPPED_ROOT / "configs/recipes/smollm2.yaml")
    )
    assert by_name.fit_configs("vanilla") == [
        "--config",
        str(SHIPPED_ROOT / by_name.fit_config),
    ]  # the config's own head
    assert by_name.fit_configs("gated")[-1] == str(SHIPPED_ROOT / "configs/heads/gated.yaml")
    other = tmp_path / "other.yaml"
    other.write_text(
        (SHIPPED_ROOT / "configs/recipes/smollm2.yaml").read_text().replace("name: smollm2", "name: other")
    )
    assert load_recipe(other).name == "other"  # a second target is one more file
    other.write_text(other.read_text() + "extra: 1\n")
    with pytest.raises(ValueError, match=r"unknown keys \['extra'\]"):
        load_recipe(other)
    with pytest.raises(FileNotFoundError, match="smollm2"):  # the error lists the recipes there are
        load_recipe("no_such_recipe")
