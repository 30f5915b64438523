"""``dspark-lightning cache``: run the frozen target once over the packed dataset and write its features.

The format, the size estimate and the reader are ``dspark_lightning.data.cache`` (the data layer never loads a model);
this half builds the target, so it sits above both ``data`` and ``models``. Design: docs/design/data.md §6.2; the
teacher statistics it stores (from the stored final hidden state): docs/design/design.md §3.6, §11."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt

from dspark_lightning.checks import usable_device, write_json
from dspark_lightning.data.accounting import NoTrainableDataError
from dspark_lightning.data.cache import (
    CACHE_FORMAT,
    FEATURE_FIELDS,
    INDEX_NAME,
    SHARD_PATTERN,
    TEACHER_STAT_FIELDS,
    TOKEN_FIELDS,
    bytes_per_sample,
    format_bytes,
)
from dspark_lightning.data.cache_integrity import DIGEST, CacheDamagedError, shard_record, verify_cache
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.dtypes import torch_dtype
from dspark_lightning.errors import OptionError, loading
from dspark_lightning.models.architectures import check_config_supported, check_target_supported
from dspark_lightning.models.backbone import default_target_layer_ids
from dspark_lightning.models.target import FrozenTarget, final_logit_softcap, load_causal_lm
from dspark_lightning.models.teacher import full_vocab_stats
from dspark_lightning.progress import progress_bar


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

    if args.layers is not None and not args.layers:  # `[]` read as "the default" surprised; omitting it says that
        raise OptionError("--layers [] selects no target layers; omit --layers for the default spread")
    with loading("--target", args.target):
        config = AutoConfig.from_pretrained(args.target, trust_remote_code=args.trust_remote_code)
    check_config_supported(config)  # a target the decoding loop cannot serve: refused before any data pass
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
        format=args.format,
    )
    datamodule.check_sources("fit", options={"train": "--data"})  # every data file sniffed before the target loads
    data_format = datamodule.data_format.format  # resolved (and logged) from --format, the records and the tokenizer
    output = Path(args.output)
    settings = _settings(args, layer_ids)
    per_sample = bytes_per_sample(args.seq_len, config.hidden_size, len(layer_ids), args.dtype)
    shape = (f"S={args.seq_len}, {len(layer_ids)} layers x H={config.hidden_size} + final hidden, {args.dtype}, "
             "+ teacher logsumexp and argmax")  # fmt: skip
    if args.count_pass:
        count = sum(1 for _ in _packed_rows(datamodule, args.num_jobs, args.job_index, args.limit))
        if not count and not datamodule.data_stats("train")["rows"]:
            raise NoTrainableDataError(datamodule.no_rows_message("train"))  # before the target is loaded
        log(f"size estimate: {count} packed samples x {format_bytes(per_sample)} ({shape}) = "
            f"{format_bytes(count * per_sample)}")  # fmt: skip
    else:
        log(f"size estimate: {format_bytes(per_sample)} per packed sample ({shape}); count pass skipped")
    if args.dry_run:
        return {"bytes_per_sample": per_sample, **settings, "data_format": data_format}

    index_path = output / INDEX_NAME
    index = {"format": CACHE_FORMAT, **settings, "data_format": data_format, "hidden_size": config.hidden_size}
    index |= {"shards": [], "complete": False}
    if index_path.exists():
        previous = json.loads(index_path.read_text())
        different = {k: (previous.get(k), v) for k, v in settings.items() if previous.get(k) != v}
        if previous.get("data_format", "chat") != data_format:  # caches from before the record: conversations
            different["data_format"] = (previous.get("data_format", "chat"), data_format)
        if previous.get("format") != CACHE_FORMAT and not previous.get("complete"):
            different["format"] = (previous.get("format"), CACHE_FORMAT)  # shards without the teacher statistics
        if different:
            raise ValueError(f"{output} holds a cache written with other settings {different}; use a new --output")
        if previous.get("complete"):
            log(f"{output}: cache already complete ({sum(s['num_samples'] for s in previous['shards'])} samples)")
            return previous
        index = previous
    done = sum(shard["num_samples"] for shard in index["shards"])
    if done:
        log(f"resuming: {done} samples in {len(index['shards'])} finished shards are kept")

    device = usable_device(args.device)
    load_kwargs = {"device_map": args.device_map} if args.device_map else {}
    compute_dtype = "auto" if args.target_dtype == "auto" else getattr(torch, args.target_dtype)
    model = load_causal_lm(args.target, compute_dtype, args.trust_remote_code, **load_kwargs)
    if not args.device_map:
        model = model.to(device)
    check_target_supported(type(model), model.config)  # remote code: its class is known only now
    target = FrozenTarget(model, layer_ids)
    softcap = final_logit_softcap(target.config)  # the statistics are of the target's logits (soft-capped: Gemma 2)
    input_device = target.embed_tokens.weight.device
    output.mkdir(parents=True, exist_ok=True)
    store_dtype = torch_dtype(args.dtype)
    fields = (*TOKEN_FIELDS, *FEATURE_FIELDS, *TEACHER_STAT_FIELDS)
    pending: dict[str, list[torch.Tensor]] = {name: [] for name in fields}

    def flush_shard() -> None:
        count = sum(t.shape[0] for t in pending["input_ids"])
        if not count:
            return
        name = SHARD_PATTERN.format(len(index["shards"]))
        tensors = {key: torch.cat(values).contiguous() for key, values in pending.items()}
        partial = output / f"{name}.partial"  # renamed whole once written: a kill never leaves a short shard
        save_file(tensors, str(partial), metadata={"format": CACHE_FORMAT})
        os.replace(partial, output / name)
        index["shards"].append({"file": name, "num_samples": count, **shard_record(output / name)})
        write_json(index_path, index)  # renamed over the old one: never half a file
        for values in pending.values():
            values.clear()
        log(f"wrote {name} ({count} samples, {sum(s['num_samples'] for s in index['shards'])} in total)")

    def run_batch(rows: list[dict[str, torch.Tensor]]) -> None:
        batch = {key: torch.stack([row[key] for row in rows]) for key in TOKEN_FIELDS}
        features = target.features(batch["input_ids"].to(input_device), batch["position_ids"].to(input_device))
        for key, dtype in TOKEN_FIELDS.items():
            pending[key].append(batch[key].to(dtype))
        pending["context_features"].append(features.context_features.to(store_dtype).cpu())
        final_hidden = features.final_hidden.to(store_dtype)
        pending["final_hidden"].append(final_hidden.cpu())
        head = target.lm_head.weight  # from the stored (rounded) state, as training from the cache will read it
        logsumexp, argmax = full_vocab_stats(final_hidden.to(head.device), head, softcap=softcap)
        pending["final_logsumexp"].append(logsumexp.cpu())
        pending["final_argmax"].append(argmax.to(torch.int32).cpu())

    rows: list[dict[str, torch.Tensor]] = []
    in_shard = 0
    remaining = count - done if args.count_pass else None  # samples still to write (unknown without the count pass)
    with progress_bar("cache", remaining, "samples") as advance:
        for position, row in enumerate(_packed_rows(datamodule, args.num_jobs, args.job_index, args.limit)):
            if position < done:
                continue  # written by an earlier, interrupted run
            rows.append(row)
            in_shard += 1
            if len(rows) == args.batch_size or in_shard == args.shard_size:
                run_batch(rows)
                advance(len(rows))
                rows = []
            if in_shard == args.shard_size:
                flush_shard()
                in_shard = 0
        if rows:
            run_batch(rows)
            advance(len(rows))
    flush_shard()
    if not sum(s["num_samples"] for s in index["shards"]):  # an empty cache would only fail later, in fit
        raise NoTrainableDataError(datamodule.no_rows_message("train"))
    index["data_stats"] = datamodule.data_stats("train")
    index["complete"] = True
    write_json(index_path, index)  # renamed over the old one: never half a file
    total = sum(s["num_samples"] for s in index["shards"])
    size = sum((output / s["file"]).stat().st_size for s in index["shards"])
    log(f"cache complete: {total} samples in {len(index['shards'])} shards, {format_bytes(size)} at {output}")
    return index


def cache_command(
    target: str | None = None,
    data: list[str] | str | None = None,
    output: str | None = None,
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
    format: Literal["auto", "chat", "completion"] = "auto",
    verify: str | None = None,
) -> dict[str, Any]:
    """Run the frozen target once over packed conversations and store its features (train with no target).

    Args:
        target: hub id or local path of the target model (and tokenizer); required unless --verify
        data: local .json/.jsonl files, dirs, globs (quoted), or a hub id; one or a list; required unless --verify
        output: cache directory (index.json + features-NNNNN.safetensors); required unless --verify
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
        format: the records' format, as data.format: chat, completion (base models) or auto (docs/design/data.md §1.5)
        verify: instead of writing, check every shard of this cache directory against the sizes and BLAKE2b digests
            its index.json records, print a summary and exit with status 2 when one is damaged
    """
    if verify is not None:
        return verify_command(verify)
    missing = [name for name, value in (("target", target), ("data", data), ("output", output)) if value is None]
    if missing:
        raise OptionError(f"cache needs {', '.join('--' + m for m in missing)} (or --verify PATH to check a cache)")
    if not 0 <= job_index < num_jobs:
        raise OptionError(f"--job_index must be in [0, {num_jobs}), got {job_index}")
    if not device_map:
        usable_device(device)  # refused before the data is read and the target loads
    settings = dict(locals())
    settings["data"] = [data] if isinstance(data, str) else list(data)  # the resume check compares lists
    return write_cache(argparse.Namespace(**settings))


def verify_command(directory: str) -> dict[str, Any]:
    """``cache --verify``: every shard's size and digest against index.json; raises naming each damaged one."""
    path = Path(directory, INDEX_NAME)
    if not path.is_file():
        raise OptionError(f"--verify {directory}: not a target cache (no {INDEX_NAME})")
    result = verify_cache(directory, json.loads(path.read_text())["shards"])  # every shard, not the first damaged
    print(
        f"{directory}: {len(result['ok'])} shards match their recorded size and {DIGEST} digest, "
        f"{len(result['damaged'])} damaged, {len(result['unrecorded'])} without a recorded digest (an older cache)"
    )
    for line in result["damaged"]:
        print(f"  damaged: {line}")
    if result["damaged"]:
        raise CacheDamagedError(f"{directory}: {len(result['damaged'])} damaged shards (listed above)")
    return result
