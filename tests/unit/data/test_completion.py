"""Completion records (base models): the completion-only mask against independent tokenisations, record validation,
the data format choice (never an invented chat template), and the data module streaming completion records."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from helpers.base_targets import BOS_TOKEN, base_model_copy
from helpers.paths import ASSETS, DEMO_TARGET
from transformers import AutoTokenizer

from dspark_lightning.data.completion import CompletionEncoder, validate_completion_record
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.data.formats import resolve_format
from dspark_lightning.data.preflight import NoUsableRecordsError
from dspark_lightning.data.sharegpt import BadRecordError, DataFormatError, InvalidRecord, validate_record
from dspark_lightning.data.tokenize import ConversationEncoder

MARKER = re.compile(r"record-(\d+)")
PAIRS = [
    ("What does `json.dumps` do?\n", "It serialises an object to a JSON formatted string."),
    ('def add(a, b):\n    """Return a + b."""\n', "    return a + b\n"),
    ("", "A text with no prompt at all: every token of it is supervised."),
    ("Once upon a time", " there was a tokenizer."),
]


@pytest.fixture(scope="module")
def base_tokenizers(tmp_path_factory):
    """The demo tokenizer without its chat template, with and without a BOS before plain text."""
    root = tmp_path_factory.mktemp("base")
    plain = base_model_copy(root / "plain", weights=False)
    bos = base_model_copy(root / "bos", weights=False, bos=True)
    return {False: (plain, AutoTokenizer.from_pretrained(plain)), True: (bos, AutoTokenizer.from_pretrained(bos))}


# ------------------------------------------------------------------------------------------ tokenisation and mask
@pytest.mark.parametrize("bos", [False, True])
@pytest.mark.parametrize("prompt, completion", PAIRS)
def test_completion_tokens_and_only_they_are_supervised(base_tokenizers, bos, prompt, completion):
    _, tokenizer = base_tokenizers[bos]
    document = CompletionEncoder(tokenizer).encode(prompt, completion)
    prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]  # the prompt as generation tokenises it
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    assert document.input_ids == prompt_ids + completion_ids
    assert document.loss_mask == [False] * len(prompt_ids) + [True] * len(completion_ids)
    assert (prompt_ids[:1] == [tokenizer.convert_tokens_to_ids(BOS_TOKEN)]) == bos  # BOS where the tokenizer adds one
    assert tokenizer.decode(document.input_ids, skip_special_tokens=True) == prompt + completion
    full = tokenizer(prompt + completion, add_special_tokens=True)["input_ids"]  # the whole text, independently
    if prompt.endswith('"""\n'):  # "\n" | "    return" as generated; the whole text merges "\n   " | " return"
        assert full != document.input_ids and full[: len(prompt_ids) - 1] == prompt_ids[:-1]
    else:  # the other prompts end where a token of the whole text ends
        assert full == document.input_ids


def test_the_completion_is_tokenised_as_a_continuation_of_the_prompt(base_tokenizers):
    """A word split at the seam stays split, as when the target continues the prompt token by token."""
    _, tokenizer = base_tokenizers[True]
    prompt, completion = "def comp", "ute(x):\n    return x"
    document = CompletionEncoder(tokenizer).encode(prompt, completion)
    supervised = [i for i, m in zip(document.input_ids, document.loss_mask) if m]
    assert supervised == tokenizer(completion, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(supervised) == completion
    assert tokenizer.decode([i for i, m in zip(document.input_ids, document.loss_mask) if not m]) == BOS_TOKEN + prompt


def test_a_tokenizer_that_spaces_every_text_falls_back_to_the_whole_text():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "<s>", "\u2581Hello", "\u2581world", "\u2581is", "\u2581there"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    encoder = CompletionEncoder(tokenizer)
    apart = encoder.encode("Hello", " world is there")  # the pieces spell the text: kept apart
    assert apart.input_ids == [2, 3, 4, 5] and apart.loss_mask == [False, True, True, True]
    whole = encoder.encode("Hello is", "there")  # apart: "Hello is there", but the text is "Hello isthere"
    assert whole.input_ids == tokenizer("Hello isthere")["input_ids"] == [2, 0]
    assert whole.loss_mask == [False, True]  # "isthere" (an unknown word) overlaps the completion


def test_truncation_and_supervision_rules_apply_to_completion_tokens(base_tokenizers):
    _, tokenizer = base_tokenizers[False]
    encoder = CompletionEncoder(tokenizer, max_length=16, min_supervised_tokens=3, block_size=4)
    with pytest.raises(InvalidRecord, match="over_max_length.*completion token"):
        encoder.encode("word " * 40, "a continuation that never fits")
    with pytest.raises(InvalidRecord, match="too_few_supervised_tokens"):
        encoder.encode("Say it:\n", "ok")
    with pytest.raises(InvalidRecord, match="no_anchor_room"):
        encoder.encode("Say it:\n", "yes it is")  # 3 supervised tokens, all in the last 4
    kept = encoder.encode("Q:\n", "a continuation longer than the sixteen tokens the encoder keeps " * 2)
    head = len(tokenizer("Q:\n")["input_ids"])
    assert kept.truncated and len(kept) == 16 and kept.loss_mask == [False] * head + [True] * (16 - head)


# --------------------------------------------------------------------------------------------- record validation
@pytest.mark.parametrize(
    "record, reason",
    [
        ([1, 2], "not_a_dict"),
        ({"conversations": [{"from": "human", "value": "q"}]}, "format_mismatch"),
        ({"completion": "x"}, "missing_prompt"),
        ({"prompt": "x"}, "missing_completion"),
        ({"prompt": 3, "completion": "x"}, "non_string_content"),
        ({"prompt": "x", "completion": None}, "non_string_content"),
        ({"prompt": "x", "completion": " \n"}, "empty_content"),
    ],
)
def test_bad_completion_records_have_named_reasons(record, reason):
    with pytest.raises(InvalidRecord) as info:
        validate_completion_record(record)
    assert info.value.reason == reason


def test_empty_prompt_is_allowed_and_a_completion_record_is_no_conversation():
    assert validate_completion_record({"prompt": "", "completion": "text"}) == ("", "text")
    with pytest.raises(InvalidRecord) as info:
        validate_record({"id": 1, "prompt": "q", "completion": "a"})
    assert info.value.reason == "format_mismatch"


# ------------------------------------------------------------------------------------------------- format choice
def test_format_choice_never_invents_a_chat_template(base_tokenizers):
    _, base = base_tokenizers[False]
    chat = AutoTokenizer.from_pretrained(DEMO_TARGET)
    assert base.chat_template is None and chat.chat_template
    choose = lambda requested, tokenizer, kind: resolve_format(requested, tokenizer, "tok", kind, "f.jsonl:3")  # noqa: E731
    assert choose("auto", base, "completion").format == "completion"
    assert choose("auto", chat, "completion").format == "completion"
    assert choose("auto", chat, "chat").format == "chat"
    assert choose("completion", chat, None).format == "completion"
    assert choose("auto", chat, None).format == "chat" and choose("auto", base, None).format == "completion"
    with pytest.raises(DataFormatError) as info:
        choose("auto", base, "chat")
    message = str(info.value)
    for expected in ("f.jsonl:3 is a conversation record", "no chat template", "never invented", "data.format: completion",
                     "regenerate --format completion"):  # fmt: skip
        assert expected in message, message
    with pytest.raises(DataFormatError, match="data.format=chat, but the tokenizer 'tok' has no chat template"):
        choose("chat", base, None)
    with pytest.raises(
        DataFormatError, match=r"data.format=completion, but f.jsonl:3 is a conversation.*set data.format: chat"
    ):
        choose("completion", chat, "chat")
    with pytest.raises(DataFormatError, match="data.format must be one of auto, chat, completion"):
        choose("plain", chat, None)
    with pytest.raises(DataFormatError, match="never invented"):
        ConversationEncoder(base)  # the backstop below the choice


def test_conversations_for_a_tokenizer_without_template_are_refused_before_any_batch(base_tokenizers):
    path, _ = base_tokenizers[False]
    train = str(ASSETS / "data/sharegpt/train-00000.jsonl")
    dm = ShareGPTDataModule(str(path), train, train, seq_len=128, block_size=4)
    with pytest.raises(DataFormatError, match=r"train-00000\.jsonl:1 is a conversation record"):
        dm.setup("fit")
    with pytest.raises(DataFormatError, match="never invented"):
        next(iter(ShareGPTDataModule(str(path), train, seq_len=128).train_dataloader()))
    explicit = ShareGPTDataModule(str(path), train, seq_len=128, format="chat")
    with pytest.raises(DataFormatError, match="data.format=chat"):
        explicit.setup("fit")


# --------------------------------------------------------------------------------------------------- data module
def completion_record(k: int) -> dict:
    return {
        "id": f"c{k}",
        "prompt": f"Question record-{k:03d}: what is {k} plus {k}?\n",
        "completion": f"The answer is {2 * k}, and that is all there is to record-{k:03d}.",
    }


BAD_COMPLETION_LINES = {
    "format_mismatch": [
        json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})
    ],
    "missing_completion": ['{"prompt": "only a prompt"}'],
    "empty_content": ['{"prompt": "p", "completion": "   "}'],
    "invalid_json": ['{"prompt": '],
}


def write_completions(directory: Path, count: int, bad: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(completion_record(k)) for k in range(count)]
    if bad:
        for i, line in enumerate(line for lines_ in BAD_COMPLETION_LINES.values() for line in lines_):
            lines.insert(2 + 3 * i, line)
    path = directory / "completions.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("bos", [False, True])
def test_data_module_packs_completion_records_with_their_masks(tmp_path, base_tokenizers, bos, caplog):
    path, tokenizer = base_tokenizers[bos]
    data = write_completions(tmp_path / "data", 12, bad=True)
    dm = ShareGPTDataModule(str(path), str(data), str(data), seq_len=96, batch_size=2, shuffle_buffer=4, block_size=4)
    with caplog.at_level(logging.INFO, logger="dspark_lightning.data.formats"):
        dm.setup("fit")
    assert dm.data_format.format == "completion" and dm.data_format.requested == "auto"
    assert dm.hparams["format"] == "completion"  # checkpoints carry the resolved format
    assert any("data format completion" in r.message and "no chat template" in r.message for r in caplog.records)
    seen = []
    for batch in dm.train_dataloader():
        assert batch["input_ids"].shape == batch["loss_mask"].shape == (batch["input_ids"].shape[0], 96)
        for ids, mask, docs, positions in zip(batch["input_ids"], batch["loss_mask"], batch["document_ids"],
                                              batch["position_ids"]):  # fmt: skip
            for d in range(int(docs.max()) + 1):
                doc_ids, doc_mask = ids[docs == d].tolist(), mask[docs == d].tolist()
                assert positions[docs == d].tolist() == list(range(len(doc_ids)))
                (k,) = {int(m) for m in MARKER.findall(tokenizer.decode(doc_ids))}
                record = completion_record(k)
                prompt_ids = tokenizer(record["prompt"])["input_ids"]
                assert doc_ids == tokenizer(record["prompt"] + record["completion"])["input_ids"]
                assert doc_mask == [False] * len(prompt_ids) + [True] * (len(doc_ids) - len(prompt_ids))
                seen.append(k)
        assert not batch["loss_mask"][batch["document_ids"] < 0].any()
    assert sorted(seen) == list(range(12))
    assert dm.bad_record_counts("train") == {reason: len(lines) for reason, lines in BAD_COMPLETION_LINES.items()}
    prompts = dm.eval_prompts()
    assert prompts == [tokenizer(completion_record(k)["prompt"])["input_ids"] for k in range(len(prompts))]
    assert len(prompts) == 8 and [c.record_id for c in dm.eval_conversations()[:2]] == ["c0", "c1"]


def test_completion_bad_records_are_named_with_file_and_line(tmp_path, base_tokenizers):
    path, _ = base_tokenizers[False]
    data = write_completions(tmp_path / "data", 6, bad=True)
    dm = ShareGPTDataModule(str(path), str(data), seq_len=96, shuffle_buffer=0, block_size=4, on_bad_record="raise")
    with pytest.raises(BadRecordError, match=r"completions\.jsonl:3: bad record \(format_mismatch\)"):
        list(dm.train_dataloader())
    conversations = tmp_path / "chats.jsonl"
    conversations.write_text((ASSETS / "data/sharegpt/validation-00000.jsonl").read_text())
    mixed = ShareGPTDataModule(str(path), str(data), str(conversations), seq_len=96, block_size=4)
    with pytest.raises(NoUsableRecordsError, match=r"(?s)data.val_files: .*usable completion record \(data.format: completion\).*chats\.jsonl: "
                       r"format_mismatch x32 \(first at line 1\)"):  # fmt: skip
        mixed.setup("fit")
