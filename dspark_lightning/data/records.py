"""Records out of local JSON files, streamed one at a time with their file and line.

Layouts, syntax errors and cut-off files: docs/design/data.md §1.2; the bad-record reasons: §2."""

from __future__ import annotations

import codecs
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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
    """Stream the records of one local file (layout sniffed, docs/design/data.md §1.2); at most ``max_records``."""
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
