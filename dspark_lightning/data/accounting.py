"""Data accounting: per-worker counters in shared memory and the DataLoader that reports after each pass.

Counts (bad records by reason, plus records / documents / truncations / rows / tokens) live in a small int64 table in
shared memory with one row per DataLoader worker; each worker zeroes and writes only its own row at the start of its
pass, and the main process sums the rows. This is exact (no lost updates, no extra keys in the batch) and works with
fork and spawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from dspark_lightning.data.sharegpt import BAD_RECORD_REASONS
from dspark_lightning.errors import UserError

# other_split_records: records that split_by_id assigns to another split (held out, not bad)
STAT_NAMES = (
    "records",
    "documents",
    "truncated_documents",
    "rows",
    "tokens",
    "supervised_tokens",
    "other_split_records",
)
COUNTER_NAMES = tuple(BAD_RECORD_REASONS) + STAT_NAMES


class SharedCounts:
    """Counters in shared memory, one row per DataLoader worker (row 0 in the main process)."""

    def __init__(self, num_rows: int):
        self.table = torch.zeros(max(1, num_rows), len(COUNTER_NAMES), dtype=torch.long).share_memory_()
        self._column = {name: i for i, name in enumerate(COUNTER_NAMES)}

    @staticmethod
    def current_row() -> int:
        info = get_worker_info()
        return info.id if info is not None else 0

    def reset(self, row: int) -> None:
        self.table[row].zero_()

    def add(self, row: int, name: str, amount: int = 1) -> None:
        self.table[row, self._column[name]] += amount

    def totals(self) -> dict[str, int]:
        summed = self.table.sum(dim=0).tolist()
        return dict(zip(COUNTER_NAMES, summed))


class NoTrainableDataError(UserError, ValueError):
    """A full pass over a split produced no packed row: the message lists what every record was skipped for."""


class _ReportingIterator:
    """Proxy of a DataLoader iterator that calls ``on_exhausted`` once when it runs out."""

    def __init__(self, inner: Iterator, on_exhausted: Callable[[], None]):
        self._inner, self._on_exhausted = inner, on_exhausted

    def __iter__(self) -> _ReportingIterator:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._inner)
        except StopIteration:
            self._on_exhausted()
            raise

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __reduce__(self) -> tuple:
        # Like Lightning's own workaround for DataLoader iterators (which cannot be pickled): pickle as exhausted.
        return iter, ((),)


class CountingDataLoader(DataLoader):
    """DataLoader that sets the stream's epoch before each pass and logs the data counts after it."""

    def __init__(
        self,
        *args: Any,
        before_pass: Callable[[], None] | None = None,
        after_pass=None,
        batches_to_skip: Callable[[], int] | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.before_pass, self.after_pass, self.batches_to_skip = before_pass, after_pass, batches_to_skip

    def __iter__(self) -> Any:
        if self.before_pass is not None:
            self.before_pass()
        inner = super().__iter__()
        skip = self.batches_to_skip() if self.batches_to_skip is not None else 0
        for _ in range(skip):  # resuming mid-epoch: replay the stream up to where the checkpoint was taken
            next(inner, None)
        return _ReportingIterator(inner, self.after_pass) if self.after_pass is not None else inner
