"""Offline target cache: run the frozen target once over the packed dataset, train many drafters from the result.

Usage (wired as ``dspark-lightning cache``)::

    dspark-lightning cache --target Qwen/Qwen3-8B --data 'sharegpt/*.jsonl' --output cache/train \\
        --seq_len 4096 --batch_size 8 [--layers 1 17 33 | --num_draft_layers 3] [--dtype bfloat16] [--limit N]

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
  (tokenise + pack only; ``--no_count_pass`` skips it and prints the per-sample size alone). ``--dry_run`` stops there.
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
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data import IterableDataset as TorchIterableDataset

from dspark_lightning.dtypes import DTYPES, torch_dtype

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
TOKEN_FIELD_BYTES = 13  # int32 ids + int32 document ids + int32 positions + bool mask, per token


def bytes_per_sample(seq_len: int, hidden_size: int, num_context_layers: int, dtype: str = "bfloat16") -> int:
    """Cache bytes of one packed sample (the safetensors headers are negligible)."""
    feature_bytes = torch_dtype(dtype).itemsize * (num_context_layers + 1) * hidden_size
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
    store_dtype = torch_dtype(args.dtype)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark-lightning cache",
        description="Run the frozen target once over packed conversations and store its features for training.",
    )
    add = parser.add_argument
    add("--target", required=True, help="hub id or local path of the target model (and tokenizer)")
    add("--data", required=True, nargs="+", help="local .json/.jsonl files, dirs, globs, or a hub id")
    add("--output", required=True, help="cache directory (index.json + features-NNNNN.safetensors)")
    add("--seq_len", "--seq-len", type=int, default=512, help="packed sequence length (as data.seq_len)")
    add("--batch_size", "--batch-size", type=int, default=8, help="packed samples per target forward")
    add("--block_size", "--block-size", type=int, default=8, help="draft block size (skips rows with no anchor room)")
    add("--layers", type=int, nargs="+", default=None, help="target layer ids to store (default: DFlash spread)")
    add("--num_draft_layers", "--num-draft-layers", type=int, default=1, help="for the default --layers spread")
    add("--dtype", choices=sorted(DTYPES), default="bfloat16", help="storage dtype of the features")
    add("--target_dtype", "--target-dtype", default="auto", help="compute dtype of the target (auto = checkpoint's)")
    add("--shard_size", "--shard-size", type=int, default=256, help="packed samples per safetensors shard")
    add("--limit", type=int, default=None, help="write at most this many packed samples")
    add("--max_length", "--max-length", type=int, default=None, help="truncate conversations to this many tokens")
    add("--num_jobs", "--num-jobs", type=int, default=1, help="split the samples over this many parallel jobs")
    add("--job_index", "--job-index", type=int, default=0, help="which of --num_jobs this is (own --output each)")
    add("--device", default=None, help="default: cuda if available, else cpu")
    add("--device_map", "--device-map", default=None, help="e.g. auto: spread a large target over all GPUs")
    add("--chat_template_kwargs", "--chat-template-kwargs", type=json.loads, default=None, help="JSON object")
    add("--no_count_pass", "--no-count-pass", dest="count_pass", action="store_false", help="skip the count pass")
    add("--dry_run", "--dry-run", action="store_true", help="print the size estimate and stop")
    add("--trust_remote_code", "--trust-remote-code", action="store_true", default=False)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if not 0 <= args.job_index < args.num_jobs:
        raise SystemExit(f"--job_index must be in [0, {args.num_jobs}), got {args.job_index}")
    return write_cache(args)


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
    "main",
    "split_for_rank",
    "write_cache",
]
