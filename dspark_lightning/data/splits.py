"""Deterministic train / validation / test splits by conversation id, and the id of a record without one."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dspark_lightning.errors import OptionError


def record_id(record: Any) -> str | None:
    """The record's own ``id`` (str or int) if it has one."""
    if isinstance(record, dict) and isinstance(record.get("id"), str | int) and not isinstance(record["id"], bool):
        return str(record["id"])
    return None


def conversation_id(raw_record: Any, messages: Sequence[dict[str, str]]) -> str:
    """The record's own id, else a stable hash of its normalised messages."""
    own = record_id(raw_record)
    if own is not None:
        return own
    digest = hashlib.sha1(json.dumps(list(messages), sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"sha1-{digest[:20]}"


SPLITS = ("train", "validation", "test")
_PART_SUFFIX = re.compile(r"_\d+$")


@dataclass(frozen=True)
class IdSplit:
    """Deterministic train / validation / test assignment by conversation id.

    ShareGPT V3 cuts long conversations into parts ``<id>_0``, ``<id>_1``, ...: the ``_N`` suffix is dropped before
    hashing so all parts of one conversation land in the same split (no leakage of a conversation's continuation into
    the held-out prompts). So is a ``#<kind>`` suffix (``<id>#first_turn``, ``<id>#code``: the completion records
    ``regenerate --format completion`` makes of one conversation), for the same reason. The split is ``sha256(group)`` read as a number in [0, 1): below ``validation`` ->
    validation, below ``validation + test`` -> test, else train. It depends on nothing but the id.
    """

    validation: float = 0.0
    test: float = 0.0

    def __post_init__(self) -> None:
        if not (0 <= self.validation and 0 <= self.test and self.validation + self.test < 1):
            raise OptionError(f"split_by_id fractions must be >= 0 and sum to < 1, got {self}")

    @classmethod
    def from_fractions(cls, fractions: dict[str, float] | None) -> IdSplit | None:
        if fractions is None:
            return None
        unknown = set(fractions) - {"validation", "test"}
        if unknown:
            raise ValueError(f"split_by_id: unknown split(s) {sorted(unknown)}; give validation and/or test fractions")
        return cls(**{name: float(value) for name, value in fractions.items()})

    def split_of(self, identifier: str) -> str:
        group = _PART_SUFFIX.sub("", identifier.split("#", 1)[0])
        u = int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "big") / 2**64
        return "validation" if u < self.validation else "test" if u < self.validation + self.test else "train"
