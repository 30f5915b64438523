"""Reading local conversation files (layouts, errors with file and line), validation and source resolution."""

from __future__ import annotations

import gzip
import json

import pytest

from dspark_lightning.data.files import NotJSONError
from dspark_lightning.data.records import iter_file_records, iter_local_records, limit_shards
from dspark_lightning.data.sharegpt import (
    BadRecordCounter,
    BadRecordError,
    InvalidRecord,
    iter_conversations,
    resolve_source,
    validate_record,
)

GOOD = {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
GOOD_OPENAI = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}  # fmt: skip


def test_sharegpt_and_openai_records_normalise_to_the_same_messages():
    assert validate_record(GOOD) == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert [m["role"] for m in validate_record(GOOD_OPENAI)] == ["system", "user", "assistant"]
    mixed = {"conversations": [{"role": "USER", "content": "Q"}, {"from": "assistant", "value": "A"}]}
    assert [m["role"] for m in validate_record(mixed)] == ["user", "assistant"]


def test_jsonl_json_array_and_pretty_printed_layouts_keep_lines(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(GOOD_OPENAI) + "\n")
    assert [(r.line, r.record) for r in iter_file_records(str(jsonl))] == [(1, GOOD), (3, GOOD_OPENAI)]
    array = tmp_path / "b.json"
    array.write_text(json.dumps([GOOD, GOOD_OPENAI, GOOD], indent=2))
    records = list(iter_file_records(str(array)))
    assert [r.record for r in records] == [GOOD, GOOD_OPENAI, GOOD]
    text = array.read_text().splitlines()
    assert [text[r.line - 1].strip() for r in records] == ["{"] * 3
    assert list(iter_file_records(str(array), max_records=2)) == records[:2]
    pretty = tmp_path / "c.json"
    pretty.write_text(json.dumps(GOOD, indent=1) + "\n" + json.dumps(GOOD_OPENAI, indent=1))
    assert [r.record for r in iter_file_records(str(pretty))] == [GOOD, GOOD_OPENAI]
    zipped = tmp_path / "d.jsonl.gz"
    zipped.write_bytes(gzip.compress(jsonl.read_bytes()))
    assert [r.record for r in iter_file_records(str(zipped))] == [GOOD, GOOD_OPENAI]
    empty_array = tmp_path / "e.json"
    empty_array.write_text("[ ]\n")
    assert list(iter_file_records(str(empty_array))) == []


def test_array_decoding_across_chunk_boundaries(tmp_path):
    records = [{"id": i, "conversations": [{"from": "human", "value": "x" * (i * 37 % 500)}]} for i in range(300)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(records, indent=1))
    assert [r.record for r in iter_file_records(str(path))] == records


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"id,text\n1,hello\n", 1),
        (b"\n\nhello world\n", 3),
        (b"\x89PNG\r\n\x1a\n\x00\x00", 1),
        (b'[\n  {"conversations": []},\n  {"conversations": [}\n]\n', 3),
        (b'[\n  {"conversations": []}\n  {"conversations": []}\n]\n', 3),
    ],
    ids=["csv", "text", "binary", "array-syntax-error", "array-missing-comma"],
)
def test_non_json_file_is_an_error_naming_file_and_line(tmp_path, content, line):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(NotJSONError, match=rf"data\.jsonl:{line}:") as info:
        list(iter_file_records(str(path)))
    assert info.value.file == str(path) and info.value.line == line


def test_exceptions_survive_a_round_trip_through_their_message():
    # DataLoader workers re-raise exceptions as ``type(error)(message)``; the message must keep file and line.
    error = NotJSONError("f.jsonl", 7, "starts with 'x'")
    assert str(NotJSONError(str(error))) == str(error)
    bad = BadRecordError("unknown_role", "turn 0", "f.jsonl", 3)
    assert str(BadRecordError(str(bad))) == str(bad) and "f.jsonl:3" in str(bad)


def test_bad_json_lines_are_counted_or_raised_with_file_and_line(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        json.dumps(GOOD) + '\n{"conversations": [\n' + json.dumps({"x": 1}) + "\n" + json.dumps(GOOD) + "\n"
    )
    counter = BadRecordCounter()
    kept = list(iter_conversations(iter_local_records([(str(path), None)]), counter=counter))
    assert [c.line for c in kept] == [1, 4]
    assert counter.counts == {"invalid_json": 1, "missing_conversations": 1}
    with pytest.raises(BadRecordError, match=r"mixed\.jsonl:2: bad record \(invalid_json\)") as info:
        list(iter_conversations(iter_local_records([(str(path), None)]), on_bad_record="raise"))
    assert (info.value.line, info.value.reason) == (2, "invalid_json")


def test_validation_reasons():
    cases = {
        "not_a_dict": [1, 2],
        "missing_conversations": {"id": 1},
        "conversations_not_a_list": {"conversations": "hi"},
        "empty_conversations": {"messages": []},
        "turn_not_a_dict": {"conversations": ["hi"]},
        "missing_role": {"conversations": [{"value": "hi"}]},
        "unknown_role": {"conversations": [{"from": "tool", "value": "hi"}]},
        "misplaced_system_turn": {"conversations": [{"from": "human", "value": "q"}, {"from": "system", "value": "s"}]},
        "missing_content": {"conversations": [{"from": "human"}]},
        "non_string_content": {"conversations": [{"from": "human", "value": ["q"]}]},
        "empty_content": {"conversations": [{"from": "human", "value": " \n"}]},
        "no_assistant_turn": {"conversations": [{"from": "human", "value": "q"}]},
    }
    for reason, record in cases.items():
        with pytest.raises(InvalidRecord) as info:
            validate_record(record)
        assert info.value.reason == reason, record


def test_resolve_source_files_directories_globs_and_hub_ids(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("b.jsonl", "a.json", "sub/c.jsonl.gz", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [p.rsplit("/", 1)[-1] for p in resolve_source(str(tmp_path)).files] == ["a.json", "b.jsonl", "c.jsonl.gz"]
    assert len(resolve_source(str(tmp_path / "*.json*")).files) == 2
    assert len(resolve_source([str(tmp_path / "a.json"), str(tmp_path / "a.json")]).files) == 1
    assert resolve_source(str(tmp_path / "notes.txt")).files  # explicit files are sniffed, not filtered
    hub = resolve_source("org/dataset")
    assert (hub.hub_id, hub.hub_config, hub.hub_split) == ("org/dataset", None, "train")
    hub = resolve_source("org/dataset:cfg:test", default_split="validation")
    assert (hub.hub_id, hub.hub_config, hub.hub_split) == ("org/dataset", "cfg", "test")
    assert resolve_source("org/dataset", default_split="validation").hub_split == "validation"
    for missing in ("./nope/data.jsonl", "nope/data.jsonl", str(tmp_path / "*.parquet")):
        with pytest.raises(FileNotFoundError):
            resolve_source(missing)
    with pytest.raises(ValueError):
        resolve_source([str(tmp_path / "a.json"), "org/dataset"])


def test_limit_shards_takes_exactly_the_first_records_in_file_order(tmp_path):
    paths = []
    for i, n in enumerate((3, 2, 4)):
        path = tmp_path / f"{i}.jsonl"
        path.write_text("".join(json.dumps({"id": f"{i}-{j}"}) + "\n" for j in range(n)))
        paths.append(str(path))
    assert limit_shards(paths, 4) == [(paths[0], 3), (paths[1], 1)]
    assert [r.record["id"] for r in iter_local_records(limit_shards(paths, 4))] == ["0-0", "0-1", "0-2", "1-0"]
    assert limit_shards(paths, None) == [(p, None) for p in paths]


@pytest.mark.parametrize(
    "tail",
    [
        '\n  {"id": "cut", "conversations": [{"from": "human", "value": "unfin',
        '\n  {"id": "cut", "convers',
        "\n",
        "\n  ",
    ],
    ids=["inside-a-string", "inside-a-key", "after-a-comma", "after-a-comma-spaces"],
)
def test_truncated_json_array_keeps_every_complete_record(tmp_path, tail):
    records = [{"id": str(i), "conversations": [GOOD["conversations"][0], GOOD["conversations"][1]]} for i in range(3)]
    text = json.dumps(records, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.rindex("}") + 1] + "," + tail)  # drop the closing bracket, cut after a comma
    raws = list(iter_file_records(str(path)))
    assert [r.record for r in raws[:-1]] == records
    assert raws[-1].truncated and raws[-1].record is None
    counter = BadRecordCounter()
    assert len(list(iter_conversations(iter(raws), counter=counter))) == 3
    assert counter.counts == {"truncated_tail": 1}


def test_sharegpt_v3_role_aliases_are_assistant_turns():
    for role in ("chatgpt", "bing", "bard", "assistant", "gpt"):
        messages = validate_record({"conversations": [{"from": "human", "value": "q"}, {"from": role, "value": "a"}]})
        assert messages[1]["role"] == "assistant"
