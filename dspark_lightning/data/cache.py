"""Offline target cache: run the frozen target once over the packed dataset, train many drafters from the result.

Usage (wired as ``dspark-lightning cache``)::

    dspark-lightning cache --target Qwen/Qwen3-8B --data 'sharegpt/*.jsonl' --output cache/train \\
        --seq_len 4096 --batch_size 8 [--layers '[1,17,33]' | --num_draft_layers 3] [--dtype bfloat16] [--limit N]

then train with no target decoder in memory (``configs/cache.yaml``: ``data.train_cache`` / ``data.val_cache`` and
``model.target_features: cache``).

Format (``index.json`` + ``features-NNNNN.safetensors``): each shard holds ``--shard_size`` packed samples as
tensors with a leading sample dimension, in the batch contract of ``dspark_lightning.data`` plus the target's
features: ``input_ids`` / ``document_ids`` / ``position_ids`` int32 [n, S], ``loss_mask`` bool [n, S],
``context_features`` [n, S, len(layers)*H] and ``final_hidden`` [n, S, H] (after the final norm) in ``--dtype``
(bf16 by default). ``index.json`` records the target, layer ids, shapes, dtype, the data options, per-shard sample
counts and the data pass counters; ``complete`` is false until the last shard is written.

Design choices:
- Packing is exactly the training stream's (``ShareGPTDataModule`` with no shuffling, file order), so a cached sample
  equals the online one; shuffling happens when reading (a permutation of sample indices per epoch).
- Size estimate before the target is loaded: bytes per sample = S * (13 + (n + 1) * H * dtype bytes) (int32 ids,
  document ids, positions, a bool mask, then the features), times the number of samples from a count pass
  (tokenise + pack only; ``--count_pass false`` skips it and prints the per-sample size alone). ``--dry_run`` stops there.
- Resumable: the index is rewritten after every finished shard; rerunning the same command skips the samples of the
  finished shards (the packed stream is deterministic) and continues. A different configuration in the same output
  directory is an error rather than a silent mix.
- Parallel writing: ``--num_jobs N --job_index i`` keeps packed samples i, i+N, ... (e.g. one job per GPU, each with
  its own ``--output``); the reader takes a list of cache directories and treats them as one dataset.
- Reading (``CachedFeatureDataset``): per epoch, the global sample list (shuffled with seed + epoch for training) is
  dealt to ranks (rank r takes every world_size-th sample from r) and cut into batches; training truncates every rank
  to the same number of samples (dropping fewer than world_size samples per epoch) so DDP ranks run the same number of
  steps, evaluation drops nothing. Batches are then dealt to DataLoader workers round-robin, which is the order the
  DataLoader yields them in, so the batch sequence is independent of ``num_workers``; resuming mid-epoch skips batches
  by index without reading them. Samples are read lazily from memory-mapped shards (``safe_open``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data import IterableDataset as TorchIterableDataset

CACHE_FORMAT = "dspark-target-cache/1"
INDEX_NAME = "index.json"
SHARD_PATTERN = "features-{:05d}.safetensors"
TOKEN_FIELDS = {
    "input_ids": torch.int32,
    "loss_mask": torch.bool,
    "document_ids": torch.int32,
    "position_ids": torch.int32,
}
FEATURE_FIELDS = ("context_features", "final_hidden")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TOKEN_FIELD_BYTES = 13  # int32 ids + int32 document ids + int32 positions + bool mask, per token


def bytes_per_sample(seq_len: int, hidden_size: int, num_context_layers: int, dtype: str = "bfloat16") -> int:
    """Cache bytes of one packed sample (the safetensors headers are negligible)."""
    feature_bytes = DTYPES[dtype].itemsize * (num_context_layers + 1) * hidden_size
    return seq_len * (TOKEN_FIELD_BYTES + feature_bytes)


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
        if meta.get("format") != CACHE_FORMAT:
            raise ValueError(f"{path}: unknown cache format {meta.get('format')!r} (expected {CACHE_FORMAT})")
        if not meta.get("complete"):
            raise ValueError(f"{path}: the cache is incomplete (interrupted?); rerun the same cache command to finish")
        return cls(directory, meta)

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
    """Batches of cached samples for one rank (see module docstring); yields dicts in the batch contract."""

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

        rows: dict[str, list[torch.Tensor]] = {name: [] for name in (*TOKEN_FIELDS, *FEATURE_FIELDS)}
        for sample in samples:
            path, row = self.locations[sample]
            if path not in self._handles:
                self._handles[path] = safe_open(path, "pt")
            handle = self._handles[path]
            for name in rows:
                rows[name].append(handle.get_slice(name)[row : row + 1])
        batch = {name: torch.cat(values) for name, values in rows.items()}
        for name in ("input_ids", "document_ids", "position_ids"):
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


# --------------------------------------------------------------------------------------------------------- writing
def _settings(args: argparse.Namespace, target_layer_ids: list[int]) -> dict[str, Any]:
    """What must agree for a rerun to continue an existing cache."""
    return {
        "target": args.target,
        "data": args.data,
        "seq_len": args.seq_len,
        "block_size": args.block_size,
        "target_layer_ids": target_layer_ids,
        "dtype": args.dtype,
        "target_dtype": args.target_dtype,
        "shard_size": args.shard_size,
        "limit": args.limit,
        "num_jobs": args.num_jobs,
        "job_index": args.job_index,
        "max_length": args.max_length,
        "chat_template_kwargs": args.chat_template_kwargs,
    }


def _packed_rows(datamodule, num_jobs: int, job_index: int, limit: int | None) -> Iterator[dict[str, torch.Tensor]]:
    stream = datamodule.build_dataset("train", rank=0, world_size=1)
    written = 0
    for position, row in enumerate(stream):
        if limit is not None and written >= limit:
            return
        if position % num_jobs == job_index:
            written += 1
            yield row


def write_cache(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the target over the packed data and write the cache (resumable); returns the index."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from dspark_lightning.data.datamodule import NoTrainableDataError, ShareGPTDataModule
    from dspark_lightning.models.backbone import default_target_layer_ids

    config = AutoConfig.from_pretrained(args.target, trust_remote_code=args.trust_remote_code)
    layer_ids = args.layers or default_target_layer_ids(config.num_hidden_layers, args.num_draft_layers)
    datamodule = ShareGPTDataModule(
        tokenizer=args.target,
        train_files=args.data if len(args.data) > 1 else args.data[0],
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        shuffle_buffer=0,
        block_size=args.block_size,
        max_length=args.max_length,
        trust_remote_code=args.trust_remote_code,
        chat_template_kwargs=args.chat_template_kwargs,
    )
    datamodule.setup("fit")  # every data file sniffed before the target is loaded
    output = Path(args.output)
    settings = _settings(args, layer_ids)
    per_sample = bytes_per_sample(args.seq_len, config.hidden_size, len(layer_ids), args.dtype)
    shape = f"S={args.seq_len}, {len(layer_ids)} layers x H={config.hidden_size} + final hidden, {args.dtype}"
    if args.count_pass:
        count = sum(1 for _ in _packed_rows(datamodule, args.num_jobs, args.job_index, args.limit))
        if not count and not datamodule.data_stats("train")["rows"]:
            raise NoTrainableDataError(datamodule.no_rows_message("train"))  # before the target is loaded
        log(f"size estimate: {count} packed samples x {format_bytes(per_sample)} ({shape}) = "
            f"{format_bytes(count * per_sample)}")  # fmt: skip
    else:
        log(f"size estimate: {format_bytes(per_sample)} per packed sample ({shape}); count pass skipped")
    if args.dry_run:
        return {"bytes_per_sample": per_sample, **settings}

    index_path = output / INDEX_NAME
    index = {"format": CACHE_FORMAT, **settings, "hidden_size": config.hidden_size, "shards": [], "complete": False}
    if index_path.exists():
        previous = json.loads(index_path.read_text())
        different = {k: (previous.get(k), v) for k, v in settings.items() if previous.get(k) != v}
        if different:
            raise ValueError(f"{output} holds a cache written with other settings {different}; use a new --output")
        if previous.get("complete"):
            log(f"{output}: cache already complete ({sum(s['num_samples'] for s in previous['shards'])} samples)")
            return previous
        index = previous
    done = sum(shard["num_samples"] for shard in index["shards"])
    if done:
        log(f"resuming: {done} samples in {len(index['shards'])} finished shards are kept")

    from dspark_lightning.models.target import FrozenTarget, load_causal_lm

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    load_kwargs = {"device_map": args.device_map} if args.device_map else {}
    compute_dtype = "auto" if args.target_dtype == "auto" else getattr(torch, args.target_dtype)
    model = load_causal_lm(args.target, compute_dtype, args.trust_remote_code, **load_kwargs)
    if not args.device_map:
        model = model.to(device)
    target = FrozenTarget(model, layer_ids)
    input_device = target.embed_tokens.weight.device
    output.mkdir(parents=True, exist_ok=True)
    store_dtype = DTYPES[args.dtype]
    pending: dict[str, list[torch.Tensor]] = {name: [] for name in (*TOKEN_FIELDS, *FEATURE_FIELDS)}

    def flush_shard() -> None:
        count = sum(t.shape[0] for t in pending["input_ids"])
        if not count:
            return
        name = SHARD_PATTERN.format(len(index["shards"]))
        tensors = {key: torch.cat(values).contiguous() for key, values in pending.items()}
        save_file(tensors, str(output / name), metadata={"format": CACHE_FORMAT})
        index["shards"].append({"file": name, "num_samples": count})
        index_path.write_text(json.dumps(index, indent=1))
        for values in pending.values():
            values.clear()
        log(f"wrote {name} ({count} samples, {sum(s['num_samples'] for s in index['shards'])} in total)")

    def run_batch(rows: list[dict[str, torch.Tensor]]) -> None:
        batch = {key: torch.stack([row[key] for row in rows]) for key in TOKEN_FIELDS}
        features = target.features(batch["input_ids"].to(input_device), batch["position_ids"].to(input_device))
        for key, dtype in TOKEN_FIELDS.items():
            pending[key].append(batch[key].to(dtype))
        pending["context_features"].append(features.context_features.to(store_dtype).cpu())
        pending["final_hidden"].append(features.final_hidden.to(store_dtype).cpu())

    rows: list[dict[str, torch.Tensor]] = []
    in_shard = 0
    for position, row in enumerate(_packed_rows(datamodule, args.num_jobs, args.job_index, args.limit)):
        if position < done:
            continue  # written by an earlier, interrupted run
        rows.append(row)
        in_shard += 1
        if len(rows) == args.batch_size or in_shard == args.shard_size:
            run_batch(rows)
            rows = []
        if in_shard == args.shard_size:
            flush_shard()
            in_shard = 0
    if rows:
        run_batch(rows)
    flush_shard()
    if not sum(s["num_samples"] for s in index["shards"]):  # an empty cache would only fail later, in fit
        raise NoTrainableDataError(datamodule.no_rows_message("train"))
    index["data_stats"] = datamodule.data_stats("train")
    index["complete"] = True
    index_path.write_text(json.dumps(index, indent=1))
    total = sum(s["num_samples"] for s in index["shards"])
    size = sum((output / s["file"]).stat().st_size for s in index["shards"])
    log(f"cache complete: {total} samples in {len(index['shards'])} shards, {format_bytes(size)} at {output}")
    return index


def cache_command(
    target: str,
    data: list[str] | str,
    output: str,
    seq_len: PositiveInt = 512,
    batch_size: PositiveInt = 8,
    block_size: PositiveInt = 8,
    layers: list[NonNegativeInt] | None = None,
    num_draft_layers: PositiveInt = 1,
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16",
    target_dtype: str = "auto",
    shard_size: PositiveInt = 256,
    limit: PositiveInt | None = None,
    max_length: PositiveInt | None = None,
    num_jobs: PositiveInt = 1,
    job_index: NonNegativeInt = 0,
    device: str | None = None,
    device_map: str | None = None,
    chat_template_kwargs: dict | None = None,
    count_pass: bool = True,
    dry_run: bool = False,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """Run the frozen target once over packed conversations and store its features (train with no target).

    Args:
        target: hub id or local path of the target model (and tokenizer)
        data: local .json/.jsonl files, dirs, globs (quoted), or a hub id; one or a list
        output: cache directory (index.json + features-NNNNN.safetensors)
        seq_len: packed sequence length (as data.seq_len)
        block_size: draft block size (skips rows with no anchor room)
        batch_size: packed samples per target forward
        layers: target layer ids to store (default: the DFlash spread for num_draft_layers)
        num_draft_layers: for the default layers spread
        dtype: storage dtype of the features
        target_dtype: compute dtype of the target (auto = the checkpoint's)
        shard_size: packed samples per safetensors shard
        limit: write at most this many packed samples
        max_length: truncate conversations to this many tokens
        num_jobs: split the samples over this many parallel jobs
        job_index: which of num_jobs this is (each its own output)
        device: default: cuda if available, else cpu
        device_map: e.g. auto: spread a large target over all GPUs
        chat_template_kwargs: passed to the chat template, e.g. {"enable_thinking": false}
        count_pass: count the packed samples first (a size estimate and a progress total)
        dry_run: print the size estimate and stop
        trust_remote_code: let transformers run the target's own modelling code
    """
    if not 0 <= job_index < num_jobs:
        raise SystemExit(f"--job_index must be in [0, {num_jobs}), got {job_index}")
    settings = dict(locals())
    settings["data"] = [data] if isinstance(data, str) else list(data)  # the resume check compares lists
    return write_cache(argparse.Namespace(**settings))


def estimated_cache_bytes(index: dict[str, Any]) -> int:
    """Bytes the cache described by ``index`` occupies (from its shapes, without reading the shards)."""
    samples = sum(s["num_samples"] for s in index["shards"])
    layers = len(index["target_layer_ids"])
    return samples * bytes_per_sample(index["seq_len"], index["hidden_size"], layers, index["dtype"])


__all__ = [
    "CACHE_FORMAT",
    "CacheIndex",
    "CachedFeatureDataset",
    "CachedFeatureLoader",
    "bytes_per_sample",
    "estimated_cache_bytes",
    "load_cache_indexes",
    "cache_command",
    "split_for_rank",
    "write_cache",
]
