"""The record stream behind ``ShareGPTDataModule``: raw records -> validated -> tokenised -> packed rows (conversations
or completion records, whichever the encoder of the data format reads).

Records are always streamed with ``datasets`` (``streaming=True``): hub ids through ``load_dataset``, local files
through ``IterableDataset.from_generator`` over this package's own reader (one shard per file, so file and line
survive for errors). Bad records are counted by reason in the shared per-worker table (``accounting.py``) or raised.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from datasets import IterableDataset, load_dataset
from torch.utils.data import IterableDataset as TorchIterableDataset

from dspark_lightning.data.accounting import SharedCounts
from dspark_lightning.data.completion import CompletionEncoder
from dspark_lightning.data.files import DEFAULT_MAX_RECORD_BYTES
from dspark_lightning.data.records import RawRecord, iter_local_records, limit_shards
from dspark_lightning.data.sharegpt import (
    BadRecordError,
    DataSource,
    IdSplit,
    InvalidRecord,
    SkipExamples,
)
from dspark_lightning.data.tokenize import ConversationEncoder, SequencePacker
from dspark_lightning.errors import loading


def _local_examples(shards: list[tuple[str, int | None]], max_record_bytes: int) -> Iterator[dict[str, Any]]:
    """Generator behind the local streaming dataset: one example per raw record, keeping file and line."""
    for raw in iter_local_records(shards, max_record_bytes, skip_broken_rest=True):
        yield {
            "record": raw.record,
            "source": raw.source,
            "line": raw.line,
            "json_error": raw.json_error,
            "reason": raw.reason,
        }


def open_record_stream(
    source: DataSource, *, limit: int | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> IterableDataset:
    """A streaming ``datasets.IterableDataset`` over the raw records of ``source`` (first ``limit`` if given)."""
    if source.is_hub:
        with loading("hub dataset", source.hub_id):
            stream = load_dataset(source.hub_id, source.hub_config, split=source.hub_split, streaming=True)
        return stream.take(limit) if limit is not None else stream
    shards = limit_shards(source.files, limit)
    return IterableDataset.from_generator(
        _local_examples, gen_kwargs={"shards": shards, "max_record_bytes": max_record_bytes}
    )


def raw_record_from_example(example: dict[str, Any], source: DataSource) -> RawRecord:
    """Undo :func:`_local_examples` (local) or wrap a hub row (the row itself is the record)."""
    if source.is_hub:
        return RawRecord(example, source.describe(), None)
    reason = example.get("reason")
    return RawRecord(example["record"], example["source"], example["line"], example["json_error"], reason=reason)


class PackedConversationStream(TorchIterableDataset):
    """Torch iterable dataset: raw records -> validated -> tokenised -> packed rows (the batch contract); the encoder
    (``ConversationEncoder`` or ``CompletionEncoder``, by the data format) parses and tokenises each record."""

    def __init__(
        self,
        records: IterableDataset,
        source: DataSource,
        encoder: ConversationEncoder | CompletionEncoder,
        seq_len: int,
        pad_token_id: int,
        on_bad_record: str,
        counts: SharedCounts,
        keep_split: tuple[IdSplit, str] | None = None,
    ):
        self.records, self.source, self.encoder, self.keep_split = records, source, encoder, keep_split
        self.seq_len, self.pad_token_id, self.on_bad_record, self.counts = seq_len, pad_token_id, on_bad_record, counts

    def set_epoch(self, epoch: int) -> None:
        self.records.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        row = self.counts.current_row()
        self.counts.reset(row)
        packer = SequencePacker(self.seq_len, self.pad_token_id)
        self.skip_examples = SkipExamples()  # per pass and worker: the first few skips of each reason are named
        for example in self.records:
            raw = raw_record_from_example(example, self.source)
            self.counts.add(row, "records")
            try:
                example = self.encoder.parse(raw)  # a conversation or a completion record, by the data format
                if self.keep_split is not None and self.keep_split[0].split_of(example.record_id) != self.keep_split[1]:
                    self.counts.add(row, "other_split_records")  # held out for another split: not a bad record
                    continue
                document = self.encoder.encode_example(example, max_length=self.seq_len)
            except InvalidRecord as bad:
                if self.on_bad_record == "raise":
                    raise BadRecordError(bad.reason, bad.detail, raw.source, raw.line) from None
                self.skip_examples.note(bad, raw.source, raw.line)
                self.counts.add(row, bad.reason)
                continue
            self.counts.add(row, "documents")
            self.counts.add(row, "truncated_documents", int(document.truncated))
            self.counts.add(row, "tokens", len(document))
            self.counts.add(row, "supervised_tokens", sum(document.loss_mask))
            for packed in packer.add(document):
                self.counts.add(row, "rows")
                yield packed
        for packed in packer.flush():
            self.counts.add(row, "rows")
            yield packed
