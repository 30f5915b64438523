"""Resumable ShareGPT JSON Lines shards: the output of ``regenerate`` (``preparation/regenerate.py`` describes the layout).

A restart recognises finished work: existing shards are scanned, a partly written last line (an interrupted run) is
cut off, and writing continues in the last shard.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SHAREGPT_ROLE = {"system": "system", "user": "human", "assistant": "gpt"}
SHARD_PREFIX = "train-"


def to_sharegpt(identifier: str, messages: Sequence[dict[str, str]]) -> dict[str, Any]:
    return {
        "id": identifier,
        "conversations": [{"from": SHAREGPT_ROLE[m["role"]], "value": m["content"]} for m in messages],
    }


class ResumableShardWriter:
    """Append records to ``train-NNNNN.jsonl`` shards; knows the ids already written (see module docstring)."""

    def __init__(self, directory: str | os.PathLike, shard_size: int, prefix: str = SHARD_PREFIX):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shard_size, self.prefix = shard_size, prefix
        self.done_ids: set[str] = set()
        self.removed_bytes = 0  # of partial / unreadable trailing lines left by an interrupted run
        own = re.compile(re.escape(prefix) + r"\d{5}\.jsonl")  # not another job's shards
        shards = sorted(p for p in self.directory.glob(f"{prefix}*.jsonl") if own.fullmatch(p.name))
        count_in_last = 0
        for shard in shards:
            count_in_last = self._scan(shard)
        self.index = len(shards) - 1 if shards and count_in_last < shard_size else len(shards)
        self.count_in_shard = count_in_last if shards and count_in_last < shard_size else 0

    def _scan(self, shard: Path) -> int:
        """Collect the ids of ``shard``; cut off a trailing partial or corrupt line. Returns the record count."""
        data = shard.read_bytes()
        keep = data.rfind(b"\n") + 1
        lines = data[:keep].split(b"\n")[:-1]
        count = 0
        offset = 0
        for line in lines:
            try:
                self.done_ids.add(json.loads(line)["id"])
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
                keep = offset  # an unreadable line: drop it and everything after it
                break
            offset += len(line) + 1
            count += 1
        if keep < len(data):
            self.removed_bytes += len(data) - keep
            with open(shard, "r+b") as handle:
                handle.truncate(keep)
        return count

    @property
    def path(self) -> Path:
        return self.directory / f"{self.prefix}{self.index:05d}.jsonl"

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.done_ids.add(record["id"])
            self.count_in_shard += 1
            if self.count_in_shard >= self.shard_size:
                self.index, self.count_in_shard = self.index + 1, 0
