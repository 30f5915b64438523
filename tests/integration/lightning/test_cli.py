"""The framework as users run it: LightningCLI fit/validate/test on the shipped demo target and conversations."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from helpers.paths import ROOT
from helpers.readme import readme_commands
from lightning.pytorch.callbacks import ModelCheckpoint

from dspark_lightning.cli import TOOL_COMMANDS, cli_main, command_parser

# fit configs; configs/recipes/ holds report-recipe's recipes (tests/integration/commands/test_report.py loads each)
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml") if p.parent.name != "recipes")
TRAIN = str(ROOT / "assets/data/sharegpt/train-00000.jsonl")
VAL = str(ROOT / "assets/data/sharegpt/validation-00000.jsonl")


def small_run_args(run_dir: Path, steps: int, extra: list[str] = ()) -> list[str]:
    """quickstart.yaml shrunk to a few steps, writing into ``run_dir`` (CSV logger only: no W&B in tests)."""
    return [
        "--config",
        str(ROOT / "configs/quickstart.yaml"),
        f"--model.target.path={ROOT / 'assets/demo-target'}",
        f"--data.train_files={TRAIN}",
        f"--data.val_files={VAL}",
        "--data.seq_len=128",
        "--data.batch_size=2",
        "--data.limit_val_samples=16",
        "--model.drafter.max_anchors=8",
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={steps}",
        "--trainer.limit_val_batches=4",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={run_dir}",
        "--trainer.logger.name=run",
        *extra,
    ]


@pytest.fixture(scope="module")
def fitted_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fit")
    cli = cli_main(["fit", *small_run_args(run_dir, 6)])
    return run_dir, cli


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_passes_print_config(config, capsys):
    # top-level configs stand alone; the config groups (heads/, logger/, strategy/ ...) compose onto the quickstart
    standalone = "/" not in config.removeprefix("configs/")
    base = [] if standalone else ["--config", str(ROOT / "configs/quickstart.yaml")]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *base, "--config", str(ROOT / config), "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["target"]
    # shared values are linked, so they are not options of their receiving side at all
    assert "tokenizer" not in printed["data"] and "block_size" not in printed["data"]
    assert "mask_token_id" not in printed["model"]


def test_fit_then_validate_from_checkpoint(fitted_run):
    run_dir, cli = fitted_run
    version = run_dir / "run" / "version_0"
    assert (version / "config.yaml").exists() and (version / "metrics.csv").exists()
    ckpt = version / "checkpoints" / "last.ckpt"
    tau_fit = float(cli.trainer.callback_metrics["val/tau"])
    assert tau_fit > 1.0 and torch.isfinite(torch.tensor(tau_fit))
    assert list((version / "plots").glob("val_acceptance_per_slot_*.png"))
    assert list((version / "plots").glob("val_selector_coverage_*.png"))
    metrics = cli.trainer.callback_metrics
    # Selector-equivalence and measured-decoding callbacks log next to the teacher-forced metrics
    assert 0.0 <= float(metrics["val/selector/coverage@16"]) <= 1.0
    assert float(metrics["val/selector/coverage@64"]) >= float(metrics["val/selector/coverage@1"])
    assert float(metrics["val/decode/markov/tau"]) >= 1.0
    on_policy = float(metrics["val/decode/markov/on_policy_greedy_tau"])  # the training metric on the target's replies
    assert on_policy >= 1.0
    assert (
        abs(float(metrics["val/decode/markov/on_policy_gap"]) - (on_policy - float(metrics["val/decode/markov/tau"])))
        < 1e-5
    )
    # the checkpoint holds only trainable drafter state, never the target
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert state and all(k.startswith("drafter.") for k in state)
    assert not any("embed_tokens" in k or k.startswith("drafter.lm_head") for k in state)

    validated = cli_main(["validate", *small_run_args(run_dir, 6), f"--ckpt_path={ckpt}"])
    tau_val = float(validated.trainer.callback_metrics["val/tau"])
    assert tau_val == pytest.approx(tau_fit, rel=1e-5)  # same blocks, same weights
    tested = cli_main(["test", *small_run_args(run_dir, 6), f"--ckpt_path={ckpt}"])
    assert float(tested.trainer.callback_metrics["test/tau"]) > 1.0
    # a checkpoint written before the config groups (flat options, the head as a class_path) validates the same
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"] = old_flat_hparams(checkpoint["hyper_parameters"])
    torch.save(checkpoint, run_dir / "old.ckpt")
    old = cli_main(["validate", *small_run_args(run_dir, 6), f"--ckpt_path={run_dir / 'old.ckpt'}"])
    assert float(old.trainer.callback_metrics["val/tau"]) == pytest.approx(tau_fit, rel=1e-5)
    # four runs with one config: four version directories, no "config.yaml exists" failure
    assert len(list((run_dir / "run").glob("version_*"))) == 4
    # validating without a checkpoint is legal (an untrained baseline) but said out loud; with one it is not
    untrained = "validate without --ckpt_path measures the drafter as initialised"
    with pytest.warns(UserWarning, match=untrained):
        cli_main(["validate", *small_run_args(run_dir, 6)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main(["validate", *small_run_args(run_dir, 6), f"--ckpt_path={ckpt}"])
    assert not [w for w in caught if untrained in str(w.message)]


def old_flat_hparams(grouped: dict) -> dict:
    """The hyper-parameters as DSparkModule stored them before the config groups (written out by hand)."""
    renamed = {
        ("target", "path"): "target", ("target", "dtype"): "target_dtype", ("target", "features"): "target_features",
        ("loss", "weights"): "loss", ("loss", "chunk_size"): "loss_chunk_size",
        ("loss", "candidate_weight"): "candidate_loss_weight",
    }  # fmt: skip
    flat = {"_instantiator": grouped.get("_instantiator")}
    for group in ("target", "drafter", "loss", "training"):
        for field, value in grouped[group].items():
            flat[renamed.get((group, field), field)] = value
    head = flat["markov_head"]
    flat["markov_head"] = {
        "class_path": "dspark_lightning.models.MarkovHeadConfig",
        "init_args": {"rank": head["rank"], "head_type": head["kind"], "gate_input": head["gate_input"],
                      "gate_activation": head["gate_activation"]},
    }  # fmt: skip
    return flat


def test_console_script_runs_fit(tmp_path):
    """The installed entry point trains and checkpoints; one step and no validation (the validation callbacks are
    exercised in process by ``test_fit_then_validate_from_checkpoint``: this test is about the console script)."""
    exe = Path(sys.executable).with_name("dspark-lightning")
    env = dict(os.environ, WANDB_MODE="disabled")
    args = small_run_args(tmp_path, 1, ["--trainer.limit_val_batches=0"])
    result = subprocess.run([str(exe), "fit", *args], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt").exists()
    assert "eval mode at the start" not in result.stderr and "LeafSpec" not in result.stderr  # nothing to act on


class SimulatedKill(Exception):
    pass


class KillAtStep(L.Callback):
    """Raise at the start of training step ``step`` (after the step-``step`` checkpoint was written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise SimulatedKill(f"killed at step {self.step}")


def test_killed_and_resumed_run_matches_an_uninterrupted_run(tmp_path):
    """Interrupted after step n (a mid-epoch checkpoint), resumed to 2n: same weights as an uninterrupted run."""
    n = 4
    no_validation = ["--trainer.limit_val_batches=0"]  # it would come after the last step: the weights are the same
    straight = cli_main(["fit", *small_run_args(tmp_path / "a", 2 * n, no_validation)])

    interrupted = cli_main(small_run_args(tmp_path / "b", 2 * n, no_validation), run=False)
    every_n = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=n, save_top_k=-1)
    interrupted.trainer.callbacks[-1:-1] = [every_n, KillAtStep(n)]
    with pytest.raises(SimulatedKill):
        interrupted.trainer.fit(interrupted.model, interrupted.datamodule)
    (ckpt,) = (tmp_path / "ckpt").glob(f"*step={n}.ckpt")

    resumed = cli_main(["fit", *small_run_args(tmp_path / "c", 2 * n, no_validation), f"--ckpt_path={ckpt}"])
    assert resumed.trainer.global_step == 2 * n
    expected = straight.model.drafter.state_dict()
    for key, value in resumed.model.drafter.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0, msg=f"{key} differs after resume")
    # not trivially equal: the weights at the kill point differ from the final ones
    halfway = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]["drafter.backbone.fc.weight"]
    assert not torch.equal(halfway, expected["backbone.fc.weight"])


@pytest.mark.parametrize("head", ["none", "gated", "rnn", "selector", "dflash"])
def test_every_head_config_trains(head, tmp_path):
    cli = cli_main(["fit", *small_run_args(tmp_path, 2, ["--config", str(ROOT / f"configs/heads/{head}.yaml")])])
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and float(metrics["val/tau"]) >= 1.0
    if head == "selector":  # the DFlash-2 candidate loss and its recall are logged
        assert 0.0 <= float(metrics["train/candidate_recall@16"]) <= 1.0
        assert torch.isfinite(metrics["train/loss_candidate"])
    expected = {"none": None, "gated": "gated", "rnn": "rnn", "selector": "gated", "dflash": None}[head]
    assert (cli.model.drafter.markov_head.config.kind if cli.model.drafter.markov_head else None) == expected


def test_every_readme_command_parses_through_the_command_table(capsys):
    commands = readme_commands()
    assert {c[0] for c in commands} >= (set(TOOL_COMMANDS) - {"report"}) | {"fit", "validate"}
    for words in commands:
        name, args = words[0], words[1:]
        if name in TOOL_COMMANDS:  # parse only: a renamed or misspelled option is a usage error here
            config = command_parser(name).parse_args(args)
            assert config.as_dict().keys() >= {"config"}, words
        else:
            with pytest.raises(SystemExit) as exit_info:
                cli_main([*words, "--print_config"])
            assert exit_info.value.code == 0, words
            capsys.readouterr()


def test_every_command_takes_help_config_and_print_config(tmp_path, capsys):
    for name in TOOL_COMMANDS:
        with pytest.raises(SystemExit) as exit_info:
            cli_main([name, "--help"])
        assert exit_info.value.code == 0 and "--config CONFIG" in capsys.readouterr().out
    config = tmp_path / "decode.yaml"
    config.write_text("ckpt_path: run/last.ckpt\nthresholds: [0.3, 0.6]\nmodes: [parallel]\n")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["decode", "--config", str(config), "--k", "4", "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["thresholds"] == [0.3, 0.6] and printed["modes"] == ["parallel"] and printed["k"] == 4
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["nonsense"])
    assert exit_info.value.code == 2 and "invalid choice: 'nonsense'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["--help"])
    top = capsys.readouterr().out  # what a first-time user reads: every command, plain text (no reST markup)
    assert exit_info.value.code == 0 and "``" not in top
    assert all(re.search(rf"^\s+{name}\s", top, re.M) for name in ("fit", "validate", "test", *TOOL_COMMANDS)), top


def test_recorded_command_lines_parse_back_to_the_same_call():
    """What report / loss-study / report-recipe write as "made by" parses, through the table, to the values given."""
    from dspark_lightning.studies.command_lines import command_line
    from dspark_lightning.studies.report import Budget

    calls = {
        "report": {"output": "out dir", "heads": ["none", "gated"], "block_sizes": [8], "budget": Budget(steps=20)},
        "loss-study": {"output": "o", "losses": ["kl"], "seeds": [0, 3], "dpace": False, "threads": 2},
        "report-recipe": {
            "recipe": "configs/recipes/smollm2.yaml",
            "output": "o",
            "heads": ["vanilla"],
            "fit_args": ["--model.drafter.max_anchors=32", "--x=[1,2]"],
        },
    }
    for name, given in calls.items():
        parser = command_parser(name)
        values = {**parser.get_defaults().as_dict(), **given}
        values.pop("config")
        line = command_line(name, TOOL_COMMANDS[name], values)
        words = shlex.split(line)
        assert words[:2] == ["dspark-lightning", name] and "--config" not in words
        parsed = parser.parse_args(words[2:]).as_dict()
        parsed.pop("config")
        if "budget" in given:
            given = {**given, "budget": vars(given["budget"])}
        assert {k: parsed[k] for k in given} == given, line
        assert all(f"--{k}" in line for k in given), line
        assert ("--threads" in line) == ("threads" in given), line  # values equal to the defaults are left out
