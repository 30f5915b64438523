"""Smoke tests of the experiments' before/after step comparisons (``experiments/training_step_speedup/bench.py``,
``experiments/gemma3_training_step/bench.py``): their quick modes run and write result files with the right fields.

No timing is asserted; "before" is this tree (``before_rev=None``), so no git revision is exported.
"""

from __future__ import annotations

import csv
import json
import sys

from helpers.paths import ROOT

if str(ROOT) not in sys.path:  # ``experiments`` is a folder of the repository, not part of the installed package
    sys.path.insert(0, str(ROOT))

from experiments.gemma3_training_step import bench as bench_gemma_step  # noqa: E402
from experiments.training_step_speedup import bench as bench_training_step  # noqa: E402


def read_csv(path):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_training_step_quick_writes_before_and_after(tmp_path):
    """Demo target, a tiny synthetic cache, one round; "before" is this tree with a format 1 cache (no git export)."""
    record = bench_training_step.run(quick=True, out_dir=tmp_path, before_rev=None, log=lambda *_: None)
    saved = json.loads((tmp_path / "training_step_quick.json").read_text())
    for side in ("before", "fallback", "after"):
        assert saved[side]["tokens_per_second"] > 0 and saved[side]["peak_memory_mb"] > 0
        assert set(saved[side]["profile"]["parts"]) >= {"teacher", "attention", "draft_head", "loss", "optimizer"}
    assert (
        "final_logsumexp" in saved["after"]["batch_fields"] and "final_logsumexp" not in saved["before"]["batch_fields"]
    )
    assert saved["first_loss_difference"] < 1e-4 and record["ratio"] > 0  # same weights, rows and anchors
    header, rows = read_csv(tmp_path / "training_step_quick.csv")
    assert header == bench_training_step.COLUMNS and [r["side"] for r in rows] == ["before", "fallback", "after"]
    markdown = (tmp_path / "training_step_quick.md").read_text()
    assert "synthetic cache" in markdown and "| teacher (LM head" in markdown


def test_gemma_step_quick_writes_both_vocabularies(tmp_path):
    """Tiny Gemma 3 shapes, one round, the full-vocabulary pass comparison skipped (no git export)."""
    record = bench_gemma_step.run(quick=True, out_dir=tmp_path, before_rev=None, log=lambda *_: None)
    saved = json.loads((tmp_path / "gemma_step_quick.json").read_text())
    sizes = [saved[side]["draft_vocab_size"] for side in bench_gemma_step.SIDES]
    assert sizes == [1024, 4096] == [record[side]["draft_vocab_size"] for side in bench_gemma_step.SIDES]
    for side in bench_gemma_step.SIDES:
        assert saved[side]["tokens_per_second"] > 0 and saved[side]["peak_memory_mb"] > 0
        assert set(saved[side]["profile"]["parts"]) >= {"teacher", "draft_head", "markov", "loss", "optimizer"}
    assert saved["full"]["trainable_params"] > saved["vd32k"]["trainable_params"]  # W2 and nothing else grows
    markdown = (tmp_path / "gemma_step_quick.md").read_text()
    assert "| Vd = 1,024 |" in markdown and "Not measured: no before revision" in markdown
