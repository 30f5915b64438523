"""Named evaluation sets measured during training: what ``SpeculativeDecodingCallback`` logs per set and mode.

Design and the logged keys: docs/design/design.md §7.7, §7.8."""

from __future__ import annotations

from collections.abc import Callable

import torch

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.decoding.stats import PromptDecodeRecord
from dspark_lightning.measuring.results import EvalSetSummary

PREFIX = "val/decode"


def metric_prefix(name: str, mode: str) -> str:
    """``val/decode/<set>/<mode>``: where one set's numbers in one mode are logged."""
    return f"{PREFIX}/{name}/{mode}"


def decode_eval_set(
    target,
    drafter,
    prompts: list[list[int]],
    mode: str,
    max_new_tokens: int,
    k: int,
    stop: Callable[[], bool] | None = None,
) -> list[PromptDecodeRecord] | None:
    """One greedy ``speculative_generate`` per prompt -> the records of the prompts that had a verify step, or None
    when ``stop()`` turned true (it is asked before each prompt: a prompt is the unit of work)."""
    device = drafter.backbone.fc.weight.device
    records = []
    for prompt in prompts:
        if stop is not None and stop():
            return None
        _, stats = speculative_generate(
            target, drafter, torch.tensor([prompt], device=device), max_new_tokens, mode=mode, k=k
        )
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
