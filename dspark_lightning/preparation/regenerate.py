"""On-policy data (``dspark-lightning regenerate``): every assistant turn of a conversation dataset rewritten with the
target's own replies, or, for a base model without a chat template (``--format completion``,
``regenerate_completion.py``), completion records of plain-text prompts and the target's own continuations.
The records, resuming, jobs and counting: docs/design/data.md §6.1; usage: docs/guides/on_policy_data.md.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt

from dspark_lightning.checks import usable_device
from dspark_lightning.data.records import RawRecord, iter_local_records, limit_shards
from dspark_lightning.data.shard_writer import ResumableShardWriter
from dspark_lightning.data.sharegpt import IdSplit, InvalidRecord, conversation_id, resolve_source, to_conversation
from dspark_lightning.errors import OptionError, loading
from dspark_lightning.preparation.greedy import sampling_options
from dspark_lightning.preparation.regenerate_chat import GreedyRegenerator
from dspark_lightning.preparation.regenerate_completion import (
    PROMPT_KINDS,
    GreedyContinuation,
    code_chat_prompts,
    read_prompt_records,
    record_prompts,
    regenerate_format,
)
from dspark_lightning.progress import progress_bar, stop_on_sigterm

__all__ = ["GreedyRegenerator", "ResumableShardWriter", "read_conversations", "regenerate", "regenerate_command"]


def read_raw_records(data: str | Sequence[str]) -> Iterable[RawRecord]:
    """The raw records of ``data`` in order (local files with file and line, or a streamed hub dataset)."""
    source = resolve_source(data, option="--data")
    if source.is_hub:
        from datasets import load_dataset

        with loading("--data", source.hub_id):
            rows = load_dataset(source.hub_id, source.hub_config, split=source.hub_split, streaming=True)
        return (RawRecord(row, source.describe(), None) for row in rows)
    return iter_local_records(limit_shards(source.files, None))


def read_conversations(data: str | Sequence[str], counts: Counter) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """``(id, messages)`` of every valid record of ``data`` in order; invalid ones are counted by reason."""
    for raw in read_raw_records(data):
        try:
            messages = to_conversation(raw).messages
        except InvalidRecord as bad:
            counts[f"bad_record:{bad.reason}"] += 1
            continue
        yield conversation_id(raw.record, messages), messages


def regenerate(
    target: str,
    data: str | Sequence[str],
    output: str | os.PathLike,
    *,
    max_new_tokens: int = 512,
    batch_size: int = 8,
    limit: int | None = None,
    shard_size: int = 1000,
    max_prompt_tokens: int | None = 4096,
    trust_remote_code: bool = False,
    device: str | None = None,
    dtype: str = "auto",
    template_kwargs: dict[str, Any] | None = None,
    model: Any = None,
    tokenizer: Any = None,
    num_jobs: int = 1,
    job_index: int = 0,
    max_turns: int | None = None,
    split: str = "train",
    split_by_id: dict[str, float] | None = None,
    format: str = "auto",
    prompts: Sequence[str] | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    engine: str = "hf",
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    vllm_python: str | None = None,
) -> dict[str, Any]:
    """Regenerate ``data`` with ``target`` into ``output`` (resumable); returns a summary of what was done.

    With ``split_by_id`` (e.g. ``{"validation": 0.02, "test": 0.02}``) only the records that :class:`IdSplit` puts in
    ``split`` are regenerated, and shards are named ``<split>-NNNNN.jsonl``; ``max_turns`` stops each conversation
    after that many regenerated replies. ``format``: ``chat`` rewrites assistant turns, ``completion`` writes
    completion records of the ``prompts`` kinds (``regenerate_completion.py``, default both), ``auto`` is chat for a
    target with a chat template and completion for one without. ``prompts=["code"]`` with chat answers each
    conversation's code prompt asked in HumanEval's chat form instead (``code_chat_prompts``). ``temperature`` > 0
    samples the replies (with ``top_p``, ``top_k``; torch's generator seeded with ``seed``) instead of greedy.
    ``engine="vllm"`` generates through vLLM (``interop.vllm_engine``; ``tensor_parallel_size``, ``data_parallel_size``
    passed to it, ``vllm_python`` or ``DSPARK_VLLM_PYTHON`` its interpreter; sampled replies seeded per prompt)."""
    if engine not in ("hf", "vllm"):
        raise OptionError(f"--engine must be hf or vllm, got {engine!r}")
    if engine == "hf" and (tensor_parallel_size, data_parallel_size) != (1, 1):
        raise OptionError("--tensor_parallel_size and --data_parallel_size are vLLM's: give --engine vllm too")
    sampling = sampling_options(temperature, top_p, top_k)
    id_split = IdSplit.from_fractions(split_by_id)
    if split not in ("train", "validation", "test"):
        raise OptionError(f"--split must be train, validation or test, got {split!r}")
    if not 0 <= job_index < num_jobs:  # checked before the model loads
        raise OptionError(f"--job_index must be in [0, {num_jobs}), got {job_index}")
    source = resolve_source(data, option="--data")  # a glob matching nothing fails before the model or --output
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = usable_device(device)  # refused before the model loads
    if tokenizer is None:
        with loading("--target", target):
            tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)
    data_format = regenerate_format(format, tokenizer, target)  # before the model loads: never an invented template
    if data_format == "completion" and max_turns is not None:
        raise OptionError("--max_turns counts chat replies; --format completion writes one continuation per prompt")
    if data_format == "chat" and prompts is not None and list(prompts) != ["code"]:
        raise OptionError(
            f"--prompts {list(prompts)} with --format chat: chat takes '[code]' (each conversation's code prompt asked "
            "in HumanEval's chat form) or no --prompts (every assistant turn rewritten; --max_turns 1 for first turns)"
        )
    if model is None and engine == "vllm":
        from dspark_lightning.interop.serve_check import vllm_interpreter
        from dspark_lightning.interop.vllm_engine import VllmGenerator

        vllm_interpreter(vllm_python)  # a missing interpreter is one line before vLLM starts
        vllm_dtype = {"auto": "bfloat16" if device.startswith("cuda") else "float32"}.get(dtype, dtype)
        model = VllmGenerator(
            target, dtype=vllm_dtype, max_model_len=(max_prompt_tokens or 4096) + max_new_tokens + 8, seed=seed,
            tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
            trust_remote_code=trust_remote_code, vllm_python=vllm_python,
        )  # fmt: skip
    if model is None:
        torch_dtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32}.get(dtype)
        torch_dtype = torch_dtype or getattr(torch, dtype)
        with loading("--target", target):
            model = AutoModelForCausalLM.from_pretrained(target, dtype=torch_dtype, trust_remote_code=trust_remote_code)
        model = model.to(device).eval()
    if sampling is not None:
        torch.manual_seed(seed)  # one seed per run: the same command samples the same replies
    try:
        return _regenerate_into(
            model, tokenizer, data, output, source, data_format, sampling, seed, max_new_tokens, batch_size, limit,
            shard_size, max_prompt_tokens, template_kwargs, num_jobs, job_index, max_turns, split, id_split, prompts,
        )  # fmt: skip
    finally:
        if callable(getattr(model, "close", None)):
            model.close()  # the vLLM worker process


def _regenerate_into(
    model,
    tokenizer,
    data,
    output,
    source,
    data_format,
    sampling,
    seed,
    max_new_tokens,
    batch_size,
    limit,
    shard_size,
    max_prompt_tokens,
    template_kwargs,
    num_jobs,
    job_index,
    max_turns,
    split,
    id_split,
    prompts,
) -> dict[str, Any]:
    """``regenerate`` once its options are checked and its model (or engine) is ready."""
    base = f"{split}-"
    prefix = base if num_jobs == 1 else f"{base}{job_index:03d}of{num_jobs:03d}-"
    writer = ResumableShardWriter(output, shard_size, prefix)
    counts: Counter = Counter()
    already = len(writer.done_ids)
    batch: list[tuple[str, Any]] = []
    if data_format == "completion":
        regenerator: Any = GreedyContinuation(model, tokenizer, max_new_tokens, max_prompt_tokens, sampling)
        unit = "prompts"

        def mine(counter: Counter) -> Iterator[tuple[str, str]]:
            records = job_conversations(data, counter, id_split, split, num_jobs, job_index, read_prompt_sources)
            return record_prompts(records, PROMPT_KINDS if prompts is None else prompts, counter)
    else:
        regenerator = GreedyRegenerator(
            model, tokenizer, max_new_tokens, max_prompt_tokens, template_kwargs, max_turns, sampling
        )
        unit = "conversations"

        def mine(counter: Counter) -> Iterator[tuple[str, list[dict[str, str]]]]:
            conversations = job_conversations(data, counter, id_split, split, num_jobs, job_index)
            return conversations if prompts is None else code_chat_prompts(conversations, counter)

    if limit is not None:  # the bar counts records written, up to the limit
        total, unit = max(0, limit - already), "records"
    else:  # the bar counts this job's conversations (prompts) still to do (unknown for a streamed hub dataset)
        total = None if source.is_hub else sum(i not in writer.done_ids for i, _ in mine(Counter()))
    with progress_bar("regenerate", total, unit) as advance, stop_on_sigterm("regenerate") as stop_requested:

        def flush() -> None:
            records = regenerator.regenerate_batch(batch, counts)
            writer.write(records)
            counts["written"] += len(records)
            advance(len(records) if limit is not None else len(batch))
            batch.clear()

        for identifier, messages in mine(counts):
            if stop_requested():  # between batches: what is written is whole, and a rerun continues from it
                break
            if limit is not None and len(writer.done_ids) >= limit:
                break
            if identifier in writer.done_ids or any(identifier == b[0] for b in batch):
                counts["skipped_already_done"] += 1
                continue
            batch.append((identifier, messages))
            # --limit counts records written: a batch asks for no more than are still wanted, and a conversation
            # that yields no record (its prompt over max_prompt_tokens, say) leaves room for the next batch
            wanted = batch_size if limit is None else min(batch_size, limit - len(writer.done_ids))
            if len(batch) >= wanted:
                flush()
        if batch and not stop_requested():
            flush()
        stopped = stop_requested()
    summary = {"output": str(output), "format": data_format, "records_before": already}
    summary["sampling"] = "greedy" if sampling is None else {**vars(sampling), "seed": seed}
    summary["records_after"] = len(writer.done_ids)
    if writer.removed_bytes:
        summary["removed_partial_bytes"] = writer.removed_bytes
    if stopped:
        summary["stopped"] = "SIGTERM: rerun the same command to continue"
    return {**summary, **counts}


def read_prompt_sources(data: str | Sequence[str], counts: Counter) -> Iterator[tuple[str, list | str]]:
    """Conversations and completion records of ``data`` (``--format completion``'s input), invalid ones counted."""
    return read_prompt_records(read_raw_records(data), counts)


def job_conversations(
    data,
    counts: Counter,
    id_split: IdSplit | None,
    split: str,
    num_jobs: int,
    job_index: int,
    reader: Callable[[Any, Counter], Iterator[tuple[str, Any]]] = read_conversations,
) -> Iterator[tuple[str, Any]]:
    """The valid records of ``data`` (``reader``: conversations by default) that ``id_split`` puts in ``split`` and
    that fall to job ``job_index`` of ``num_jobs`` (the split's records dealt out in turn), in order."""
    ordinal = -1
    for identifier, messages in reader(data, counts):
        if id_split is not None and id_split.split_of(identifier) != split:
            counts["skipped_other_split"] += 1
            continue
        ordinal += 1  # jobs share out the records of this split
        if ordinal % num_jobs == job_index:
            yield identifier, messages


def regenerate_command(
    target: str,
    data: list[str] | str,
    output: str,
    max_new_tokens: PositiveInt = 512,
    batch_size: PositiveInt = 8,
    limit: PositiveInt | None = None,
    shard_size: PositiveInt = 1000,
    max_prompt_tokens: PositiveInt = 4096,
    device: str | None = None,
    dtype: str = "auto",
    chat_template_kwargs: dict | None = None,
    num_jobs: PositiveInt = 1,
    job_index: NonNegativeInt = 0,
    trust_remote_code: bool = False,
    max_turns: PositiveInt | None = None,
    split: Literal["train", "validation", "test"] = "train",
    split_by_id: dict[str, float] | None = None,
    format: Literal["auto", "chat", "completion"] = "auto",
    prompts: list[Literal["first_turn", "code"]] | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: NonNegativeInt = 0,
    seed: int = 0,
    engine: Literal["hf", "vllm"] = "hf",
    tensor_parallel_size: PositiveInt = 1,
    data_parallel_size: PositiveInt = 1,
    vllm_python: str | None = None,
) -> dict[str, Any]:
    """Rewrite the assistant turns of a conversation dataset with the target's own greedy replies (on-policy data).

    Args:
        target: hub id or local path of the target model (and tokenizer)
        data: local .json/.jsonl files, dirs, globs (quoted), or a hub id; one or a list
        output: directory for train-NNNNN.jsonl shards
        max_new_tokens: longest reply generated per assistant turn
        batch_size: prompts generated together
        limit: total records wanted in output (resume-aware)
        shard_size: records per output shard
        max_prompt_tokens: stop a conversation at longer prompts
        device: default: cuda if available, else cpu
        dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, ...
        chat_template_kwargs: passed to the chat template, e.g. {"enable_thinking": false}
        num_jobs: split the records over this many parallel jobs
        job_index: which of num_jobs this process is (0-based)
        trust_remote_code: let transformers run the target's own modelling code
        max_turns: regenerate at most this many replies per record
        split: the split to regenerate (with split_by_id)
        split_by_id: fractions of conversations held out by id, e.g. {"validation": 0.02, "test": 0.02}
        format: chat (rewrite assistant turns), completion (base models: plain-text prompts and the target's greedy
            continuations), auto (chat when the target has a chat template, else completion)
        prompts: with completion: prompts made of each conversation, first_turn and/or code (default: both); with
            chat: [code] answers each conversation's code prompt asked in HumanEval's chat form
        temperature: 0 = greedy replies; > 0 samples them (DeepSpec's recipe: 0.7 with top_p 0.8, top_k 20)
        top_p: with temperature > 0: nucleus sampling over this probability mass (1 = off)
        top_k: with temperature > 0: sample among the k most likely tokens (0 = off)
        seed: with temperature > 0: torch's seed (vLLM: the first prompt's, then one more per prompt), so the same
            command samples the same replies
        engine: hf (transformers generate, in this process) or vllm (vLLM's offline LLM.generate in the interpreter
            of --vllm_python / $DSPARK_VLLM_PYTHON; the same prompts, files, resume and counts)
        tensor_parallel_size: with --engine vllm: GPUs the target is split over
        data_parallel_size: with --engine vllm: engine replicas
        vllm_python: with --engine vllm: a Python interpreter with vLLM (default: $DSPARK_VLLM_PYTHON)
    """
    summary = regenerate(
        target,
        data,
        output,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        limit=limit,
        shard_size=shard_size,
        max_prompt_tokens=max_prompt_tokens,
        trust_remote_code=trust_remote_code,
        device=device,
        dtype=dtype,
        template_kwargs=chat_template_kwargs,
        num_jobs=num_jobs,
        job_index=job_index,
        max_turns=max_turns,
        split=split,
        split_by_id=split_by_id,
        format=format,
        prompts=prompts,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        engine=engine,
        tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size,
        vllm_python=vllm_python,
    )
    print(json.dumps(summary, indent=2))
    if "stopped" in summary:
        raise SystemExit(143)  # 128 + SIGTERM, as if the signal had ended it: a `regenerate && ...` chain stops
    return summary
