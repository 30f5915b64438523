"""Assistant masks (template markers and the fallback), truncation rules and packing boundaries."""

from __future__ import annotations

import pytest
import torch
from helpers.paths import DEMO_TARGET
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from dspark_lightning.data.sharegpt import InvalidRecord
from dspark_lightning.data.tokenize import (
    ConversationEncoder,
    SequencePacker,
    TokenizedConversation,
    build_packed_row,
    has_generation_markers,
)

TEMPLATE_WITH_MARKERS = (
    "{%- for m in messages %}{%- if m['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{%- generation %}{{- m['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TEMPLATE_WITHOUT_MARKERS = TEMPLATE_WITH_MARKERS.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")

THREE_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello there"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Goodbye"},
]

# Hand-written expectation: (token, supervised?) for THREE_TURNS under a whitespace word-level tokenizer.
EXPECTED_TOKENS_AND_MASK = [
    ("<|im_start|>", 0), ("system", 0), ("Be", 0), ("brief.", 0), ("<|im_end|>", 0),
    ("<|im_start|>", 0), ("user", 0), ("Hi", 0), ("<|im_end|>", 0),
    ("<|im_start|>", 0), ("assistant", 0), ("Hello", 1), ("there", 1), ("<|im_end|>", 1),
    ("<|im_start|>", 0), ("user", 0), ("Bye", 0), ("<|im_end|>", 0),
    ("<|im_start|>", 0), ("assistant", 0), ("Goodbye", 1), ("<|im_end|>", 1),
]  # fmt: skip


def word_tokenizer(chat_template: str) -> PreTrainedTokenizerFast:
    words = ["<|im_start|>", "<|im_end|>", "<pad>", "[UNK]", "system", "user", "assistant", "Be", "brief.", "Hi"]
    words += ["Hello", "there", "Bye", "Goodbye"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="[UNK]",
        extra_special_tokens=["<|im_start|>"],
        chat_template=chat_template,
    )


@pytest.mark.parametrize("template", [TEMPLATE_WITH_MARKERS, TEMPLATE_WITHOUT_MARKERS], ids=["markers", "fallback"])
def test_three_turn_assistant_mask_token_by_token(template):
    tokenizer = word_tokenizer(template)
    encoder = ConversationEncoder(tokenizer, block_size=0)
    assert encoder.uses_generation_markers == (template is TEMPLATE_WITH_MARKERS)
    encoded = encoder.encode(THREE_TURNS)
    tokens = tokenizer.convert_ids_to_tokens(encoded.input_ids)
    assert list(zip(tokens, map(int, encoded.loss_mask))) == EXPECTED_TOKENS_AND_MASK


def test_shipped_tokenizer_mask_matches_piecewise_encoding():
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TARGET)
    pieces = [
        ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", False),
        ("Hello there<|im_end|>", True),
        ("\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", False),
        ("Goodbye<|im_end|>", True),
        ("\n", False),
    ]
    expected_ids, expected_mask = [], []
    for text, supervised in pieces:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        expected_ids += ids
        expected_mask += [supervised] * len(ids)
    encoded = ConversationEncoder(tokenizer, block_size=0).encode(THREE_TURNS)
    assert encoded.input_ids == expected_ids
    assert encoded.loss_mask == expected_mask
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids)[-2:] == ["<|im_end|>", "Ċ"]


def test_fallback_finds_replies_in_order_even_when_quoted_earlier():
    tokenizer = word_tokenizer(TEMPLATE_WITHOUT_MARKERS)
    messages = [
        {"role": "user", "content": "Hello there"},  # same words as the reply: must not be marked
        {"role": "assistant", "content": "Hello there"},
    ]
    encoded = ConversationEncoder(tokenizer, block_size=0).encode(messages)
    tokens = tokenizer.convert_ids_to_tokens(encoded.input_ids)
    marked = [t for t, m in zip(tokens, encoded.loss_mask) if m]
    assert marked == ["Hello", "there", "<|im_end|>"]
    assert encoded.loss_mask.index(True) == tokens.index("assistant") + 1


def test_generation_marker_detection():
    assert has_generation_markers(TEMPLATE_WITH_MARKERS)
    assert has_generation_markers("{% generation %}x{% endgeneration %}")
    assert not has_generation_markers(TEMPLATE_WITHOUT_MARKERS)
    assert not has_generation_markers(None)


def test_truncation_and_supervision_rules():
    tokenizer = word_tokenizer(TEMPLATE_WITH_MARKERS)
    full = ConversationEncoder(tokenizer, block_size=0).encode(THREE_TURNS)
    assert len(full) == 22 and not full.truncated
    cut = ConversationEncoder(tokenizer, max_length=13, block_size=0).encode(THREE_TURNS)
    assert cut.truncated and len(cut) == 13 and cut.loss_mask[-2:] == [True, True]
    assert ConversationEncoder(tokenizer, block_size=0).encode(THREE_TURNS, max_length=12).truncated
    with pytest.raises(InvalidRecord) as info:
        ConversationEncoder(tokenizer, max_length=11, block_size=0).encode(THREE_TURNS)
    assert info.value.reason == "over_max_length"
    with pytest.raises(InvalidRecord) as info:
        ConversationEncoder(tokenizer, min_supervised_tokens=6, block_size=0).encode(THREE_TURNS)
    assert info.value.reason == "too_few_supervised_tokens"
    # first supervised token is at index 11 of 22: a block of 10 fits after it, a block of 11 does not
    ConversationEncoder(tokenizer, block_size=10).encode(THREE_TURNS)
    with pytest.raises(InvalidRecord) as info:
        ConversationEncoder(tokenizer, block_size=11).encode(THREE_TURNS)
    assert info.value.reason == "no_anchor_room"


def test_template_exception_is_a_bad_record():
    template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InvalidRecord) as info:
        ConversationEncoder(word_tokenizer(template), block_size=0).encode(THREE_TURNS)
    assert info.value.reason == "chat_template_error" and "roles must alternate" in info.value.detail


def doc(length: int, supervised_from: int, first_id: int) -> TokenizedConversation:
    return TokenizedConversation(
        list(range(first_id, first_id + length)), [i >= supervised_from for i in range(length)]
    )


def test_packed_row_boundaries():
    row = build_packed_row([doc(3, 1, 100), doc(4, 2, 200)], seq_len=10, pad_token_id=0)
    assert row["input_ids"].tolist() == [100, 101, 102, 200, 201, 202, 203, 0, 0, 0]
    assert row["document_ids"].tolist() == [0, 0, 0, 1, 1, 1, 1, -1, -1, -1]
    assert row["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 0, 0]
    assert row["loss_mask"].tolist() == [False, True, True, False, False, True, True, False, False, False]
    assert {k: v.dtype for k, v in row.items()} == {
        "input_ids": torch.long,
        "loss_mask": torch.bool,
        "document_ids": torch.long,
        "position_ids": torch.long,
    }


def test_packer_first_fit_never_exceeds_budget_and_keeps_every_document():
    packer = SequencePacker(seq_len=8, pad_token_id=0, open_rows=2)
    lengths = [5, 6, 3, 2, 8, 1, 7, 4]
    rows = []
    for i, length in enumerate(lengths):
        rows += packer.add(doc(length, 0, 10 * i))
    rows += packer.flush()
    assert all(r["input_ids"].shape == (8,) for r in rows)
    seen = []
    for r in rows:
        ids, docs = r["input_ids"], r["document_ids"]
        assert (r["loss_mask"][docs < 0] == 0).all() and (ids[docs < 0] == 0).all()
        for d in range(int(docs.max()) + 1):
            part = ids[docs == d].tolist()
            assert r["position_ids"][docs == d].tolist() == list(range(len(part)))
            seen.append(part)
    assert sorted(seen) == sorted(list(range(10 * i, 10 * i + n)) for i, n in enumerate(lengths))
    assert len(rows) == 5  # 36 tokens: [5+3], [6+2], [8], [1+7], [4]
    with pytest.raises(ValueError):
        packer.add(doc(9, 0, 0))
