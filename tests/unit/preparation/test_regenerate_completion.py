"""regenerate --format completion (base models): plain-text prompts made of conversations (first user turns, code
prompts cut after a function's signature and docstring), continued by the target's own greedy generation, resumable."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers.base_targets import base_model_copy
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark_lightning.data.completion import CompletionEncoder, first_turn_prompt
from dspark_lightning.data.sharegpt import DataFormatError
from dspark_lightning.data.splits import IdSplit
from dspark_lightning.errors import OptionError
from dspark_lightning.measuring.eval_sets import HUMANEVAL_CHAT_FORMAT
from dspark_lightning.preparation.regenerate import regenerate
from dspark_lightning.preparation.regenerate_completion import code_prompt

SOURCE = '''Here is `textwrap.dedent`:
```python
import re

@public
def dedent(text,
           margin=None):
    """Remove any common leading whitespace
    from every line in `text`.
    """
    lines = text.splitlines()
    return lines
```'''
CONVERSATIONS = [
    {"id": "one", "conversations": [{"from": "human", "value": "What does `json.dumps` do?"},
                                    {"from": "gpt", "value": "It serialises."}]},
    {"id": "two", "conversations": [{"from": "system", "value": "Be brief."},
                                    {"from": "human", "value": "Show me `textwrap.dedent`."},
                                    {"from": "gpt", "value": SOURCE}]},
    {"id": "bad", "conversations": [{"from": "human", "value": "no reply"}]},
    {"id": "listed", "prompt": "def fib(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n"},
    {"messages": [{"role": "user", "content": "Explain `heapq.heappush`."}, {"role": "assistant", "content": "w"}]},
    {"id": "blank", "prompt": "   "},
]  # fmt: skip


@pytest.fixture(scope="module")
def base_target(tmp_path_factory):
    """The demo target without a chat template (a base model), its model and tokenizer."""
    path = base_model_copy(tmp_path_factory.mktemp("base") / "target")
    return path, AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def read_records(directory: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------------------------------------- prompts
def test_code_prompt_is_the_code_up_to_the_signature_and_docstring():
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": SOURCE}]
    assert code_prompt(messages) == (
        "import re\n\n@public\ndef dedent(text,\n           margin=None):\n"
        '    """Remove any common leading whitespace\n    from every line in `text`.\n    """\n'
    )
    fence = "```py\nclass A:\n    def f(self) -> int:  # returns one\n        return 1\n```"
    assert code_prompt([{"role": "user", "content": fence}]) == "class A:\n    def f(self) -> int:  # returns one\n"
    one_line = "```python\ndef g():\n    '''One line.'''\n    pass\n```"
    assert code_prompt([{"role": "user", "content": one_line}]) == "def g():\n    '''One line.'''\n"
    cut = '```python\ndef h():\n    """never closed\n```\n```python\nasync def k(x): \n    return x\n```'
    assert code_prompt([{"role": "user", "content": cut}]) == "async def k(x): \n"  # the first block is cut inside
    for content in ("no code here", "```javascript\nfunction f() {}\n```", "```python\nx = 1\n```"):
        assert code_prompt([{"role": "user", "content": content}]) is None


def test_first_turn_prompt_is_the_first_user_turn_as_plain_text():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "Hi?"},
        {"role": "user", "content": "x"},
    ]
    assert first_turn_prompt(messages) == "Hi?\n" and first_turn_prompt(messages[:1]) is None


def test_prompt_ids_keep_their_conversation_split():
    split = IdSplit(validation=0.3, test=0.3)
    for identifier in ("abc", "QWJhYvA_1", "r17"):
        expected = split.split_of(identifier)
        assert split.split_of(f"{identifier}#first_turn") == split.split_of(f"{identifier}#code") == expected


# ----------------------------------------------------------------------------------------------------- regenerate
def greedy_continuation(model, tokenizer, prompt: str, max_new_tokens: int) -> tuple[list[int], str]:
    """The target's own greedy continuation of a plain-text prompt, computed independently with ``generate``."""
    encoded = tokenizer(prompt, return_tensors="pt")
    output = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    new = output[0, encoded["input_ids"].shape[1] :].tolist()
    new = new[: new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new
    return new, tokenizer.decode(new, skip_special_tokens=True)


def test_completion_records_hold_the_targets_greedy_continuations_and_resume(tmp_path, base_target):
    path, model, tokenizer = base_target
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n")
    out = tmp_path / "out"
    kwargs = dict(max_new_tokens=24, batch_size=2, shard_size=3, model=model, tokenizer=tokenizer)

    first = regenerate(str(path), str(data), out, limit=3, **kwargs)  # format auto: the target has no chat template
    assert first["format"] == "completion" and first["written"] == 3
    (out / "train-00001.jsonl").write_text('{"id": "listed", "prompt": "def fi')  # an interrupted write
    second = regenerate(str(path), str(data), out, **kwargs)
    assert second["records_before"] == 3 and second["removed_partial_bytes"] > 0
    assert second["skipped_already_done"] == 3 and second["written"] == 2
    assert second["bad_record:no_assistant_turn"] == 1 and second["bad_record:empty_content"] == 1
    assert second["records_without_code_prompt"] == 2  # "one" and the messages record: counted, not silently left out
    records = read_records(out)
    sha = next(r["id"] for r in records if r["id"].startswith("sha1-"))
    assert [r["id"] for r in records] == ["one#first_turn", "two#first_turn", "two#code", "listed", sha]
    assert sha.endswith("#first_turn")
    assert regenerate(str(path), str(data), out, **kwargs).get("written", 0) == 0  # finished: nothing left

    prompts = {r["id"]: r["prompt"] for r in records}
    assert prompts["one#first_turn"] == "What does `json.dumps` do?\n"
    assert prompts["two#code"] == code_prompt([{"role": "assistant", "content": SOURCE}])
    assert prompts["listed"] == CONVERSATIONS[3]["prompt"]
    encoder = CompletionEncoder(tokenizer)
    for record in records:
        new, text = greedy_continuation(model, tokenizer, record["prompt"], 24)
        assert record["completion"] == text and set(record) == {"id", "prompt", "completion"}
        document = encoder.encode(record["prompt"], record["completion"])  # training sees the generated tokens
        assert [i for i, m in zip(document.input_ids, document.loss_mask) if m] == new


def test_prompt_kinds_limits_and_errors(tmp_path, base_target):
    path, model, tokenizer = base_target
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n")
    kwargs = dict(max_new_tokens=8, batch_size=4, model=model, tokenizer=tokenizer)
    code_only = regenerate(str(path), str(data), tmp_path / "code", prompts=["code"], **kwargs)
    assert [r["id"] for r in read_records(tmp_path / "code")] == ["two#code", "listed"]
    assert code_only["records_without_code_prompt"] == 2
    short = regenerate(str(path), str(data), tmp_path / "short", max_prompt_tokens=12, **kwargs)
    assert short["skipped_prompt_over_max_prompt_tokens"] >= 2  # the code prompts
    with pytest.raises(DataFormatError, match="--format chat, but the target .* has no chat template"):
        regenerate(str(path), str(data), tmp_path / "chat", format="chat", **kwargs)
    with pytest.raises(OptionError, match="--max_turns"):
        regenerate(str(path), str(data), tmp_path / "turns", max_turns=1, **kwargs)
    with pytest.raises(DataFormatError, match="--prompts"):
        regenerate(str(path), str(data), tmp_path / "kinds", prompts=["last_turn"], **kwargs)
    assert not (tmp_path / "chat").exists() and not any((tmp_path / "turns").glob("*"))


def test_a_chat_target_can_write_completion_records_when_asked(tmp_path, base_target):
    _, model, _ = base_target  # same weights as the demo target, which has a chat template
    from helpers.paths import DEMO_TARGET

    tokenizer = AutoTokenizer.from_pretrained(DEMO_TARGET)
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps(CONVERSATIONS[0]) + "\n")
    summary = regenerate(str(DEMO_TARGET), str(data), tmp_path / "out", format="completion", max_new_tokens=6,
                         model=model, tokenizer=tokenizer)  # fmt: skip
    assert summary["format"] == "completion" and read_records(tmp_path / "out")[0]["id"] == "one#first_turn"
    chat = regenerate(
        str(DEMO_TARGET), str(data), tmp_path / "chat", max_new_tokens=6, model=model, tokenizer=tokenizer
    )
    assert chat["format"] == "chat" and "conversations" in read_records(tmp_path / "chat")[0]
    assert Counter(chat)["written"] == 1


def test_a_chat_target_answers_code_prompts_asked_as_humaneval_asks(tmp_path, base_target):
    """``--format chat --prompts '[code]'``: each conversation's code prompt becomes one user turn in HumanEval's chat
    form, and the record holds the chat target's own greedy reply to it (checked against ``generate``)."""
    _, model, _ = base_target
    from helpers.paths import DEMO_TARGET

    tokenizer = AutoTokenizer.from_pretrained(DEMO_TARGET)
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n")
    kwargs = dict(max_new_tokens=10, batch_size=2, model=model, tokenizer=tokenizer, format="chat")
    summary = regenerate(str(DEMO_TARGET), str(data), tmp_path / "code", prompts=["code"], **kwargs)
    assert summary["format"] == "chat" and summary["written"] == 1
    assert summary["records_without_code_prompt"] == 2  # "one" and the messages record, counted
    (record,) = read_records(tmp_path / "code")
    assert record["id"] == "two#code"
    question, reply = record["conversations"]
    code = code_prompt([{"role": "assistant", "content": SOURCE}])
    assert question == {"from": "human", "value": HUMANEVAL_CHAT_FORMAT.format(prompt=code)}
    messages = [{"role": "user", "content": question["value"]}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    output = model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, pad_token_id=0)
    new = output[0, len(ids) :].tolist()
    new = new[: new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new
    assert reply == {"from": "gpt", "value": tokenizer.decode(new, skip_special_tokens=True).strip()}
    for kinds in (["first_turn"], ["code", "first_turn"]):
        with pytest.raises(OptionError, match=r"--prompts .* with --format chat"):
            regenerate(str(DEMO_TARGET), str(data), tmp_path / "kinds", prompts=kinds, **kwargs)
