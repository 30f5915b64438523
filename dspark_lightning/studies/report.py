"""``dspark-lightning report``: train the Markov-head variants on the demo and write a one-page experiment report.

    dspark-lightning report --output /tmp/r --heads '[none,vanilla]' --block_sizes '[8]' --budget.steps 40  # quick

What it runs and measures, its sizes and what it writes: docs/design/design.md §12.1."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse.typing import PositiveInt

from dspark_lightning.checks import dumps_json
from dspark_lightning.lightning.fit import lightning_main
from dspark_lightning.machine import machine_description, machine_line
from dspark_lightning.measuring.head_measurements import evaluate_variant
from dspark_lightning.studies.command_lines import command_line
from dspark_lightning.studies.quiet_output import quieted
from dspark_lightning.studies.report_charts import plot_results
from dspark_lightning.studies.runs import demo_fit_args
from dspark_lightning.studies.table_cells import format_number

HEADS = ("none", "vanilla", "gated", "rnn")


@dataclass(frozen=True)
class Budget:
    """Training and evaluation sizes of one variant (``--budget.*`` of ``dspark-lightning report``).

    Args:
        steps: optimizer steps per variant
        seq_len: packed tokens per row
        batch_size: packed rows per step
        max_anchors: blocks sampled per row per step
        val_samples: validation conversations (the first N, file order)
        val_batches: validation batches
        num_prompts: eval prompts for measured speculative decoding
        max_new_tokens: tokens generated per eval prompt
        k: Selector candidates per slot (agreement@k, selector mode)
        max_blocks: validation blocks for the Selector and calibration measurements
    """

    steps: PositiveInt = 600
    seq_len: PositiveInt = 128
    batch_size: PositiveInt = 4
    max_anchors: PositiveInt = 16
    val_samples: PositiveInt = 64
    val_batches: PositiveInt = 8
    num_prompts: PositiveInt = 16
    max_new_tokens: PositiveInt = 96
    k: PositiveInt = 16
    max_blocks: PositiveInt = 512


def train_and_evaluate(
    runs_dir: Path,
    head: str,
    block_size: int,
    budget: Budget,
    extra: Sequence[str] = (),
    name: str | None = None,
    measure: Callable[[Any, Any, dict], dict] | None = None,
) -> dict:
    """Fit one variant through ``lightning_main`` (what ``dspark-lightning fit`` runs) and measure it; one result row.

    ``extra``: more ``fit`` arguments (e.g. a loss config and seeds, as ``dspark-lightning loss-study`` passes);
    ``name``: the run's directory name under ``runs_dir`` (default ``<head>_b<B>``); ``measure(module, datamodule,
    row)``: more numbers for the row (the loss study's evaluation sets), measured after the report's own.
    """
    args = demo_fit_args(
        runs_dir,
        head=head,
        block_size=block_size,
        steps=budget.steps,
        seq_len=budget.seq_len,
        batch_size=budget.batch_size,
        max_anchors=budget.max_anchors,
        val_samples=budget.val_samples,
        val_batches=budget.val_batches,
        eval_prompts=budget.num_prompts,
        name=name,
        extra=extra,
    )
    start = time.perf_counter()
    cli = lightning_main(["fit", *args])
    fit_seconds = time.perf_counter() - start
    start = time.perf_counter()
    row = evaluate_variant(
        cli.model,
        cli.datamodule,
        num_prompts=budget.num_prompts,
        max_new_tokens=budget.max_new_tokens,
        k=budget.k,
        max_blocks=budget.max_blocks,
    )
    if measure is not None:
        row.update(measure(cli.model, cli.datamodule, row))
    trainable = sum(p.numel() for p in cli.model.drafter.parameters() if p.requires_grad)
    head_params = sum(p.numel() for p in cli.model.drafter.markov_head.parameters()) if head != "none" else 0
    row.update(
        head=head,
        block_size=block_size,
        fit_seconds=fit_seconds,
        eval_seconds=time.perf_counter() - start,
        trainable_parameters=trainable,
        head_parameters=head_params,
        run_dir=cli.trainer.log_dir,
    )
    return row


def markdown_report(rows: list[dict], budget: Budget, plots: list[str], command: str, seconds: float) -> str:
    k = budget.k
    lines = [
        "# DSpark heads on the demo target",
        "",
        f"Made by `{command}` in {seconds / 60:.1f} min. {machine_line(machine_description())} Every variant: `configs/quickstart.yaml` + `configs/heads/<head>.yaml`, "
        f"{budget.steps} steps of {budget.batch_size} packed rows x {budget.seq_len} tokens, {budget.max_anchors} "
        f"anchors per row, seed 0; validation on the first {budget.val_samples} validation conversations; "
        f"measured decoding on {budget.num_prompts} eval prompts x {budget.max_new_tokens} new tokens. "
        "One seed and a short budget: differences of a few hundredths are noise.",
        "",
        f"| head | B | teacher-forced tau | TF greedy tau | measured tau | measured Selector tau (k={k}) "
        f"| agreement@{k} | coverage@{k} | prefix ECE raw | prefix ECE calibrated | fit s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['head']} | {r['block_size']} | {format_number(r['teacher_tau'])} "
            f"| {format_number(r['teacher_greedy_tau'])} | {format_number(r['measured_tau'])} ({r['measured_mode']}) "
            f"| {format_number(r['measured_selector_tau'])} | {format_number(r['agreement_at_k'])} "
            f"| {format_number(r['coverage_at_k'])} | {format_number(r['ece_before'], 4)} "
            f"| {format_number(r['ece_after'], 4)} | {r['fit_seconds']:.0f} |"
        )
    lines += ["", *_headlines(rows), ""]
    lines += [
        "Columns:",
        "- *teacher-forced tau*: 1 + sum_k prod_{j<=k} alpha_j on validation blocks (alpha = 1 - TV(draft, target), "
        "the acceptance probability of speculative sampling), ground-truth prefix; *TF greedy tau*: 1 + leading run "
        "of slots whose draft argmax equals the target's argmax.",
        "- *measured tau*: tokens emitted per target forward in real greedy speculative decoding with the target "
        "(`markov` mode: sequential Markov decode; `parallel` for the head-less drafter). *Measured Selector tau*: "
        f"the same with the top-{k} Selector walk (vanilla and gated heads only; the rnn head is path dependent).",
        f"- *agreement@{k}* / *coverage@{k}*: fraction of validation slots where the Selector walk picks the "
        f"sequential decode's token / where that token is among the top-{k} base logits.",
        "- *prefix ECE*: expected calibration error of the confidence head's prefix survival prod_{j<=n} c_j, raw and "
        "after sequential temperature scaling fitted on the other half of the validation blocks.",
        "",
    ]
    lines += [f"![{Path(p).stem}]({p})" for p in plots]
    lines.append("")
    return "\n".join(lines)


def _headlines(rows: list[dict]) -> list[str]:
    out = []
    for block in sorted({r["block_size"] for r in rows}):
        group = [r for r in rows if r["block_size"] == block]
        best = max(group, key=lambda r: r["measured_tau"])
        text = f"**B = {block}**: best measured tau {best['measured_tau']:.3f} ({best['head']})"
        base = next((r for r in group if r["head"] == "none"), None)
        if base is not None and best is not base:
            text += f", vs {base['measured_tau']:.3f} without a Markov head"
        out.append(text + ".")
    return out


def run_report(
    output: str | Path,
    heads: Sequence[str] = HEADS,
    block_sizes: Sequence[int] = (8, 16),
    budget: Budget | None = None,
    runs_dir: str | Path | None = None,
    command: str = "dspark-lightning report",
) -> list[dict]:
    """Train and evaluate every (head, block size), write the report into ``output``; returns the result rows."""
    budget = budget or Budget()
    unknown = sorted(set(heads) - set(HEADS) - {"selector"})
    if unknown:
        raise ValueError(f"unknown heads {unknown}; choose from {HEADS + ('selector',)}")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    keep = runs_dir is not None
    runs = Path(runs_dir) if keep else Path(tempfile.mkdtemp(prefix="dspark-report-"))
    start, machine = time.perf_counter(), machine_description()
    rows = []
    try:
        variants = [(block, head) for block in block_sizes for head in heads]
        for index, (block, head) in enumerate(variants, 1):
            try:
                row = train_and_evaluate(runs, head, block, budget)
            except Exception:
                if rows:  # keep the finished variants before the error propagates
                    partial = {"command": command, "failed": f"{head} B={block}", "machine": machine, "rows": rows}
                    (output / "results.partial.json").write_text(dumps_json(partial, indent=2, default=str))
                    print(f"{head} B={block} failed; {len(rows)} finished variant(s) kept in results.partial.json")
                raise
            rows.append(row)
            print(
                f"[{index}/{len(variants)}] {head:8s} B={block:<3d} fit {row['fit_seconds']:.0f}s "
                f"eval {row['eval_seconds']:.0f}s | teacher-forced tau {row['teacher_tau']:.3f} | measured tau "
                f"{row['measured_tau']:.3f} | agreement@{budget.k} {format_number(row['agreement_at_k'])} "
                f"| prefix ECE {format_number(row['ece_before'], 4)} -> {format_number(row['ece_after'], 4)}",
                flush=True,
            )
            if not keep:
                row["run_dir"] = None
    finally:
        if not keep:
            shutil.rmtree(runs, ignore_errors=True)
    seconds = time.perf_counter() - start
    plots = plot_results(rows, output, budget.k)
    (output / "report.md").write_text(markdown_report(rows, budget, plots, command, seconds))
    payload = {"command": command, "seconds": seconds, "budget": vars(budget), "machine": machine, "rows": rows}
    (output / "results.json").write_text(dumps_json(payload, indent=2))  # strict: an undefined value is null
    print(f"wrote {output / 'report.md'} ({seconds / 60:.1f} min)")
    return rows


def report_command(
    output: str,
    heads: list[Literal["none", "vanilla", "gated", "rnn", "selector"]] = list(HEADS),  # noqa: B006 (read only)
    block_sizes: list[PositiveInt] = [8, 16],  # noqa: B006
    runs_dir: str | None = None,
    budget: Budget = Budget(),  # noqa: B008 (frozen: never changed)
    threads: PositiveInt = 1,
) -> list[dict]:
    """Train every Markov head x block size on the demo and write report.md, results.json and plots.

    Args:
        output: directory for report.md, results.json and the PNGs
        heads: Markov heads (configs/heads/<name>.yaml)
        block_sizes: draft block sizes B
        runs_dir: keep the run directories here (default: a deleted temporary directory)
        budget: training and evaluation sizes of every variant
        threads: torch CPU threads
    """
    command = command_line("report", report_command, dict(locals()))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with quieted():
            return run_report(output, heads, block_sizes, budget, runs_dir, command)
    finally:
        torch.set_num_threads(previous)
