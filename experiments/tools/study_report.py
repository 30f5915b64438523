"""Collect a training study's measured points into a report: results.json, results.csv, table.md, a plot.

    python experiments/tools/study_report.py --study_dir study/smollm2 --output experiments/smollm2_cpu_hour_study

A point is a checkpoint ``<study_dir>/<run>/step=<N>.ckpt`` with its ``step=<N>.decode.json`` (``decode --eval_sets
... --baseline false --json``, as ``experiments/smollm2_cpu_hour_study/run.sh`` writes them). What each point trained with is read
from the checkpoint itself (drafter layers and anchors, learning rate, training caches, seed), never typed here; the
conversations it saw are the ``records`` of each training cache's ``index.json``; a run's last checkpoint also gets the
teacher-forced greedy tau its fit printed at its one validation (``<run>.fit.log``, 16 cached validation rows); CPU seconds per step come from the
modification times of the run's consecutive checkpoints (a run's length is its last checkpoint's step) (both under the same load, which the report states).

The extrapolation fits measured tau = a + b * log10(training tokens) per evaluation set by least squares over the
points of the base configuration (every run whose only difference from ``base`` is its length) and solves it for the
tau targets: what a target would cost at this configuration, if the trend held (a trend over less than a decade).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from dspark_lightning.measuring.intervals import ratio_difference_bootstrap_ci
from dspark_lightning.measuring.results import read_eval_set_rows

SETTINGS = ("num_layers", "max_anchors", "lr", "conversations", "max_steps")  # what tells two runs' configs apart
TARGETS = {"sharegpt_heldout": 2.0, "humaneval": 2.5}  # issue #28's measured-tau targets per eval set


def checkpoint_settings(ckpt: Path) -> dict:
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    drafter = state["hyper_parameters"]["drafter"]
    data = state["datamodule_hyper_parameters"]
    caches = data["train_cache"] if isinstance(data["train_cache"], list) else [data["train_cache"]]
    records = sum(json.loads((Path(c) / "index.json").read_text())["data_stats"]["records"] for c in caches)
    group = state["optimizer_states"][0]["param_groups"][0]
    return dict(
        num_layers=drafter["num_layers"], max_anchors=drafter["max_anchors"], block_size=drafter["block_size"],
        markov_head=drafter["markov_head"]["kind"], lr=group.get("initial_lr", group["lr"]), conversations=records,
        seq_len=data["seq_len"], batch_size=data["batch_size"],
    )  # fmt: skip


def final_tf_greedy_tau(fit_log: Path) -> float | None:
    """The teacher-forced greedy tau of the run's last validation, as the fit's summary table printed it."""
    values = (
        re.findall(r"greedy_tau \(teacher-forced\)\s*│\s*([0-9.]+)", fit_log.read_text()) if fit_log.exists() else []
    )
    return float(values[-1]) if values else None


def collect(study_dir: Path) -> list[dict]:
    points = []
    for decode_json in sorted(study_dir.glob("*/step=*.decode.json")):
        run, step = decode_json.parent.name, int(re.search(r"step=(\d+)", decode_json.name)[1])
        ckpt = decode_json.with_name(f"step={step}.ckpt")
        settings = checkpoint_settings(ckpt)
        ckpts = sorted(decode_json.parent.glob("step=*.ckpt"), key=lambda p: int(re.search(r"\d+", p.name)[0]))
        times = [(int(re.search(r"\d+", p.name)[0]), p.stat().st_mtime) for p in ckpts]
        per_step = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(times, times[1:], strict=False)]
        # the fit validates once, at its last step: the run's own teacher-forced number on the cached validation rows
        tf_tau = final_tf_greedy_tau(study_dir / f"{run}.fit.log") if step == times[-1][0] else None
        for row in read_eval_set_rows(decode_json):
            summary = row.summary
            points.append(dict(
                run=run, step=step, max_steps=times[-1][0], **settings,
                training_tokens=step * settings["batch_size"] * settings["seq_len"],
                seconds_per_step=sum(per_step) / len(per_step) if per_step else None, tf_greedy_tau=tf_tau,
                eval_set=summary.eval_set, mode=summary.mode, num_prompts=summary.num_prompts,
                max_new_tokens=summary.max_new_tokens, measured_tau=summary.measured_tau,
                measured_tau_ci=summary.measured_tau_ci, acceptance_per_slot=summary.acceptance_per_slot,
                prompt_counts=[[r.emitted_tokens, r.target_forwards] for r in row.decoded.prompt_records],
            ))  # fmt: skip
    return sorted(points, key=lambda p: (p["run"], p["step"], p["eval_set"] != "sharegpt_heldout"))


def base_points(points: list[dict]) -> list[dict]:
    """Points whose run differs from ``base`` at most in its length (max_steps)."""
    base = next((p for p in points if p["run"] == "base"), None)
    if base is None:
        return []
    same = [k for k in SETTINGS if k != "max_steps"]
    return [p for p in points if all(p[k] == base[k] for k in same)]


def paired_differences(points: list[dict]) -> None:
    """Each point that is not on the base trend gets ``delta_vs_base``: its measured tau minus that of the base
    configuration at the same step of a run as long, on the same prompts, with a paired bootstrap interval."""
    base = base_points(points)
    for p in points:
        if any(p is b for b in base):
            continue
        ref = next(
            (
                b
                for b in base
                if (b["eval_set"], b["step"], b["max_steps"]) == (p["eval_set"], p["step"], p["max_steps"])
            ),
            None,
        )
        if ref is None:
            continue
        (num_a, den_a), (num_b, den_b) = zip(*p["prompt_counts"], strict=True), zip(*ref["prompt_counts"], strict=True)
        p["reference"] = f"{ref['run']}@{ref['step']}"
        p["delta_vs_base"] = p["measured_tau"] - ref["measured_tau"]
        p["delta_vs_base_ci"] = list(ratio_difference_bootstrap_ci(num_a, den_a, num_b, den_b))


def extrapolate(points: list[dict]) -> dict:
    out = {}
    for eval_set, target in TARGETS.items():
        pts = [p for p in base_points(points) if p["eval_set"] == eval_set]
        xs, ys = [math.log10(p["training_tokens"]) for p in pts], [p["measured_tau"] for p in pts]
        if len(set(xs)) < 2:
            continue
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        a = my - b * mx
        tokens = 10 ** ((target - a) / b) if b > 0 else None
        per_step = [p["seconds_per_step"] for p in pts if p["seconds_per_step"]]
        seconds = (
            tokens / (pts[0]["seq_len"] * pts[0]["batch_size"]) * (sum(per_step) / len(per_step))
            if tokens and per_step
            else None
        )
        out[eval_set] = dict(
            target_tau=target, intercept=a, slope_per_decade=b, points=len(pts), tokens_for_target=tokens,
            cpu_hours_for_target=seconds / 3600 if seconds else None,
        )  # fmt: skip
    return out


def delta(p: dict) -> str:
    if "delta_vs_base" not in p:
        return "-"
    lo, hi = p["delta_vs_base_ci"]
    return f"{p['delta_vs_base']:+.3f} [{lo:+.3f}, {hi:+.3f}] vs {p['reference']}"


def table(points: list[dict]) -> str:
    lines = [
        "| run | step | training tokens | layers | anchors | lr | conversations | s/step | eval set | prompts "
        "| measured tau [95% CI] | Δ tau vs base, same prompts [95% CI] | teacher-forced greedy tau |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|",
    ]
    for p in points:
        lo, hi = p["measured_tau_ci"]
        sps = f"{p['seconds_per_step']:.2f}" if p["seconds_per_step"] else "-"
        lines.append(
            f"| {p['run']} | {p['step']} | {p['training_tokens']:,} | {p['num_layers']} | {p['max_anchors']} "
            f"| {p['lr']:g} | {p['conversations']:,} | {sps} | {p['eval_set']} | {p['num_prompts']} "
            f"| {p['measured_tau']:.3f} [{lo:.3f}, {hi:.3f}] | {delta(p)} "
            f"| {'-' if p['tf_greedy_tau'] is None else format(p['tf_greedy_tau'], '.3f')} |"
        )
    return "\n".join(lines) + "\n"


def plot(points: list[dict], path: Path, fits: dict | None = None) -> None:
    """Measured tau against training tokens per eval set: the base configuration's points joined (with its fitted
    log-linear trend, dashed), every other run a marker, nudged sideways so that equal budgets stay readable."""
    sets = sorted({p["eval_set"] for p in points}, key=lambda name: (name != "sharegpt_heldout", name))
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4), sharey=True, squeeze=False)
    base = {id(p) for p in base_points(points)}
    runs = sorted(
        {p["run"] for p in points}, key=lambda run: (run not in {q["run"] for q in points if id(q) in base}, run)
    )
    for ax, eval_set in zip(axes[0], sets, strict=True):
        on_trend = sorted(
            (p for p in points if p["eval_set"] == eval_set and id(p) in base), key=lambda p: p["training_tokens"]
        )
        if on_trend:
            ax.plot(
                [p["training_tokens"] for p in on_trend],
                [p["measured_tau"] for p in on_trend],
                "-",
                color="gray",
                alpha=0.5,
            )
        fit = (fits or {}).get(eval_set)
        if fit:
            xs = [min(p["training_tokens"] for p in points) * 0.9, max(p["training_tokens"] for p in points) * 1.5]
            ax.plot(
                xs,
                [fit["intercept"] + fit["slope_per_decade"] * math.log10(x) for x in xs],
                "--",
                color="gray",
                label=f"base trend: {fit['slope_per_decade']:+.2f} tau per 10x tokens",
            )
        for i, run in enumerate(runs):
            pts = sorted((p for p in points if p["eval_set"] == eval_set and p["run"] == run), key=lambda p: p["step"])
            if not pts:
                continue
            xs = [p["training_tokens"] * (1 + 0.025 * (i - len(runs) / 2)) for p in pts]
            ys = [p["measured_tau"] for p in pts]
            err = [
                [y - p["measured_tau_ci"][0] for p, y in zip(pts, ys, strict=True)],
                [p["measured_tau_ci"][1] - y for p, y in zip(pts, ys, strict=True)],
            ]
            ax.errorbar(xs, ys, yerr=err, fmt="o" if id(pts[0]) in base else "s", capsize=3, label=run)
        ax.axhline(TARGETS.get(eval_set, float("nan")), ls=":", color="black", label="issue #28 target")
        ax.set_xscale("log")
        ax.set_xlabel("training tokens seen (packed 1,024-token rows x steps)")
        ax.set_title(f"{eval_set}: measured tau, 95% CI over prompts")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("measured tau")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study_dir", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    points = collect(Path(args.study_dir))
    if not points:
        raise SystemExit(f"no step=N.decode.json next to a step=N.ckpt under {args.study_dir}")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    paired_differences(points)
    results = dict(points=points, extrapolation=extrapolate(points))
    (output / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    listed = (
        "acceptance_per_slot",
        "measured_tau_ci",
        "prompt_counts",
        "reference",
        "delta_vs_base",
        "delta_vs_base_ci",
    )
    columns = [k for k in points[0] if k not in listed]
    with open(output / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [*columns, "tau_ci_low", "tau_ci_high", "reference", "delta_vs_base", "delta_ci_low", "delta_ci_high"]
        )
        writer.writerows(
            [*(p[k] for k in columns), *p["measured_tau_ci"], p.get("reference", ""), p.get("delta_vs_base", ""),
             *p.get("delta_vs_base_ci", ["", ""])]
            for p in points
        )  # fmt: skip
    (output / "table.md").write_text(table(points))
    plot(points, output / "tau_vs_training_tokens.png", results["extrapolation"])
    print(table(points))
    print(json.dumps(results["extrapolation"], indent=1))


if __name__ == "__main__":
    main()
