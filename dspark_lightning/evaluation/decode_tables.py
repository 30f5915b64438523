"""Speculative decoding measured per mode and schedule, and its tables (``decode`` prints them, the reports read them).

A row: tau = tokens per target forward, tokens/s, mean verified length, the accepted rate per slot and the time per
phase; with ``baseline`` also the target's own ``generate`` timed alternately and the outputs compared.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import torch

from dspark_lightning.decoding import DecodeStats, best_verify_length, measure_speedup, speculative_generate
from dspark_lightning.decoding.eval_report import PromptDecodeRecord


def decode_table(
    module,
    prompts: list[list[int]],
    modes,
    temperature,
    thresholds,
    max_new_tokens,
    k,
    seed=0,
    baseline=False,
    packed_verify=False,
):
    """Run speculative generation over ``prompts`` for each mode x threshold; one summary dict per row.

    With ``baseline`` (greedy only) every row is measured by ``measure_speedup``: the target's own ``generate``
    timed alternately with the speculative run, prompt by prompt, and the outputs checked equal. Each row keeps its
    per-prompt measurements (``prompt_records``, the input of ``summarize_eval_set``); a prompt with no verify step
    (its first token ended it) has no tau and is counted in ``prompts_without_verify`` instead.
    """
    rows = []
    for mode in modes:
        for threshold in thresholds:
            schedule = dict(
                confidence_threshold=None if isinstance(threshold, tuple) else threshold,
                cost_model=threshold[1:] if isinstance(threshold, tuple) else None,
                packed_verify=packed_verify,
            )
            extra = {}
            if baseline and temperature == 0:
                result = measure_speedup(
                    module.target, module.drafter, prompts, max_new_tokens, mode=mode, k=k, **schedule
                )
                stats = result.pop("stats")
                records = result["prompt_records"]
                extra = {
                    key: result[key]
                    for key in (
                        "speedup",
                        "median_prompt_speedup",
                        "baseline_tokens_per_second",
                        "outputs_equal",
                        "mismatches",
                    )
                }
            else:
                generator = torch.Generator().manual_seed(seed)
                runs = []
                for prompt in prompts:
                    _, run = speculative_generate(
                        module.target,
                        module.drafter,
                        torch.tensor([prompt]),
                        max_new_tokens,
                        mode=mode,
                        k=k,
                        temperature=temperature,
                        generator=generator,
                        **schedule,
                    )
                    runs.append(run)
                stats = DecodeStats.merge(runs)
                records = [asdict(PromptDecodeRecord.from_stats(run)) for run in runs if run.target_forwards > 0]
            rows.append(
                dict(
                    mode=mode,
                    threshold=threshold,
                    tau=stats.tau,
                    tokens_per_second=result["speculative_tokens_per_second"] if extra else stats.tokens_per_second,
                    mean_verified=stats.mean_verified,
                    accepted_rate_per_slot=stats.accepted_rate_per_slot,
                    phase_ms_per_step=stats.phase_ms_per_step(),
                    prompts_without_verify=len(prompts) - len(records),
                    prompt_records=records,
                    **extra,
                )
            )
    return rows


def measured_decoding(module, prompts, modes, max_new_tokens: int, k: int) -> dict[str, dict]:
    """Greedy speculative decoding per mode on ``prompts`` -> {mode: decode_table row}."""
    rows = decode_table(module, prompts, modes, 0.0, [None], max_new_tokens, k)
    return {row["mode"]: row for row in rows}


def verify_length_table(rows, cost_model: tuple[float, float]) -> list[dict]:
    """For each mode's whole-block row: the verify length that maximises predicted tokens/s (``best_verify_length``)
    from its measured per-slot acceptance and drafter cost per step, under T(n) = t0 + t1 * n."""
    table = []
    for row in rows:
        if row["threshold"] is not None or not row["accepted_rate_per_slot"]:
            continue
        phases = row["phase_ms_per_step"]
        overhead = (phases["draft_backbone"] + phases["draft_head"] + phases["bookkeeping"]) / 1e3
        best = best_verify_length(row["accepted_rate_per_slot"], overhead, cost_model)
        row["verify_length"] = best
        table.append(dict(mode=row["mode"], overhead_ms=overhead * 1e3, **best))
    return table


def print_verify_length_table(table, cost_model) -> None:
    """``verify_length_table`` as a rich table."""
    from rich.console import Console
    from rich.table import Table

    t0, t1 = cost_model
    title = f"predicted tokens/s per verify length n (T(n) = {t0 * 1e3:.2f} + {t1 * 1e3:.3f} n ms)"
    out = Table(title=title)
    for column in ("mode", "draft+bookkeeping ms/step", "best n", "tokens/step at best n", "tokens/s by n"):
        out.add_column(column, justify="left" if column in ("mode", "tokens/s by n") else "right")
    for row in table:
        n = row["best_n"]
        out.add_row(
            row["mode"],
            f"{row['overhead_ms']:.2f}",
            str(n),
            f"{row['expected_tokens'][n - 1]:.2f}",
            " ".join(f"{v:.0f}" for v in row["tokens_per_second"]),
        )
    Console().print(out)


def schedule_label(schedule) -> str:
    """A schedule as a table cell: "-" (whole blocks), a confidence threshold, or "cost model"."""
    if schedule is None:
        return "-"
    if isinstance(schedule, (tuple, list)):
        return "cost model"
    return f"{schedule:.2f}"


def print_decode_table(rows, title: str) -> None:
    """The decode rows as two rich tables (numbers, then ms per phase); a greedy mismatch with ``generate`` in red."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    with_baseline = any("speedup" in row for row in rows)
    columns = ["mode", "threshold", "tau", "tokens/s"]
    columns += ["generate tokens/s", "speedup", "= generate"] if with_baseline else []
    columns += ["verified", "accepted rate per slot"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("mode", "accepted rate per slot") else "right")
    phases = Table(title="where the time goes: ms per step")
    for column in ("mode", "threshold", "draft backbone", "draft head", "verify", "bookkeeping"):
        phases.add_column(column, justify="left" if column == "mode" else "right")
    mismatched = []
    for row in rows:
        label = schedule_label(row["threshold"])
        cells = [row["mode"], label, f"{row['tau']:.3f}", f"{row['tokens_per_second']:.1f}"]
        if with_baseline:
            equal = row.get("outputs_equal", True)
            cells += [f"{row['baseline_tokens_per_second']:.1f}", f"{row['speedup']:.2f}x"]
            cells.append("yes" if equal else "[bold red]NO[/]")
            if not equal:
                mismatched.append(row)
        cells += [
            f"{row['mean_verified']:.2f}",
            " ".join("-" if math.isnan(v) else f"{v:.2f}" for v in row["accepted_rate_per_slot"]),
        ]
        table.add_row(*cells)
        ms = row["phase_ms_per_step"]
        phases.add_row(
            row["mode"], label, *(f"{ms[p]:.2f}" for p in ("draft_backbone", "draft_head", "verify", "bookkeeping"))
        )
    console = Console()
    console.print(table)
    console.print(phases)
    for row in mismatched:
        console.print(
            f"[bold red]MISMATCH: {row['mode']} / {schedule_label(row['threshold'])} differs from the target's greedy "
            f"generate on prompts {row['mismatches']}: greedy speculative decoding must be lossless[/]"
        )
