"""The loss study's results: per-loss aggregates over seeds, the significance rule, ``report.md`` and the plot.

Kept apart from ``loss_study`` (which trains and measures) so that a finished study can be re-rendered, or a new
table added, without touching the training loop.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch

from dspark_lightning.machine import machine_line
from dspark_lightning.measuring.results import EvalSetRow, EvalSetSummary, from_json
from dspark_lightning.studies.recipes import load_recipe
from dspark_lightning.studies.table_cells import format_mean_std

METRICS = ("teacher_tau", "teacher_greedy_tau", "measured_tau")
DEMO = ("the demo target", "configs/quickstart.yaml", "ce+tv")  # title, base config, its default loss (the Δ baseline)


def study_recipe(study: dict) -> tuple[str, str, str]:
    """(title of the report, base config, default loss) of the study's recipe; studies written before recipe files
    were recorded name their recipe only (``configs/recipes/<name>.yaml``)."""
    if study.get("recipe", "demo") == "demo":
        return DEMO
    recipe = load_recipe(study.get("recipe_file") or study["recipe"])
    return recipe.title, recipe.fit_config, recipe.default_loss


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _slot_mean(curves: Sequence[Sequence[float]]) -> list[float]:
    out = []
    for column in zip(*curves):
        finite = [v for v in column if v is not None and not math.isnan(v)]
        out.append(statistics.fmean(finite) if finite else math.nan)
    return out


def aggregate(label: str, runs: list[dict]) -> dict:
    """Mean and seed standard deviation of every headline number of one loss."""
    out: dict = {"label": label, "seeds": [r["seed"] for r in runs], "n": len(runs)}
    for key in METRICS:
        out[key], out[f"{key}_std"] = _mean_std([r[key] for r in runs])
    out["accept_rate_per_slot"] = _slot_mean([r["accept_rate_per_slot"] for r in runs])
    out["measured_accepted_per_slot"] = _slot_mean([r["measured_accepted_per_slot"] for r in runs])
    out["fit_seconds"] = sum(r["fit_seconds"] for r in runs)
    if any("eval_sets" in r for r in runs):
        out["eval_sets"] = aggregate_eval_sets(runs)
    return out


def aggregate_eval_sets(runs: list[dict]) -> list[dict]:
    """Per evaluation set (whole-block rows): the seed mean and std of the runs' measured tau, and each run's tau
    and 95% interval over prompts (``measured_tau_per_seed``, ``measured_tau_ci_per_seed``, in seed order)."""
    summaries = [
        eval_set_summary(e, f"{r.get('label', 'run')} seed {r.get('seed')}")
        for r in runs
        for e in r.get("eval_sets", [])
    ]
    summaries = [s for s in summaries if s.threshold is None]
    out = []
    for name in dict.fromkeys(s.eval_set for s in summaries):
        mine = [s for s in summaries if s.eval_set == name]
        mean, std = _mean_std([s.measured_tau for s in mine])
        out.append(
            {
                "eval_set": name,
                "n": len(mine),
                "num_prompts": [s.num_prompts for s in mine],
                "measured_tau": mean,
                "measured_tau_std": std,
                "measured_tau_per_seed": [s.measured_tau for s in mine],
                "measured_tau_ci_per_seed": [s.measured_tau_ci for s in mine],
            }
        )
    return out


def eval_set_summary(entry: dict, where: str) -> EvalSetSummary:
    """One run's eval-set entry in results.json (an ``EvalSetRow``, or a pre-schema flat row) as its summary."""
    return from_json(EvalSetRow, entry, f"{where} eval_sets").summary


def eval_set_lines(study: dict) -> list[str]:
    """The evaluation-set table of report.md: one row per loss, one column per set (nothing without eval sets)."""
    groups = [g for g in study["groups"] if g.get("eval_sets")]
    if not groups:
        return []
    names = list(dict.fromkeys(e["eval_set"] for g in groups for e in g["eval_sets"]))
    plan = study.get("eval_sets") or {}

    def cell(entry: dict | None) -> str:
        if entry is None or entry["measured_tau"] is None or math.isnan(entry["measured_tau"]):
            return "n/a"
        if entry["n"] > 1:
            return format_mean_std(entry["measured_tau"], entry["measured_tau_std"], entry["n"])
        low, high = entry["measured_tau_ci_per_seed"][0]
        return f"{entry['measured_tau']:.3f} [{low:.3f}, {high:.3f}]"

    lines = [
        "",
        f"Measured tau on the evaluation sets (greedy, {plan.get('max_new_tokens', '?')} new tokens per prompt, "
        + (f"the first {plan['limit']} prompts of each set" if plan.get("limit") else "every prompt of each set")
        + "; mean ± seed std, or with one seed the run's tau [95% paired bootstrap interval over prompts]; every "
        "run's interval and per-prompt counts are in results.json):",
        "",
        "| loss | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for g in groups:
        entries = {e["eval_set"]: e for e in g["eval_sets"]}
        lines.append(f"| {g['label']} | " + " | ".join(cell(entries.get(name)) for name in names) + " |")
    return lines


def significance(a: dict, b: dict, key: str) -> dict:
    """Difference of means a − b and whether it exceeds the sum of the two seed standard deviations."""
    delta = a[key] - b[key]
    spread = a[f"{key}_std"] + b[f"{key}_std"]
    significant = min(a["n"], b["n"]) > 1 and abs(delta) > spread
    return {"delta": delta, "spread": spread, "significant": bool(significant)}


def plot_study(groups: list[dict], output: Path) -> str:
    """loss_study.png: tau per loss (error bars = seed std) and acceptance per slot, teacher-forced and measured
    (the measured rate of slot k is conditional on slots < k having been accepted)."""
    import matplotlib.pyplot as plt  # deferred: matplotlib is only needed to draw

    from dspark_lightning import plotting  # deferred with matplotlib

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    ax = axes[0]
    xs = range(len(groups))
    series = (
        ("teacher_tau", "teacher-forced tau"),
        ("teacher_greedy_tau", "TF greedy tau"),
        ("measured_tau", "measured tau"),
    )
    width = 0.8 / len(series)
    for i, (key, name) in enumerate(series):
        ax.bar(
            [x + (i - (len(series) - 1) / 2) * width for x in xs],
            [g[key] for g in groups],
            width=width,
            yerr=[g[f"{key}_std"] for g in groups],
            capsize=2,
            label=name,
        )
    ax.set_xticks(list(xs), [g["label"] for g in groups], rotation=30, ha="right")
    low = min(g[key] for g in groups for key, _ in series)
    high = max(g[key] for g in groups for key, _ in series)
    ax.set(ylabel="tokens per target forward", title="tau per loss (mean ± seed std)")
    ax.set_ylim(max(0.0, low - 0.15), high + 0.3)  # head room for the legend
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    for ax, key, title in (
        (axes[1], "accept_rate_per_slot", "teacher-forced acceptance per slot"),
        (axes[2], "measured_accepted_per_slot", "measured accept rate, earlier slots accepted"),
    ):
        for g in groups:
            ax.plot(range(len(g[key])), g[key], marker="o", ms=3, label=g["label"])
        ax.set(title=title + ", seed mean", xlabel="draft slot k", ylabel="rate", ylim=(0, 1))
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    return Path(plotting.save(fig, output / "loss_study.png")).name


def markdown_report(study: dict, plot: str) -> str:
    groups, budget = study["groups"], study["budget"]
    title, base_config, baseline = study_recipe(study)
    base = next((g for g in groups if g["label"] == baseline), None)
    if study.get("recipe", "demo") == "demo":
        sizes = (
            f"{budget['steps']} steps of {budget['batch_size']} packed rows x {budget['seq_len']} tokens, "
            f"{budget['max_anchors']} anchors per row, seeds {study['seeds']} (initialisation, anchors and data "
            f"order); validation on the first {budget['val_samples']} validation conversations"
        )
    else:  # the recipe's config sets the data, sequence length, batch and anchors; the study only the steps
        sizes = (
            f"{budget['steps']} steps at the config's data, sequence length, batch and anchors, seeds "
            f"{study['seeds']} (initialisation, anchors and data order); teacher-forced numbers on the config's "
            "validation cache"
        )
    lines = [
        f"# Drafter losses on {title}",
        "",
        *(
            []
            if study.get("complete", True)
            else [f"**Partial study**: stopped after {len(study['runs'])} runs; each loss's n is its seed count.", ""]
        ),
        f"Made by `{study['command']}` in {study['seconds'] / 60:.1f} min wall clock"
        + (f", {study['cpu_seconds'] / 60:.1f} min CPU" if study.get("cpu_seconds") else "")
        + (
            f". {machine_line(study['machine'])}"
            if study.get("machine")
            else f" (torch {torch.__version__}, one thread, CPU)."
        )
        + f" Every run: `{base_config}` + "
        f"`configs/heads/{study['head']}.yaml` + `configs/losses/<loss>.yaml`, B = {study['block_size']}, {sizes}; "
        f"measured greedy decoding on {budget['num_prompts']} held-out prompts x {budget['max_new_tokens']} new "
        "tokens. `+dpace` is the loss with the best mean teacher-forced tau retrained with D-PACE position weights.",
        "",
        "Significance rule: a difference of means counts as significant only when it exceeds the sum of the two "
        "seed standard deviations (sample std over seeds); with one seed nothing is significant. "
        f"Δ columns compare with `{baseline}` (the recipe's default loss).",
        "",
        "Teacher-forced tau uses the sampling acceptance α = Σ min(p, q) per slot on ground-truth prefixes; "
        "*TF greedy tau* counts leading slots whose draft argmax equals the target's; measured tau is real *greedy* "
        "speculative decoding with the target, so it follows the greedy quantity.",
        "",
        *(
            f"- best mean {name}: **{max(groups, key=lambda g: g[key])['label']}** ({max(g[key] for g in groups):.3f})"
            for key, name in (
                ("teacher_tau", "teacher-forced tau"),
                ("teacher_greedy_tau", "TF greedy tau"),
                ("measured_tau", "measured tau"),
            )
        ),
        "",
        "| loss | teacher-forced tau | Δ vs default | TF greedy tau | measured tau | Δ vs default | fit s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def delta(g, key):
        if base is None or g is base:
            return "—"
        s = significance(g, base, key)
        return f"{s['delta']:+.3f}{' (significant)' if s['significant'] else ''}"

    for g in groups:
        lines.append(
            f"| {g['label']} | {format_mean_std(g['teacher_tau'], g['teacher_tau_std'], g['n'])} "
            f"| {delta(g, 'teacher_tau')} "
            f"| {format_mean_std(g['teacher_greedy_tau'], g['teacher_greedy_tau_std'], g['n'])} "
            f"| {format_mean_std(g['measured_tau'], g['measured_tau_std'], g['n'])} | {delta(g, 'measured_tau')} "
            f"| {g['fit_seconds']:.0f} |"
        )
    width = len(groups[0]["accept_rate_per_slot"])
    for key, title in (
        ("accept_rate_per_slot", "Teacher-forced acceptance per slot (seed mean)"),
        (
            "measured_accepted_per_slot",
            "Measured accepted rate per slot, given the slots before it were accepted (seed mean; '-' = never reached)",
        ),
    ):
        lines += ["", f"{title}:", "", "| loss | " + " | ".join(f"k={k}" for k in range(width)) + " |"]
        lines.append("|---|" + "---:|" * width)
        for g in groups:
            cells = ["-" if math.isnan(v) else f"{v:.2f}" for v in g[key]]
            lines.append(f"| {g['label']} | " + " | ".join(cells) + " |")
    lines += ["", "Pairs whose difference is significant under the rule:", ""]
    pairs = [
        f"- {a['label']} vs {b['label']}: {key} {s['delta']:+.3f} (spread {s['spread']:.3f})"
        for key in ("teacher_tau", "measured_tau")
        for i, a in enumerate(groups)
        for b in groups[i + 1 :]
        if (s := significance(a, b, key))["significant"]
    ]
    lines += pairs or ["- none"]
    lines += eval_set_lines(study)
    lines += ["", f"![loss study]({plot})", ""]
    return "\n".join(lines)


def rerender_study(output: str | Path) -> dict:
    """Rewrite report.md and loss_study.png from an existing results.json (no training; the numbers are kept)."""
    output = Path(output)
    study = json.loads((output / "results.json").read_text())
    for g in study["groups"]:  # strict JSON stored NaN as null
        for key, value in g.items():
            if value is None:
                g[key] = math.nan
            elif isinstance(value, list):
                g[key] = [math.nan if v is None else v for v in value]
    plot = plot_study(study["groups"], output)
    (output / "report.md").write_text(markdown_report(study, plot))
    return study
