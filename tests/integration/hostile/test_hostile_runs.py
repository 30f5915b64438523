"""Hostile runs and tools (issue #17): divergence, resume, run directories, checkpoints, tool arguments."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest
import torch
from helpers import hostile
from helpers.hostile import DEADLINE_S, ROOT, fit_args

from dspark_lightning.checks import NonFiniteError, dumps_json
from dspark_lightning.cli import cli_main, main
from dspark_lightning.errors import LoadError, MissingPackageError, OptionError, UnsupportedError
from dspark_lightning.lightning.run_dirs import claim_version_dir

# fixtures shared by both hostile-input modules (see helpers/hostile.py for why not a conftest.py)
deadline = hostile.deadline
checkpoint, diverged_checkpoint = hostile.checkpoint, hostile.diverged_checkpoint


# ------------------------------------------------------------------------------------------- 2. silent divergence
def test_divergent_learning_rate_stops_before_a_bad_step_and_no_checkpoint_holds_nan(tmp_path):
    every_step = json.dumps(
        [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"every_n_train_steps": 1}}]
    )
    args = fit_args(tmp_path, 6, extra=("--model.optimizer.init_args.lr=1e6", f"--trainer.callbacks={every_step}"))
    with pytest.raises(NonFiniteError, match=r"(loss is nan|non-finite gradient) at step \d") as info:
        cli_main(["fit", *args])
    assert "no checkpoint of it was written" in str(info.value)
    for path in tmp_path.rglob("*.ckpt"):
        state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()), path


def test_tools_and_resume_refuse_non_finite_weights(diverged_checkpoint, tmp_path, capsys):

    tensor = r"drafter\.backbone\.fc\.weight"
    with pytest.raises(NonFiniteError, match=tensor):
        cli_main(["export", "--ckpt_path", str(diverged_checkpoint), "--output", str(tmp_path / "export")])
    assert not (tmp_path / "export").exists()
    with pytest.raises(NonFiniteError, match=tensor):
        cli_main(["decode", "--ckpt_path", str(diverged_checkpoint), "--modes", "[parallel]"])
    with pytest.raises(NonFiniteError, match=tensor):
        cli_main(["calibrate", "--ckpt_path", str(diverged_checkpoint)])
    with pytest.raises(NonFiniteError, match=tensor):
        cli_main(["fit", *fit_args(tmp_path, 3), f"--ckpt_path={diverged_checkpoint}"])


def test_json_output_never_contains_nan(checkpoint, tmp_path, capsys):

    def strict(text: str):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON output"))

    assert strict(dumps_json({"ece": math.nan, "per_slot": [1.0, math.inf]})) == {"ece": None, "per_slot": [1.0, None]}
    out = tmp_path / "rows.json"
    cli_main(
        ["decode", "--ckpt_path", str(checkpoint), "--modes", "[parallel]", "--num_prompts", "1", "--json", str(out)]
    )
    assert strict(out.read_text())[0]["mode"] == "parallel"
    capsys.readouterr()
    cli_main(
        ["calibrate", "--ckpt_path", str(checkpoint), "--max_batches", "1", "--output", str(tmp_path / "cal.ckpt")]
    )
    printed = capsys.readouterr().out
    assert "temperatures" in strict(printed[printed.index("{") :])


# ------------------------------------------------------------------------------------------- 4. resume honesty
@pytest.mark.parametrize("argument", ["drafter.max_anchors", "drafter.block_size"])
def test_resume_with_a_different_model_argument_is_an_error_naming_it(checkpoint, tmp_path, argument):
    args = fit_args(tmp_path, 3, extra=(f"--ckpt_path={checkpoint}", f"--model.{argument}=16"))
    with pytest.raises(ValueError, match=rf"--model\.{re.escape(argument)}: given 16, checkpoint 8") as info:
        cli_main(["fit", *args])
    other = {"drafter.max_anchors", "drafter.block_size"} - {argument}
    assert f"--model.{other.pop()}" not in str(info.value)  # only what differs is named
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------- 5. run directories
def _claim_many(root: str) -> list[int]:
    return [claim_version_dir(root) for _ in range(4)]


def test_concurrent_claims_never_share_a_version(tmp_path):
    found: list[int] = []
    threads = [threading.Thread(target=lambda: found.extend(_claim_many(str(tmp_path / "t")))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(found) == list(range(32))
    with ProcessPoolExecutor(4, mp_context=get_context("fork")) as pool:
        claimed = [v for part in pool.map(_claim_many, [str(tmp_path / "p")] * 4) for v in part]
    assert sorted(claimed) == list(range(16)) and len(list((tmp_path / "p").iterdir())) == 16


@pytest.mark.parametrize("repeat", [0, 1])
def test_two_fits_started_moments_apart_get_their_own_directories(tmp_path, repeat):
    """Two real CLI processes with the quickstart's CSV + offline W&B loggers, the second started half a second after
    the first. The Trainer used to read ``log_dir`` (resolving the CSV version by a scan) seconds before the CSV
    experiment created it, wandb.init in between: both runs got version_0 and the second's config save aborted."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    loggers = [
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path), "name": "run"}},
        {
            "class_path": "dspark_lightning.lightning.wandb.OfflineFirstWandbLogger",
            "init_args": {"save_dir": str(tmp_path), "project": "race"},
        },
    ]
    args = [a for a in fit_args(tmp_path, 1) if not a.startswith("--trainer.logger")]
    command = [sys.executable, "-m", "dspark_lightning", "fit", *args, f"--trainer.logger={json.dumps(loggers)}"]
    runs = []
    for _ in range(2):
        runs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        time.sleep(0.5)
    outputs = [run.communicate(timeout=DEADLINE_S - 60)[0].decode(errors="replace") for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    versions = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert versions == ["version_0", "version_1"]
    for version in versions:
        directory = tmp_path / "run" / version
        assert (directory / "config.yaml").is_file() and (directory / "metrics.csv").is_file()
        assert (directory / "checkpoints" / "last.ckpt").is_file()


def test_a_run_that_fails_before_its_first_step_leaves_no_directory(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(Exception, match="empty.jsonl"):
        cli_main(["fit", *fit_args(tmp_path, 1, train=empty)])
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_export_refuses_a_non_empty_directory_and_overwrite_leaves_no_stale_files(checkpoint, tmp_path):

    output = tmp_path / "export"
    output.mkdir()
    (output / "model-00002-of-00002.safetensors").write_text("stale shard")
    args = ["--ckpt_path", str(checkpoint), "--output", str(output), "--dtype", "float32"]
    with pytest.raises(FileExistsError, match=r"--output .*export.* not empty: pass --overwrite true"):
        cli_main(["export", *args])
    assert (output / "model-00002-of-00002.safetensors").exists()
    cli_main(["export", *args, "--overwrite", "true"])
    assert sorted(p.name for p in output.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export.")]  # no staging directory left


# ------------------------------------------------------------------------------------------------- smaller items
def test_missing_target_path_is_named(tmp_path):
    missing = tmp_path / "no-such-target"
    with pytest.raises(FileNotFoundError, match=rf"{missing}.*does not exist.*model\.target"):
        cli_main(["fit", *fit_args(tmp_path, extra=(f"--model.target.path={missing}",))])


def test_text_file_as_checkpoint_is_refused_clearly(tmp_path, monkeypatch, capsys):

    notes = tmp_path / "notes.ckpt"
    notes.write_text("not a checkpoint\n")
    calls = [
        lambda: cli_main(["decode", "--ckpt_path", str(notes)]),
        lambda: cli_main(["export", "--ckpt_path", str(notes), "--output", str(tmp_path / "out")]),
        lambda: cli_main(["validate", *fit_args(tmp_path), f"--ckpt_path={notes}"]),
    ]
    for call in calls:
        with pytest.raises(
            OptionError, match=r"notes\.ckpt' is not a checkpoint written by `dspark-lightning fit`"
        ) as e:
            call()
        assert "weights_only=False" not in str(e.value)
    with pytest.raises(FileNotFoundError, match=r"--ckpt_path .*missing\.ckpt' does not exist"):
        cli_main(["decode", "--ckpt_path", str(tmp_path / "missing.ckpt")])
    # the console script prints it as one line naming the file and exits 2, with torch's reason, not a traceback
    monkeypatch.setattr("sys.argv", ["dspark-lightning", "decode", "--ckpt_path", str(notes)])
    assert main() == 2
    err = capsys.readouterr().err
    assert err.startswith("dspark-lightning: error: --ckpt_path") and "Traceback" not in err
    assert "Unsupported operand" in err and "In PyTorch 2.6" not in err  # what failed, not torch's advice


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["fit", "--config", str(ROOT / "configs/quickstart.yaml"), "--data.train_files={}"], "data.train_files"),
        (["validate", "--config", str(ROOT / "configs/quickstart.yaml"), "--data.val_files={}"], "data.val_files"),
        (["cache", "--target", str(hostile.TARGET), "--data={}", "--output={}"], "--data"),
        (["draft-vocab", "--tokenizer", str(hostile.TARGET), "--data={}", "--size=9", "--output={}"], "--data"),
        (["regenerate", "--target", str(hostile.TARGET), "--data={}", "--output={}"], "--data"),
    ],
)
def test_a_data_glob_matching_nothing_names_the_option_given(argv, option, tmp_path):
    pattern, output = str(tmp_path / "typo-*.jsonl"), tmp_path / "out"
    with pytest.raises(FileNotFoundError) as error:
        cli_main([arg.replace("{}", pattern if arg.startswith("--data") else str(output)) for arg in argv])
    assert str(error.value) == f"{option}: no files match {pattern!r}"
    assert not output.exists()  # nothing created before the input was found


def test_a_checkpoint_without_hyper_parameters_is_refused_clearly(tmp_path):
    bare = tmp_path / "bare.ckpt"
    torch.save({"state_dict": {"drafter.w": torch.zeros(2)}}, bare)  # a state dict saved by hand, not by fit
    with pytest.raises(OptionError, match=r"bare\.ckpt: no hyper_parameters .*`dspark-lightning fit`"):
        cli_main(["decode", "--ckpt_path", str(bare)])


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["decode", "--thresholds", "[1.5]"], "thresholds"),
        (["decode", "--thresholds", "[-1]"], "thresholds"),
        (["decode", "--thresholds", "[nan]"], "thresholds"),
        (["decode", "--max_new_tokens", "0"], "max_new_tokens"),
        (["calibrate", "--max_batches", "0"], "max_batches"),
    ],
)
def test_tool_arguments_out_of_range_are_usage_errors(argv, option, capsys):
    with pytest.raises(SystemExit) as info:
        cli_main([*argv, "--ckpt_path", "unused.ckpt"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f'Parser key "{option}"' in err and "does not conform to restriction" in err  # the option and the rule


def test_report_keeps_finished_variants_when_a_later_one_fails(tmp_path, monkeypatch):
    from dspark_lightning.studies import report

    def fake(runs_dir, head, block_size, budget):
        if head == "gated":
            raise RuntimeError("variant failed")
        times = {"fit_seconds": 1.0, "eval_seconds": 1.0, "agreement_at_k": None, "ece_after": 0.1}
        return {
            "head": head,
            "block_size": block_size,
            "teacher_tau": 1.5,
            "measured_tau": 1.2,
            "ece_before": math.nan,
        } | times

    monkeypatch.setattr(report, "train_and_evaluate", fake)
    with pytest.raises(RuntimeError, match="variant failed"):
        report.run_report(tmp_path / "report", heads=["none", "gated"], block_sizes=[8])
    partial = json.loads((tmp_path / "report" / "results.partial.json").read_text())
    assert partial["failed"] == "gated B=8" and [r["head"] for r in partial["rows"]] == ["none"]
    assert partial["rows"][0]["ece_before"] is None


def test_load_from_checkpoint_does_not_list_target_tensors_as_missing(checkpoint):
    from dspark_lightning.lightning.module import DSparkModule

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = DSparkModule.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    assert not [w for w in caught if "not in the checkpoint" in str(w.message)]
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    assert torch.equal(module.drafter.backbone.fc.weight, state["drafter.backbone.fc.weight"])


# ------------------------------------------------------------------------------------------- user errors, one line
def _cli(args, env_extra=None):
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **(env_extra or {}))
    env.pop("DSPARK_DEBUG", None) if not env_extra else None
    return subprocess.run(
        [sys.executable, "-m", "dspark_lightning", *args], env=env, capture_output=True, text=True, timeout=DEADLINE_S
    )


def _user_error_cases(tmp_path, checkpoint):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    return {
        "bad data": (["fit", *fit_args(tmp_path / "a", 1, train=empty)], "empty.jsonl"),
        "missing target": (["fit", *fit_args(tmp_path / "b", 1), "--model.target.path=/nowhere/target"], "/nowhere"),
        "non-finite loss": (
            ["fit", *fit_args(tmp_path / "c", 6, extra=("--model.optimizer.init_args.lr=1e6",))],
            "non-finite",
        ),
        "resume with other arguments": (
            [
                "fit",
                *fit_args(tmp_path / "d", 3, extra=(f"--ckpt_path={checkpoint}", "--model.drafter.max_anchors=16")),
            ],
            "--model.drafter.max_anchors",
        ),
    }


@pytest.mark.parametrize("case", ["bad data", "missing target", "non-finite loss", "resume with other arguments"])
def test_user_errors_print_one_line_and_exit_2(case, tmp_path, checkpoint):
    args, named = _user_error_cases(tmp_path, checkpoint)[case]
    result = _cli(args)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("dspark-lightning: error:")]
    assert len(errors) == 1 and named in errors[0], result.stderr[-3000:]


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, checkpoint):
    args, _ = _user_error_cases(tmp_path, checkpoint)["bad data"]
    result = _cli(args, {"DSPARK_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_a_drafter_without_a_confidence_head_refuses_calibration_and_schedules(tmp_path):
    cli_main(["fit", *fit_args(tmp_path, 1, extra=("--model.drafter.confidence_head=false",))])
    (trained,) = tmp_path.rglob("last.ckpt")
    with pytest.raises(UnsupportedError, match=r"last\.ckpt': this drafter has no confidence head, nothing to calib"):
        cli_main(["calibrate", f"--ckpt_path={trained}"])
    for schedule in ("--thresholds=[0.5]", "--cost_model=true"):  # they would silently change nothing
        with pytest.raises(OptionError, match=r"--thresholds and --cost_model schedule by the confidence head"):
            cli_main(["decode", f"--ckpt_path={trained}", schedule])
    assert not list(tmp_path.rglob("*.calibrated.ckpt"))


def test_an_output_file_that_cannot_be_written_is_refused_before_the_work(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the output path was checked")

    monkeypatch.setattr("dspark_lightning.measuring.decode.load_trained", never)
    monkeypatch.setattr("dspark_lightning.measuring.calibrate.load_trained", never)
    with pytest.raises(OptionError, match=r"--json .*a-file/rows\.json': cannot create its folder .*a-file'"):
        cli_main(["decode", "--ckpt_path=unused.ckpt", f"--json={blocker / 'rows.json'}"])
    with pytest.raises(OptionError, match=r"--gap_table .* is a directory; expected a file path"):
        cli_main(["decode", "--ckpt_path=unused.ckpt", "--check_identity=true", f"--gap_table={tmp_path}"])
    with pytest.raises(OptionError, match=r"--output .*a-file/cal\.ckpt': cannot create its folder"):
        cli_main(["calibrate", "--ckpt_path=unused.ckpt", f"--output={blocker / 'cal.ckpt'}"])


def test_decode_makes_the_folder_of_its_json(checkpoint, tmp_path):
    rows_file = tmp_path / "not" / "yet" / "rows.json"
    cli_main(["decode", f"--ckpt_path={checkpoint}", "--modes=[parallel]", "--num_prompts=1", f"--json={rows_file}"])
    assert json.loads(rows_file.read_text())[0]["mode"] == "parallel"


@pytest.fixture
def hub_offline(monkeypatch):
    """The Hub unreachable at once (as offline, without a cached copy), whatever this machine's network does."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["fit", "--model.target.path=nobody/no-model"], "--data.tokenizer (linked from --model.target.path) 'nobody/"),
        (["fit", "--data.train_files=nobody/no-data"], "hub dataset 'nobody/no-data'"),
        (["cache", f"--data={hostile.TRAIN}", "--output=unused", "--target=nobody/no-model"], "--target 'nobody/"),
        (["regenerate", f"--target={hostile.TARGET}", "--output=unused", "--data=nobody/no-data"], "--data 'nobody/"),
    ],
)
def test_an_unreachable_hub_id_is_one_line_naming_the_option(argv, named, hub_offline, tmp_path, monkeypatch, capsys):
    if argv[0] == "fit":
        argv = ["fit", *fit_args(tmp_path), *argv[1:]]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["dspark-lightning", *argv])
    assert main() == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith(f"dspark-lightning: error: {named}") and "cannot be loaded" in line, line
    assert "(no such local folder; as a hub id it needs the network or a Hugging Face cache copy)" in line


def test_a_local_target_folder_without_its_files_is_named_without_the_hub_hint(tmp_path):
    empty = tmp_path / "empty-target"
    empty.mkdir()
    with pytest.raises(LoadError, match=rf"--target '{re.escape(str(empty))}' cannot be loaded: ") as error:
        cli_main(["cache", f"--data={hostile.TRAIN}", f"--output={tmp_path / 'out'}", f"--target={empty}"])
    assert "hub id" not in str(error.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--job_index=3", "--num_jobs=2"], r"--job_index must be in \[0, 2\), got 3"),
        (["--device=cuda"], r"--device 'cuda': no CUDA device is visible to this torch .*; use cpu"),
        (["--device=gpu"], r"--device 'gpu' is not a torch device"),
    ],
)
@pytest.mark.parametrize("command", ["cache", "regenerate"])
def test_cache_and_regenerate_refuse_a_bad_job_or_device_before_loading(command, extra, message, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a GPU machine

    def never(*args, **kwargs):
        raise AssertionError("the target was loaded before the options were checked")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", never)
    argv = [command, f"--target={hostile.TARGET}", f"--data={hostile.TRAIN}", f"--output={tmp_path / 'out'}", *extra]
    with pytest.raises(OptionError, match=message):
        cli_main(argv)


def test_a_target_layer_out_of_range_names_both_options(tmp_path):
    with pytest.raises(OptionError, match=r"target layer id 9 out of range for a 4-layer target \(model\.drafter"):
        cli_main(["fit", *fit_args(tmp_path), "--model.drafter.target_layer_ids=[0,9]"])
    with pytest.raises(OptionError, match=r"or cache --layers: ids 0\.\.3\)"):
        cli_main(
            ["cache", f"--target={hostile.TARGET}", f"--data={hostile.TRAIN}", f"--output={tmp_path}/c", "--layers=[7]"]
        )


def test_a_missing_package_or_target_folder_is_one_line_naming_it(tmp_path, checkpoint):
    with pytest.raises(MissingPackageError, match=r"--gguf 'pkg:no_such_pkg': no installed Python package"):
        cli_main(["import-gguf", "--gguf=pkg:no_such_pkg", f"--output={tmp_path / 'target'}"])
    with pytest.raises(MissingPackageError, match=r"data\.train_files: 'pkg:no_such_pkg': no installed Python package"):
        cli_main(["fit", *fit_args(tmp_path), "--data.train_files=pkg:no_such_pkg"])
    missing = tmp_path / "moved-target"  # e.g. a checkpoint's target that was moved, or a mistyped --target
    with pytest.raises(LoadError, match=rf"^target '{re.escape(str(missing))}' does not exist$"):
        cli_main(["export", f"--ckpt_path={checkpoint}", f"--output={tmp_path / 'export'}", f"--target={missing}"])


def test_decode_without_a_user_prompt_to_decode_says_so(checkpoint, tmp_path):
    replies_only = tmp_path / "replies.jsonl"  # trainable (it has a reply) but holds no prompt to decode from
    replies_only.write_text(json.dumps({"id": "a", "conversations": [{"from": "gpt", "value": "hello there"}]}) + "\n")
    with pytest.raises(OptionError, match=r"^--val_files .*: no valid conversation with a user prompt to decode$"):
        cli_main(["decode", f"--ckpt_path={checkpoint}", f"--val_files={replies_only}"])


SWEEP = {  # found by running every command with one wrong value: each was a traceback
    "split fractions": (["regenerate", "--split_by_id={validation: 1.5}"], "split_by_id fractions must be >= 0"),
    "draft vocab size": (["draft-vocab", "--size=999999"], "--size: a draft vocabulary size must be in [1, 2048]"),
    "candidate selector": (["export", "--candidate_selector=true"], "--candidate_selector true needs a DFlash-2 form"),
    "no eval prompt": (["decode", "--val_files={target}/config.json"], "--val_files: none of the first 32 records"),
    "output exists": (["calibrate", "--output={checkpoint}"], "--output '"),
    "negative lr": (["fit", "--model.optimizer.init_args.lr=-1"], "model.optimizer: Invalid learning rate: -1.0"),
    "mask token": (["fit", "--data.mask_token=<nope>"], "data.mask_token: tokenizer '"),
    "target dtype": (["fit", "--model.target.dtype=int8"], "target.dtype must be one of"),
    "draft vocab file": (
        ["fit", "--model.drafter.draft_vocab=/nowhere/v.safetensors"],
        "model.drafter.draft_vocab: could",
    ),
    "flex on cpu": (
        ["fit", "--model.drafter.attention_backend=flex"],
        "model.drafter.attention_backend flex has no backward",
    ),
    "heads": (["fit", "--model.drafter.num_heads=3"], "model.drafter.num_heads 3 must be a multiple of num_kv_heads"),
    "cache without caches": (["fit", "--model.target.features=cache"], "model.target.features is 'cache' but"),
    "unknown loss": (["fit", "--model.loss.weights={bogus: 1.0}"], "unknown loss 'bogus' in spec (model.loss.weights)"),
    "warm-up": (["fit", "--model.training.lr_warmup_steps=-5"], "model.training.lr_warmup_steps must be >= 0"),
    "markov rank": (
        ["fit", "--model.drafter.markov_head.rank=-1"],
        "model.drafter.markov_head.rank must be an integer",
    ),
    "no target layer": (["fit", "--model.drafter.target_layer_ids=[]"], "model.drafter.target_layer_ids is empty"),
    "always include": (
        ["draft-vocab", "--size=9", "--always_include=[99999]"],
        "--always_include: ids [0, 2, 3, 99999]",
    ),
    "linked mask token id": (["fit", "--model.drafter.mask_token_id=5"], "--model.drafter.mask_token_id is linked"),
    "decode val_files glob": (["decode", "--val_files=/nowhere/*.jsonl"], "--val_files: no files match"),
    "no cache layer": (["cache", "--layers=[]"], "--layers [] selects no target layers; omit --layers"),
}


@pytest.mark.parametrize("case", list(SWEEP))
def test_a_wrong_value_is_one_line_naming_it(case, checkpoint, tmp_path, monkeypatch, capsys):
    extra, expected = SWEEP[case]
    paths = {"{target}": str(hostile.TARGET), "{checkpoint}": str(checkpoint)}
    command, extra = extra[0], extra[1:]
    for placeholder, path in paths.items():
        extra = [arg.replace(placeholder, path) for arg in extra]
    base = {
        "fit": fit_args(tmp_path),
        "regenerate": [f"--target={hostile.TARGET}", f"--data={hostile.TRAIN}", f"--output={tmp_path / 'out'}"],
        "cache": [f"--target={hostile.TARGET}", f"--data={hostile.TRAIN}", f"--output={tmp_path / 'cache'}"],
        "draft-vocab": [f"--tokenizer={hostile.TARGET}", f"--data={hostile.TRAIN}", f"--output={tmp_path}/v.st"],
        "export": [f"--ckpt_path={checkpoint}", f"--output={tmp_path / 'export'}"],
        "decode": [f"--ckpt_path={checkpoint}"],
        "calibrate": [f"--ckpt_path={checkpoint}"],
    }[command]
    monkeypatch.setattr("sys.argv", ["dspark-lightning", command, *base, *extra])
    assert main() == 2
    err = capsys.readouterr().err
    error = err[err.rindex("dspark-lightning: error: ") :]  # the data checks list each file's reasons below it
    assert error.startswith(f"dspark-lightning: error: {expected}") and "Traceback" not in err, error
