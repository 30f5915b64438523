"""ShareGPTDataModule: batch contract, rank/worker sharding, per-epoch shuffling, bad-record counts, eval prompts."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from datasets import IterableDataset
from helpers.paths import ASSETS

from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.data.files import NotJSONError
from dspark_lightning.data.sharegpt import BadRecordError

DEMO_TARGET = str(ASSETS / "demo-target")
MARKER = re.compile(r"record-(\d+)")


def conversation(k: int) -> dict:
    turns = [
        {"from": "human", "value": f"Tell me about record-{k:03d}."},
        {"from": "gpt", "value": f"It is number {k}, one of the test conversations for the data module."},
    ]
    if k % 3 == 0:
        turns = [{"from": "system", "value": "Be brief."}, *turns]
    if k % 4 == 0:
        turns += [{"from": "human", "value": "And then?"}, {"from": "gpt", "value": "Nothing else to say."}]
    return {"id": f"r{k}", "conversations": turns}


def write_corpus(directory: Path, num_files: int, per_file: int) -> list[int]:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(num_files):
        lines = [json.dumps(conversation(f * per_file + j)) for j in range(per_file)]
        (directory / f"part-{f:02d}.jsonl").write_text("\n".join(lines) + "\n")
    return list(range(num_files * per_file))


def datamodule(train, val=None, **kwargs) -> ShareGPTDataModule:
    settings = dict(seq_len=128, batch_size=4, shuffle_buffer=16, block_size=4)
    settings.update(kwargs)
    return ShareGPTDataModule(DEMO_TARGET, str(train), str(val if val is not None else train), **settings)


def markers_in(batches, tokenizer) -> list[int]:
    found = []
    for batch in batches:
        for ids, docs in zip(batch["input_ids"], batch["document_ids"]):
            for d in range(int(docs.max()) + 1):
                text = tokenizer.decode(ids[docs == d])
                found += [int(m) for m in MARKER.findall(text)]
    return found


def test_batches_follow_the_contract(tmp_path):
    write_corpus(tmp_path / "data", 2, 20)
    dm = datamodule(tmp_path / "data")
    batches = list(dm.train_dataloader())
    pad = dm.pad_token_id
    for batch in batches:
        assert set(batch) == {"input_ids", "loss_mask", "document_ids", "position_ids"}
        assert batch["input_ids"].dtype == torch.long and batch["loss_mask"].dtype == torch.bool
        assert batch["input_ids"].shape[1] == 128 and all(v.shape == batch["input_ids"].shape for v in batch.values())
        for ids, mask, docs, pos in zip(
            *(batch[k] for k in ("input_ids", "loss_mask", "document_ids", "position_ids"))
        ):
            padding = docs < 0
            assert (ids[padding] == pad).all() and not mask[padding].any() and (pos[padding] == 0).all()
            used = int((~padding).sum())
            assert not padding[:used].any()  # documents first, padding only at the end
            assert docs[0] == 0 and ((docs[1:used] - docs[: used - 1]) >= 0).all()
            starts = torch.nonzero(torch.diff(docs[:used], prepend=torch.tensor([-1]))).flatten()
            assert (pos[starts] == 0).all() and (
                (pos[1:used] - pos[: used - 1])[docs[1:used] == docs[: used - 1]] == 1
            ).all()
            assert mask[:used].any()
    assert sorted(markers_in(batches, dm.tokenizer)) == list(range(40))
    stats = dm.data_stats("train")
    assert stats["records"] == stats["documents"] == 40 and stats["rows"] == sum(len(b["input_ids"]) for b in batches)
    assert dm.bad_record_counts("train") == {}


@pytest.mark.parametrize("num_files", [4, 3], ids=["whole-shards", "every-other-record"])
def test_two_ranks_with_two_workers_each_see_every_record_once(tmp_path, num_files):
    expected = write_corpus(tmp_path / "data", num_files, 6)
    dm = datamodule(tmp_path / "data", num_workers=2)
    seen = []
    per_rank = []
    for rank in (0, 1):
        markers = markers_in(dm.train_dataloader(rank=rank, world_size=2), dm.tokenizer)
        per_rank.append(markers)
        assert dm.data_stats("train")["documents"] == len(markers)
        seen += markers
    assert all(per_rank) and sorted(seen) == expected
    assert not [k for k, n in Counter(seen).items() if n > 1]


def test_training_order_is_reshuffled_every_epoch_and_validation_is_not(tmp_path):
    write_corpus(tmp_path / "data", 4, 8)
    dm = datamodule(tmp_path / "data", seq_len=64, batch_size=1)
    train = dm.train_dataloader()
    first, second = markers_in(train, dm.tokenizer), markers_in(train, dm.tokenizer)
    assert sorted(first) == sorted(second) == list(range(32)) and first != second
    assert markers_in(datamodule(tmp_path / "data", seq_len=64, batch_size=1).train_dataloader(), dm.tokenizer) == first
    val = dm.val_dataloader()
    in_order = markers_in(val, dm.tokenizer)
    assert in_order == markers_in(val, dm.tokenizer) and sorted(in_order) == list(range(32))


def sharegpt(*turns: tuple) -> str:
    return json.dumps({"conversations": [{"from": role, "value": value} for role, value in turns]})


BAD_LINES = {
    "invalid_json": ['{"conversations": [', '{"id": 1,}'],
    "not_a_dict": ["[1, 2]", '"just text"'],
    "missing_conversations": ['{"id": "x", "text": "hi"}'],
    "conversations_not_a_list": ['{"conversations": "hi"}'],
    "empty_conversations": ['{"messages": []}'],
    "turn_not_a_dict": ['{"conversations": ["hi", "there"]}'],
    "missing_role": ['{"conversations": [{"value": "q"}, {"from": "gpt", "value": "a"}]}'],
    "unknown_role": [
        sharegpt(("robot", "q"), ("gpt", "a")),
        '{"messages": [{"role": 3, "content": "q"}, {"role": "assistant", "content": "a"}]}',
    ],
    "misplaced_system_turn": [sharegpt(("human", "q"), ("system", "s"), ("gpt", "a"))],
    "missing_content": ['{"conversations": [{"from": "human"}, {"from": "gpt", "value": "a"}]}'],
    "non_string_content": [
        sharegpt(("human", 42), ("gpt", "a")),
        '{"messages": [{"role": "user", "content": null}, {"role": "assistant", "content": "a"}]}',
    ],
    "empty_content": [sharegpt(("human", "q"), ("gpt", "  "))],
    "no_assistant_turn": [sharegpt(("human", "q"), ("human", "r"))],
    "over_max_length": [sharegpt(("human", "word " * 200), ("gpt", "A long enough answer here."))],
    "too_few_supervised_tokens": [sharegpt(("human", "q"), ("gpt", "ok"))],  # "ok" + <|im_end|>: 2 < 3 tokens
    "no_anchor_room": [sharegpt(("human", "q"), ("gpt", "No"))],  # 3 supervised tokens, all in the last 4
}


def write_bad_corpus(directory: Path) -> tuple[list[Path], int]:
    """Two files: good records interleaved with every malformation; also an invalid UTF-8 line."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [line for bad in BAD_LINES.values() for line in bad]
    files = [[json.dumps(conversation(0))], [json.dumps(conversation(1))]]  # a valid first line per file
    for i, line in enumerate(lines):
        files[i % 2] += [line, json.dumps(conversation(i + 2))]
    paths = []
    for i, content in enumerate(files):
        path = directory / f"bad-{i}.jsonl"
        path.write_bytes("\n".join(content).encode() + b"\n" + (b"\xff\xfe{bad bytes}\n" if i == 1 else b""))
        paths.append(path)
    return paths, len(lines) + 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_record_corpus_counts_every_reason(tmp_path, num_workers, caplog):
    paths, num_bad = write_bad_corpus(tmp_path / "bad")
    assert len(BAD_LINES) >= 12
    dm = datamodule(tmp_path / "bad", num_workers=num_workers, max_length=64, min_supervised_tokens=3)
    with caplog.at_level(logging.INFO, logger="dspark_lightning.data.datamodule"):
        batches = list(dm.train_dataloader())
    expected = {reason: len(lines) for reason, lines in BAD_LINES.items()}
    expected["invalid_json"] += 1  # the invalid UTF-8 line
    assert dm.bad_record_counts("train") == expected
    stats = dm.data_stats("train")
    num_good = stats["records"] - num_bad
    assert stats["documents"] == num_good == len(markers_in(batches, dm.tokenizer)) and num_good > 20
    assert any("skipped" in r.message and "no_anchor_room" in r.message for r in caplog.records)


def test_raise_mode_names_file_and_line(tmp_path):
    paths, _ = write_bad_corpus(tmp_path / "bad")
    dm = datamodule(paths[0], shuffle_buffer=0, on_bad_record="raise", max_length=64, min_supervised_tokens=3)
    with pytest.raises(BadRecordError, match=r"bad-0\.jsonl:2: bad record \(invalid_json\)"):
        list(dm.train_dataloader())
    second = tmp_path / "second.jsonl"
    second.write_text(json.dumps(conversation(5)) + "\n" + BAD_LINES["unknown_role"][0] + "\n")
    with pytest.raises(BadRecordError, match=r"second\.jsonl:2: bad record \(unknown_role\)"):
        list(datamodule(second, on_bad_record="raise", num_workers=1).train_dataloader())


def test_non_json_file_error_names_file_and_line_even_from_a_worker(tmp_path):
    write_corpus(tmp_path / "data", 1, 3)
    (tmp_path / "data" / "zz.json").write_text("\n# not json\n")
    for workers in (0, 1):
        with pytest.raises(NotJSONError, match=r"zz\.json:2: not a JSON"):
            list(datamodule(tmp_path / "data", num_workers=workers).train_dataloader())


def test_eval_prompts_linked_properties_and_validation_limit(tmp_path):
    write_corpus(tmp_path / "data", 2, 10)
    dm = datamodule(tmp_path / "data", num_eval_prompts=5, limit_val_samples=7)
    tokenizer = dm.tokenizer
    assert (dm.vocab_size, dm.pad_token_id) == (len(tokenizer), tokenizer.pad_token_id)
    assert dm.mask_token_id == tokenizer.convert_tokens_to_ids("<|mask|>")
    prompts = dm.eval_prompts()
    assert len(prompts) == 5
    for k, prompt in enumerate(prompts):
        text = tokenizer.decode(prompt)
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n") and f"record-{k:03d}" in text
        assert "number" not in text  # stops before the first reply
    assert sorted(markers_in(dm.val_dataloader(), tokenizer)) == list(range(7))
    assert datamodule(tmp_path / "data", mask_token="<|endoftext|>").mask_token_id == tokenizer.pad_token_id
    with pytest.raises(ValueError, match="mask"):
        _ = datamodule(tmp_path / "data", mask_token="<|no such token|>").mask_token_id


def test_hub_dataset_ids_stream_through_load_dataset(tmp_path, monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, split=None, streaming=False):
        calls.append((path, name, split, streaming))
        rows = [{"id": f"h{k}", **{k2: v for k2, v in conversation(k).items() if k2 != "id"}} for k in range(6)]
        rows.append({"conversations": []})
        return IterableDataset.from_generator(lambda: iter(rows))

    monkeypatch.setattr("dspark_lightning.data.stream.load_dataset", fake_load_dataset)
    dm = ShareGPTDataModule(DEMO_TARGET, "someone/chats", "someone/chats:cfg:test", seq_len=128, block_size=4)
    assert sorted(markers_in(dm.train_dataloader(), dm.tokenizer)) == list(range(6))
    assert dm.bad_record_counts("train") == {"empty_conversations": 1}
    assert len(dm.eval_prompts()) == 6
    assert calls[0] == ("someone/chats", None, "train", True) and calls[-1] == ("someone/chats", "cfg", "test", True)


def test_shipped_demo_data_streams_without_bad_records():
    dm = ShareGPTDataModule(
        DEMO_TARGET,
        str(ASSETS / "data/sharegpt/train-*.jsonl"),
        str(ASSETS / "data/sharegpt/validation-*.jsonl"),
        seq_len=512,
    )
    assert sum(len(b["input_ids"]) for b in dm.val_dataloader()) > 0
    stats = dm.data_stats("validation")
    assert stats["records"] == stats["documents"] == 480 and dm.bad_record_counts("validation") == {}
    assert len(dm.eval_prompts()) == 8


class RecordingModule(L.LightningModule):
    """Consumes batches and remembers which records each epoch saw (no learning)."""

    def __init__(self, tokenizer):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.tokenizer = tokenizer
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_index):
        self.seen.setdefault(self.current_epoch, []).extend(markers_in([batch], self.tokenizer))
        return self.layer(batch["input_ids"][:, :1].float()).sum() * 0.0

    def validation_step(self, batch, batch_index):
        assert batch["input_ids"].shape[1] == 64

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_lightning_fit_reshuffles_by_trainer_epoch_and_logs_counts(tmp_path, caplog):
    write_corpus(tmp_path / "data", 2, 8)
    with (tmp_path / "data" / "part-01.jsonl").open("a") as part:
        part.write('{"conversations": []}\n')
    dm = datamodule(tmp_path / "data", seq_len=64, batch_size=2, num_workers=1)
    module = RecordingModule(dm.tokenizer)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with caplog.at_level(logging.INFO, logger="dspark_lightning.data.datamodule"):
        trainer.fit(module, datamodule=dm)
    assert sorted(module.seen[0]) == sorted(module.seen[1]) == list(range(16)) and module.seen[0] != module.seen[1]
    assert dm.bad_record_counts("train") == dm.bad_record_counts("validation") == {"empty_conversations": 1}
    passes = [r.message.split(" data pass")[0] for r in caplog.records if "data pass" in r.message]
    assert passes.count("train") == 2 and passes.count("validation") == 2


def test_split_by_id_carves_disjoint_splits_out_of_one_source(tmp_path):
    from dspark_lightning.data.sharegpt import IdSplit

    records = write_corpus(tmp_path / "corpus", num_files=2, per_file=30)
    fractions = {"validation": 0.25, "test": 0.25}
    dm = ShareGPTDataModule(
        DEMO_TARGET, str(tmp_path / "corpus"), seq_len=128, batch_size=4, block_size=4, split_by_id=fractions
    )
    seen = {
        "train": sorted(markers_in(dm.train_dataloader(), dm.tokenizer)),
        "validation": sorted(markers_in(dm.val_dataloader(), dm.tokenizer)),
        "test": sorted(markers_in(dm.test_dataloader(), dm.tokenizer)),
    }
    expected = {name: [k for k in records if IdSplit(**fractions).split_of(f"r{k}") == name] for name in seen}
    assert seen == expected and all(seen.values())  # each split exactly its own ids, none empty
    assert dm.data_stats("validation")["other_split_records"] == len(records) - len(seen["validation"])
    assert dm.bad_record_counts("train") == {}  # held-out records are not bad records
    users = [next(m["content"] for m in c.messages if m["role"] == "user") for c in dm.eval_conversations()]
    prompt_ids = {int(MARKER.search(text).group(1)) for text in users}
    assert prompt_ids <= set(seen["validation"])
    with pytest.raises(ValueError, match="split_by_id"):
        ShareGPTDataModule(DEMO_TARGET, str(tmp_path / "corpus"), split_by_id={"valid": 0.1})
