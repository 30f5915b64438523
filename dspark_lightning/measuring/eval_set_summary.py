"""One evaluation set's decoding results, pooled over its prompts with bootstrap intervals (``EvalSetSummary``).

Each prompt contributes one :class:`PromptDecodeRecord`. Measured tau and speedup are ratios of sums over prompts
(see ``intervals.py``); ``acceptance_per_slot[k]`` is the fraction of all verification steps in which drafted slot
``k`` was accepted (so slot k's rate counts every step, including those that verified fewer than k + 1 slots, and
the rates sum to the mean number of accepted drafted tokens per step). Pure functions: nothing is read or written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from dspark_lightning.decoding.stats import PromptDecodeRecord
from dspark_lightning.measuring.intervals import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    ratio_bootstrap_ci,
    ratio_of_sums,
)
from dspark_lightning.measuring.results import EvalSetSummary, Schedule


def _as_record(record: PromptDecodeRecord | Mapping) -> PromptDecodeRecord:
    return record if isinstance(record, PromptDecodeRecord) else PromptDecodeRecord(**record)


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else float(value)


def acceptance_per_slot(records: Iterable[PromptDecodeRecord]) -> list[float]:
    """Per drafted slot: accepted steps / all verification steps, pooled over the prompts."""
    records = list(records)
    forwards = sum(r.target_forwards for r in records)
    slots = max((len(r.accepted_per_slot) for r in records), default=0)
    # a prompt's list stops at its longest accepted prefix: the slots after it were accepted in none of its steps
    accepted = [sum(r.accepted_per_slot[k] for r in records if k < len(r.accepted_per_slot)) for k in range(slots)]
    return [count / forwards for count in accepted]


def summarize_eval_set(
    name: str,
    per_prompt_records: Iterable[PromptDecodeRecord | Mapping],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    mode: str | None = None,
    threshold: Schedule = None,
    max_new_tokens: int | None = None,
) -> EvalSetSummary:
    """The summary of evaluation set ``name`` (decoded in ``mode`` and schedule ``threshold``) from its per-prompt
    records (dataclasses or their dicts). Its speedup fields are None when no prompt was timed, the packed ones
    unless every prompt timed ``generate`` on packed kernels too; floats are never NaN (None instead)."""
    records = [_as_record(record) for record in per_prompt_records]
    if not records:
        raise ValueError(f"eval set {name!r}: no per-prompt records to summarize")
    timed = [record.has_timing for record in records]
    if any(timed) and not all(timed):
        raise ValueError(f"eval set {name!r}: {timed.count(False)} of {len(records)} prompts have no timing")
    settings = dict(confidence=confidence, resamples=resamples, seed=seed)
    emitted = [record.emitted_tokens for record in records]
    forwards = [record.target_forwards for record in records]
    speedup, speedup_ci = None, None
    if all(timed):
        baseline = [record.baseline_seconds for record in records]
        speculative = [record.speculative_seconds for record in records]
        speedup = _json_float(ratio_of_sums(baseline, speculative))
        speedup_ci = [_json_float(bound) for bound in ratio_bootstrap_ci(baseline, speculative, **settings)]
    packed_speedup, packed_ci = None, None
    if records[0].packed_generate_seconds is not None:
        if any(record.packed_generate_seconds is None for record in records):
            raise ValueError(f"eval set {name!r}: some prompts have packed_generate_seconds and some do not")
        packed_seconds = [record.packed_generate_seconds for record in records]
        packed_speedup = _json_float(ratio_of_sums(packed_seconds, speculative))
        packed_ci = [_json_float(bound) for bound in ratio_bootstrap_ci(packed_seconds, speculative, **settings)]
    compared = [record.outputs_equal for record in records if record.outputs_equal is not None]
    return EvalSetSummary(
        eval_set=name,
        num_prompts=len(records),
        measured_tau=_json_float(ratio_of_sums(emitted, forwards)),
        measured_tau_ci=[_json_float(bound) for bound in ratio_bootstrap_ci(emitted, forwards, **settings)],
        acceptance_per_slot=[_json_float(rate) for rate in acceptance_per_slot(records)],
        speedup=speedup,
        speedup_ci=speedup_ci,
        speedup_vs_packed_generate=packed_speedup,
        speedup_vs_packed_generate_ci=packed_ci,
        outputs_equal=all(compared) if compared else None,
        output_ties=sum(record.output_tie for record in records),  # differences from generate by a float tie
        ci_confidence=confidence,
        mode=mode,
        threshold=list(threshold) if isinstance(threshold, tuple) else threshold,
        max_new_tokens=max_new_tokens,
    )
