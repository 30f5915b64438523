"""scripts/validation_curves.py: the validation rows of CSVLogger files, 1-based steps, one CSV and one chart."""

from __future__ import annotations

import csv
import importlib.util

import pytest
from helpers.paths import ROOT

spec = importlib.util.spec_from_file_location("validation_curves", ROOT / "scripts" / "validation_curves.py")
curves = importlib.util.module_from_spec(spec)
spec.loader.exec_module(curves)

HEADER = ["epoch", "lr-AdamW", "step", "train/loss", "val/greedy_tau", "val/loss", "val/tau"]


def write_metrics(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        writer.writerows(rows)
    return path


def test_two_runs_at_different_intervals_give_their_own_validation_rows(tmp_path):
    a = write_metrics(tmp_path / "a.csv", [
        [0, 0.001, 24, 4.9, "", "", ""],  # a training row: no validation
        [0, "", 199, "", 1.19, 4.05, 1.14],
        [0, "", 399, "", 1.27, 3.68, 1.22],
    ])  # fmt: skip
    b = write_metrics(tmp_path / "b.csv", [[1, "", 499, "", 1.23, 3.60, 1.19], [0, 0.001, 524, 3.8, "", "", ""]])
    rows = curves.write_curves({"short": a, "long": b}, tmp_path / "out")
    assert [(r["run"], r["step"], r["tf_greedy_tau"]) for r in rows] == [
        ("short", 200, 1.19), ("short", 400, 1.27), ("long", 500, 1.23),
    ]  # fmt: skip
    with open(tmp_path / "out" / "validation_curve.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert written[2] == {"run": "long", "step": "500", "tf_greedy_tau": "1.2300", "tf_expected_tau": "1.1900",
                          "val_loss": "3.6000"}  # fmt: skip
    assert (tmp_path / "out" / "tau_vs_steps.png").stat().st_size > 0


def test_a_file_without_validations_is_an_error_naming_it(tmp_path):
    empty = write_metrics(tmp_path / "train_only.csv", [[0, 0.001, 24, 4.9, "", "", ""]])
    with pytest.raises(ValueError, match="train_only.csv: no row with a validation"):
        curves.validation_rows("x", empty)
    other = tmp_path / "other.csv"
    other.write_text("step,loss\n1,2\n")
    with pytest.raises(ValueError, match=r"other.csv: no validation columns"):
        curves.validation_rows("x", other)
    with pytest.raises(SystemExit):
        curves.main(["--run", "no-equals-sign", "--output", str(tmp_path)])
