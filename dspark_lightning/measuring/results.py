"""What measuring a drafter produces, as types: a decoded row (``MeasuredRow``), its timing against ``generate``
(``GenerateComparison``, ``Spread``, ``PackedBaseline``), ``measure_speedup``'s result (``SpeedupResult``), an eval
set's pooled numbers (``EvalSetSummary``, ``EvalSetRow``). ``to_json`` writes them tagged ``"schema"``, ``from_json``
reads them back strictly; a file written before the schema is one flat dict, from which each type takes its keys.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dspark_lightning.decoding.stats import DecodeStats, PromptDecodeRecord

SCHEMA_VERSION = 1
T = TypeVar("T")

Schedule = float | list | None
"""A verify schedule: None (whole blocks), a confidence threshold, or ``["cost", t0, t1]`` (the cost model)."""


@dataclass
class Spread:
    """The noise of one timed measurement, from its per-prompt numbers (``measuring.speedup.spread``)."""

    prompt_speedup_iqr: float
    """Interquartile range of the per-prompt speedups."""
    baseline_tokens_per_second_median: float
    """Median over prompts of ``generate``'s tokens/s."""
    baseline_tokens_per_second_iqr: float
    """Its interquartile range."""
    baseline_relative_spread: float
    """IQR / median of ``generate``'s tokens/s: the same target on every prompt, so it should barely move."""
    noisy: bool
    """``baseline_relative_spread`` above ``NOISE_LIMIT`` (or not measured): a wall clock not to trust."""
    load_average: list[float] | None
    """``os.getloadavg()`` (1, 5, 15 minutes) when the measurement ended; None where the platform has none."""
    torch_threads: int | None = None
    """Threads the target, the drafter and the baseline ran on (not recorded before decode rows kept it)."""
    prompt_speedups: list[float] = field(default_factory=list)
    """Per prompt: baseline seconds / speculative seconds (kept by ``measure_speedup``, not by decode rows before
    schema 1)."""
    baseline_prompt_tokens_per_second: list[float] = field(default_factory=list)
    """Per prompt: ``generate``'s tokens/s."""


@dataclass
class PackedBaseline:
    """The second baseline of ``packed_verify``: ``generate`` on the packed kernels the verify forwards use."""

    packed_generate_seconds: float
    """Its seconds over every prompt."""
    speedup_vs_packed_generate: float
    """``packed_generate_seconds`` / speculative seconds: what speculation gains on the same kernels."""
    packed_generate_mismatches: list[int]
    """Prompts where it differed from ``generate`` on the default kernels (a near-tie resolved the other way)."""


@dataclass
class GenerateComparison:
    """Speculative decoding timed against the target's greedy ``generate``, prompt by prompt, outputs compared."""

    speedup: float
    """Total ``generate`` seconds / total speculative seconds (sampled: each prompt's ``generate`` seconds per token
    times the speculative run's tokens, so a ratio of seconds per token)."""
    median_prompt_speedup: float
    """Median over prompts of the per-prompt speedup."""
    baseline_tokens_per_second: float
    """``generate``'s new tokens / its seconds, over every prompt."""
    outputs_equal: bool | None
    """Every output equals ``generate``'s token for token, or differs from it by a float tie only; None: sampled
    (T > 0), two samples are not compared."""
    mismatches: list[int]
    """Prompts whose output differs by more than a float tie (greedy decoding must be lossless)."""
    ties: list[int] = field(default_factory=list)
    """Prompts whose output differs by a float tie at the first differing token (``measuring.ties``; older files
    counted every difference in ``mismatches``)."""
    differences: list[dict] = field(default_factory=list)
    """Per differing prompt: its index, ``kind`` (``tie`` or ``error``), position, logit gap and tolerance."""
    spread: Spread | None = None
    """The measurement's noise (None in files written before it was measured)."""
    packed: PackedBaseline | None = None
    """With ``packed_verify``: the baseline on the packed kernels."""


@dataclass
class SpeedupResult:
    """``measure_speedup``: greedy speculative decoding timed against ``generate`` over a list of prompts."""

    mode: str
    k: int
    confidence_threshold: float | None
    cost_model: list[float] | None
    """(t0, t1) of the cost-model schedule, seconds; None: whole blocks or a threshold."""
    drafter_cache: bool
    prompts: int
    """How many prompts were timed."""
    max_new_tokens: int
    new_tokens: int
    """Tokens the speculative runs emitted."""
    baseline_new_tokens: int
    """Tokens ``generate`` emitted."""
    baseline_seconds: float
    speculative_seconds: float
    speculative_tokens_per_second: float
    tau: float
    """Tokens per target forward, pooled over the prompts."""
    target_forwards: int
    mean_verified: float
    """Drafted tokens sent to verification per step."""
    accepted_rate_per_slot: list[float]
    phase_ms_per_step: dict[str, float]
    """Milliseconds per step in each phase (``decoding.stats.PHASES`` but prefill)."""
    prefill_seconds: float
    baseline_prompt_seconds: list[float]
    speculative_prompt_seconds: list[float]
    comparison: GenerateComparison
    packed_verify: bool = False
    """The verify forwards ran on packed kernels (``comparison.packed`` then holds the second baseline)."""
    dtype: str | None = None
    """The target's dtype (the baseline runs in the same one)."""
    prompt_records: list[PromptDecodeRecord] = field(default_factory=list)
    """Each prompt's record (a prompt with no verify step has none): the input of ``summarize_eval_set``."""
    stats: DecodeStats | None = field(default=None, compare=False, metadata={"json": False})
    """The merged ``DecodeStats`` of the speculative runs; never written (its numbers are the fields above)."""


@dataclass
class MeasuredRow:
    """One mode and schedule decoded over a list of prompts (``tables.decode_table``)."""

    mode: str
    threshold: Schedule
    """The schedule (``Schedule``)."""
    tau: float
    tokens_per_second: float
    """The speculative run's new tokens / its seconds."""
    mean_verified: float
    accepted_rate_per_slot: list[float]
    phase_ms_per_step: dict[str, float]
    prompt_records: list[PromptDecodeRecord] = field(default_factory=list)
    """Each prompt's record (none in decode files written before they were kept)."""
    prompts_without_verify: int | None = None
    """Prompts whose first token ended them: no verify step, so no tau; not in ``prompt_records``."""
    comparison: GenerateComparison | None = None
    """With ``baseline`` (greedy only): the timing against ``generate``."""
    dtype: str | None = None
    """The target's dtype."""
    temperature: float | None = None
    """0: greedy; what ``decode --json`` records beside each row."""
    machine: dict | None = None
    """``machine.machine_description()`` where the row was measured (``decode --json``)."""
    verify_length: dict | None = None
    """With ``decode --cost_model``: ``best_verify_length`` for this row's measured acceptance."""


@dataclass
class EvalSetSummary:
    """One evaluation set decoded in one mode and schedule, pooled over its prompts with bootstrap intervals."""

    eval_set: str
    num_prompts: int
    measured_tau: float | None
    """Total emitted / total target forwards (None where not finite)."""
    measured_tau_ci: list[float | None]
    """[low, high]: paired percentile bootstrap over prompts."""
    acceptance_per_slot: list[float | None]
    """Per drafted slot: accepted steps / all verification steps."""
    speedup: float | None
    """Total ``generate`` seconds / total speculative seconds; None when no prompt was timed."""
    speedup_ci: list[float | None] | None
    outputs_equal: bool | None
    """Every compared prompt equal (float ties count as equal); None when none was compared."""
    ci_confidence: float
    output_ties: int = 0
    """Prompts that differed from ``generate`` by a float tie only (older files counted none apart)."""
    speedup_vs_packed_generate: float | None = None
    speedup_vs_packed_generate_ci: list[float | None] | None = None
    mode: str | None = None
    threshold: Schedule = None
    max_new_tokens: int | None = None


@dataclass
class EvalSetRow:
    """``measure_eval_sets``: one (set, mode, schedule) decoded, and its summary."""

    summary: EvalSetSummary
    decoded: MeasuredRow | None
    """The decode row; None in recipe reports written before schema 1, which kept the summary only."""


def to_json(result) -> dict:
    """``result`` (any type of this module) as a JSON-ready dict tagged with ``SCHEMA_VERSION``."""
    return {"schema": SCHEMA_VERSION, **_plain(result)}


def from_json(cls: type[T], data: Mapping, where: str = "result") -> T:
    """A ``cls`` from ``to_json``'s dict, or from a flat pre-schema one. ``where`` names the data in errors (a file,
    a row). Raises ``ValueError`` on a newer schema, a key ``cls`` does not have, or a missing field."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object for {cls.__name__}, got {type(data).__name__}")
    schema = data.get("schema")
    if schema is None:
        return _build(cls, data, where, flat=True)
    if schema != SCHEMA_VERSION:
        raise ValueError(f"{where}: schema {schema} (this version reads {SCHEMA_VERSION} and pre-schema files)")
    return _build(cls, {key: value for key, value in data.items() if key != "schema"}, where, flat=False)


def read_eval_set_rows(path: str | os.PathLike) -> list[EvalSetRow]:
    """The rows of a ``decode --eval_sets ... --json`` file (this schema's or a pre-schema one), each with the
    context ``decode`` wrote beside it (``decoded.dtype``, ``temperature``, ``machine``)."""
    rows = json.loads(Path(path).read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected the JSON list decode --json writes, got {type(rows).__name__}")
    return [from_json(EvalSetRow, row, f"{path} row {index}") for index, row in enumerate(rows)]


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.metadata.get("json", True)
        }
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _dataclass_of(hint) -> type | None:
    """The dataclass in ``X`` or ``X | None``, else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [arg for arg in typing.get_args(hint) if dataclasses.is_dataclass(arg)]
        return found[0] if found else None
    return None


def _build(cls, data: Mapping, where: str, *, flat: bool):
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    written = [f for f in dataclasses.fields(cls) if f.metadata.get("json", True)]
    for f in written:
        hint = hints[f.name]
        nested = _dataclass_of(hint)
        if nested is not None:
            if flat:  # a pre-schema row: the nested type's fields sit beside this one's
                required = [g.name for g in dataclasses.fields(nested) if _required(g)]
                if all(name in data for name in required):
                    kwargs[f.name] = _build(nested, data, where, flat=True)
                elif nested is hint:
                    raise ValueError(f"{where}: {cls.__name__} needs the {nested.__name__} fields {required}")
                else:
                    kwargs[f.name] = None  # an optional part this row never measured
            elif data.get(f.name) is not None:
                kwargs[f.name] = _build(nested, data[f.name], f"{where}.{f.name}", flat=False)
            elif nested is hint:
                raise ValueError(f"{where}: {cls.__name__} needs {f.name!r}, which is missing")
            else:
                kwargs[f.name] = None
            continue
        if f.name not in data:
            if _required(f):
                raise ValueError(f"{where}: {cls.__name__} needs {f.name!r}, which is missing")
            continue
        value = data[f.name]
        if typing.get_origin(hint) is list and typing.get_args(hint)[:1] == (PromptDecodeRecord,):
            value = [item if isinstance(item, PromptDecodeRecord) else PromptDecodeRecord(**item) for item in value]
        elif value is None and hint is float:
            value = math.nan  # strict JSON writes a non-finite float as null
        kwargs[f.name] = value
    if not flat:
        unknown = sorted(set(data) - {f.name for f in written})
        if unknown:
            raise ValueError(f"{where}: {cls.__name__} has no field {unknown[0]!r} (schema {SCHEMA_VERSION})")
    return cls(**kwargs)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
