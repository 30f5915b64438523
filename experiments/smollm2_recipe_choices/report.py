"""Collect the recipe-choice study (``run.sh``) into results.json, results.csv, table.md and a plot of the paired
differences: each choice's measured tau minus the base's on the same prompts, with a paired bootstrap 95% interval.

    python experiments/smollm2_recipe_choices/report.py --study_dir study/smollm2_recipe_choices \
        --output experiments/smollm2_recipe_choices

A run is ``<study_dir>/<name>/`` with ``budget.json`` (the probe, the steps, the fit's wall seconds) and
``step=<steps>.decode.json`` (``decode --eval_sets ... --baseline false --json``). What each run trained with is read
from its checkpoint, never typed here.
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

from dspark_lightning.machine import machine_line
from dspark_lightning.measuring.intervals import ratio_difference_bootstrap_ci
from dspark_lightning.measuring.results import read_eval_set_rows

BASE = "base"  # --base: the run every other one is paired with
# the base recipe's measured-tau trend per 10x training tokens, fitted by the earlier study on the same target
TREND = "experiments/smollm2_cpu_hour_study/results.json"
TARGET_TAU = 2.0  # issue 43's measured-tau target on both evaluation sets


def train_data(train_cache: str | list[str] | None) -> list[str]:
    """The feature caches a run trained on, by folder (``cache/<name>/train`` -> ``<name>``); [] for raw text."""
    caches = [train_cache] if isinstance(train_cache, str) else list(train_cache or [])
    return [Path(str(c)).parent.name for c in caches]


def train_size(train_cache: str | list[str] | None) -> dict:
    """Records, packed rows and supervised tokens of the caches a run trained on, summed from each cache's
    ``index.json``; None where a cache is not on this machine (the study's caches are untracked)."""
    caches = [train_cache] if isinstance(train_cache, str) else list(train_cache or [])
    stats = [Path(str(c)) / "index.json" for c in caches]
    if not caches or not all(p.is_file() for p in stats):
        return dict(train_records=None, train_rows=None, train_supervised_tokens=None)
    counts = [json.loads(p.read_text())["data_stats"] for p in stats]
    return {f"train_{k}": sum(c[k] for c in counts) for k in ("records", "rows", "supervised_tokens")}


def settings(ckpt: Path) -> dict:
    """What the run trained with, from the checkpoint's saved hyper-parameters and optimizer state."""
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    hp = state["hyper_parameters"]
    drafter, training = hp["drafter"], hp.get("training") or {}
    optimizer = state["optimizer_states"][0]  # the optimizer is no hyper-parameter: MuonAdamW saves its inner ones
    groups = (
        [g for inner in optimizer["inner"] for g in inner["param_groups"]]
        if "inner" in optimizer
        else optimizer["param_groups"]
    )
    return dict(
        block_size=drafter["block_size"], max_anchors=drafter["max_anchors"], markov_head=drafter["markov_head"]["kind"],
        draft_vocab="full" if not drafter.get("draft_vocab") else Path(str(drafter["draft_vocab"])).name,
        optimizer="MuonAdamW" if "inner" in optimizer else "AdamW",
        lr=[g.get("initial_lr", g["lr"]) for g in groups], feature_noise_std=training.get("feature_noise_std", 0.0),
        seq_len=state["datamodule_hyper_parameters"]["seq_len"],
        # the feature caches it trained on, by folder (cache/<name>/train), e.g. greedy or sampled replies
        train_data=train_data(state["datamodule_hyper_parameters"].get("train_cache")),
        # how much text that is, and how often a step draws a row of it (passes = steps x batch_size / train_rows)
        **train_size(state["datamodule_hyper_parameters"].get("train_cache")),
        batch_size=state["datamodule_hyper_parameters"]["batch_size"],
        # a stage (experiments/smollm2_draft_opd): the run it started from, and the draft-induced-state options
        init_weights=training.get("init_weights") and "/".join(Path(training["init_weights"]).parts[-2:]),
        error_replay=training.get("error_replay", 0.0), markov_prev=training.get("markov_prev", "teacher"),
    )  # fmt: skip


def final_tf_greedy_tau(fit_log: Path) -> float | None:
    """The teacher-forced greedy tau of the fit's one validation, at its last step, as its summary table printed it."""
    values = (
        re.findall(r"greedy_tau \(teacher-forced\)\s*│\s*([0-9.]+)", fit_log.read_text()) if fit_log.exists() else []
    )
    return float(values[-1]) if values else None


def stage_start(study_dir: Path, init_weights: str | None) -> dict:
    """The ``budget.json`` of the run a stage started from (``<run>/step=N.ckpt`` under ``study_dir``), {} if none:
    a stage's training cost is its own fit plus its start's."""
    if not init_weights:
        return {}
    path = study_dir / Path(init_weights).parent / "budget.json"
    if not path.exists():
        raise SystemExit(
            f"{init_weights}: a stage's start must be in the study ({path} is missing; link its run there)"
        )
    return json.loads(path.read_text())


def total_fit_seconds(point: dict) -> float:
    """The fit seconds behind a drafter: its own, plus its start's for a stage."""
    return point["fit_wall_seconds"] + (point.get("start_fit_seconds") or 0.0)


def collect(study_dir: Path, base: str = BASE, kind: str = "decode") -> list[dict]:
    """Every run's measured rows from ``step=<steps>.<kind>.json`` (``--kind``: another measurement of the same
    checkpoints, e.g. a sampled decode ``decode_t0.7``)."""
    points = []
    for budget_file in sorted(study_dir.glob("*/budget.json")):
        run_dir = budget_file.parent
        budget = json.loads(budget_file.read_text())
        decode_json = run_dir / f"step={budget['steps']}.{kind}.json"
        if not decode_json.exists():
            continue
        run_settings = settings(run_dir / f"step={budget['steps']}.ckpt")
        start = stage_start(study_dir, run_settings["init_weights"])
        for measured in read_eval_set_rows(decode_json):
            summary, decoded = measured.summary, measured.decoded
            points.append(dict(
                run=run_dir.name, steps=budget["steps"], budget_s=budget["budget_s"],
                probe_seconds_per_step=budget["probe_seconds_per_step"],
                fit_wall_seconds=budget.get("fit_wall_seconds"), precision=budget.get("precision"),
                start_fit_seconds=start.get("fit_wall_seconds"), start_steps=start.get("steps"),
                tf_greedy_tau=final_tf_greedy_tau(study_dir / f"{run_dir.name}.fit.log"),
                training_tokens=(budget["steps"] + start.get("steps", 0)) * run_settings["seq_len"], **run_settings,
                eval_set=summary.eval_set, mode=summary.mode, num_prompts=summary.num_prompts,
                max_new_tokens=summary.max_new_tokens, measured_tau=summary.measured_tau,
                measured_tau_ci=summary.measured_tau_ci, acceptance_per_slot=summary.acceptance_per_slot,
                prompt_counts=[[r.emitted_tokens, r.target_forwards] for r in decoded.prompt_records],
                dtype=decoded.dtype, machine=decoded.machine,
                temperature=decoded.temperature if decoded.temperature is not None else 0.0,
            ))  # fmt: skip
    return sorted(points, key=lambda p: (p["run"] != base, p["run"], p["eval_set"] != "sharegpt_heldout"))


def collect_wall_clock(study_dir: Path) -> list[dict]:
    """The timed runs: speedup against ``generate`` on its default kernels and on the packed kernels the speculative
    loop verifies with (the same-kernel baseline), each with its 95% interval, whole blocks and cost-model schedule."""
    rows = []
    for budget_file in sorted(study_dir.glob("*/budget.json")):
        steps = json.loads(budget_file.read_text())["steps"]
        timed = budget_file.parent / f"step={steps}.wall_clock.json"
        if not timed.exists():
            continue
        ckpt_settings = settings(budget_file.parent / f"step={steps}.ckpt")
        for measured in read_eval_set_rows(timed):
            summary, decoded = measured.summary, measured.decoded
            records, spread = decoded.prompt_records, decoded.comparison.spread
            # packed verify: generate timed on its default and on the packed kernels; otherwise (bf16) the speculative
            # loop verifies on generate's own default kernels, so its plain speedup is the same-kernel one
            packed = summary.speedup_vs_packed_generate is not None
            same, same_ci = (
                (summary.speedup_vs_packed_generate, summary.speedup_vs_packed_generate_ci)
                if packed
                else (summary.speedup, summary.speedup_ci)
            )
            rows.append(dict(
                run=budget_file.parent.name, steps=steps, markov_head=ckpt_settings["markov_head"],
                eval_set=summary.eval_set, schedule="cost model" if isinstance(summary.threshold, list) else "whole blocks",
                num_prompts=summary.num_prompts, max_new_tokens=summary.max_new_tokens,
                measured_tau=summary.measured_tau, measured_tau_ci=summary.measured_tau_ci,
                speedup=summary.speedup, speedup_ci=summary.speedup_ci,
                speedup_vs_packed_generate=same, speedup_vs_packed_generate_ci=same_ci, verify_kernels=
                "oneDNN-packed" if packed else "default", dtype=decoded.dtype,
                # the tau at which this run's cost per step would pay against the same-kernel generate (speedup ∝ tau)
                break_even_tau=summary.measured_tau / same, mean_verified=decoded.mean_verified,
                outputs_equal=sum(bool(r.outputs_equal) for r in records),
                output_ties=sum(bool(r.output_tie) for r in records),
                torch_threads=spread.torch_threads if spread else None,
                load_average=spread.load_average if spread else None, machine=decoded.machine,
            ))  # fmt: skip
    return rows


def wall_clock_table(rows: list[dict]) -> str:
    lines = [
        "| run | head | eval set | schedule | prompts | measured tau [95% CI] | drafts verified per step "
        "| speedup vs `generate` [95% CI] | vs `generate` on the same kernels [95% CI] | break-even tau, same kernels "
        "| outputs equal (ties) |",
        "|---|---|---|---|---:|---|---:|---|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['markov_head']} | {r['eval_set']} | {r['schedule']} | {r['num_prompts']} "
            f"| {r['measured_tau']:.3f} [{r['measured_tau_ci'][0]:.3f}, {r['measured_tau_ci'][1]:.3f}] "
            f"| {r['mean_verified']:.2f} | {r['speedup']:.3f}x [{r['speedup_ci'][0]:.3f}, {r['speedup_ci'][1]:.3f}] "
            f"| {r['speedup_vs_packed_generate']:.3f}x [{r['speedup_vs_packed_generate_ci'][0]:.3f}, "
            f"{r['speedup_vs_packed_generate_ci'][1]:.3f}] | {r['break_even_tau']:.2f} "
            f"| {r['outputs_equal']}/{r['num_prompts']} ({r['output_ties']}) |"
        )
    return "\n".join(lines) + "\n"


def paired_differences(points: list[dict], trend: dict, base_run: str = BASE, pairs: dict | None = None) -> None:
    """Each non-base point gets ``delta_vs_base`` and its paired interval over the prompts both ran on, and
    ``delta_from_seconds``: what its extra (or missing) fit seconds alone would be worth on the base trend,
    slope x log10(fit seconds / base fit seconds), the probe's error in turning the budget into steps (a stage's
    seconds include its start's). ``pairs`` maps a run to its own base (``paired_with``), e.g. a longer run to the
    base's run of the same length; a base named there must be in the study."""
    pairs = pairs or {}
    missing = sorted(set(pairs.values()) - {p["run"] for p in points})
    if missing:
        raise SystemExit(f"--pair: no measured run {missing[0]} in the study")
    by_run = {(p["run"], p["eval_set"]): p for p in points}
    for p in points:
        own_base = pairs.get(p["run"], base_run)
        ref = by_run.get((own_base, p["eval_set"]))
        if p["run"] == base_run or p["run"] in pairs.values() or ref is None:
            continue
        if own_base != base_run:
            p["paired_with"] = own_base
        if len(ref["prompt_counts"]) != len(p["prompt_counts"]):  # pairing needs the same prompts, in order
            raise SystemExit(f"{p['run']} / {p['eval_set']}: {len(p['prompt_counts'])} prompts, base has "
                             f"{len(ref['prompt_counts'])}; measure both with the same PROMPTS")  # fmt: skip
        (num_a, den_a), (num_b, den_b) = zip(*p["prompt_counts"], strict=True), zip(*ref["prompt_counts"], strict=True)
        p["delta_vs_base"] = p["measured_tau"] - ref["measured_tau"]
        p["delta_vs_base_ci"] = list(ratio_difference_bootstrap_ci(num_a, den_a, num_b, den_b))
        slope = trend[p["eval_set"]]["slope_per_decade"]
        p["delta_from_seconds"] = slope * math.log10(total_fit_seconds(p) / total_fit_seconds(ref))


def table(points: list[dict]) -> str:
    lines = [
        "| run | head | optimizer | noise std | draft vocab | B | steps | s/step (probe) | fit s | eval set | prompts "
        "| measured tau [95% CI] | Δ tau vs base, same prompts [95% CI] | Δ its fit seconds alone would give "
        "| teacher-forced greedy tau |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---|---:|---|---|---:|---:|",
    ]
    for p in points:
        lo, hi = p["measured_tau_ci"]
        delta = "-"
        if "delta_vs_base" in p:
            dlo, dhi = p["delta_vs_base_ci"]
            delta = f"{p['delta_vs_base']:+.3f} [{dlo:+.3f}, {dhi:+.3f}]"
            if p.get("paired_with"):  # --pair: against its own base, named
                delta += f" vs {p['paired_with']}"
        fit_s = f"{p['fit_wall_seconds']:.0f}" if p["fit_wall_seconds"] else "-"
        if p.get("start_fit_seconds"):  # a stage: its start's seconds, then its own
            fit_s = f"{p['start_fit_seconds']:.0f} + {fit_s}"
        lines.append(
            f"| {p['run']} | {p['markov_head']} | {p['optimizer']} | {p['feature_noise_std']:g} | {p['draft_vocab']} | {p['block_size']} "
            f"| {p['steps']} | {p['probe_seconds_per_step']:.2f} | {fit_s} | {p['eval_set']} | {p['num_prompts']} "
            f"| {p['measured_tau']:.3f} [{lo:.3f}, {hi:.3f}] | {delta} "
            f"| {'-' if 'delta_from_seconds' not in p else format(p['delta_from_seconds'], '+.3f')} "
            f"| {'-' if p['tf_greedy_tau'] is None else format(p['tf_greedy_tau'], '.3f')} |"
        )
    return "\n".join(lines) + "\n"


def plot(points: list[dict], path: Path) -> None:
    """The paired differences per evaluation set: a dot and its 95% interval per choice, zero marked."""
    sets = sorted({p["eval_set"] for p in points}, key=lambda name: (name != "sharegpt_heldout", name))
    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 3), sharex=True, squeeze=False)
    for ax, eval_set in zip(axes[0], sets, strict=True):
        pts = [p for p in points if p["eval_set"] == eval_set and "delta_vs_base" in p]
        ys = range(len(pts))
        ax.errorbar(
            [p["delta_vs_base"] for p in pts], ys, fmt="o", capsize=3,
            xerr=[[p["delta_vs_base"] - p["delta_vs_base_ci"][0] for p in pts],
                  [p["delta_vs_base_ci"][1] - p["delta_vs_base"] for p in pts]],
        )  # fmt: skip
        ax.axvline(0, color="gray", ls=":")
        ax.set_yticks(list(ys), [p["run"] for p in pts])
        ax.set_title(f"{eval_set}: Δ measured tau vs base")
        ax.set_xlabel("paired difference, 95% CI over prompts")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study_dir", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--base", default=BASE, help="the run the others are paired with (default: base)")
    parser.add_argument("--kind", default="decode", help="read step=N.<kind>.json (default: decode)")
    parser.add_argument("--pair", action="append", default=[], metavar="RUN=BASE",
                        help="pair RUN with BASE instead of --base (repeatable); BASE is then no one's pair")  # fmt: skip
    args = parser.parse_args()
    pairs = dict(item.split("=", 1) for item in args.pair if "=" in item)
    if len(pairs) != len(args.pair):
        raise SystemExit(f"--pair {args.pair}: expected RUN=BASE")
    points = collect(Path(args.study_dir), args.base, args.kind)
    if not points:
        raise SystemExit(f"no <run>/budget.json with its step=N.{args.kind}.json under {args.study_dir}")
    paired_differences(points, json.loads(Path(TREND).read_text())["extrapolation"], args.base, pairs)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    machines = {json.dumps(p["machine"], sort_keys=True) for p in points if p["machine"]}
    results = dict(
        target_tau=TARGET_TAU,
        machine=points[0]["machine"],
        machine_line=machine_line(points[0]["machine"]) if points[0]["machine"] else None,
        machines_differ=len({json.loads(m)["cpu"] for m in machines}) > 1,
        points=points,
        # the timed runs are greedy decodes of the same checkpoints: they belong to the default measurement only
        wall_clock=collect_wall_clock(Path(args.study_dir)) if args.kind == "decode" else [],
    )
    (output / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    listed = (
        "acceptance_per_slot",
        "measured_tau_ci",
        "prompt_counts",
        "delta_vs_base",
        "delta_vs_base_ci",
        "machine",
        "delta_from_seconds",
    )
    columns = [k for k in points[0] if k not in listed]
    with open(output / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*columns, "tau_ci_low", "tau_ci_high", "delta_vs_base", "delta_ci_low", "delta_ci_high",
                         "delta_from_seconds", "cpu", "cpu_flags", "torch_threads"])  # fmt: skip
        writer.writerows(
            [*(p[k] for k in columns), *p["measured_tau_ci"], p.get("delta_vs_base", ""),
             *p.get("delta_vs_base_ci", ["", ""]), p.get("delta_from_seconds", ""), (p["machine"] or {}).get("cpu", ""),
             (p["machine"] or {}).get("flags", ""), (p["machine"] or {}).get("threads", "")]
            for p in points
        )  # fmt: skip
    (output / "table.md").write_text(table(points))
    plot(points, output / "paired_differences.png")
    print(table(points))
    if results["wall_clock"]:
        (output / "wall_clock.md").write_text(wall_clock_table(results["wall_clock"]))
        print(wall_clock_table(results["wall_clock"]))


if __name__ == "__main__":
    main()
