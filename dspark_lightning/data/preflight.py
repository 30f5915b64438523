"""The data check before anything expensive: every local file of a split sniffed, and a sample of its records
validated, so a wrong file is named before a target loads (the CLI runs it before the model is built)."""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Sequence

from dspark_lightning.data.files import DEFAULT_MAX_RECORD_BYTES, NotJSONError, check_data_files
from dspark_lightning.data.records import RawRecord, iter_file_records
from dspark_lightning.data.sharegpt import InvalidRecord, to_conversation

logger = logging.getLogger(__name__)

SAMPLE_RECORDS = 32  # records read per file: enough to tell a wrong file, cheap for a glob of thousands


class NoUsableRecordsError(NotJSONError):
    """A split none of whose sampled records is usable (each file named with its reasons and first bad lines)."""


def preflight_data_files(
    files: Sequence[str],
    option: str,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    sample_records: int = SAMPLE_RECORDS,
    parse: Callable[[RawRecord], object] = to_conversation,
    what: str = "conversation",
) -> None:
    """Sniff every file (``check_data_files``) and validate its first ``sample_records`` records with ``parse``
    (``to_conversation``, or the completion format's ``to_completion``; ``what`` names the record kind in messages).

    A split where no sampled record is usable raises :class:`NoUsableRecordsError` naming, per file, the reasons and
    the first bad line of each; a file whose sample is all unusable while others are fine is a warning. Later bad
    records are skipped and counted during training, as before.
    """
    check_data_files(files, option, max_record_bytes)
    verdicts: dict[str, tuple[int, Counter, dict[str, int | None]]] = {}
    for path in files:
        good, reasons, first_line = 0, Counter(), {}
        records = itertools.islice(iter_file_records(path, max_record_bytes=max_record_bytes), sample_records)
        try:
            for raw in records:
                try:
                    parse(raw)
                    good += 1
                except InvalidRecord as bad:
                    reasons[bad.reason] += 1
                    first_line.setdefault(bad.reason, raw.line)
        except NotJSONError:
            pass  # a file that breaks after its sniffed start: the stream counts the rest of it, as before
        verdicts[path] = (good, reasons, first_line)

    def described(path: str) -> str:
        _, reasons, first_line = verdicts[path]
        listed = ", ".join(
            f"{reason} x{count} (first at line {first_line[reason]})" for reason, count in reasons.items()
        )
        return f"{path}: {listed}"

    unusable = [path for path, (good, reasons, _) in verdicts.items() if good == 0 and reasons]
    if unusable and len(unusable) == sum(1 for good, reasons, _ in verdicts.values() if good or reasons):
        listed = "\n  ".join(described(path) for path in unusable)
        raise NoUsableRecordsError(
            f"{option}: none of the first {sample_records} records of any file is a usable {what} "
            f"(see docs/design/data.md §2 for the reasons):\n  {listed}"
        )
    for path in unusable:
        logger.warning("%s: no usable %s in the first %d records: %s", option, what, sample_records, described(path))
