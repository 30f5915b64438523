"""Conversation records: validate and normalise them (the sources and the file reading live next door).

Source specs, record shapes and the bad-record reasons: docs/design/data.md §1.1, §1.3, §2."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dspark_lightning.data.records import RawRecord
from dspark_lightning.data.sources import (  # noqa: F401  (re-exported: the source specs are part of this API)
    LOCAL_SUFFIXES,
    PACKAGE_PREFIX,
    DataSource,
    package_path,
    resolve_source,
)
from dspark_lightning.data.splits import IdSplit, conversation_id, record_id  # noqa: F401  (re-exported)
from dspark_lightning.errors import UserError

logger = logging.getLogger(__name__)

BAD_RECORD_REASONS: dict[str, str] = {
    "invalid_json": "a JSON Lines line that is not valid JSON (or not UTF-8)",
    "record_too_large": "a record over max_record_bytes, skipped before it is parsed",
    "unreadable_rest_of_file": "a JSON array / values file broken mid-file (syntax error, oversized record): the rest "
    "of that file is skipped",
    "truncated_tail": "a JSON array / JSON values file cut off at the end: a partial last record or no closing ']'",
    "not_a_dict": "the record is not a JSON object",
    "missing_conversations": "neither 'conversations' nor 'messages' is present",
    "conversations_not_a_list": "'conversations'/'messages' is not a list",
    "empty_conversations": "'conversations'/'messages' is an empty list",
    "turn_not_a_dict": "a turn is not a JSON object",
    "missing_role": "a turn has neither 'from' nor 'role'",
    "unknown_role": "a turn's role is not one of system/human/user/gpt/assistant/chatgpt/bing/bard",
    "misplaced_system_turn": "a system turn that is not the first turn",
    "missing_content": "a turn has neither 'value' nor 'content'",
    "non_string_content": "a turn's content (or a completion record's prompt / completion) is not a string",
    "empty_content": "a turn's content (or a completion record's completion) is empty or only whitespace",
    "no_assistant_turn": "the conversation has no assistant turn",
    "format_mismatch": "a conversation record where data.format is completion, or a completion record where it is chat",
    "missing_prompt": "a completion record without a 'prompt'",
    "missing_completion": "a completion record without a 'completion'",
    "chat_template_error": "the tokenizer's chat template rejected the conversation",
    "over_max_length": "nothing supervised is left after truncation to max_length / seq_len",
    "too_few_supervised_tokens": "fewer supervised (assistant / completion) tokens than min_supervised_tokens",
    "no_anchor_room": "no supervised token leaves room for a full draft block inside the document",
}

# ShareGPT V3 also labels assistant turns by the product that wrote them (chatgpt, bing, bard).
ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
}


class BadRecordError(UserError, ValueError):
    """Raised under ``on_bad_record="raise"``: a record is unusable; says where and why (or just a message)."""

    def __init__(self, reason: str, detail: str | None = None, source: str = "", line: int | None = None):
        if detail is None:
            super().__init__(reason)
        else:
            where = f"{source}:{line}" if line is not None else source
            super().__init__(f"{where}: bad record ({reason}): {detail}")
        self.reason, self.detail, self.source, self.line = reason, detail, source, line


class DataFormatError(UserError, ValueError):
    """The data format (``data.format``) does not fit the records or the tokenizer: chat records for a tokenizer
    without a chat template (none is ever invented), or records of the other format than the one asked for."""


class InvalidRecord(Exception):
    """Internal signal from validation: the record is unusable for ``reason`` (a key of BAD_RECORD_REASONS)."""

    def __init__(self, reason: str, detail: str = ""):
        assert reason in BAD_RECORD_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Conversation:
    """A validated conversation: messages with roles system/user/assistant and non-empty string content."""

    messages: list[dict[str, str]]
    record_id: str | None = None
    source: str = ""
    line: int | None = None


def _turn_field(turn: dict, names: tuple[str, str]) -> tuple[bool, Any]:
    for name in names:
        if name in turn:
            return True, turn[name]
    return False, None


def validate_record(record: Any) -> list[dict[str, str]]:
    """Normalised messages of a record, or :class:`InvalidRecord` with the reason it is unusable."""
    if not isinstance(record, dict):
        raise InvalidRecord("not_a_dict", f"got {type(record).__name__}")
    key = "conversations" if "conversations" in record else "messages" if "messages" in record else None
    if key is None and ("prompt" in record or "completion" in record):
        raise InvalidRecord("format_mismatch", "a completion record (prompt / completion) where conversations are read")
    if key is None:
        raise InvalidRecord("missing_conversations", f"keys: {sorted(record)[:8]}")
    turns = record[key]
    if not isinstance(turns, list):
        raise InvalidRecord("conversations_not_a_list", f"'{key}' is {type(turns).__name__}")
    if not turns:
        raise InvalidRecord("empty_conversations", f"'{key}' is empty")
    messages = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise InvalidRecord("turn_not_a_dict", f"turn {index} is {type(turn).__name__}")
        has_role, role = _turn_field(turn, ("from", "role"))
        if not has_role:
            raise InvalidRecord("missing_role", f"turn {index} keys: {sorted(turn)}")
        normalised_role = ROLE_ALIASES.get(role.strip().lower()) if isinstance(role, str) else None
        if normalised_role is None:
            raise InvalidRecord("unknown_role", f"turn {index} role {role!r}")
        if normalised_role == "system" and index != 0:
            raise InvalidRecord("misplaced_system_turn", f"system turn at position {index}")
        has_content, content = _turn_field(turn, ("value", "content"))
        if not has_content:
            raise InvalidRecord("missing_content", f"turn {index} keys: {sorted(turn)}")
        if not isinstance(content, str):
            raise InvalidRecord("non_string_content", f"turn {index} content is {type(content).__name__}")
        if not content.strip():
            raise InvalidRecord("empty_content", f"turn {index} is empty")
        messages.append({"role": normalised_role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise InvalidRecord("no_assistant_turn", f"roles: {[m['role'] for m in messages]}")
    return messages


def to_conversation(raw: RawRecord) -> Conversation:
    """Validate one raw record (including JSON Lines decode failures) into a :class:`Conversation`."""
    if raw.reason is not None or raw.truncated:
        raise InvalidRecord(raw.reason or "truncated_tail", raw.json_error or "")
    if raw.json_error is not None:
        raise InvalidRecord("invalid_json", raw.json_error)
    messages = validate_record(raw.record)
    return Conversation(messages, conversation_id(raw.record, messages), raw.source, raw.line)


SKIP_EXAMPLES_PER_REASON = 3  # skipped records named with file and line, per reason and process; the rest only counted


@dataclass
class SkipExamples:
    """Names the first few skipped records of each reason (file, line, detail) in the log; counts stay elsewhere."""

    shown: dict[str, int] = field(default_factory=dict)

    def note(self, bad: InvalidRecord, source: str, line: int | None) -> None:
        count = self.shown.get(bad.reason, 0)
        if count >= SKIP_EXAMPLES_PER_REASON:
            return
        self.shown[bad.reason] = count + 1
        where = f"{source}:{line}" if line is not None else source
        more = " (further ones are only counted)" if count + 1 == SKIP_EXAMPLES_PER_REASON else ""
        logger.warning("skipped bad record (%s) at %s: %s%s", bad.reason, where, bad.detail, more)


@dataclass
class BadRecordCounter:
    """Counts of unusable records by reason (plain in-process counter; see the datamodule for cross-process)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str, amount: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + amount

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def iter_conversations(
    raws: Iterator[RawRecord],
    on_bad_record: str = "skip",
    counter: BadRecordCounter | None = None,
    parse: Callable[[RawRecord], Any] | None = None,
) -> Iterator[Conversation]:
    """Validated conversations of a raw stream (or what ``parse`` makes of each record: the completion format's
    ``to_completion``); bad ones are counted (skip, the first few of each reason named in the log) or raised with
    file and line."""
    examples = SkipExamples()
    parse = parse or to_conversation
    for raw in raws:
        try:
            yield parse(raw)
        except InvalidRecord as bad:
            if on_bad_record == "raise":
                raise BadRecordError(bad.reason, bad.detail, raw.source, raw.line) from None
            examples.note(bad, raw.source, raw.line)
            if counter is not None:
                counter.add(bad.reason)
