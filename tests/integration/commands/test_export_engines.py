"""``export`` through the command line with the support matrix: a gated head exports with a one-line warning,
``--target_engine vllm`` refuses it in one line (exit status 2, no traceback, nothing written), and a head-less
DFlash-convention drafter without a confidence head exports in the DFlash format by default."""

from __future__ import annotations

import json
import sys

from helpers.export import RANK, make_target_dir, train_and_checkpoint

from dspark_lightning.cli import main
from dspark_lightning.models import MarkovHeadConfig


def run(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["dspark-lightning", "export", *args])
    capsys.readouterr()  # what training printed
    status = main()
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_gated_head_is_warned_about_and_refused_for_vllm(tmp_path, monkeypatch, capsys):
    target_dir = make_target_dir(tmp_path / "target")
    ckpt, _ = train_and_checkpoint(tmp_path, target_dir, markov_head=MarkovHeadConfig("gated", RANK))
    refused = tmp_path / "refused"
    status, out, err = run(
        monkeypatch, capsys, "--ckpt_path", str(ckpt), "--output", str(refused), "--target_engine", "vllm"
    )
    assert status == 2 and out == "" and not refused.exists()
    error = err.splitlines()[-1]  # above it: the target's loading bar, if transformers draws one
    assert error.startswith("dspark-lightning: error: --target_engine vllm: a gated Markov head")
    assert (
        "markov_head.gate_up_proj" in error and "Traceback" not in err and "error" not in err.removesuffix(error + "\n")
    )

    status, out, err = run(monkeypatch, capsys, "--ckpt_path", str(ckpt), "--output", str(tmp_path / "export"))
    assert status == 0 and "error" not in err
    lines = out.splitlines()
    assert lines[0].startswith("exported to") and "(dspark format)" in lines[0]
    assert [line for line in lines if line.startswith("warning:")] == [lines[-1]]
    assert "served by no vllm version" in lines[-1] and "vllm-dspark 0.32" in lines[-1]


def test_a_head_less_dflash_convention_drafter_exports_as_dflash_by_default(tmp_path, monkeypatch, capsys):
    target_dir = make_target_dir(tmp_path / "target")
    fields = dict(markov_head=None, confidence_head=False, confidence_with_markov=False, sample_from_anchor=False)
    ckpt, _ = train_and_checkpoint(tmp_path, target_dir, **fields)
    out_dir = tmp_path / "export"
    status, out, _ = run(
        monkeypatch, capsys, "--ckpt_path", str(ckpt), "--output", str(out_dir), "--target_engine", "vllm"
    )
    assert status == 0 and "(dflash format)" in out and "warning" not in out
    config = json.loads((out_dir / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["architectures"] == ["DFlashDraftModel"]
    status, out, _ = run(
        monkeypatch, capsys, "--ckpt_path", str(ckpt), "--output", str(tmp_path / "ds"), "--format", "dspark"
    )
    assert status == 0 and "(dspark format)" in out and "warning" not in out
