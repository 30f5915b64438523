"""On-policy regeneration: turn-by-turn greedy replies, ShareGPT shards, resume after an interruption."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from helpers.paths import DEMO_TARGET
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark_lightning.cli import cli_main
from dspark_lightning.preparation.regenerate import GreedyRegenerator, ResumableShardWriter, regenerate

CONVERSATIONS = [
    {"id": "one", "conversations": [{"from": "human", "value": "What does `json.dumps` do?"}, {"from": "gpt", "value": "x"}]},
    {"conversations": [{"from": "system", "value": "You are a concise coding assistant."},
                       {"from": "human", "value": "What is the `heapq` module for?"}, {"from": "gpt", "value": "y"},
                       {"from": "human", "value": "Which names does it define?"}, {"from": "gpt", "value": "z"}]},
    {"id": "bad", "conversations": [{"from": "human", "value": "no reply"}]},
    {"id": "three", "messages": [{"role": "user", "content": "Explain `textwrap.dedent`."}, {"role": "assistant", "content": "w"}]},
]  # fmt: skip


@pytest.fixture(scope="module")
def target():
    return AutoModelForCausalLM.from_pretrained(DEMO_TARGET).eval(), AutoTokenizer.from_pretrained(DEMO_TARGET)


def read_records(directory: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


def test_regenerate_resumes_after_interruption_without_duplicates(tmp_path, target):
    model, tokenizer = target
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n")
    out = tmp_path / "out"
    kwargs = dict(max_new_tokens=12, batch_size=2, shard_size=2, model=model, tokenizer=tokenizer)

    first = regenerate(str(DEMO_TARGET), str(data), out, limit=2, **kwargs)
    assert first["written"] == 2 and first["records_after"] == 2
    ids_first = [r["id"] for r in read_records(out)]
    assert ids_first[0] == "one" and ids_first[1].startswith("sha1-")

    # an interrupted write leaves half a line behind in a new shard
    (out / "train-00001.jsonl").write_text('{"id": "three", "conversations": [{"from": "hu')
    second = regenerate(str(DEMO_TARGET), str(data), out, limit=10, **kwargs)
    assert second["records_before"] == 2 and second["written"] == 1 and second["skipped_already_done"] == 2
    assert second["bad_record:no_assistant_turn"] == 1 and second["removed_partial_bytes"] > 0
    records = read_records(out)
    assert [r["id"] for r in records] == [*ids_first, "three"]
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["train-00000.jsonl", "train-00001.jsonl"]

    third = regenerate(str(DEMO_TARGET), str(data), out, limit=10, **kwargs)
    assert third.get("written", 0) == 0 and read_records(out) == records

    two_turns = records[1]["conversations"]
    assert [t["from"] for t in two_turns] == ["system", "human", "gpt", "human", "gpt"]
    assert two_turns[1]["value"] == CONVERSATIONS[1]["conversations"][1]["value"]
    assert all(t["value"] not in ("y", "z") and t["value"] for t in two_turns if t["from"] == "gpt")


def test_regenerated_reply_is_the_greedy_continuation_of_the_conversation_so_far(target):
    model, tokenizer = target
    regenerator = GreedyRegenerator(model, tokenizer, max_new_tokens=10)
    prompt = [{"role": "user", "content": "What does `json.dumps` do?"}]
    short_prompt = [{"role": "user", "content": "Hi"}]
    batched = regenerator.generate_replies([prompt, short_prompt], Counter())
    alone = regenerator.generate_replies([prompt], Counter())
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    reference = model.generate(**ids, max_new_tokens=10, do_sample=False)[0, ids["input_ids"].shape[1] :]
    expected = tokenizer.decode(reference, skip_special_tokens=True).strip()
    assert batched[0] == alone[0] == expected


def test_cli_main_and_shard_writer_roll_over(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n")
    out = tmp_path / "cli"
    summary = cli_main(
        ["regenerate", "--target", str(DEMO_TARGET), "--data", str(data), "--output", str(out),
         "--max_new_tokens", "4", "--batch_size", "4", "--shard_size", "2", "--device", "cpu"]
    )  # fmt: skip
    assert summary["records_after"] == 3
    assert [len(p.read_text().splitlines()) for p in sorted(out.glob("*.jsonl"))] == [2, 1]
    writer = ResumableShardWriter(out, shard_size=2)
    assert writer.path.name == "train-00001.jsonl" and len(writer.done_ids) == 3


def test_regenerate_one_split_and_at_most_max_turns_replies(tmp_path, target):
    from dspark_lightning.data.sharegpt import IdSplit

    model, tokenizer = target
    fractions = {"validation": 0.4, "test": 0.2}
    split = IdSplit(**fractions)
    lead_id = next(f"lead{i}" for i in range(100) if split.split_of(f"lead{i}") == "train")
    lead = {"id": lead_id, "conversations": [{"from": "gpt", "value": "hello"}, *CONVERSATIONS[0]["conversations"]]}
    records = [*CONVERSATIONS, lead] + [
        {"id": f"c{i}_{part}", "conversations": CONVERSATIONS[1]["conversations"]} for i in range(12) for part in (0, 1)
    ]
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    kwargs = dict(max_new_tokens=6, batch_size=4, model=model, tokenizer=tokenizer, split_by_id=fractions, max_turns=1)
    summaries = {name: regenerate(str(DEMO_TARGET), str(data), tmp_path / "out", split=name, **kwargs) for name in ("train", "validation")}  # fmt: skip
    written = {name: [json.loads(line) for p in sorted((tmp_path / "out").glob(f"{name}-*.jsonl")) for line in p.read_text().splitlines()] for name in ("train", "validation")}  # fmt: skip
    for name, rows in written.items():
        assert rows and all(split.split_of(r["id"]) == name for r in rows)
        assert all(sum(t["from"] == "gpt" for t in r["conversations"]) == 1 for r in rows)  # max_turns=1
        assert summaries[name]["skipped_other_split"] > 0
    parts = {r["id"].rsplit("_", 1)[0]: r["id"] for rows in written.values() for r in rows if r["id"].startswith("c")}
    assert len({split.split_of(i) for i in parts}) >= 2  # both splits got some conversations
    (lead_row,) = [r for r in written["train"] if r["id"] == lead_id]  # a reply to no prompt is skipped
    assert [t["from"] for t in lead_row["conversations"]] == ["human", "gpt"]
    assert summaries["train"]["skipped_reply_without_prompt"] == 1


def test_limit_counts_records_written_not_conversations_tried(tmp_path, target):
    model, tokenizer = target
    long_prompt = "Explain this module in detail: " + "json " * 80  # over max_prompt_tokens: yields no record
    rows = []
    for i in range(9):
        prompt = long_prompt if i % 3 == 0 else f"What does module number {i} do?"
        rows.append(
            {"id": f"r{i}", "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": "x"}]}
        )
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    kwargs = dict(max_new_tokens=4, batch_size=3, max_prompt_tokens=40, model=model, tokenizer=tokenizer)
    summary = regenerate(str(DEMO_TARGET), str(data), tmp_path / "out", limit=5, **kwargs)
    written = [r["id"] for r in read_records(tmp_path / "out")]
    # r0, r3, r6 are dropped; the limit is met from the next conversations, in source order, and never overshot
    assert written == ["r1", "r2", "r4", "r5", "r7"] and summary["records_after"] == 5
    assert summary["dropped_no_regenerated_turn"] == 3


class SignalledAfterFirstGenerate:
    """The target, but its first ``generate`` call ends with a real SIGTERM to this process (as ``timeout`` sends)."""

    def __init__(self, model):
        self.model, self.generation_config, self.calls = model, model.generation_config, 0

    def parameters(self):
        return self.model.parameters()

    def generate(self, **kwargs):
        output = self.model.generate(**kwargs)
        self.calls += 1
        if self.calls == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return output


def test_sigterm_stops_between_batches_with_a_progress_bar_and_a_rerun_finishes_the_job(tmp_path, target, capsys):
    model, tokenizer = target
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n")
    kwargs = dict(max_new_tokens=8, batch_size=2, shard_size=10, tokenizer=tokenizer)
    handler = signal.getsignal(signal.SIGTERM)

    stopped = regenerate(
        str(DEMO_TARGET), str(data), tmp_path / "out", model=SignalledAfterFirstGenerate(model), **kwargs
    )
    # the batch being generated when the signal came is finished and written whole; the next one never starts
    assert stopped["stopped"].startswith("SIGTERM") and stopped["written"] == stopped["records_after"] == 2
    assert signal.getsignal(signal.SIGTERM) is handler  # the command's handler is gone again
    err = capsys.readouterr().err
    assert "regenerate: SIGTERM received" in err and "2/3 conversations" in err  # 3 valid conversations to do

    resumed = regenerate(str(DEMO_TARGET), str(data), tmp_path / "out", model=model, **kwargs)
    assert "stopped" not in resumed and resumed["written"] == 1 and resumed["skipped_already_done"] == 2
    uninterrupted = regenerate(str(DEMO_TARGET), str(data), tmp_path / "whole", model=model, **kwargs)
    assert read_records(tmp_path / "out") == read_records(tmp_path / "whole") and uninterrupted["written"] == 3
