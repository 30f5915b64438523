"""Measured decoding on named evaluation sets: per set and mode, tau and speedup with bootstrap intervals over prompts.

The sets are ``measuring/eval_sets.py`` (``sharegpt_heldout``: held-out conversation prompts; ``humaneval``: the 164
HumanEval problems); each (set, mode, schedule) is an ``EvalSetRow``: the ``decode_table`` row and the set's
``EvalSetSummary`` (measured tau and speedup with their intervals, acceptance per slot).
"""

from __future__ import annotations

from dspark_lightning.measuring.eval_set_summary import summarize_eval_set
from dspark_lightning.measuring.eval_sets import datamodule_prompt_ids
from dspark_lightning.measuring.results import EvalSetRow, MeasuredRow
from dspark_lightning.measuring.tables import (
    compact_table,
    decode_plan,
    decode_table,
    schedule_label,
    table_console,
)

DEFAULT_MAX_NEW_TOKENS = 128  # at least 128 new tokens: 64 leaves too few verify steps per prompt to steer by


def measure_eval_sets(
    module,
    data,
    names: list[str],
    modes: list[str],
    schedules: list,
    *,
    temperature: float,
    max_new_tokens: int,
    k: int,
    limit: int | None = None,
    baseline: bool = True,
    packed_verify: bool = False,
    heldout_files: str | None = None,
    heldout_split: dict[str, float] | None = None,
    on_rows=None,
) -> list[EvalSetRow]:
    """One row per (set, mode, schedule): the decode row and the set's summary with 95% intervals over prompts.
    ``on_rows``: called with every set's rows so far after each row (a partial ``--json`` that survives a stop)."""
    rows = []
    for name in names:
        prompts = datamodule_prompt_ids(data, name, limit, heldout_files, heldout_split)
        _, plan = decode_plan(len(prompts), len(modes), len(schedules), max_new_tokens, baseline, packed_verify)
        print(f"eval set {name}: {plan}", flush=True)

        def finished(set_rows: list[MeasuredRow], name: str = name) -> None:
            row = set_rows[-1]
            summary = summarize_eval_set(
                name, row.prompt_records, mode=row.mode, threshold=row.threshold, max_new_tokens=max_new_tokens
            )
            rows.append(EvalSetRow(summary=summary, decoded=row))
            if on_rows is not None:
                on_rows(rows)

        decode_table(
            module, prompts, modes, temperature, schedules, max_new_tokens, k, baseline=baseline,
            packed_verify=packed_verify, progress=f"eval set {name}", on_rows=finished,
        )  # fmt: skip
    return rows


def _interval(value, interval, digits: int, suffix: str = "") -> str:
    if value is None:
        return "-"
    low, high = interval
    return f"{value:.{digits}f}{suffix} [{low:.{digits}f}, {high:.{digits}f}]"


def print_eval_set_table(rows: list[EvalSetRow]) -> None:
    """The eval-set rows as one rich table, a row per line (everything else is in the JSON)."""
    summaries = [row.summary for row in rows]
    confidence = summaries[0].ci_confidence if summaries else 0.95
    table = compact_table(f"measured decoding per eval set ({confidence:.0%} bootstrap intervals over prompts)")
    packed = any(s.speedup_vs_packed_generate is not None for s in summaries)
    columns = ("eval set", "mode", "sched.", "n", "tau [CI]", "speedup [CI]", "= gen.")
    for column in columns + (("vs packed gen. [CI]",) if packed else ()):
        # an interval cut over two lines, or a set name cut short, reads as a different number
        table.add_column(column, justify="left" if column in ("eval set", "mode") else "right", no_wrap=True)
    for s in summaries:
        equal = s.outputs_equal
        packed_cell = (_interval(s.speedup_vs_packed_generate, s.speedup_vs_packed_generate_ci, 2, "x"),)
        table.add_row(
            s.eval_set,
            s.mode,
            schedule_label(s.threshold),
            str(s.num_prompts),
            _interval(s.measured_tau, s.measured_tau_ci, 2),
            _interval(s.speedup, s.speedup_ci, 2, "x"),
            "-" if equal is None else ("yes" if equal else "[bold red]NO[/]"),
            *(packed_cell if packed else ()),
        )
    table_console().print(table)
