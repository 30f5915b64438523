"""The data format of a run: ``chat`` or ``completion``, chosen explicitly or by ``auto``, never an invented chat
template.

Design: docs/design/data.md §1.5."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dspark_lightning.data.cache import INDEX_NAME
from dspark_lightning.data.completion import CompletionEncoder, record_kind
from dspark_lightning.data.files import DEFAULT_MAX_RECORD_BYTES, NotJSONError
from dspark_lightning.data.records import RawRecord, iter_file_records
from dspark_lightning.data.sharegpt import DataFormatError
from dspark_lightning.data.sources import DataSource
from dspark_lightning.data.tokenize import ConversationEncoder

logger = logging.getLogger(__name__)

DATA_FORMATS = ("auto", "chat", "completion")
SNIFF_RECORDS = 32  # records looked at for a conversation or a completion record before giving up
COMPLETION_RECORD = '{"prompt": ..., "completion": ...}'


@dataclass(frozen=True)
class FormatChoice:
    """The format a run reads its records in, what was asked for and why."""

    format: str
    requested: str
    reason: str
    tokenizer: str
    chat_template: bool

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def has_chat_template(tokenizer: Any) -> bool:
    return isinstance(getattr(tokenizer, "chat_template", None), str | dict) and bool(tokenizer.chat_template)


def first_record_kind(raws: Iterable[RawRecord]) -> tuple[str | None, str]:
    """``(kind, "file:line")`` of the first record among ``raws`` that is a conversation or a completion record
    (at most :data:`SNIFF_RECORDS` looked at); ``(None, "")`` when none is."""
    for raw in itertools.islice(raws, SNIFF_RECORDS):
        kind = record_kind(raw.record)
        if kind is not None:
            return kind, f"{raw.source}:{raw.line}" if raw.line is not None else raw.source
    return None, ""


def first_kind_in_sources(sources: Sequence[DataSource], max_record_bytes: int) -> tuple[str | None, str]:
    """:func:`first_record_kind` over the records of ``sources`` in order (local files read as training reads them,
    a file that is not JSON passed over: the data check names it with its option; a hub dataset's first rows)."""
    for source in sources:
        if source.is_hub:
            from dspark_lightning.data.stream import open_record_stream, raw_record_from_example  # datasets: hub only

            stream = open_record_stream(source, limit=SNIFF_RECORDS)
            kind, where = first_record_kind(raw_record_from_example(example, source) for example in stream)
            if kind is not None:
                return kind, where
            continue
        for path in source.files:
            try:
                kind, where = first_record_kind(iter_file_records(path, SNIFF_RECORDS, max_record_bytes))
            except NotJSONError:
                continue
            if kind is not None:
                return kind, where
    return None, ""


def cache_data_format(directory: str) -> str | None:
    """The data format a ``dspark-lightning cache`` directory was written from (None for caches that predate the
    record: they were all written from conversations)."""
    index = Path(directory) / INDEX_NAME
    return json.loads(index.read_text()).get("data_format") if index.exists() else None


def no_template_message(tokenizer_name: str, where: str, option: str) -> str:
    return (
        f"{where} is a conversation record, but the tokenizer {tokenizer_name!r} has no chat template, and a chat "
        f"template is never invented. Train this target on completion records {COMPLETION_RECORD} with {option}: "
        f"completion (docs/design/data.md §1.5): `dspark-lightning regenerate --format completion --target "
        f"{tokenizer_name} --data <these conversations> --output DIR` writes the target's own continuations of their "
        "first user turns and code prompts; or use a target whose tokenizer has a chat template"
    )


def resolve_format(
    requested: str,
    tokenizer: Any,
    tokenizer_name: str,
    detected: str | None,
    where: str,
    option: str = "data.format",
) -> FormatChoice:
    """The format to read the records in (docs/design/data.md §1.5); ``detected`` is the kind of the first record
    (at ``where``), None when there was none to look at. Raises :class:`DataFormatError`; logs the choice."""
    if requested not in DATA_FORMATS:
        raise DataFormatError(f"{option} must be one of {', '.join(DATA_FORMATS)}, got {requested!r}")
    template = has_chat_template(tokenizer)
    if requested != "auto" and detected is not None and detected != requested:
        other = "conversation" if detected == "chat" else f"completion record {COMPLETION_RECORD}"
        raise DataFormatError(
            f"{option}={requested}, but {where} is a {other}: set {option}: {detected} (or auto), or give "
            f"{'conversation' if requested == 'chat' else 'completion'} records"
        )
    if (requested == "chat" or (requested == "auto" and detected == "chat")) and not template:
        if detected == "chat":
            raise DataFormatError(f"{option}={requested}: {no_template_message(tokenizer_name, where, option)}")
        raise DataFormatError(
            f"{option}=chat, but the tokenizer {tokenizer_name!r} has no chat template, and a chat template is never "
            f"invented: set {option}: completion and give completion records {COMPLETION_RECORD} (docs/design/data.md §1.5)"
        )
    if requested != "auto":
        chosen, reason = requested, f"{option}={requested}"
    elif detected is not None:
        chosen = detected
        reason = f"auto: {where} is a {'conversation' if detected == 'chat' else 'completion'} record"
    else:
        chosen = "chat" if template else "completion"
        reason = f"auto: no record to look at; the tokenizer {'has' if template else 'has no'} chat template"
    choice = FormatChoice(chosen, requested, reason, str(tokenizer_name), template)
    message = "data format %s (%s); tokenizer %r %s"
    template_note = "has a chat template" if template else "has no chat template (none is invented)"
    log = logger.info if template else logger.warning
    log(message, choice.format, reason, str(tokenizer_name), template_note)
    return choice


def choose_format(
    requested: str,
    tokenizer: Any,
    tokenizer_name: str,
    sources: Sequence[DataSource],
    caches: Sequence[str | Sequence[str]] = (),
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> FormatChoice:
    """A run's format: :func:`resolve_format` on the first record of ``sources`` (else the format recorded in one of
    the ``caches``), checked against the format every cache was written from."""
    kind, where = first_kind_in_sources(sources, max_record_bytes)
    directories = [c for entry in caches for c in ([entry] if isinstance(entry, str) else entry)]
    cached = {c: cache_data_format(c) for c in directories}
    if kind is None and any(cached.values()):
        where, kind = next((f"cache {c}", f) for c, f in cached.items() if f)
    choice = resolve_format(requested, tokenizer, tokenizer_name, kind, where)
    wrong = {c: f for c, f in cached.items() if f is not None and f != choice.format}
    if wrong:
        raise DataFormatError(
            f"data.format resolves to {choice.format} ({choice.reason}), but these caches were written from "
            f"{'/'.join(sorted(set(wrong.values())))} records: {sorted(wrong)}; rewrite them or set data.format"
        )
    return choice


def make_encoder(
    data_format: str,
    tokenizer: Any,
    max_length: int | None = None,
    min_supervised_tokens: int = 1,
    block_size: int = 0,
    template_kwargs: dict[str, Any] | None = None,
) -> ConversationEncoder | CompletionEncoder:
    """The encoder of a resolved format (``chat`` or ``completion``): parses, tokenises and masks its records."""
    if data_format == "completion":
        return CompletionEncoder(tokenizer, max_length, min_supervised_tokens, block_size)
    if data_format == "chat":
        return ConversationEncoder(tokenizer, max_length, min_supervised_tokens, block_size, template_kwargs)
    raise ValueError(f"make_encoder needs a resolved format (chat or completion), got {data_format!r}")
