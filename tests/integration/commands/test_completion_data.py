"""Completion data end to end on a base model (the demo target without its chat template): ``fit`` saves the format
it chose with the run, chat records are refused before the target loads, and ``cache`` / ``draft-vocab`` read
completion records as training does."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from helpers.base_targets import base_model_copy
from helpers.paths import ASSETS, ROOT
from helpers.readme import readme_commands
from safetensors.torch import load_file
from transformers import AutoTokenizer

from dspark_lightning.cli import cli_main, main
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.data.sharegpt import DataFormatError

SHAREGPT = ASSETS / "data/sharegpt"


def completion_records(source: Path, count: int) -> list[dict]:
    """Completion records made of demo conversations: the first user turn as the prompt, the first reply after it."""
    records = []
    for line in source.read_text().splitlines()[:count]:
        record = json.loads(line)
        turns = record["conversations"]
        first_user = next(t["value"] for t in turns if t["from"] == "human")
        first_reply = next(t["value"] for t in turns if t["from"] == "gpt")
        records.append({"id": record["id"], "prompt": first_user + "\n", "completion": first_reply})
    return records


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A base-model target directory and completion train / validation files."""
    root = tmp_path_factory.mktemp("completion")
    target = base_model_copy(root / "target")
    files = {}
    for name, source, count in (("train", SHAREGPT / "train-00000.jsonl", 160), ("val", SHAREGPT / "validation-00000.jsonl", 40)):  # fmt: skip
        files[name] = root / f"{name}.jsonl"
        files[name].write_text("\n".join(json.dumps(r) for r in completion_records(source, count)) + "\n")
    return target, files


def fit_args(target: Path, train: Path, val: Path, save_dir: Path, steps: int = 2) -> list[str]:
    return [
        "--config", str(ROOT / "configs/quickstart.yaml"), f"--model.target.path={target}",
        f"--data.train_files={train}", f"--data.val_files={val}", "--data.seq_len=128", "--data.batch_size=2",
        "--model.drafter.max_anchors=8", f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}",
        "--trainer.limit_val_batches=2", "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={save_dir}", "--trainer.logger.name=run",
    ]  # fmt: skip


def test_fit_on_completion_records_saves_the_chosen_format_with_the_run(tmp_path, base, caplog):
    target, files = base
    with caplog.at_level("INFO", logger="dspark_lightning.data.formats"):
        cli = cli_main(["fit", *fit_args(target, files["train"], files["val"], tmp_path)])
    chosen = [r.message for r in caplog.records if r.message.startswith("data format")]
    assert len(chosen) == 1 and "data format completion" in chosen[0] and "no chat template" in chosen[0]
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and float(metrics["val/tau"]) >= 1.0
    assert float(metrics["val/decode/markov/tau"]) >= 1.0  # measured decoding from the completion prompts
    (run,) = (tmp_path / "run").glob("version_*")
    saved = json.loads((run / "data_format.json").read_text())
    assert saved["format"] == "completion" and saved["requested"] == "auto" and saved["chat_template"] is False
    assert f"{files['train']}:1 is a completion record" in saved["reason"] and saved["tokenizer"] == str(target)
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["format"] == "auto"  # what was asked for
    checkpoint = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["datamodule_hyper_parameters"]["format"] == "completion"  # what decode rebuilds the data with

    from dspark_lightning.measuring.eval_sets import datamodule_prompt_ids, load_eval_set
    from dspark_lightning.measuring.loading import load_trained

    _, data = load_trained(str(run / "checkpoints/last.ckpt"))
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [json.loads(line)["prompt"] for line in files["val"].read_text().splitlines()[:2]]
    assert data.data_format.format == "completion" and data.data_format.requested == "completion"
    assert data.eval_prompts()[:2] == [tokenizer(p)["input_ids"] for p in prompts]
    humaneval = datamodule_prompt_ids(data, "humaneval", 1)  # its completion form: the raw prompt
    assert humaneval == [tokenizer(load_eval_set("humaneval", form="completion", limit=1).prompts[0])["input_ids"]]


def test_chat_records_for_a_target_without_template_fail_before_it_loads(tmp_path, base, monkeypatch, capsys):
    target, _ = base
    train = SHAREGPT / "train-00000.jsonl"
    monkeypatch.setattr(sys, "argv", ["dspark-lightning", "fit", *fit_args(target, train, train, tmp_path)])
    monkeypatch.setattr("lightning.pytorch.cli.LightningCLI.instantiate_classes", _never_built)  # model, trainer
    assert main() == 2
    error = capsys.readouterr().err
    for expected in (f"{train}:1 is a conversation record", "no chat template", "never invented", "data.format: completion",
                     "regenerate --format completion"):  # fmt: skip
        assert expected in error, error
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    with pytest.raises(DataFormatError, match="data.format=chat"):
        cli_main(["fit", *fit_args(target, train, train, tmp_path), "--data.format=chat"])


def _never_built(*args, **kwargs):
    raise AssertionError("the model (and its target) was built before the data format was checked")


def test_cache_and_draft_vocab_read_completion_records_as_training_does(tmp_path, base):
    target, files = base
    tokenizer = AutoTokenizer.from_pretrained(target)
    common = ["--target", str(target), "--seq_len", "128", "--device", "cpu", "--dtype", "float32"]
    cli_main(["cache", *common, "--data", str(files["train"]), "--output", str(tmp_path / "train"), "--limit", "4"])
    cli_main(["cache", *common, "--data", str(files["val"]), "--output", str(tmp_path / "val"), "--limit", "2"])
    index = json.loads((tmp_path / "train/index.json").read_text())
    assert index["data_format"] == "completion" and index["complete"]
    stored = load_file(str(tmp_path / "train" / index["shards"][0]["file"]))
    online = ShareGPTDataModule(str(target), str(files["train"]), seq_len=128, shuffle_buffer=0, block_size=8)
    rows = [row for row, _ in zip(online.build_dataset("train", 0, 1), range(4))]
    assert torch.equal(stored["loss_mask"], torch.stack([r["loss_mask"] for r in rows]))
    assert torch.equal(stored["input_ids"].long(), torch.stack([r["input_ids"] for r in rows]))

    cached = cli_main(["fit", *fit_args(target, files["train"], files["val"], tmp_path / "runs"),
                       "--config", str(ROOT / "configs/cache.yaml"), f"--data.train_cache={tmp_path / 'train'}",
                       f"--data.val_cache={tmp_path / 'val'}", "--trainer.callbacks=[]"])  # fmt: skip
    assert float(cached.trainer.callback_metrics["val/tau"]) >= 1.0
    (run,) = (tmp_path / "runs/run").glob("version_*")
    assert json.loads((run / "data_format.json").read_text())["format"] == "completion"
    with pytest.raises(DataFormatError, match="caches were written from completion records"):
        mixed = ShareGPTDataModule(
            str(ASSETS / "demo-target"),
            val_files=str(SHAREGPT / "validation-00000.jsonl"),
            train_cache=str(tmp_path / "train"),
        )  # conversations to validate on: chat
        mixed.setup("fit")

    summary = cli_main(["draft-vocab", "--tokenizer", str(target), "--data", str(files["val"]), "--size", "64",
                        "--output", str(tmp_path / "vocab.safetensors")])  # fmt: skip
    expected = Counter()
    for line in files["val"].read_text().splitlines():  # the completion tokens alone, never the prompts'
        expected.update(tokenizer(json.loads(line)["completion"], add_special_tokens=False)["input_ids"])
    counts = load_file(str(tmp_path / "vocab.safetensors"))["counts"]
    assert summary["data_format"] == "completion" and summary["supervised_tokens"] == expected.total()
    assert {i: int(c) for i, c in enumerate(counts.tolist()) if c} == dict(expected)


def test_readme_base_model_commands_run_at_demo_scale(tmp_path, monkeypatch):
    """The "Base models" guide's commands, each as written plus a small limit, outputs under tmp_path."""
    monkeypatch.chdir(ROOT)  # the commands use repository-relative paths
    section = (ROOT / "docs/guides/base_models.md").read_text()
    ran = Counter()
    for words in readme_commands(section):
        args = [str(tmp_path / a) if a.startswith("data/completion") else a for a in words]
        if args[0] == "regenerate":
            summary = cli_main([*args, "--limit", "6", "--max_new_tokens", "16", "--device", "cpu"])
            assert summary["format"] == "completion" and summary["written"] == 6
        else:
            cli = cli_main([
                *args, f"--data.train_files={tmp_path / 'data/completion/train/train-*.jsonl'}",
                f"--data.val_files={tmp_path / 'data/completion/val/validation-*.jsonl'}", "--trainer.max_steps=2",
                "--trainer.val_check_interval=2", "--trainer.callbacks=[]", "--data.batch_size=2",
                "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path / 'runs'}",
                "--model.drafter.max_anchors=8",
            ])  # fmt: skip
            assert float(cli.trainer.callback_metrics["val/tau"]) >= 1.0
            (run,) = (tmp_path / "runs").glob("*/version_*")
            assert json.loads((run / "data_format.json").read_text())["reason"] == "data.format=completion"
        ran[args[0]] += 1
    assert ran == {"regenerate": 2, "fit": 1}
    records = [json.loads(line) for line in (tmp_path / "data/completion/val/validation-00000.jsonl").open()]
    assert len(records) == 6 and set(records[0]) == {"id", "prompt", "completion"}
