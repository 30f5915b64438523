"""Completion records: a plain-text prompt and its continuation, for targets without a chat template (base models).

The record and how it is tokenised (as generation sees it): docs/design/data.md §1.5, §3.1."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dspark_lightning.data.records import RawRecord
from dspark_lightning.data.sharegpt import InvalidRecord
from dspark_lightning.data.splits import record_id
from dspark_lightning.data.tokenize import TokenizedConversation, finish_document, mask_from_spans

CONVERSATION_KEYS = ("conversations", "messages")
COMPLETION_KEYS = ("prompt", "completion")
# A conversation's first user turn as a plain-text prompt (regenerate --format completion, the completion form of the
# sharegpt_heldout eval set): its content and one newline, so a continuation starts on a line of its own.
FIRST_TURN_FORMAT = "{content}\n"


def first_turn_prompt(messages: Sequence[dict[str, str]]) -> str | None:
    """The first user turn as plain text (:data:`FIRST_TURN_FORMAT`); None without a user turn."""
    first = next((m["content"] for m in messages if m["role"] == "user"), None)
    return None if first is None else FIRST_TURN_FORMAT.format(content=first)


def record_kind(record: Any) -> str | None:
    """``"chat"`` for a conversation record, ``"completion"`` for a completion record, None for anything else."""
    if not isinstance(record, dict):
        return None
    if any(key in record for key in CONVERSATION_KEYS):
        return "chat"
    if any(key in record for key in COMPLETION_KEYS):
        return "completion"
    return None


@dataclass(frozen=True)
class Completion:
    """A validated completion record: the prompt (possibly empty) and its non-blank continuation."""

    prompt: str
    completion: str
    record_id: str | None = None
    source: str = ""
    line: int | None = None


def validate_completion_record(record: Any) -> tuple[str, str]:
    """``(prompt, completion)`` of a record, or :class:`InvalidRecord` with the reason it is unusable."""
    if not isinstance(record, dict):
        raise InvalidRecord("not_a_dict", f"got {type(record).__name__}")
    if record_kind(record) == "chat":
        raise InvalidRecord("format_mismatch", "a conversation record where completion records (prompt / completion) "
                            "are read")  # fmt: skip
    for key, reason in (("prompt", "missing_prompt"), ("completion", "missing_completion")):
        if key not in record:
            raise InvalidRecord(reason, f"keys: {sorted(record)[:8]}")
        if not isinstance(record[key], str):
            raise InvalidRecord("non_string_content", f"'{key}' is {type(record[key]).__name__}")
    if not record["completion"].strip():
        raise InvalidRecord("empty_content", "'completion' is empty or only whitespace")
    return record["prompt"], record["completion"]


def completion_id(raw_record: Any, prompt: str, completion: str) -> str:
    """The record's own id, else a stable hash of its prompt and completion."""
    own = record_id(raw_record)
    if own is not None:
        return own
    digest = hashlib.sha1(json.dumps([prompt, completion], ensure_ascii=False).encode()).hexdigest()
    return f"sha1-{digest[:20]}"


def to_completion(raw: RawRecord) -> Completion:
    """Validate one raw record (including JSON Lines decode failures) into a :class:`Completion`."""
    if raw.reason is not None or raw.truncated:
        raise InvalidRecord(raw.reason or "truncated_tail", raw.json_error or "")
    if raw.json_error is not None:
        raise InvalidRecord("invalid_json", raw.json_error)
    prompt, completion = validate_completion_record(raw.record)
    return Completion(prompt, completion, completion_id(raw.record, prompt, completion), raw.source, raw.line)


class CompletionEncoder:
    """Tokenise, mask and truncate completion records with one tokenizer (docs/design/data.md §3.1)."""

    format = "completion"

    def __init__(
        self, tokenizer: Any, max_length: int | None = None, min_supervised_tokens: int = 1, block_size: int = 0
    ):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.min_supervised_tokens = min_supervised_tokens
        self.block_size = block_size

    @staticmethod
    def parse(raw: RawRecord) -> Completion:
        return to_completion(raw)

    def ids_and_mask(self, prompt: str, completion: str) -> tuple[list[int], list[bool]]:
        """Token ids of the prompt then the completion and the mask of the completion's tokens (docs/design/data.md §3.1):
        tokenised apart when that spells the text exactly, else the whole text with the overlap mask."""
        prompt_ids = self.prompt_ids(prompt)
        completion_ids = list(self.tokenizer(completion, add_special_tokens=False)["input_ids"])
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        if decode(prompt_ids + completion_ids) == decode(prompt_ids) + completion:
            return prompt_ids + completion_ids, [False] * len(prompt_ids) + [True] * len(completion_ids)
        text = prompt + completion  # e.g. a tokenizer that puts a space before every text it is given
        encoded = self.tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
        return list(encoded["input_ids"]), mask_from_spans(encoded["offset_mapping"], [(len(prompt), len(text))])

    def encode(self, prompt: str, completion: str, max_length: int | None = None) -> TokenizedConversation:
        """Token ids and completion mask, truncated to ``min(self.max_length, max_length)``; raises InvalidRecord."""
        input_ids, loss_mask = self.ids_and_mask(prompt, completion)
        return finish_document(
            input_ids, loss_mask, (self.max_length, max_length), self.min_supervised_tokens, self.block_size,
            supervised_name="completion",
        )  # fmt: skip

    def encode_example(self, example: Completion, max_length: int | None = None) -> TokenizedConversation:
        return self.encode(example.prompt, example.completion, max_length)

    def prompt_ids(self, prompt: str) -> list[int]:
        """Ids of the prompt alone, as plain text with the tokenizer's special tokens (the input a continuation of
        it is generated from)."""
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def example_prompt_ids(self, example: Completion) -> list[int] | None:
        """The prompt ids of an example for measured decoding; None for a blank prompt (nothing to continue)."""
        return self.prompt_ids(example.prompt) if example.prompt.strip() else None

    def example_reference(self, example: Completion) -> TokenizedConversation:
        """The prompt and its completion, tokenised and masked as in training (untruncated)."""
        return self.encode(example.prompt, example.completion)
