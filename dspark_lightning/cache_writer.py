"""``dspark-lightning cache``: run the frozen target once over the packed dataset and write its features.

The format, the size estimate and the reader are ``dspark_lightning.data.cache`` (the data layer, which never loads
a model); this module is the half that builds the target, so it sits above both ``data`` and ``models``. Packing is
exactly the training stream's (``ShareGPTDataModule``, no shuffling, file order), so a cached sample equals the
online one; the index is rewritten after every finished shard, so rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dspark_lightning.data.cache import (
    CACHE_FORMAT,
    FEATURE_FIELDS,
    INDEX_NAME,
    SHARD_PATTERN,
    TOKEN_FIELDS,
    bytes_per_sample,
    format_bytes,
)
from dspark_lightning.data.datamodule import NoTrainableDataError, ShareGPTDataModule
from dspark_lightning.dtypes import DTYPES, torch_dtype
from dspark_lightning.models.backbone import default_target_layer_ids
from dspark_lightning.models.target import FrozenTarget, load_causal_lm


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
    from safetensors.torch import save_file  # deferred: only the writer needs it, not `--help`
    from transformers import AutoConfig  # deferred: heavy import

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
