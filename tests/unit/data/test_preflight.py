"""The data preflight: every file of a split is sampled, a split with no usable record is refused naming each bad
file, and a bad file among good ones is a warning. Files are written here, one JSON record a line."""

from __future__ import annotations

import json
import logging

import pytest

from dspark_lightning.data.preflight import NoUsableRecordsError, preflight_data_files

GOOD = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
NO_REPLY = {"conversations": [{"from": "human", "value": "hi"}]}  # no assistant turn: unusable


def write(tmp_path, name: str, records: list[dict]) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_a_split_of_bad_files_is_refused_naming_every_one(tmp_path):
    files = [write(tmp_path, f"bad{i}.jsonl", [NO_REPLY] * 3) for i in range(3)]
    with pytest.raises(NoUsableRecordsError) as error:
        preflight_data_files(files, "data.train_files")
    for path in files:
        assert f"{path}: no_assistant_turn x3 (first at line 1)" in str(error.value)


def test_a_bad_file_after_good_ones_is_a_warning_naming_it(tmp_path, caplog):
    good = [write(tmp_path, f"good{i}.jsonl", [GOOD] * 2) for i in range(2)]
    bad = write(tmp_path, "bad.jsonl", [NO_REPLY, {"x": 1}])
    with caplog.at_level(logging.WARNING, logger="dspark_lightning.data.preflight"):
        preflight_data_files([*good, bad], "data.train_files")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and bad in warned[0] and "missing_conversations x1 (first at line 2)" in warned[0]


def test_an_empty_file_does_not_make_a_bad_split_usable(tmp_path):
    """An empty file has no record to judge: with it, a split whose only other file is bad is still refused."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    bad = write(tmp_path, "bad.jsonl", [NO_REPLY])
    with pytest.raises(NoUsableRecordsError, match="bad.jsonl: no_assistant_turn x1"):
        preflight_data_files([str(empty), bad], "data.val_files")


def test_only_the_first_records_are_sampled(tmp_path):
    """Bad records after the sample are left to training, where they are skipped and counted."""
    late = write(tmp_path, "late.jsonl", [GOOD] * 4 + [NO_REPLY] * 10)
    preflight_data_files([late], "data.train_files", sample_records=4)
    with pytest.raises(NoUsableRecordsError, match="no_assistant_turn x2"):
        preflight_data_files([write(tmp_path, "early.jsonl", [NO_REPLY] * 2 + [GOOD])], "x", sample_records=2)
