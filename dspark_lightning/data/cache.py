"""Offline target cache: the format and the reader (``CachedFeatureDataset``) of the target's features.

The data layer never loads a model; the writer, which runs the target, is ``dspark_lightning.preparation.cache``.
Format, size, resuming, parallel jobs and reading order: docs/design/data.md §6.2; the teacher statistics:
docs/design/design.md §3.6."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data import IterableDataset as TorchIterableDataset

from dspark_lightning.data.cache_integrity import DIGEST, HASH_ON_READ_MAX_BYTES, check_digest, check_sizes
from dspark_lightning.dtypes import torch_dtype

log = logging.getLogger(__name__)

CACHE_FORMAT = "dspark-target-cache/2"
READABLE_FORMATS = ("dspark-target-cache/1", CACHE_FORMAT)  # 1: no teacher statistics
INDEX_NAME = "index.json"
SHARD_PATTERN = "features-{:05d}.safetensors"
TOKEN_FIELDS = {
    "input_ids": torch.int32,
    "loss_mask": torch.bool,
    "document_ids": torch.int32,
    "position_ids": torch.int32,
}
FEATURE_FIELDS = ("context_features", "final_hidden")
# per position of final_hidden: logsumexp and argmax of the target's logits over its whole vocabulary (format 2)
TEACHER_STAT_FIELDS = ("final_logsumexp", "final_argmax")
TOKEN_FIELD_BYTES = 13  # int32 ids + int32 document ids + int32 positions + bool mask, per token
TEACHER_STAT_BYTES = 8  # float32 logsumexp + int32 argmax, per token


def bytes_per_sample(
    seq_len: int, hidden_size: int, num_context_layers: int, dtype: str = "bfloat16", teacher_stats: bool = True
) -> int:
    """Cache bytes of one packed sample (the safetensors headers are negligible); ``teacher_stats=False`` for a
    format 1 cache."""
    feature_bytes = torch_dtype(dtype).itemsize * (num_context_layers + 1) * hidden_size
    return seq_len * (TOKEN_FIELD_BYTES + TEACHER_STAT_BYTES * teacher_stats + feature_bytes)


def format_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------------------- reading
@dataclass
class CacheIndex:
    """One cache directory: its ``index.json`` and where each global sample lives."""

    directory: Path
    meta: dict[str, Any]

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CacheIndex:
        directory = Path(directory)
        path = directory / INDEX_NAME
        if not path.exists():
            raise FileNotFoundError(f"{directory} is not a target cache (no {INDEX_NAME}); write one with "
                                    "`dspark-lightning cache`")  # fmt: skip
        meta = json.loads(path.read_text())
        if meta.get("format") not in READABLE_FORMATS:
            raise ValueError(
                f"{path}: unknown cache format {meta.get('format')!r} (expected one of {READABLE_FORMATS})"
            )
        if not meta.get("complete"):
            raise ValueError(f"{path}: the cache is incomplete (interrupted?); rerun the same cache command to finish")
        check_sizes(directory, meta["shards"])  # before any step: a shard cut short or missing is named now
        if meta["shards"] and all(DIGEST not in shard for shard in meta["shards"]):
            log.info("%s: written before index.json recorded shard sizes and digests: nothing to check", directory)
        return cls(directory, meta)

    @property
    def has_teacher_stats(self) -> bool:
        """Whether the shards hold ``TEACHER_STAT_FIELDS`` (format 2)."""
        return self.meta["format"] != READABLE_FORMATS[0]

    @property
    def num_samples(self) -> int:
        return sum(shard["num_samples"] for shard in self.meta["shards"])

    def locate(self) -> list[tuple[str, int]]:
        """(shard path, row inside the shard) for every sample, in order."""
        return [
            (str(self.directory / shard["file"]), row)
            for shard in self.meta["shards"]
            for row in range(shard["num_samples"])
        ]


def load_cache_indexes(directories: str | Sequence[str]) -> list[CacheIndex]:
    """Indexes of one or several cache directories that must describe the same features."""
    directories = [directories] if isinstance(directories, str | os.PathLike) else list(directories)
    indexes = [CacheIndex.load(d) for d in directories]
    keys = ("target_layer_ids", "hidden_size", "seq_len", "dtype")
    for index in indexes[1:]:
        for key in keys:
            if index.meta[key] != indexes[0].meta[key]:
                raise ValueError(
                    f"caches {indexes[0].directory} and {index.directory} differ in {key}: "
                    f"{indexes[0].meta[key]} vs {index.meta[key]}"
                )
    return indexes


def split_for_rank(num_samples: int, rank: int, world_size: int, even: bool) -> range:
    """Positions (in an epoch's sample order) that ``rank`` reads: every ``world_size``-th from ``rank``; with
    ``even`` all ranks get ``num_samples // world_size`` of them."""
    stop = (num_samples // world_size) * world_size if even else num_samples
    return range(rank, stop, world_size)


class CachedFeatureDataset(TorchIterableDataset):
    """Batches of cached samples for one rank (docs/design/data.md §6.2); yields dicts in the batch contract."""

    def __init__(
        self,
        directories: str | Sequence[str],
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.indexes = load_cache_indexes(directories)
        self.locations = [loc for index in self.indexes for loc in index.locate()]
        self.shard_entries = {
            str(index.directory / s["file"]): s for index in self.indexes for s in index.meta["shards"]
        }
        self.teacher_stats = all(index.has_teacher_stats for index in self.indexes)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.skip_batches = 0, 0
        self._handles: dict[str, Any] = {}

    @property
    def meta(self) -> dict[str, Any]:
        return self.indexes[0].meta

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def sample_order(self) -> list[int]:
        """Global sample ids of this rank for the current epoch, in reading order."""
        n = len(self.locations)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(n, generator=generator).tolist()
        else:
            order = list(range(n))
        return [order[i] for i in split_for_rank(n, self.rank, self.world_size, even=self.shuffle)]

    def batches(self) -> list[list[int]]:
        order = self.sample_order()
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def __len__(self) -> int:
        return len(self.batches())

    def read(self, samples: Sequence[int]) -> dict[str, torch.Tensor]:
        """Stack the given global samples into one batch."""
        from safetensors import safe_open

        stats = TEACHER_STAT_FIELDS if self.teacher_stats else ()
        rows: dict[str, list[torch.Tensor]] = {name: [] for name in (*TOKEN_FIELDS, *FEATURE_FIELDS, *stats)}
        for sample in samples:
            path, row = self.locations[sample]
            if path not in self._handles:
                shard = self.shard_entries[path]
                if shard.get("bytes", HASH_ON_READ_MAX_BYTES + 1) <= HASH_ON_READ_MAX_BYTES:
                    check_digest(path, shard)  # once per process: a flipped byte is named, never trained on
                self._handles[path] = safe_open(path, "pt")
            handle = self._handles[path]
            for name in rows:
                rows[name].append(handle.get_slice(name)[row : row + 1])
        batch = {name: torch.cat(values) for name, values in rows.items()}
        for name in ("input_ids", "document_ids", "position_ids", *(("final_argmax",) if stats else ())):
            batch[name] = batch[name].long()
        batch["loss_mask"] = batch["loss_mask"].bool()
        return batch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        batches = self.batches()[self.skip_batches :]
        for samples in batches[worker::workers]:
            yield self.read(samples)

    def __getstate__(self) -> dict[str, Any]:  # file handles stay in the process that opened them
        return {**self.__dict__, "_handles": {}}


class CachedFeatureLoader(DataLoader):
    """DataLoader over a ``CachedFeatureDataset`` (already batched); ``before_pass`` returns (epoch, batches to
    skip) and runs before every pass, in the main process, before workers copy the dataset."""

    def __init__(self, dataset: CachedFeatureDataset, num_workers: int, before_pass: Callable[[], tuple[int, int]]):
        super().__init__(dataset, batch_size=None, num_workers=num_workers)
        self.before_pass = before_pass

    def __iter__(self) -> Any:
        epoch, skip = self.before_pass()
        self.dataset.set_epoch(epoch)
        self.dataset.skip_batches = skip
        return super().__iter__()


def estimated_cache_bytes(index: dict[str, Any]) -> int:
    """Bytes the cache described by ``index`` occupies (from its shapes, without reading the shards)."""
    samples = sum(s["num_samples"] for s in index["shards"])
    layers = len(index["target_layer_ids"])
    stats = index.get("format") != READABLE_FORMATS[0]
    return samples * bytes_per_sample(index["seq_len"], index["hidden_size"], layers, index["dtype"], stats)


__all__ = [
    "CACHE_FORMAT",
    "READABLE_FORMATS",
    "TEACHER_STAT_FIELDS",
    "CacheIndex",
    "CachedFeatureDataset",
    "CachedFeatureLoader",
    "bytes_per_sample",
    "estimated_cache_bytes",
    "load_cache_indexes",
    "split_for_rank",
]
