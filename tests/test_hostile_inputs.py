"""Hostile but realistic input (issue #17): every case ends in a clear error or documented behaviour, never a hang.

Each test runs under a SIGALRM deadline (``deadline`` fixture), so a regression that loops forever fails instead of
blocking CI; the deadline is generous because it only has to catch hangs, nothing here measures time.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import tracemalloc
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pytest
import torch

from dspark_lightning.checks import NonFiniteError, dumps_json
from dspark_lightning.cli import cli_main
from dspark_lightning.data.datamodule import NoTrainableDataError, ShareGPTDataModule
from dspark_lightning.data.files import RecordTooLargeError
from dspark_lightning.data.sharegpt import BadRecordError, NotJSONError, iter_file_records, to_conversation
from dspark_lightning.lightning.run_dirs import claim_version_dir

ROOT = Path(__file__).resolve().parents[1]
TARGET = str(ROOT / "assets/demo-target")
TRAIN = ROOT / "assets/data/sharegpt/train-00000.jsonl"
VAL = str(ROOT / "assets/data/sharegpt/validation-00000.jsonl")
DEADLINE_S = 600
ONLY_CHECKPOINT = json.dumps(
    [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True, "save_top_k": 0}}]
)


class Hang(Exception):
    pass


@pytest.fixture(autouse=True)
def deadline():
    def expire(signum, frame):
        raise Hang(f"no result after {DEADLINE_S} s: treated as a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(DEADLINE_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def good_lines(count: int = 40) -> list[str]:
    return TRAIN.read_text().splitlines()[:count]


def fit_args(run_dir: Path, steps: int = 2, train: str | Path = TRAIN, extra: tuple[str, ...] = ()) -> list[str]:
    """A few steps of the quickstart on the demo target, only a last.ckpt callback, CSV logger into ``run_dir``."""
    return [
        "--config",
        str(ROOT / "configs/quickstart.yaml"),
        f"--model.target={TARGET}",
        f"--data.train_files={train}",
        f"--data.val_files={VAL}",
        "--data.seq_len=128",
        "--data.batch_size=2",
        "--data.limit_val_samples=8",
        "--model.max_anchors=8",
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={steps}",
        "--trainer.limit_val_batches=1",
        f"--trainer.callbacks={ONLY_CHECKPOINT}",
        "--trainer.enable_progress_bar=false",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={run_dir}",
        "--trainer.logger.name=run",
        *extra,
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained")
    cli_main(["fit", *fit_args(run_dir)])
    return run_dir / "run" / "version_0" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def diverged_checkpoint(checkpoint, tmp_path_factory) -> Path:
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state["state_dict"]["drafter.backbone.fc.weight"][0, 0] = float("nan")
    path = tmp_path_factory.mktemp("diverged") / "nan.ckpt"
    torch.save(state, path)
    return path


def datamodule(train, **kwargs) -> ShareGPTDataModule:
    settings = dict(seq_len=128, batch_size=2, shuffle_buffer=0, block_size=8)
    return ShareGPTDataModule(TARGET, str(train), VAL, **(settings | kwargs))


# ------------------------------------------------------------------------------------------- 1. streams without rows
def test_seq_len_below_every_record_is_an_error_not_a_hang(tmp_path):
    with pytest.raises(NoTrainableDataError, match=r"no trainable row.*data\.seq_len=4") as info:
        cli_main(["fit", *fit_args(tmp_path, extra=("--data.seq_len=4",))])
    assert "records were skipped (" in str(info.value) and str(TRAIN) in str(info.value)


def test_empty_jsonl_fails_at_setup_naming_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(NotJSONError, match=r"data\.train_files: every data file is empty: .*empty\.jsonl"):
        cli_main(["fit", *fit_args(tmp_path, train=empty)])


def test_file_of_only_bad_records_is_an_error_with_counts_by_reason(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{"conversations": []}\n{"conversations": [{"from": "tool", "value": "x"}]}\n')
    with pytest.raises(NoTrainableDataError) as info:
        cli_main(["fit", *fit_args(tmp_path, train=bad)])
    message = str(info.value)
    assert "all 3 records were skipped" in message and "bad.jsonl" in message
    for reason in ("missing_conversations: 1", "empty_conversations: 1", "unknown_role: 1"):
        assert reason in message


# ---------------------------------------------------------------------------------- 3. files checked before training
def test_utf8_bom_is_stripped_and_the_file_is_read(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    (directory / "a.jsonl").write_text("\n".join(good_lines(10)) + "\n")
    (directory / "b-bom.jsonl").write_bytes(b"\xef\xbb\xbf" + ("\n".join(good_lines(10)) + "\n").encode())
    records = list(iter_file_records(str(directory / "b-bom.jsonl")))
    assert len(records) == 10 and all(to_conversation(r).messages for r in records)
    dm = datamodule(directory)
    dm.setup("fit")
    assert sum(len(batch["input_ids"]) for batch in dm.train_dataloader()) > 0
    stats = dm.data_stats("train")
    assert stats["records"] == 20 and dm.bad_record_counts("train") == {}


def test_unreadable_file_in_a_directory_fails_before_the_first_step(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    (directory / "a.jsonl").write_text("\n".join(good_lines()) + "\n")
    (directory / "b-utf16.jsonl").write_bytes(("\n".join(good_lines(3)) + "\n").encode("utf-16"))
    (directory / "c.json").write_text("id,text\n1,hello\n")
    cli = cli_main(fit_args(tmp_path / "runs", train=directory), run=False)
    with pytest.raises(NotJSONError) as info:
        cli.trainer.fit(cli.model, cli.datamodule)
    message = str(info.value)
    assert "data.train_files: 2 of 3 data file(s) cannot be used" in message
    assert "b-utf16.jsonl:1: " in message and "UTF-16" in message and "c.json:1: " in message
    assert cli.trainer.global_step == 0 and not list((tmp_path / "runs").rglob("*.ckpt"))


def test_array_file_broken_mid_file_is_counted_not_a_late_crash(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    (directory / "a.jsonl").write_text("\n".join(good_lines(20)) + "\n")
    records = [json.loads(line) for line in good_lines(3)]
    text = json.dumps(records, indent=1)
    (directory / "b.json").write_text(text[: text.rindex("{")] + '{"conversations": [}\n]\n')  # third one broken
    with pytest.raises(NotJSONError, match=r"b\.json:\d+: "):
        list(iter_file_records(str(directory / "b.json")))  # the reader itself stays strict
    dm = datamodule(directory)
    dm.setup("fit")
    list(dm.train_dataloader())
    assert dm.bad_record_counts("train") == {"unreadable_rest_of_file": 1}
    assert dm.data_stats("train")["documents"] == 22  # every record before the break is kept
    with pytest.raises(BadRecordError, match=r"b\.json:\d+: bad record \(unreadable_rest_of_file\)"):
        list(datamodule(directory, on_bad_record="raise").train_dataloader())


def test_layout_is_judged_from_more_than_the_first_line(tmp_path):
    path = tmp_path / "first-line-broken.jsonl"
    path.write_text('{"conversations": [\n' + "\n".join(good_lines(5)) + "\n")
    records = list(iter_file_records(str(path)))
    assert [r.line for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[0].json_error and all(r.record for r in records[1:])


# ---------------------------------------------------------------------------------------------- oversized records
def test_oversized_jsonl_line_is_skipped_without_being_held_in_memory(tmp_path):
    path = tmp_path / "huge-line.jsonl"
    line = good_lines(1)[0]
    huge = '{"conversations": [{"from": "human", "value": "' + "x" * (20 << 20) + '"}]}'
    path.write_text(f"{line}\n{huge}\n{line}\n")
    limit = 1 << 20
    tracemalloc.start()
    records = list(iter_file_records(str(path), max_record_bytes=limit))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [r.reason for r in records] == [None, "record_too_large", None]
    assert records[1].line == 2 and "max_record_bytes" in records[1].json_error
    assert peak < 4 * limit  # the 20 MiB line never existed as one object
    dm = datamodule(path, max_record_bytes=limit)
    dm.setup("fit")
    list(dm.train_dataloader())
    assert dm.bad_record_counts("train") == {"record_too_large": 1}


def test_oversized_record_in_a_json_array(tmp_path):
    record = json.loads(good_lines(1)[0])
    big = {"conversations": [{"from": "human", "value": "y" * 300_000}, {"from": "gpt", "value": "ok"}]}
    path = tmp_path / "array.json"
    path.write_text(json.dumps([record, big, record], indent=1))
    with pytest.raises(RecordTooLargeError, match=r"array\.json:\d+: .*data\.max_record_bytes=100000"):
        list(iter_file_records(str(path), max_record_bytes=100_000))
    small = tmp_path / "small.json"
    small.write_text(json.dumps([record, {"conversations": [{"from": "human", "value": "z" * 3000}]}, record]))
    reasons = [r.reason for r in iter_file_records(str(small), max_record_bytes=2000)]
    assert reasons == [None, "record_too_large", None]


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
    from dspark_lightning.evaluate import calibrate_main, decode_main
    from dspark_lightning.export import main as export_main

    tensor = r"drafter\.backbone\.fc\.weight"
    with pytest.raises(NonFiniteError, match=tensor):
        export_main(["--ckpt_path", str(diverged_checkpoint), "--output", str(tmp_path / "export")])
    assert not (tmp_path / "export").exists()
    with pytest.raises(NonFiniteError, match=tensor):
        decode_main(["--ckpt_path", str(diverged_checkpoint), "--modes", "parallel"])
    with pytest.raises(NonFiniteError, match=tensor):
        calibrate_main(["--ckpt_path", str(diverged_checkpoint)])
    with pytest.raises(NonFiniteError, match=tensor):
        cli_main(["fit", *fit_args(tmp_path, 3), f"--ckpt_path={diverged_checkpoint}"])


def test_json_output_never_contains_nan(checkpoint, tmp_path, capsys):
    from dspark_lightning.evaluate import calibrate_main, decode_main

    def strict(text: str):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON output"))

    assert strict(dumps_json({"ece": math.nan, "per_slot": [1.0, math.inf]})) == {"ece": None, "per_slot": [1.0, None]}
    out = tmp_path / "rows.json"
    decode_main(["--ckpt_path", str(checkpoint), "--modes", "parallel", "--num_prompts", "1", "--json", str(out)])
    assert strict(out.read_text())[0]["mode"] == "parallel"
    capsys.readouterr()
    calibrate_main(["--ckpt_path", str(checkpoint), "--max_batches", "1", "--output", str(tmp_path / "cal.ckpt")])
    printed = capsys.readouterr().out
    assert "temperatures" in strict(printed[printed.index("{") :])


# ------------------------------------------------------------------------------------------- 4. resume honesty
@pytest.mark.parametrize("argument", ["max_anchors", "block_size"])
def test_resume_with_a_different_model_argument_is_an_error_naming_it(checkpoint, tmp_path, argument):
    args = fit_args(tmp_path, 3, extra=(f"--ckpt_path={checkpoint}", f"--model.{argument}=16"))
    with pytest.raises(ValueError, match=rf"--model\.{argument}: given 16, checkpoint 8") as info:
        cli_main(["fit", *args])
    other = {"max_anchors", "block_size"} - {argument}
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


def test_two_fits_started_together_get_their_own_directories(tmp_path):
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "dspark_lightning", "fit", *fit_args(tmp_path, 1)]
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outputs = [run.communicate(timeout=DEADLINE_S - 60)[0].decode(errors="replace") for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    versions = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert versions == ["version_0", "version_1"]
    for version in versions:
        directory = tmp_path / "run" / version
        assert (directory / "config.yaml").is_file() and (directory / "metrics.csv").is_file()
        assert (directory / "checkpoints" / "last.ckpt").is_file()


def test_export_refuses_a_non_empty_directory_and_overwrite_leaves_no_stale_files(checkpoint, tmp_path):
    from dspark_lightning.export import main as export_main

    output = tmp_path / "export"
    output.mkdir()
    (output / "model-00002-of-00002.safetensors").write_text("stale shard")
    args = ["--ckpt_path", str(checkpoint), "--output", str(output), "--dtype", "float32"]
    with pytest.raises(FileExistsError, match=r"--output .*export.* not empty: pass --overwrite"):
        export_main(args)
    assert (output / "model-00002-of-00002.safetensors").exists()
    export_main([*args, "--overwrite"])
    assert sorted(p.name for p in output.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export.")]  # no staging directory left


# ------------------------------------------------------------------------------------------- 6. visible accounting
def test_skips_are_logged_as_metrics_and_summarised_in_a_run_shorter_than_a_pass(tmp_path, caplog):
    train = tmp_path / "train.jsonl"
    train.write_text('{"id": 1}\n{"id": 2}\n{"conversations": []}\n' + "\n".join(good_lines(60)) + "\n")
    extra = ("--trainer.log_every_n_steps=1", "--data.shuffle_buffer=0")
    with caplog.at_level(logging.INFO, logger="dspark_lightning"):
        cli_main(["fit", *fit_args(tmp_path, 2, train=train, extra=extra)])
    rows = (tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    for column in ("data/skipped/missing_conversations", "data/skipped/empty_conversations", "data/skipped/total"):
        assert column in header
    totals = [row.split(",")[header.index("data/skipped/total")] for row in rows[1:]]
    assert "3.0" in totals
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fit finished; train data")]
    assert summary and "3 skipped" in summary[0] and "missing_conversations" in summary[0]


def test_skip_warning_is_logged_once_not_every_pass(tmp_path, caplog):
    train = tmp_path / "train.jsonl"
    train.write_text('{"id": 1}\n' + "\n".join(good_lines(10)) + "\n")
    dm = datamodule(train)
    with caplog.at_level(logging.INFO, logger="dspark_lightning"):
        for _ in range(3):
            list(dm.train_dataloader())
    passes = [r for r in caplog.records if "train data pass" in r.getMessage()]
    assert len(passes) == 3 and [r.levelno for r in passes] == [logging.WARNING, logging.INFO, logging.INFO]
    assert all("missing_conversations" in r.getMessage() for r in passes)


# ------------------------------------------------------------------------------------------------- smaller items
def test_missing_target_path_is_named(tmp_path):
    missing = tmp_path / "no-such-target"
    with pytest.raises(FileNotFoundError, match=rf"{missing}.*does not exist.*model\.target"):
        cli_main(["fit", *fit_args(tmp_path, extra=(f"--model.target={missing}",))])


def test_text_file_as_checkpoint_is_refused_clearly(tmp_path):
    from dspark_lightning.evaluate import decode_main
    from dspark_lightning.export import main as export_main

    notes = tmp_path / "notes.ckpt"
    notes.write_text("not a checkpoint\n")
    calls = [
        lambda: decode_main(["--ckpt_path", str(notes)]),
        lambda: export_main(["--ckpt_path", str(notes), "--output", str(tmp_path / "out")]),
        lambda: cli_main(["validate", *fit_args(tmp_path), f"--ckpt_path={notes}"]),
    ]
    for call in calls:
        with pytest.raises(
            ValueError, match=r"notes\.ckpt' is not a checkpoint written by `dspark-lightning fit`"
        ) as e:
            call()
        assert "weights_only=False" not in str(e.value)
    with pytest.raises(FileNotFoundError, match=r"--ckpt_path .*missing\.ckpt' does not exist"):
        decode_main(["--ckpt_path", str(tmp_path / "missing.ckpt")])


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["decode", "--thresholds", "1.5"], "--thresholds"),
        (["decode", "--thresholds", "-1"], "--thresholds"),
        (["decode", "--thresholds", "nan"], "--thresholds"),
        (["decode", "--max_new_tokens", "0"], "--max_new_tokens"),
        (["calibrate", "--max_batches", "0"], "--max_batches"),
    ],
)
def test_tool_arguments_out_of_range_are_usage_errors(argv, option, capsys):
    with pytest.raises(SystemExit) as info:
        cli_main([*argv, "--ckpt_path", "unused.ckpt"])
    assert info.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


def test_draft_vocab_on_empty_or_unusable_input_fails(tmp_path):
    from dspark_lightning.draft_vocab import main as draft_vocab_main

    empty, bad = tmp_path / "empty.jsonl", tmp_path / "bad.jsonl"
    empty.write_text("")
    bad.write_text('{"id": 1}\n')
    base = ["--tokenizer", TARGET, "--size", "64", "--output", str(tmp_path / "v.safetensors")]
    with pytest.raises(NotJSONError, match=r"every data file is empty: .*empty\.jsonl"):
        draft_vocab_main([*base, "--data", str(empty)])
    with pytest.raises(NoTrainableDataError, match=r"missing_conversations: 1"):
        draft_vocab_main([*base, "--data", str(bad)])
    assert not (tmp_path / "v.safetensors").exists()


def test_cache_over_only_bad_records_fails(tmp_path):
    from dspark_lightning.data.cache import main as cache_main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{"messages": "hi"}\n')
    with pytest.raises(NoTrainableDataError, match=r"missing_conversations: 1.*conversations_not_a_list: 1"):
        cache_main(["--target", TARGET, "--data", str(bad), "--output", str(tmp_path / "cache"), "--device", "cpu"])
    assert not (tmp_path / "cache" / "index.json").exists()


def test_report_keeps_finished_variants_when_a_later_one_fails(tmp_path, monkeypatch):
    from dspark_lightning import report

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
