"""``dspark-lightning loss-study`` at a tiny budget, its aggregation rule, and the loss options of the model/YAML."""

from __future__ import annotations

import json
import math

import pytest

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import OptionError
from dspark_lightning.measuring import eval_sets
from dspark_lightning.measuring.eval_sets import EvalSetError
from dspark_lightning.measuring.results import EvalSetRow, from_json
from dspark_lightning.shipped import SHIPPED_ROOT
from dspark_lightning.studies import loss_study, loss_study_results


def test_tiny_study_writes_every_file_with_finite_numbers(tmp_path):
    out = tmp_path / "study"
    study = cli_main(
        [
            "loss-study", "--output", str(out), "--losses", "[kl,lk_hybrid]", "--seeds", "[0]", "--budget.steps", "3",
            "--budget.val_samples", "8", "--budget.val_batches", "1", "--budget.num_prompts", "1",
            "--budget.max_new_tokens", "8", "--budget.max_blocks", "16",
        ]
    )  # fmt: skip
    assert {p.name for p in out.iterdir()} == {"report.md", "results.json", "loss_study.png", "log.txt"}
    saved = json.loads((out / "results.json").read_text())
    labels = [g["label"] for g in saved["groups"]]
    assert labels[:2] == ["kl", "lk_hybrid"] and labels[2] in ("kl+dpace", "lk_hybrid+dpace")
    best = max(study["groups"][:2], key=lambda g: g["teacher_tau"])
    assert labels[2] == best["label"] + "+dpace"  # D-PACE reruns the loss with the best mean teacher-forced tau
    assert [(r["loss"], r["seed"], r["dpace"]) for r in saved["runs"]] == [
        ("kl", 0, False),
        ("lk_hybrid", 0, False),
        (best["label"], 0, True),
    ]
    for g in saved["groups"]:
        assert g["n"] == 1 and g["teacher_tau_std"] == 0.0
        for key in ("teacher_tau", "teacher_greedy_tau", "measured_tau"):
            assert math.isfinite(g[key]) and g[key] >= 1.0
        assert len(g["accept_rate_per_slot"]) == 8 and all(0 <= a <= 1 for a in g["accept_rate_per_slot"])
    assert saved["budget"]["steps"] == 3
    assert "eval_sets" not in saved and all("eval_sets" not in r for r in saved["runs"])  # only when asked for
    assert saved["command"] == (  # the made-by line: the options given, in the table's spelling
        f"dspark-lightning loss-study --output {out} --losses '[kl,lk_hybrid]' --seeds '[0]' --budget.steps 3 "
        "--budget.val_samples 8 --budget.val_batches 1 --budget.num_prompts 1 --budget.max_new_tokens 8 "
        "--budget.max_blocks 16"
    )
    assert isinstance(saved["cpu_seconds"], float) and math.isfinite(saved["cpu_seconds"])
    log = (out / "log.txt").read_text().splitlines()
    assert sum(line.startswith("[") for line in log) == 3  # one progress line per run
    assert (out / "loss_study.png").stat().st_size > 0
    # --rerender rebuilds the report and the plot from results.json alone, leaving the numbers untouched
    before = (out / "results.json").read_text()
    (out / "report.md").unlink()
    (out / "loss_study.png").unlink()
    again = cli_main(["loss-study", "--output", str(out), "--rerender", "true"])
    assert (out / "report.md").exists() and (out / "loss_study.png").exists()
    assert (out / "results.json").read_text() == before
    assert [g["teacher_tau"] for g in again["groups"]] == [g["teacher_tau"] for g in saved["groups"]]


def group(label, values):
    runs = [
        {
            "seed": i,
            "teacher_tau": v,
            "teacher_greedy_tau": v,
            "measured_tau": v,
            "accept_rate_per_slot": [v - 1, math.nan],
            "measured_accepted_per_slot": [math.nan, v],
            "fit_seconds": 1.0,
        }
        for i, v in enumerate(values)
    ]
    return loss_study_results.aggregate(label, runs)


def test_aggregate_and_significance_rule():
    a = group("a", [1.5, 1.7])
    assert a["teacher_tau"] == pytest.approx(1.6) and a["teacher_tau_std"] == pytest.approx(math.sqrt(0.02))
    assert a["accept_rate_per_slot"][0] == pytest.approx(0.6) and math.isnan(a["accept_rate_per_slot"][1])
    assert a["measured_accepted_per_slot"][1] == pytest.approx(1.6)
    b = group("b", [1.2, 1.22])  # |Δ| = 0.39 > 0.141 + 0.014
    c = group("c", [1.45, 1.55])  # |Δ| = 0.1 < 0.141 + 0.071
    s = loss_study_results.significance(a, b, "teacher_tau")
    assert s["delta"] == pytest.approx(0.39) and s["significant"]
    assert not loss_study_results.significance(a, c, "teacher_tau")["significant"]
    one, other = group("x", [1.0]), group("y", [2.0])
    assert not loss_study_results.significance(one, other, "measured_tau")["significant"]  # one seed: never significant


def test_unknown_loss_or_no_seed_fails_before_training(tmp_path):
    with pytest.raises(OptionError, match="--losses: unknown loss 'jsd'"):  # one line naming the option, exit 2
        loss_study.run_study(tmp_path, losses=["kl", "jsd"])
    with pytest.raises(OptionError, match="--seeds"):
        loss_study.run_study(tmp_path, losses=["kl"], seeds=[])
    assert not (tmp_path / "log.txt").exists()


def test_loss_configs_compose_and_bad_options_name_themselves(capsys):
    from dspark_lightning.cli import cli_main
    from dspark_lightning.lightning.config import LossArgs, TargetArgs
    from dspark_lightning.lightning.module import DSparkModule

    root = SHIPPED_ROOT
    with pytest.raises(SystemExit):
        cli_main(["fit", f"--config={root}/configs/quickstart.yaml", f"--config={root}/configs/losses/lk_hybrid.yaml",
                  "--model.loss.lk_eta=1.5", "--print_config"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "lk_hybrid: 1.0" in printed and "lk_eta: 1.5" in printed and "tv: 0.9" not in printed  # spec replaced
    for kwargs, option in (
        ({"weights": {"jsd": 1.0}}, "unknown loss 'jsd'"),
        ({"weights": {"js": -1.0}}, "'js'"),
        ({"lk_eta": -1.0}, "lk_eta"),
        ({"nla_alpha_min": 0.0}, "nla_alpha_min"),
    ):
        with pytest.raises(ValueError, match=option):  # fails on the option, before the target is loaded
            DSparkModule(TargetArgs("/nonexistent"), loss=LossArgs(**kwargs))


def test_study_on_eval_sets_keeps_each_runs_per_set_objects(tmp_path):
    out = tmp_path / "study"
    cli_main(
        [
            "loss-study", "--output", str(out), "--losses", "[kl]", "--seeds", "[0]", "--dpace", "false",
            "--budget.steps", "40", "--budget.val_samples", "8", "--budget.val_batches", "1",
            "--budget.num_prompts", "1", "--budget.max_new_tokens", "8", "--budget.max_blocks", "16",
            "--eval_sets", "[sharegpt_heldout,humaneval]", "--eval_set_limit", "3", "--eval_max_new_tokens", "12",
        ]
    )  # fmt: skip
    saved = json.loads((out / "results.json").read_text())
    assert saved["eval_sets"] == {
        "names": ["sharegpt_heldout", "humaneval"], "limit": 3, "max_new_tokens": 12, "heldout_files": None,
        "heldout_split": None,
    }  # fmt: skip
    (run,) = saved["runs"]
    measured = [from_json(EvalSetRow, e, "results.json") for e in run["eval_sets"]]
    assert [(e.summary.eval_set, e.summary.mode) for e in measured] == [
        ("sharegpt_heldout", run["measured_mode"]),
        ("humaneval", run["measured_mode"]),
    ]
    for entry in measured:  # the object decode --eval_sets and report-recipe --eval_sets write
        summary, records = entry.summary, entry.decoded.prompt_records
        assert (
            summary.max_new_tokens == 12
            and summary.num_prompts == len(records) == 3 - entry.decoded.prompts_without_verify
        )
        tau = sum(r.emitted_tokens for r in records) / sum(r.target_forwards for r in records)
        assert summary.measured_tau == pytest.approx(tau) and tau > 1.0  # recomputed from the raw per-prompt counts
        low, high = summary.measured_tau_ci
        assert 1.0 <= low <= tau <= high and summary.ci_confidence == 0.95
        assert summary.speedup is None and summary.speedup_ci is None  # no wall clock in a loss study
        assert entry.decoded.comparison is None
    (group,) = saved["groups"]
    assert [(g["eval_set"], g["n"], g["measured_tau"]) for g in group["eval_sets"]] == [
        (e.summary.eval_set, 1, e.summary.measured_tau) for e in measured
    ]
    report = (out / "report.md").read_text()
    assert "| loss | sharegpt_heldout | humaneval |" in report
    cells = [
        f"{e.summary.measured_tau:.3f} [{e.summary.measured_tau_ci[0]:.3f}, {e.summary.measured_tau_ci[1]:.3f}]"
        for e in measured
    ]
    assert f"| kl | {cells[0]} | {cells[1]} |" in report
    assert "sharegpt_heldout tau" in (out / "log.txt").read_text()
    (out / "report.md").unlink()  # --rerender rebuilds the table from results.json alone
    cli_main(["loss-study", "--output", str(out), "--rerender", "true"])
    assert f"| kl | {cells[0]} | {cells[1]} |" in (out / "report.md").read_text()


def test_a_missing_or_malformed_eval_set_fails_the_study_before_training(tmp_path, monkeypatch):
    missing = tmp_path / "heldout.jsonl"
    args = ["loss-study", "--output", str(tmp_path / "study"), "--losses", "[kl]", "--seeds", "[0]"]
    with pytest.raises(EvalSetError, match=f"eval set 'sharegpt_heldout': cannot read heldout_files=.*{missing}"):
        cli_main([*args, "--eval_sets", "[sharegpt_heldout]", "--heldout_files", str(missing)])
    garbled = tmp_path / "HumanEval.jsonl"
    garbled.write_text('{"task_id": "T/0"}\n')
    monkeypatch.setattr(eval_sets, "humaneval_path", lambda: str(garbled))
    with pytest.raises(EvalSetError, match=f"eval set 'humaneval': {garbled}:1: record has no 'prompt' string"):
        cli_main([*args, "--eval_sets", "[humaneval]"])
    assert not (tmp_path / "study").exists()  # nothing trained, nothing written
    with pytest.raises(SystemExit):  # an unknown name is a usage error naming --eval_sets
        cli_main([*args, "--eval_sets", "[mmlu]"])
