"""Hostile data (issue #17): streams without rows, files that break, oversized records, skip accounting."""

from __future__ import annotations

import json
import logging
import tracemalloc

import pytest
from helpers import hostile
from helpers.hostile import TARGET, TRAIN, datamodule, fit_args, good_lines

from dspark_lightning.cli import cli_main
from dspark_lightning.data.accounting import NoTrainableDataError
from dspark_lightning.data.files import NotJSONError, RecordTooLargeError
from dspark_lightning.data.preflight import NoUsableRecordsError
from dspark_lightning.data.records import iter_file_records
from dspark_lightning.data.sharegpt import BadRecordError, to_conversation
from dspark_lightning.errors import UserError

# fixtures shared by both hostile-input modules (see helpers/hostile.py for why not a conftest.py)
deadline = hostile.deadline


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
    with pytest.raises(NoUsableRecordsError) as info:
        cli_main(["fit", *fit_args(tmp_path, train=bad)])
    message = str(info.value)
    assert "data.train_files" in message and "bad.jsonl" in message
    for reason in ("missing_conversations x1 (first at line 1)", "empty_conversations x1 (first at line 2)"):
        assert reason in message
    assert "unknown_role x1 (first at line 3)" in message


def _no_assistant(path):
    path.write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n' * 5)


def _junk(path):
    path.write_text("id,text\n1,hello\n")


def _utf16(path):
    path.write_bytes(("\n".join(good_lines(3)) + "\n").encode("utf-16"))


def _empty(path):
    path.write_text("")


@pytest.mark.parametrize(
    "write", [_empty, _utf16, _junk, _no_assistant], ids=["empty", "utf16", "junk", "no-assistant"]
)
def test_bad_data_is_named_before_the_target_loads_and_leaves_no_run(tmp_path, monkeypatch, write):
    """The data module's check runs before the model is built: a 30-layer target would otherwise load first."""
    from dspark_lightning.models import target

    loads = []
    for cls in (target.FrozenTarget, target.TargetHeads):
        original = cls.from_pretrained.__func__
        monkeypatch.setattr(
            cls, "from_pretrained", classmethod(lambda c, *a, _o=original, **k: loads.append(a) or _o(c, *a, **k))
        )
    path = tmp_path / "bad-data.jsonl"
    write(path)
    with pytest.raises(UserError, match=r"(?s)data\.train_files.*bad-data\.jsonl"):
        cli_main(["fit", *fit_args(tmp_path / "runs", train=path)])
    assert loads == []  # no target was loaded
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("version_*"))


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


def test_draft_vocab_on_empty_or_unusable_input_fails(tmp_path):
    empty, bad = tmp_path / "empty.jsonl", tmp_path / "bad.jsonl"
    empty.write_text("")
    bad.write_text('{"id": 1}\n')
    base = ["--tokenizer", TARGET, "--size", "64", "--output", str(tmp_path / "v.safetensors")]
    with pytest.raises(NotJSONError, match=r"every data file is empty: .*empty\.jsonl"):
        cli_main(["draft-vocab", *base, "--data", str(empty)])
    with pytest.raises(NoUsableRecordsError, match=r"missing_conversations x1 \(first at line 1\)"):
        cli_main(["draft-vocab", *base, "--data", str(bad)])
    assert not (tmp_path / "v.safetensors").exists()


def test_cache_over_only_bad_records_fails(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{"messages": "hi"}\n')
    with pytest.raises(NoUsableRecordsError, match=r"missing_conversations x1.*conversations_not_a_list x1"):
        cli_main(
            ["cache", "--target", TARGET, "--data", str(bad), "--output", str(tmp_path / "cache"), "--device", "cpu"]
        )
    assert not (tmp_path / "cache" / "index.json").exists()


def test_skipped_records_are_named_with_file_and_line_for_the_first_few(tmp_path, caplog):
    path = tmp_path / "mixed.jsonl"
    bad = '{"conversations": [{"from": "human", "value": "hi"}]}'  # no assistant turn
    lines = [*good_lines(12), *([bad] * 5)]
    path.write_text("\n".join(lines) + "\n")
    dm = datamodule(path)
    dm.setup("fit")
    with caplog.at_level(logging.WARNING, logger="dspark_lightning.data.sharegpt"):
        list(dm.train_dataloader())
    named = [r.getMessage() for r in caplog.records if "skipped bad record (no_assistant_turn)" in r.getMessage()]
    assert [m.split(" at ")[1].split(":")[1] for m in named] == ["13", "14", "15"]  # the first 3 of 5, by line
    assert all(str(path) in m for m in named) and "further ones are only counted" in named[-1]
    assert dm.bad_record_counts("train") == {"no_assistant_turn": 5}
