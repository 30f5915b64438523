"""A checkpoint whose fit was given relative paths (target, data) decodes and calibrates from another directory."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers.hostile import TARGET, TRAIN, VAL, fit_args

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import LoadError
from dspark_lightning.lightning.frozen_state import WORKING_DIRECTORY
from dspark_lightning.measuring.loading import load_trained


@pytest.fixture(scope="module")
def project_checkpoint(tmp_path_factory):
    """fit run inside a project folder, the way a user types it: ``--model.target.path=target`` and so on."""
    project = tmp_path_factory.mktemp("project")
    shutil.copytree(TARGET, project / "target")
    (project / "data").mkdir()
    shutil.copy(TRAIN, project / "data/train.jsonl")
    shutil.copy(VAL, project / "data/validation.jsonl")
    relative = ["--model.target.path=target", "--data.train_files=data/train.jsonl", "--data.val_files=data/*.jsonl"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        cli_main(["fit", *fit_args(project / "runs"), *relative])
    return project, project / "runs/run/version_0/checkpoints/last.ckpt"


def test_fit_records_its_working_directory_and_the_paths_as_given(project_checkpoint):
    project, checkpoint = project_checkpoint
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert saved[WORKING_DIRECTORY] == str(project)
    assert saved["hyper_parameters"]["target"]["path"] == "target"  # recorded as given: the project can move
    assert saved["datamodule_hyper_parameters"]["val_files"] == "data/*.jsonl"


def test_relative_paths_are_read_from_the_fit_directory_when_not_found_from_here(project_checkpoint, monkeypatch):
    project, checkpoint = project_checkpoint
    elsewhere = project.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    monkeypatch.chdir(elsewhere)
    module, data = load_trained(str(checkpoint))
    assert module.target_args.path == str(project / "target")
    assert (data.tokenizer_name, data.val_files) == (str(project / "target"), str(project / "data/*.jsonl"))
    rows = cli_main(
        [
            "decode",
            f"--ckpt_path={checkpoint}",
            "--modes=[parallel]",
            "--num_prompts=1",
            "--max_new_tokens=4",
            "--baseline=false",
            f"--json={elsewhere / 'rows.json'}",
        ]  # fmt: skip
    )
    (written,) = json.loads((elsewhere / "rows.json").read_text())
    assert (written["mode"], written["tau"]) == ("parallel", rows[0].tau) and rows[0].tau >= 1  # JSON beside the row
    cli_main(["calibrate", f"--ckpt_path={checkpoint}", f"--output={elsewhere / 'calibrated.ckpt'}", "--max_batches=1"])
    assert (elsewhere / "calibrated.ckpt").is_file()


def test_a_path_found_from_here_wins_and_a_checkpoint_without_the_record_names_its_target(
    project_checkpoint, tmp_path, monkeypatch
):
    project, checkpoint = project_checkpoint
    here = tmp_path / "here"
    shutil.copytree(project / "target", here / "target")  # a `target` folder in the current directory is the one read
    monkeypatch.chdir(here)
    module, _ = load_trained(str(checkpoint))
    assert module.target_args.path == "target"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    del saved[WORKING_DIRECTORY]  # as written before the record existed: relative means relative to here
    old = tmp_path / "old.ckpt"
    torch.save(saved, old)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError, match=r"^target 'target' cannot be loaded"):
        load_trained(str(old))
