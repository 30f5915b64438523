"""The benchmark and user prompt files (``measuring/prompt_sets.py``): what each packaged set holds, each supported
shape of a user's JSONL file, and one clear line for each bad file."""

from __future__ import annotations

import gzip
import json

import pytest

from dspark_lightning.measuring.prompt_sets import BENCHMARKS, MBPP_FORMAT, read_benchmark, read_prompt_file


@pytest.mark.parametrize("name,count,turns", [("gsm8k", 1319, 1), ("mbpp", 500, 1), ("mt_bench", 80, 2)])
def test_each_packaged_benchmark_holds_its_published_problems(name, count, turns):
    records = read_benchmark(BENCHMARKS[name])
    assert len(records) == count and len({r.id for r in records}) == count
    assert all(1 + len(r.follow_ups) == turns and r.messages[0]["role"] == "user" for r in records)


def test_the_prompts_are_the_records_own_text(tmp_path):
    gsm8k = tmp_path / "gsm8k.jsonl.gz"
    with gzip.open(gsm8k, "wt") as out:
        out.write(json.dumps({"doc_id": 7, "doc": {"question": "What is 2 + 2?", "answer": "4"}}) + "\n")
    (record,) = read_benchmark(BENCHMARKS["gsm8k"], str(gsm8k))
    assert (record.id, record.messages) == ("7", [{"role": "user", "content": "What is 2 + 2?"}])
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps({"doc": {"task_id": 3, "text": "Add.", "test_list": ["assert f(1) == 2"]}}) + "\n")
    (record,) = read_benchmark(BENCHMARKS["mbpp"], str(mbpp))
    assert record.messages[0]["content"] == "Add.\nYour code should pass these tests:\n\nassert f(1) == 2"
    assert MBPP_FORMAT.format(text="Add.", tests="assert f(1) == 2") == record.messages[0]["content"]
    first = read_benchmark(BENCHMARKS["mt_bench"])[0]
    assert first.id == "81" and first.follow_ups == [
        "Rewrite your previous response. Start every sentence with the letter A."
    ]


def test_a_user_file_of_every_supported_shape(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"prompt": "Hello?"},
        {"id": "two", "turns": ["First.", "Then this."]},
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
                           {"from": "gpt", "value": "Hello"}, {"from": "human", "value": "later"}]},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    one, two, three = read_prompt_file(str(path))
    assert (one.id, one.messages, one.follow_ups) == ("1", [{"role": "user", "content": "Hello?"}], [])
    assert (two.id, two.messages[0]["content"], two.follow_ups) == ("two", "First.", ["Then this."])
    assert three.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    "lines,message",
    [
        (['{"prompt": "a"}', "{not json"], r"mine\.jsonl:2: not a JSON record"),
        (['{"prompt": "a", "turns": ["b"]}'], r"mine\.jsonl:1: a prompt record holds exactly one of"),
        (['{"text": "a"}'], r"mine\.jsonl:1: a prompt record holds exactly one of .*keys: \['text'\]"),
        (['{"turns": []}'], r"mine\.jsonl:1: 'turns' must be a non-empty list"),
        (['{"prompt": "  "}'], r"mine\.jsonl:1: every turn must be a non-empty string"),
        (['{"conversations": [{"from": "gpt", "value": "x"}]}'], r"mine\.jsonl:1: the prompt must end in a user turn"),
        (['{"id": 1, "prompt": "a"}', '{"id": 1, "prompt": "b"}'], r"mine\.jsonl: id '1' appears twice"),
        (['{"prompt": "a"}', "[1, 2]"], r"mine\.jsonl:2: expected a JSON object, got list"),
        ([], r"mine\.jsonl holds no prompts"),
    ],
)
def test_a_bad_user_file_is_one_line_naming_file_and_record(tmp_path, lines, message):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(ValueError, match=message):
        read_prompt_file(str(path))
    with pytest.raises(ValueError, match=r"missing\.jsonl: no such file"):
        read_prompt_file(str(tmp_path / "missing.jsonl"))
