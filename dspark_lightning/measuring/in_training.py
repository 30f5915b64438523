"""Named evaluation sets measured during training: what ``SpeculativeDecodingCallback`` logs per set and mode.

Design and the logged keys: docs/design/design.md §7.7, §7.8."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.decoding.stats import DecodeStats, PromptDecodeRecord
from dspark_lightning.measuring.eval_sets import is_prompt_file
from dspark_lightning.measuring.results import EvalSetSummary
from dspark_lightning.measuring.turns import Prompt, decode_turns, reply_ids

PREFIX = "val/decode"


def metric_prefix(name: str, mode: str) -> str:
    """``val/decode/<set>/<mode>``: where one set's numbers in one mode are logged; a prompt file's set is named
    by its file name without ``.jsonl[.gz]`` (``prompts/my_chat.jsonl`` -> ``my_chat``)."""
    label = os.path.basename(name).removesuffix(".gz").removesuffix(".jsonl") if is_prompt_file(name) else name
    return f"{PREFIX}/{label}/{mode}"


def decode_eval_set(
    target,
    drafter,
    prompts: list[Prompt],
    mode: str,
    max_new_tokens: int,
    k: int,
    stop: Callable[[], bool] | None = None,
) -> list[PromptDecodeRecord] | None:
    """One greedy ``speculative_generate`` per prompt (per turn of a ``Conversation``) -> the records of the prompts that had a verify step, or None
    when ``stop()`` turned true (it is asked before each prompt: a prompt is the unit of work)."""
    device = drafter.backbone.fc.weight.device
    records = []

    def turn(ids):  # greedy and lossless: the output is the target's own reply, which the next turn follows
        output, stats = speculative_generate(
            target, drafter, torch.tensor([ids], device=device), max_new_tokens, mode=mode, k=k
        )
        return stats, reply_ids(output, len(ids))

    for prompt in prompts:
        if stop is not None and stop():
            return None
        stats = DecodeStats.merge(decode_turns(prompt, turn))  # a multi-turn prompt: one record over its turns
        if stats.target_forwards > 0:
            records.append(PromptDecodeRecord.from_stats(stats))
    return records


def eval_set_metrics(summary: EvalSetSummary) -> dict[str, float]:
    """The scalars logged for one summary: tau, the two bounds of its interval and the number of prompts."""
    prefix = metric_prefix(summary.eval_set, summary.mode)
    low, high = summary.measured_tau_ci
    return {
        f"{prefix}/tau": float(summary.measured_tau),
        f"{prefix}/tau_ci_low": float(low),
        f"{prefix}/tau_ci_high": float(high),
        f"{prefix}/num_prompts": float(summary.num_prompts),
    }
