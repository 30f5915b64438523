"""``dspark-lightning report-recipe``: train every head on a recipe (``configs/recipes/<name>.yaml``) and measure it.

    dspark-lightning report-recipe --recipe smollm2 --output /tmp/r --heads '[none,vanilla]' --steps 20 --num_prompts 2

What it measures, wall clock included: docs/design/design.md §12.2; the recipes: docs/guides/recipe_smollm2.md."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import PositiveInt

from dspark_lightning.checks import dumps_json, read_checkpoint
from dspark_lightning.errors import OptionError
from dspark_lightning.lightning.checkpoint import load_checkpoint_module
from dspark_lightning.lightning.fit import lightning_main
from dspark_lightning.machine import machine_description, machine_line
from dspark_lightning.measuring import measure_speedup, measure_verify_cost
from dspark_lightning.measuring.eval_set_tables import DEFAULT_MAX_NEW_TOKENS, measure_eval_sets
from dspark_lightning.measuring.eval_sets import EvalSetName
from dspark_lightning.measuring.head_measurements import evaluate_variant
from dspark_lightning.measuring.loading import in_dtype
from dspark_lightning.measuring.results import EvalSetRow, SpeedupResult, from_json, to_json
from dspark_lightning.studies.command_lines import command_line
from dspark_lightning.studies.quiet_output import quieted
from dspark_lightning.studies.recipes import HEADS, Recipe, load_recipe
from dspark_lightning.studies.report_charts import plot_results
from dspark_lightning.studies.table_cells import format_number


def fit_head(recipe: Recipe, runs: Path, head: str, steps: int, extra: Sequence[str], name: str | None = None):
    """(the fit's CLI object, its last checkpoint)."""
    args = [
        "fit",
        *recipe.fit_configs(head),
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={steps}",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={runs}",
        f"--trainer.logger.name={name or head}",
        *extra,
    ]
    cli = lightning_main(args)
    return cli, cli.trainer.checkpoint_callback.last_model_path


def finished_run(runs: Path, head: str, steps: int) -> Path | None:
    """The newest ``last.ckpt`` under runs/<head>/ that reached ``steps`` optimizer steps, if any."""
    found = []
    for path in (runs / head).glob("version_*/checkpoints/last.ckpt"):
        step = read_checkpoint(path, "--reuse_runs", mmap=True).get("global_step")  # mmap: no tensor is read
        if step == steps:
            found.append(path)
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def validate_head(recipe: Recipe, checkpoint: Path, head: str, extra: Sequence[str]):
    """(the CLI object of a ``validate`` of ``checkpoint``, the checkpoint): the fit's last validation, rerun."""
    with tempfile.TemporaryDirectory(prefix="dspark-validate-") as scratch:  # the CLI's config.yaml goes here
        args = [
            "validate",
            *recipe.fit_configs(head),
            "--trainer.logger=false",
            f"--trainer.default_root_dir={scratch}",
        ]
        return lightning_main([*args, *extra, f"--ckpt_path={checkpoint}"]), str(checkpoint)


def evaluate_head(
    cli,
    checkpoint: str,
    *,
    num_prompts: int,
    max_new_tokens: int,
    k: int,
    max_blocks: int,
    wall_clock: bool = True,
    packed_verify: bool = False,
    cost_model: bool = False,
    eval_sets: Sequence[str] = (),
    eval_set_limit: int | None = None,
    eval_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    recipe: Recipe | None = None,
    heldout_files: str | None = None,
    heldout_split: dict[str, float] | None = None,
    dtype: str = "auto",
) -> dict:
    """The report's numbers for a fitted head, re-loaded with the whole target (in ``dtype``: ``auto`` keeps the
    checkpoint's, the baseline ``generate`` runs in the same one); ``wall_clock`` adds the timing,
    ``cost_model`` a second timing whose verify length is scheduled by the measured T(n) (``wall_clock_scheduled``),
    ``eval_sets`` the measured tau on each evaluation set with 95% intervals over prompts, and with ``wall_clock``
    the speedup too. ``sharegpt_heldout`` reads ``heldout_files`` / ``heldout_split`` (default: the recipe's)."""
    online = in_dtype(load_checkpoint_module(checkpoint, features="online"), dtype)
    online.last_validation = cli.model.last_validation  # the fit's last validation (cached rows, same weights)
    cli.datamodule.num_eval_prompts = max(cli.datamodule.num_eval_prompts, num_prompts)
    row = evaluate_variant(
        online, cli.datamodule, num_prompts=num_prompts, max_new_tokens=max_new_tokens, k=k, max_blocks=max_blocks
    )
    cost = None
    if wall_clock:
        cost = time_against_generate(
            row, online, cli.datamodule, num_prompts, max_new_tokens, k, packed_verify, cost_model
        )
    if eval_sets:
        row["eval_sets"] = eval_set_rows(
            online, cli.datamodule, eval_sets, row["measured_mode"], k=k, limit=eval_set_limit,
            max_new_tokens=eval_max_new_tokens, baseline=wall_clock, packed_verify=packed_verify,
            schedules=[None] if cost is None else [None, ("cost", *cost)],
            heldout_files=heldout_files or (recipe.heldout_files if recipe else None),
            heldout_split=heldout_split or (recipe.heldout_split_by_id if recipe else None),
        )  # fmt: skip
    return row


def time_against_generate(row, online, datamodule, num_prompts, max_new_tokens, k, packed_verify, cost_model):
    """The wall clock against the target's ``generate`` (``row["wall_clock"]``, with ``cost_model`` also
    ``row["wall_clock_scheduled"]``); returns the measured verify cost (t0, t1), or None without ``cost_model``."""
    prompts = datamodule.eval_prompts()[:num_prompts]
    row["load_average"] = os.getloadavg()[0]  # the machine is shared: the 1-minute load when the timing starts
    timing = measure_speedup(
        online.target, online.drafter, prompts, max_new_tokens, mode=row["measured_mode"], k=k,
        packed_verify=packed_verify,
    )  # fmt: skip
    row["wall_clock"] = to_json(timing)
    row["speedup"] = timing.comparison.speedup  # the whole-block speedup at the top of the row, beside measured_tau
    if not cost_model:
        return None
    cost = measure_verify_cost(online.target, max_block=online.drafter.block_size, packed_verify=packed_verify)
    scheduled = measure_speedup(
        online.target, online.drafter, prompts, max_new_tokens, mode=row["measured_mode"], k=k,
        packed_verify=packed_verify, cost_model=cost,
    )  # fmt: skip
    row["wall_clock_scheduled"] = to_json(scheduled)
    return cost


def eval_set_rows(
    module, datamodule, names: Sequence[str], mode: str, *, k: int, limit: int | None, max_new_tokens: int,
    baseline: bool, packed_verify: bool = False, schedules: Sequence = (None,), heldout_files: str | None = None,
    heldout_split: dict[str, float] | None = None,
) -> list[dict]:  # fmt: skip
    """Greedy decoding of ``module`` in ``mode`` on each evaluation set (``measure_eval_sets``): per set and
    schedule, its ``EvalSetRow`` as JSON (``baseline``: timed against ``generate``, with the speedup)."""
    measured = measure_eval_sets(
        module, datamodule, list(names), [mode], list(schedules), temperature=0.0, max_new_tokens=max_new_tokens,
        k=k, limit=limit, baseline=baseline, packed_verify=packed_verify, heldout_files=heldout_files,
        heldout_split=heldout_split,
    )  # fmt: skip
    return [to_json(row) for row in measured]


def wall_clock(row: dict, key: str = "wall_clock") -> SpeedupResult | None:
    """A report row's timing against ``generate`` (``wall_clock`` or ``wall_clock_scheduled``), None if absent."""
    return from_json(SpeedupResult, row[key], f"head {row.get('head')} {key}") if key in row else None


def _timed_dtype(row: dict, default: str) -> str:
    """The dtype the row was timed in (the target's), else ``default`` (the ``--dtype`` option)."""
    timing = wall_clock(row)
    return timing.dtype if timing is not None and timing.dtype is not None else default


def machine_text(rows: list[dict]) -> str:
    """The machine sentence of report.md: from the rows (each names its machine), else this one's torch only."""
    machine = next((r["machine"] for r in rows if r.get("machine")), None)
    if machine is None:
        return f"Machine not recorded (torch {torch.__version__}, {torch.get_num_threads()} thread)."
    return machine_line(machine)


def markdown(rows: list[dict], recipe: Recipe, *, k: int, steps: int, command: str, plots: list[str]) -> str:
    """report.md: how it was made, one row per head (wall clock included), the break-even analysis, the charts."""
    commands = list(dict.fromkeys(r.get("command", command) for r in rows))
    made_by = "; ".join(
        f"`{c}` ({', '.join(r['head'] for r in rows if r.get('command', command) == c)})" for c in commands
    )
    timings = [wall_clock(r) for r in rows]
    first = timings[0]
    lines = [
        f"# DSpark heads on {recipe.title} (CPU)",
        "",
        f"Made by {made_by}. {machine_text(rows)} Every head: "
        f"`{recipe.fit_config}` + `configs/heads/<head>.yaml` {recipe.training_note}, "
        f"{', '.join(sorted({str(r.get('steps', steps)) for r in rows}))} steps, seed 0. Measured decoding and "
        f"wall clock: {first.prompts} held-out prompts (validation split) x "
        f"{first.max_new_tokens} new tokens, greedy, the target re-loaded whole; verify forward "
        f"on {'packed (oneDNN)' if first.packed_verify else 'the default'} kernels, "
        "`generate` on the default ones.",
        "",
    ]
    scheduled = all("wall_clock_scheduled" in r for r in rows)
    lines += [
        f"| head | teacher-forced tau | TF greedy tau | measured tau | Selector tau (k={k}) | agreement@{k} "
        f"| coverage@{k} | prefix ECE raw -> calibrated | generate tok/s | speculative tok/s | speedup "
        + ("| speedup, cost-model schedule (drafts verified per step) " if scheduled else "")
        + "| draft / verify ms per step | outputs equal |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|" + ("---:|" if scheduled else "") + "---:|---|",
    ]
    for r, w in zip(rows, timings):
        phases = w.phase_ms_per_step
        draft = phases["draft_backbone"] + phases["draft_head"]
        lines.append(
            f"| {r['head']} | {format_number(r['teacher_tau'])} | {format_number(r['teacher_greedy_tau'])} "
            f"| {format_number(r['measured_tau'])} ({r['measured_mode']}) "
            f"| {format_number(r['measured_selector_tau'])} | {format_number(r['agreement_at_k'])} "
            f"| {format_number(r['coverage_at_k'])} "
            f"| {format_number(r['ece_before'], 4)} -> {format_number(r['ece_after'], 4)} "
            f"| {w.comparison.baseline_tokens_per_second:.1f} | {w.speculative_tokens_per_second:.1f} "
            f"| {w.comparison.speedup:.2f}x "
            + (_scheduled_cell(wall_clock(r, "wall_clock_scheduled")) if scheduled else "")
            + f"| {draft:.1f} / {phases['verify']:.1f} "
            f"| {'yes' if not _mismatches(r) else 'NO: prompts ' + str(_mismatches(r))} |"
        )
    lines += ["", *break_even(rows), *eval_set_table(rows), "", *[f"![{Path(p).stem}]({p})" for p in plots], ""]
    return "\n".join(lines)


def eval_set_table(rows: list[dict]) -> list[str]:
    """The evaluation-set measurements of every head that has them, one line per (head, set, schedule)."""
    measured = [
        (r["head"], from_json(EvalSetRow, e, f"head {r['head']} eval_sets").summary)
        for r in rows
        for e in r.get("eval_sets", [])
    ]
    if not measured:
        return []

    def interval(value, bounds, suffix=""):
        return "n/a" if value is None else f"{value:.3f}{suffix} [{bounds[0]:.3f}, {bounds[1]:.3f}]"

    lines = [
        "",
        f"Evaluation sets ({measured[0][1].max_new_tokens} new tokens per prompt, greedy; 95% paired bootstrap "
        "intervals over prompts; speedup = total `generate` seconds / total speculative seconds, timed alternately):",
        "",
        "| head | eval set | schedule | prompts | measured tau [95% CI] | speedup [95% CI] | outputs equal |",
        "|---|---|---|---:|---|---|---|",
    ]
    for head, e in measured:
        schedule = "cost model" if isinstance(e.threshold, list | tuple) else "whole blocks"
        lines.append(
            f"| {head} | {e.eval_set} | {schedule} | {e.num_prompts} "
            f"| {interval(e.measured_tau, e.measured_tau_ci)} | {interval(e.speedup, e.speedup_ci, 'x')} "
            f"| {'yes' if e.outputs_equal else 'NO'} |"
        )
    return lines


def _scheduled_cell(w: SpeedupResult) -> str:
    return f"| {w.comparison.speedup:.2f}x ({w.mean_verified:.2f}) "


def _mismatches(row: dict) -> list[int]:
    """Prompts whose output differed from ``generate`` in either timing."""
    both = [wall_clock(row), wall_clock(row, "wall_clock_scheduled")]
    return sorted({i for w in both if w is not None for i in w.comparison.mismatches})


def break_even(rows: list[dict]) -> list[str]:
    """What the wall-clock numbers mean: the tau at which a step of this drafter + verify costs what ``generate``
    spends on the same tokens (tau x one generate token), from each head's own measured times."""
    best = max(rows, key=lambda r: r["measured_tau"])
    base = next((r for r in rows if r["head"] == "none"), None)
    lines = [f"Best measured tau: **{best['measured_tau']:.3f}** ({best['head']})"]
    if base is not None and best is not base:
        lines[0] += f", against {base['measured_tau']:.3f} for the head-less DFlash drafter"
    lines[0] += "."
    for r in rows:
        w = wall_clock(r)
        phases, generate_rate = w.phase_ms_per_step, w.comparison.baseline_tokens_per_second
        step_ms = sum(phases.values())
        needed = step_ms * generate_rate / 1e3
        lines.append(
            f"- {r['head']}: one speculative step costs {step_ms:.0f} ms (drafter "
            f"{phases['draft_backbone'] + phases['draft_head']:.0f} ms), one "
            f"`generate` token {1e3 / generate_rate:.0f} ms: break-even at tau = {needed:.2f}, "
            f"measured {w.tau:.2f}"
            + (f" (load average {r['load_average']:.1f} on the 2 cores when timed)." if "load_average" in r else ".")
        )
    return lines


def report_recipe_command(
    recipe: str,
    output: str,
    heads: list[Literal["none", "vanilla", "gated", "rnn", "selector"]] | None = None,
    steps: PositiveInt | None = None,
    num_prompts: PositiveInt | None = None,
    max_new_tokens: PositiveInt | None = None,
    k: PositiveInt = 16,
    max_blocks: PositiveInt = 512,
    runs_dir: str | None = None,
    threads: PositiveInt = 1,
    rerender: bool = False,
    fit_args: list[str] = [],  # noqa: B006 (read only; jsonargparse shows it)
    reuse_runs: bool = False,
    packed_verify: bool = False,
    cost_model: bool = False,
    eval_sets: list[EvalSetName] = [],  # noqa: B006
    eval_set_limit: PositiveInt | None = None,
    eval_max_new_tokens: PositiveInt = DEFAULT_MAX_NEW_TOKENS,
    dtype: Literal["auto", "float32", "bfloat16"] = "auto",
) -> list[dict]:
    """Train every head on a recipe (configs/recipes/*.yaml); measured tau and wall clock against the target's generate.

    Args:
        recipe: the recipe: a YAML file, or a name for configs/recipes/<name>.yaml
        output: directory for report.md, results.json and the PNGs
        heads: Markov heads to train (configs/heads/<name>.yaml; default: the recipe's heads); rows of other heads
            already in output are kept
        steps: optimizer steps per head (default: the recipe's)
        num_prompts: held-out prompts for decoding and wall clock (default: the recipe's)
        max_new_tokens: tokens generated per prompt (default: the recipe's)
        k: Selector candidates per slot
        max_blocks: validation blocks for the Selector and calibration
        runs_dir: keep the run directories here (default: a deleted temporary directory)
        threads: torch CPU threads
        rerender: rewrite report.md and the plots from results.json
        fit_args: more fit options for every head, e.g. [--model.drafter.max_anchors=32]
        reuse_runs: with runs_dir: a head whose runs_dir/<head>/version_*/checkpoints/last.ckpt reached ``steps``
            is validated and measured from that checkpoint instead of trained again (a report in several sittings)
        packed_verify: time the speculative runs with the verify forward on oneDNN-packed weights
            (``decoding.kernels``); the ``generate`` baseline keeps the default kernels
        cost_model: also time each head with the verify length scheduled by the confidence head and the measured
            verify cost T(n) = t0 + t1 * n (``decode --cost_model``), a second speedup column
        eval_sets: also measure each head on these evaluation sets (sharegpt_heldout from the recipe's heldout_files,
            humaneval), 128 new tokens per prompt, tau and speedup with 95% intervals over prompts
        eval_set_limit: only the first this many prompts of each evaluation set
        eval_max_new_tokens: tokens generated per evaluation-set prompt
        dtype: the dtype each head's target decodes in (auto: the fit config's target.dtype; float32; bfloat16),
            the baseline generate in the same one; every row records it
    """
    if reuse_runs and not runs_dir:
        raise ValueError("--reuse_runs true needs --runs_dir: the directory whose finished runs are reused")
    if packed_verify and dtype == "bfloat16":
        raise OptionError("--packed_verify packs float32 weights; --dtype bfloat16 decodes on the default kernels")
    command = command_line("report-recipe", report_recipe_command, dict(locals()))
    loaded = load_recipe(recipe)
    heads = heads or list(loaded.heads)
    steps = steps or loaded.steps
    num_prompts, max_new_tokens = num_prompts or loaded.num_prompts, max_new_tokens or loaded.max_new_tokens
    torch.set_num_threads(threads)
    output = Path(output)
    if rerender:
        saved = json.loads((output / "results.json").read_text())
        command = saved.get("command", command)
        plots = plot_results(saved["rows"], output, k)
        (output / "report.md").write_text(
            markdown(saved["rows"], loaded, k=k, steps=steps, command=command, plots=plots)
        )
        return saved["rows"]
    output.mkdir(parents=True, exist_ok=True)
    runs = Path(runs_dir) if runs_dir else Path(tempfile.mkdtemp(prefix=f"dspark-{loaded.name}-"))
    # Rows of heads measured by an earlier run into the same --output are kept (a rerun of a head replaces its row),
    # so the heads of one report can be trained in several sittings.
    previous = output / "results.json"
    kept = json.loads(previous.read_text())["rows"] if previous.exists() else []
    rows: list[dict] = [r for r in kept if r["head"] not in heads]
    try:
        for head in heads:
            with quieted():
                finished = finished_run(runs, head, steps) if reuse_runs else None
                if finished is not None:
                    cli, checkpoint = validate_head(loaded, finished, head, fit_args)
                else:
                    cli, checkpoint = fit_head(loaded, runs, head, steps, fit_args)
                row = evaluate_head(
                    cli, checkpoint, num_prompts=num_prompts, max_new_tokens=max_new_tokens, k=k,
                    max_blocks=max_blocks, packed_verify=packed_verify, cost_model=cost_model,
                    eval_sets=eval_sets, eval_set_limit=eval_set_limit, eval_max_new_tokens=eval_max_new_tokens,
                    recipe=loaded, dtype=dtype,
                )  # fmt: skip
            row.update(
                head=head, block_size=cli.model.drafter.config.block_size, command=command, steps=steps,
                machine=machine_description(), dtype=_timed_dtype(row, dtype),
            )  # fmt: skip
            rows.append(row)
            rows.sort(key=lambda r: HEADS.index(r["head"]))
            # written after every head, so a long run that is stopped keeps a complete report of what finished
            (output / "results.json").write_text(
                dumps_json({"command": command, "machine": machine_description(), "rows": rows}, indent=2)
            )
            plots = plot_results(rows, output, k)
            (output / "report.md").write_text(markdown(rows, loaded, k=k, steps=steps, command=command, plots=plots))
            print(f"{head}: measured tau {row['measured_tau']:.3f}, speedup {wall_clock(row).comparison.speedup:.2f}x")
    finally:
        if not runs_dir:
            shutil.rmtree(runs, ignore_errors=True)
    return rows
