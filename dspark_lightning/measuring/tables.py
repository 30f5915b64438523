"""Speculative decoding measured per mode and schedule, and its tables (``decode`` prints them, the reports read them).

A row: tau = tokens per target forward, tokens/s, mean verified length, the accepted rate per slot and the time per
phase; with ``baseline`` also the target's own ``generate`` timed alternately and the outputs compared.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext

import torch

from dspark_lightning.decoding import DecodeStats, speculative_generate
from dspark_lightning.decoding.stats import PromptDecodeRecord
from dspark_lightning.measuring.cost import best_verify_length
from dspark_lightning.measuring.results import MeasuredRow
from dspark_lightning.measuring.speedup import measure_speedup
from dspark_lightning.measuring.turns import Prompt, decode_turns, reply_ids
from dspark_lightning.progress import progress_bar


def decode_plan(
    num_prompts: int, num_modes: int, num_schedules: int, max_new_tokens: int, baseline: bool, packed: bool = False
):
    """(timed runs, the line that announces them): what ``decode`` and each eval set print before they start."""
    runs = num_prompts * num_modes * num_schedules * (runs_per_timed_prompt(packed) if baseline else 1)
    text = (
        f"{num_modes} modes x {num_schedules} schedules x {num_prompts} prompts x {max_new_tokens} new tokens, "
        f"baseline {'on' + (' (default and packed kernels)' if packed else '') if baseline else 'off'}: "
        f"{runs} timed runs"
    )
    return runs, text


def runs_per_timed_prompt(packed: bool) -> int:
    """``generate``, then the speculative run; on packed kernels (``packed_verify``) also ``generate`` on them."""
    return 3 if packed else 2


def decode_table(
    module,
    prompts: list[Prompt],
    modes,
    temperature,
    thresholds,
    max_new_tokens,
    k,
    seed=0,
    baseline=False,
    packed_verify=False,
    progress: str | None = None,
    on_rows=None,
) -> list[MeasuredRow]:
    """Run speculative generation over ``prompts`` for each mode x threshold; one ``MeasuredRow`` per pair. A
    ``Conversation`` prompt is decoded turn by turn, each turn after the target's own reply, and counts as one prompt.

    With ``baseline`` every row is measured by ``measure_speedup``: the target's own ``generate`` (sampling at the
    same ``temperature`` when it is > 0) timed alternately with the speculative run, prompt by prompt, and greedy
    outputs checked equal (the row's
    ``comparison``, its spread included). Each row keeps its per-prompt measurements (``prompt_records``, the input
    of ``summarize_eval_set``); a prompt with no verify step (its first token ended it) has no tau and is counted in
    ``prompts_without_verify`` instead. ``progress``: a progress bar with this description over the timed runs.
    ``on_rows``: called with the rows so far after each one (``decode --json`` keeps what an interrupted run measured).
    """
    total, _ = decode_plan(len(prompts), len(modes), len(thresholds), max_new_tokens, baseline, packed_verify)
    bar = progress_bar(progress, total, "runs") if progress else nullcontext(lambda n=1: None)
    runs_per_prompt = runs_per_timed_prompt(packed_verify)
    rows = []
    with bar as advance:
        for mode in modes:
            for threshold in thresholds:
                schedule = dict(
                    confidence_threshold=None if isinstance(threshold, tuple) else threshold,
                    cost_model=threshold[1:] if isinstance(threshold, tuple) else None,
                    packed_verify=packed_verify,
                )
                label = dict(mode=mode, threshold=list(threshold) if isinstance(threshold, tuple) else threshold)
                if baseline:
                    on_prompt = lambda: advance(runs_per_prompt)  # noqa: E731
                    row = _timed_row(module, prompts, temperature, max_new_tokens, k, seed, schedule, on_prompt, label)
                else:
                    row = _untimed_row(module, prompts, temperature, max_new_tokens, k, seed, schedule, advance, label)
                rows.append(row)
                if on_rows is not None:
                    on_rows(rows)
    return rows


def _timed_row(module, prompts, temperature, max_new_tokens, k, seed, schedule, on_prompt, label) -> MeasuredRow:
    result = measure_speedup(
        module.target, module.drafter, prompts, max_new_tokens, mode=label["mode"], k=k, on_prompt=on_prompt,
        temperature=temperature, seed=seed, **schedule,
    )  # fmt: skip
    return dataclasses.replace(
        _stats_row(result.stats, len(prompts), result.prompt_records, label),
        tokens_per_second=result.speculative_tokens_per_second,  # over the timed calls, prompt forwards included
        comparison=result.comparison,
        dtype=result.dtype,
    )


def _untimed_row(module, prompts, temperature, max_new_tokens, k, seed, schedule, advance, label) -> MeasuredRow:
    generator = torch.Generator().manual_seed(seed)
    runs = []

    def turn(ids):  # lossless: the speculative output is the target's own reply, the next turn follows it
        output, run = speculative_generate(
            module.target, module.drafter, torch.tensor([ids]), max_new_tokens, mode=label["mode"], k=k,
            temperature=temperature, generator=generator, **schedule,
        )  # fmt: skip
        return run, reply_ids(output, len(ids))

    for prompt in prompts:
        runs.append(DecodeStats.merge(decode_turns(prompt, turn)))  # a multi-turn prompt: its turns pooled
        advance()
    records = [PromptDecodeRecord.from_stats(run) for run in runs if run.target_forwards > 0]
    return _stats_row(DecodeStats.merge(runs), len(prompts), records, label)


def _stats_row(stats: DecodeStats, num_prompts: int, records: list[PromptDecodeRecord], label: dict) -> MeasuredRow:
    return MeasuredRow(
        **label,
        tau=stats.tau,
        tokens_per_second=stats.tokens_per_second,
        mean_verified=stats.mean_verified,
        accepted_rate_per_slot=stats.accepted_rate_per_slot,
        phase_ms_per_step=stats.phase_ms_per_step(),
        prompts_without_verify=num_prompts - len(records),
        prompt_records=records,
    )


def measured_decoding(module, prompts, modes, max_new_tokens: int, k: int) -> dict[str, MeasuredRow]:
    """Greedy speculative decoding per mode on ``prompts`` -> {mode: decode_table row}."""
    rows = decode_table(module, prompts, modes, 0.0, [None], max_new_tokens, k)
    return {row.mode: row for row in rows}


def verify_length_table(rows, cost_model: tuple[float, float]) -> list[dict]:
    """For each mode's whole-block row: the verify length that maximises predicted tokens/s (``best_verify_length``)
    from its measured per-slot acceptance and drafter cost per step, under T(n) = t0 + t1 * n."""
    table = []
    for row in rows:
        if row.threshold is not None or not row.accepted_rate_per_slot:
            continue
        phases = row.phase_ms_per_step
        overhead = (phases["draft_backbone"] + phases["draft_head"] + phases["bookkeeping"]) / 1e3
        best = best_verify_length(row.accepted_rate_per_slot, overhead, cost_model)
        row.verify_length = best
        table.append(dict(mode=row.mode, overhead_ms=overhead * 1e3, **best))
    return table


def print_verify_length_table(table, cost_model) -> None:
    """``verify_length_table`` as a rich table (80 columns; overhead = draft + bookkeeping ms per step)."""
    t0, t1 = cost_model
    out = compact_table(f"predicted tokens/s per verify length n (T(n) = {t0 * 1e3:.2f} + {t1 * 1e3:.3f} n ms)")
    for column in ("mode", "overhead ms", "best n", "tokens/step", "tokens/s for n = 1, 2, ..."):
        out.add_column(column, justify="left" if column in ("mode", "tokens/s for n = 1, 2, ...") else "right")
    for row in table:
        n = row["best_n"]
        out.add_row(
            row["mode"],
            f"{row['overhead_ms']:.2f}",
            str(n),
            f"{row['expected_tokens'][n - 1]:.2f}",
            " ".join(f"{v:.0f}" for v in row["tokens_per_second"]),
        )
    table_console().print(out)


def schedule_label(schedule) -> str:
    """A schedule as a table cell: "-" (whole blocks), a confidence threshold, or "cost model"."""
    if schedule is None:
        return "-"
    if isinstance(schedule, (tuple, list)):
        return "cost model"
    return f"{schedule:.2f}"


def table_console():
    """Where the decode tables print: a terminal's own width (at least 80 columns); off a terminal (a log file, a pipe,
    ``nohup``) 160 columns, since a file has no width and rich would otherwise wrap every cell at its default 80."""
    from rich.console import Console

    console = Console()
    return Console(width=max(80, console.width) if console.is_terminal else max(160, console.width))


def compact_table(title: str):
    """A rich table without vertical rules or doubled padding: eight numeric columns fit 80 columns."""
    from rich.box import SIMPLE_HEAD
    from rich.table import Table

    return Table(title=title, box=SIMPLE_HEAD, show_edge=False, collapse_padding=True)


def print_decode_table(rows: list[MeasuredRow], title: str) -> None:
    """The decode rows as three rich tables that fit 80 columns: the numbers, the accepted rate per slot, the ms per
    phase (everything else is in ``decode --json``). A greedy mismatch with ``generate`` is printed in red, a noisy
    wall clock (the comparison's ``spread.noisy``) marks its speedup with ``?`` and is explained below the tables."""
    table = compact_table(title)
    with_baseline = any(row.comparison is not None for row in rows)
    columns = ["mode", "sched.", "tau", "tok/s"]
    with_packed = any(row.comparison is not None and row.comparison.packed is not None for row in rows)
    columns += ["gen. tok/s", "speedup", "= gen."] if with_baseline else []
    columns += ["vs packed gen."] if with_packed else []
    columns += ["verified"]
    for column in columns:
        table.add_column(column, justify="left" if column == "mode" else "right")
    slots = compact_table("accepted rate per slot")
    for column in ("mode", "sched.", "slot 0, 1, ..."):
        slots.add_column(column, justify="right" if column == "sched." else "left")
    phases = compact_table("where the time goes: ms per step")
    for column in ("mode", "sched.", "backbone", "head", "verify", "bookkeeping"):
        phases.add_column(column, justify="left" if column == "mode" else "right")
    mismatched, noisy = [], []
    for row in rows:
        label = schedule_label(row.threshold)
        cells = [row.mode, label, f"{row.tau:.3f}", f"{row.tokens_per_second:.1f}"]
        compared = row.comparison
        if with_baseline and compared is not None:
            is_noisy = compared.spread is not None and compared.spread.noisy
            cells += [f"{compared.baseline_tokens_per_second:.1f}", f"{compared.speedup:.2f}x{'?' if is_noisy else ''}"]
            cells.append({True: "yes", False: "[bold red]NO[/]", None: "- (sampled)"}[compared.outputs_equal])
            if with_packed:
                packed = compared.packed
                cells.append(f"{packed.speedup_vs_packed_generate:.2f}x" if packed is not None else "-")
            mismatched += [] if compared.outputs_equal is not False else [row]
            noisy += [row] if is_noisy else []
        elif with_baseline:
            cells += ["-", "-", "-"] + (["-"] if with_packed else [])
        table.add_row(*cells, f"{row.mean_verified:.2f}")
        rates = " ".join("-" if math.isnan(v) else f"{v:.2f}" for v in row.accepted_rate_per_slot)
        slots.add_row(row.mode, label, rates)
        ms = row.phase_ms_per_step
        phases.add_row(
            row.mode, label, *(f"{ms[p]:.2f}" for p in ("draft_backbone", "draft_head", "verify", "bookkeeping"))
        )
    console = table_console()
    for out in (table, slots, phases):
        console.print(out)
    for row in noisy:
        spread = row.comparison.spread
        console.print(
            f"[yellow]? {row.mode} / {schedule_label(row.threshold)}: generate's tokens/s spread "
            f"{spread.baseline_relative_spread:.0%} across prompts (IQR / median, over 25%): too noisy to trust; "
            f"load average {spread.load_average}[/]"
        )
    for row in mismatched:
        console.print(
            f"[bold red]MISMATCH: {row.mode} / {schedule_label(row.threshold)} differs from the target's greedy "
            f"generate on prompts {row.comparison.mismatches}: greedy speculative decoding must be lossless[/]"
        )
