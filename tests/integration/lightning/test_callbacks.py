"""The callbacks that log and summarise: the decoding gap against the same validation's tau, the end-of-run summary
with both calibration errors named apart and the measured tau, the reliability diagram's title, and stop requests.

One real fit on the demo target with two validations (the gap must use each one's own ``val/tau``); the summary,
the diagram and the Selector report's stop are checked on stand-in trainers, which is all those hooks read.
"""

from __future__ import annotations

import csv
import json
import re
from types import SimpleNamespace

import pytest
import torch
from helpers.quickstart import quickstart_fit_args

from dspark_lightning.cli import cli_main
from dspark_lightning.lightning import callbacks
from dspark_lightning.lightning.callbacks import CalibrationDiagram, ValidationSummary
from dspark_lightning.models import MarkovHead
from dspark_lightning.selector import equivalence_report

DECODING = "dspark_lightning.measuring.callback.SpeculativeDecodingCallback"


def test_decode_gap_is_this_validations_tau_minus_the_measured_tau(tmp_path, capsys):
    decode = {"class_path": DECODING, "init_args": {"modes": ["markov"], "num_prompts": 1, "max_new_tokens": 12}}
    summary = {"class_path": "dspark_lightning.lightning.callbacks.ValidationSummary"}
    cli_main(
        [
            *quickstart_fit_args(),
            "--data.seq_len=128",
            "--data.batch_size=2",
            "--data.limit_val_samples=8",
            "--model.drafter.max_anchors=8",
            "--trainer.max_steps=6",
            "--trainer.val_check_interval=3",  # two validations, with training between them (their taus differ)
            "--trainer.limit_val_batches=2",
            f"--trainer.callbacks={json.dumps([decode, summary])}",
            "--trainer.enable_progress_bar=false",
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
            f"--trainer.logger.save_dir={tmp_path}",
            "--trainer.logger.name=run",
        ]
    )
    rows = list(csv.DictReader((tmp_path / "run/version_0/metrics.csv").open()))
    validations = [row for row in rows if row.get("val/tau")]
    assert [int(row["step"]) for row in validations] == [2, 5]  # logged at the last step before each validation
    assert validations[0]["val/tau"] != validations[1]["val/tau"]
    for row in validations:  # the gap of each validation is against that validation's teacher-forced tau
        gap = float(row["val/tau"]) - float(row["val/decode/markov/tau"])
        assert float(row["val/decode/markov/gap"]) == pytest.approx(gap, abs=1e-6)
    printed = capsys.readouterr().out
    assert "SpeculativeDecodingCallback: decoding 1 prompts x 1 modes" in printed
    measured = float(validations[-1]["val/decode/markov/tau"])  # the end-of-run summary shows the measured tau
    assert re.search(rf"tau measured \(markov decoding\) +│ +{measured:.4f} │", printed)


def test_summary_and_reliability_diagram_name_the_two_calibration_errors_apart(capsys, monkeypatch):
    values = {
        "acceptance/tau": torch.tensor(1.5),
        "confidence/slot_ece": torch.tensor(0.0123),
        "confidence/prefix_ece": torch.tensor(0.0456),
        "confidence/reliability_confidence": torch.tensor([0.5]),
        "confidence/reliability_observed": torch.tensor([0.4]),
        "confidence/reliability_count": torch.tensor([3]),
    }
    trainer = SimpleNamespace(global_step=7, is_global_zero=True, sanity_checking=False, callback_metrics={})
    ValidationSummary().on_fit_end(trainer, SimpleNamespace(last_validation=values))
    printed = capsys.readouterr().out
    assert re.search(r"slot_ece \(c_k vs alpha_k\) +│ +0\.0123 │", printed)
    assert re.search(r"prefix_ece \(prefix survival\) +│ +0\.0456 │", printed)
    assert "tau measured" not in printed  # no decoding callback, no measured tau

    titles = []
    monkeypatch.setattr(callbacks.plotting, "reliability_diagram", lambda *args, title: titles.append(title))
    monkeypatch.setattr(callbacks, "publish_figure", lambda *args: None)
    CalibrationDiagram().on_validation_end(trainer, SimpleNamespace(last_validation=values))
    assert titles == ["prefix survival calibration (prefix ECE 0.046)"]


def test_selector_report_stops_between_walks_when_asked():
    generator = torch.Generator().manual_seed(0)
    head = MarkovHead(verifier_vocab_size=32, draft_vocab_size=32, rank=4, hidden_size=8)
    base, hidden = torch.randn(5, 3, 32, generator=generator), torch.randn(5, 3, 8, generator=generator)
    first_prev = torch.randint(0, 32, (5,), generator=generator)
    asked = []

    def stop() -> bool:  # a SIGTERM arrives during the second walk
        asked.append(1)
        return len(asked) > 2

    report = equivalence_report(base, head, first_prev, hidden, ks=(1, 4, 16, 32), stop=stop)
    assert report.ks == (1, 4) and set(report.coverage) == {1, 4}
    assert set(report.to_flat_dict()) >= {"coverage@1", "coverage@4"} and "coverage@16" not in report.to_flat_dict()
