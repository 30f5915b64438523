"""Local data files before any record is parsed: bounded line reading, layout and encoding sniffing, the setup check.

Design: docs/design/data.md §1.2."""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from dspark_lightning.errors import UserError

logger = logging.getLogger(__name__)

DEFAULT_MAX_RECORD_BYTES = 16 << 20  # 16 MiB: far above any real conversation, far below a memory problem
SNIFF_LINES = 20
SNIFF_BYTES = 1 << 18  # stop sampling lines after 256 KiB (at least one line is always sampled)
UTF8_BOM = b"\xef\xbb\xbf"
_WIDE_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16",
    b"\xfe\xff": "UTF-16",
}
_DRAIN_BYTES = 1 << 20


class NotJSONError(UserError, ValueError):
    """A local data file that is not JSON (or has an unrecoverable syntax error), with file and line.

    ``NotJSONError(message)`` also works, because DataLoader workers re-raise exceptions as ``type(error)(message)``.
    """

    def __init__(self, file: str, line: int | None = None, detail: str = ""):
        if line is not None:
            message = f"{file}:{line}: not a JSON / JSON Lines conversation file: {detail}"
        else:
            message = f"{file}: not a JSON / JSON Lines conversation file: {detail}" if detail else file
        super().__init__(message)
        self.file, self.line, self.detail = file, line, detail


class TruncatedJSONError(NotJSONError):
    """The file ends inside a JSON value (or before the array's closing bracket): everything before it is kept."""


class RecordTooLargeError(NotJSONError):
    """A record over ``max_record_bytes`` inside a JSON array / values file, where it cannot be skipped."""


def open_binary(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")  # noqa: SIM115


def read_bounded_lines(handle: IO[bytes], max_bytes: int) -> Iterator[tuple[int, bytes, int]]:
    """``(line number, bytes, size)`` per line; ``size`` excludes the newline. A line with ``size > max_bytes`` is
    drained without being kept: ``bytes`` then holds only its first 256 bytes (for sniffing)."""
    number = 0
    while True:
        line = handle.readline(max_bytes + 1)
        if not line:
            return
        number += 1
        if line.endswith(b"\n") or len(line) <= max_bytes:
            yield number, line, len(line.rstrip(b"\r\n"))
            continue
        head, size = line[:256], len(line)  # enough to sniff the layout; the rest is dropped piece by piece
        line = b""
        while not line.endswith(b"\n"):
            line = handle.readline(_DRAIN_BYTES)
            if not line:
                break
            size += len(line)
        yield number, head, size - line.endswith(b"\n")


@dataclass(frozen=True)
class FileLayout:
    """What sniffing found: ``layout`` is ``jsonl``, ``array``, ``values`` or ``empty``; ``bom``: a UTF-8 BOM."""

    path: str
    layout: str
    bom: bool = False


def skip_bom(handle: IO[bytes], path: str) -> bool:
    """Consume a UTF-8 byte-order mark if there is one (True); a UTF-16/32 one is an error."""
    head = handle.read(4)
    for mark, name in _WIDE_BOMS.items():
        if head.startswith(mark):
            raise NotJSONError(path, 1, f"{name} encoded (byte-order mark {mark.hex(' ')}); convert it to UTF-8")
    bom = head.startswith(UTF8_BOM)
    handle.seek(len(UTF8_BOM) if bom else 0)
    return bom


def sniff_file(path: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> FileLayout:
    """Open ``path`` and decide its layout and encoding from its first lines (docs/design/data.md §1.2)."""
    try:
        with open_binary(path) as handle:
            bom = skip_bom(handle, path)
            sample: list[tuple[int, bytes, int]] = []
            sampled_bytes = 0
            for number, data, size in read_bounded_lines(handle, max_record_bytes):
                if data.strip():
                    sample.append((number, data, size))
                    sampled_bytes += len(data)
                if len(sample) >= SNIFF_LINES or sampled_bytes > SNIFF_BYTES:
                    break
    except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError
        raise NotJSONError(path, None, f"cannot be read: {error}") from None
    if not sample:
        return FileLayout(path, "empty", bom)
    number, data, size = sample[0]
    start = data.lstrip()[:1]
    if start not in (b"[", b"{"):
        raise NotJSONError(path, number, f"starts with {data.strip()[:40].decode('utf-8', 'replace')!r}")
    complete = [(n, d) for n, d, s in sample if s <= max_record_bytes]
    for line_number, line in complete[:1] if start == b"[" else complete:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            raise NotJSONError(path, line_number, "not UTF-8 text") from None
    if start == b"[":
        return FileLayout(path, "array", bom)
    objects = sum(s > max_record_bytes and d.lstrip().startswith(b"{") for _, d, s in sample)
    for _, line in complete:
        try:
            objects += isinstance(json.loads(line), dict)
        except json.JSONDecodeError:
            pass
    return FileLayout(path, "jsonl" if 2 * objects >= len(sample) else "values", bom)


def check_data_files(
    files: Sequence[str], option: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> list[FileLayout]:
    """Sniff every file of one split before training; every unreadable file is named in one error."""
    layouts, problems = [], []
    for path in files:
        try:
            layouts.append(sniff_file(path, max_record_bytes))
        except NotJSONError as error:
            problems.append(str(error))
    if problems:
        listed = "\n  ".join(problems)
        raise NotJSONError(f"{option}: {len(problems)} of {len(files)} data file(s) cannot be used:\n  {listed}")
    empty = [layout.path for layout in layouts if layout.layout == "empty"]
    if empty and len(empty) == len(layouts):
        raise NotJSONError(f"{option}: every data file is empty: {', '.join(empty[:8])}")
    if empty:
        logger.warning("%s: %d of %d data file(s) are empty: %s", option, len(empty), len(layouts), empty[:8])
    with_bom = [layout.path for layout in layouts if layout.bom]
    if with_bom:
        logger.info("%s: UTF-8 byte-order mark stripped from %s", option, with_bom[:8])
    return layouts
