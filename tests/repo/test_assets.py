"""The shipped demo assets: size budget, manifests, tokenizer, target model and its stored greedy continuation."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch
from helpers.paths import ASSETS
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark_lightning.data.records import iter_file_records
from dspark_lightning.data.sharegpt import validate_record
from dspark_lightning.data.tokenize import has_generation_markers

TARGET = ASSETS / "demo-target"
SHAREGPT = ASSETS / "data" / "sharegpt"
REGENERATED = ASSETS / "data" / "regenerated"
MANIFEST_ROW = re.compile(r"^\| (\S+\.jsonl) \| (\d+) \| ([0-9a-f]{64}) \|$", re.MULTILINE)


def records_of(paths) -> list[dict]:
    return [raw.record for path in paths for raw in iter_file_records(str(path))]


def test_assets_fit_the_size_budget():
    total = sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file())
    assert total <= 25 * 1024 * 1024, f"assets take {total / 2**20:.1f} MiB"


@pytest.mark.parametrize("directory", [SHAREGPT, REGENERATED], ids=["sharegpt", "regenerated"])
def test_data_shards_match_their_manifest_and_are_valid(directory):
    manifest = MANIFEST_ROW.findall((directory / "README.md").read_text())
    shards = sorted(directory.glob("*.jsonl"))
    assert sorted(name for name, _, _ in manifest) == [p.name for p in shards] and shards
    for name, count, digest in manifest:
        data = (directory / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest and data.count(b"\n") == int(count)
    records = records_of(shards)
    assert len({r["id"] for r in records}) == len(records)
    for record in records:
        validate_record(record)


def test_train_and_validation_splits():
    train = records_of(sorted(SHAREGPT.glob("train-*.jsonl")))
    validation = records_of(sorted(SHAREGPT.glob("validation-*.jsonl")))
    assert len(train) >= 4000 and len(validation) >= 200
    assert len(list(SHAREGPT.glob("train-*.jsonl"))) >= 4 and len(list(SHAREGPT.glob("validation-*.jsonl"))) == 2
    assert not {r["id"] for r in train} & {r["id"] for r in validation}
    roles = {t["from"] for r in train for t in r["conversations"]}
    assert roles == {"system", "human", "gpt"}
    assert sum(len(r["conversations"]) > 3 for r in train) > len(train) // 5  # multi-turn
    regenerated = records_of(sorted(REGENERATED.glob("*.jsonl")))
    assert {r["id"] for r in regenerated} <= {r["id"] for r in train} and len(regenerated) >= 500
    assert "Python Software Foundation License" in (ASSETS / "data" / "LICENSE.md").read_text()


def test_tokenizer_loads_with_special_tokens_and_an_assistant_masking_template():
    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    assert 2048 <= len(tokenizer) <= 4096
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.mask_token) == (
        "<|endoftext|>",
        "<|im_end|>",
        "<|mask|>",
    )
    assert len({tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.mask_token_id}) == 3
    assert has_generation_markers(tokenizer.chat_template)
    text = "Ünïcode → bytes 🐍 def f(x):\n\treturn x"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


@pytest.fixture(scope="module")
def target():
    return AutoModelForCausalLM.from_pretrained(TARGET).eval(), AutoTokenizer.from_pretrained(TARGET)


def test_target_is_a_small_qwen3_saved_as_safetensors(target):
    model, tokenizer = target
    assert (TARGET / "model.safetensors").exists() and not list(TARGET.glob("*.bin"))
    config = model.config
    assert config.model_type == "qwen3" and config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer) and config.num_hidden_layers == 4
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert "perplexity" in (TARGET / "TRAINING.md").read_text()


def test_greedy_continuation_of_a_validation_prompt_is_deterministic_and_as_stored(target):
    model, tokenizer = target
    expected = json.loads((TARGET / "expected_generation.json").read_text())
    prompt_ids = tokenizer.apply_chat_template(
        expected["prompt_messages"], add_generation_prompt=True, return_dict=False
    )
    assert prompt_ids == expected["prompt_ids"]
    inputs = torch.tensor([prompt_ids])
    runs = [
        model.generate(inputs, max_new_tokens=expected["max_new_tokens"], do_sample=False)[0, len(prompt_ids) :]
        for _ in range(2)
    ]
    assert runs[0].tolist() == runs[1].tolist() == expected["generated_ids"]
    assert tokenizer.decode(runs[0], skip_special_tokens=True) == expected["generated_text"]


def test_grown_smollm2_split_extends_the_report_split_and_stays_held_out():
    # experiments/smollm2_heads/gated_longer trains on the grown split; experiments/smollm2_heads/400steps on its first 378 lines (a resumed regeneration)
    smollm2 = ASSETS / "smollm2"
    report = (smollm2 / "regenerated" / "train-00000.jsonl").read_bytes()
    grown = (smollm2 / "regenerated-951" / "train-00000.jsonl").read_bytes()
    assert grown.startswith(report) and report.count(b"\n") == 378 and grown.count(b"\n") == 951
    records = records_of([smollm2 / "regenerated-951" / "train-00000.jsonl"])
    for record in records:
        validate_record(record)
    validation = records_of([smollm2 / "regenerated" / "validation-00000.jsonl"])
    assert len({r["id"] for r in records}) == 951 and not {r["id"] for r in records} & {r["id"] for r in validation}


def test_the_regenerated_training_split_continues_in_order_and_stays_held_out():
    # regenerated-more holds the same resumed run past the 951: conversations 952-1284 (the extra data of
    # experiments/smollm2_heads/3000steps), then 1285 onwards; every id is a training-split id, never a validation one
    from dspark_lightning.data.splits import IdSplit

    smollm2 = ASSETS / "smollm2"
    first = records_of([smollm2 / "regenerated-951" / "train-00000.jsonl"])
    more = [records_of([path]) for path in sorted((smollm2 / "regenerated-more").glob("train-*.jsonl"))]
    assert [len(part) for part in more] == [333, 1716]
    records = first + [r for part in more for r in part]
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids) == 3000
    split = IdSplit(validation=0.02, test=0.02)
    assert {split.split_of(i) for i in ids} == {"train"}
    validation = records_of([smollm2 / "regenerated" / "validation-00000.jsonl"])
    assert not set(ids) & {r["id"] for r in validation}
    for record in records:
        validate_record(record)
        assert [t["from"] for t in record["conversations"]][-2:] == ["human", "gpt"]  # --max_turns 1: one reply


def test_the_smollm2_code_replies_answer_training_code_prompts_and_never_a_humaneval_problem():
    # regenerated-code: SmolLM2's replies to the code prompts of training conversations asked as HumanEval asks
    # (regenerate --format chat --prompts '[code]'); none may be a HumanEval problem, which is an eval set
    from dspark_lightning.data.splits import IdSplit
    from dspark_lightning.measuring.eval_sets import HUMANEVAL_CHAT_FORMAT, humaneval_path, read_humaneval

    records = records_of([ASSETS / "smollm2" / "regenerated-code" / "train-00000.jsonl"])
    assert len(records) == 300 and len({r["id"] for r in records}) == 300
    split = IdSplit(validation=0.02, test=0.02)
    head, tail = HUMANEVAL_CHAT_FORMAT.split("{prompt}")
    humaneval = {prompt.strip() for _, prompt in read_humaneval(humaneval_path())}
    for record in records:
        validate_record(record)
        assert record["id"].endswith("#code") and split.split_of(record["id"]) == "train"
        question, reply = record["conversations"]
        assert (question["from"], reply["from"]) == ("human", "gpt") and reply["value"].strip()
        assert question["value"].startswith(head) and question["value"].endswith(tail)
        assert question["value"][len(head) : -len(tail)].strip() not in humaneval
