"""``dspark-lightning loss-study``: train the same head with each drafter loss, over several seeds, and compare.

    dspark-lightning loss-study --output reports/loss_study                      # the committed study
    dspark-lightning loss-study --output /tmp/s --losses '[kl,nla]' --seeds '[0]' --budget.steps 4   # a quick look

Every variant is ``configs/quickstart.yaml`` + ``configs/heads/<head>.yaml`` + ``configs/losses/<loss>.yaml``
trained through the real CLI by :func:`dspark_lightning.report.train_and_evaluate` (same budget, data and measuring
code as ``dspark-lightning report``); with ``--recipe smollm2`` the base config is ``configs/smollm2_sharegpt.yaml``
(SmolLM2-135M-Instruct from its offline feature cache, trained and measured by ``report-smollm2``'s functions, without
its wall-clock part; only ``steps`` and the evaluation sizes of the budget apply, the rest is the config's),
with ``seed_everything``, ``model.seed`` and ``data.seed`` set to the seed, so seeds change the initialisation, the
anchors and the data order. Runs go seed by seed; after the first seed's pass over the listed losses, the one with
the highest teacher-forced tau is trained with D-PACE position weighting (``--model.position_weighting dpace``;
``--dpace false`` skips it) in every pass. The report is rewritten after every run.

Numbers per run: teacher-forced tau and acceptance per slot on the validation blocks, and measured tau and accepted
rate per slot of real greedy speculative decoding with the target. Per loss: mean and sample standard deviation over
seeds. Significance rule (stated in the report): a difference of means between two losses counts as significant only
when it exceeds the sum of their seed standard deviations; with one seed nothing is called significant.

Writes ``report.md``, ``results.json`` (every run and every aggregate), ``loss_study.png`` and ``log.txt`` (the
progress log) into ``--output``.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt

from dspark_lightning.analysis import REPO_ROOT, command_line, quieted
from dspark_lightning.report import Budget, train_and_evaluate
from dspark_lightning.report_smollm2 import evaluate_head, fit_head

LOSS_CONFIGS = {  # label -> configs/losses/<file>.yaml
    "kl": "kl",
    "tv": "tv",
    "ce+tv": "ce_tv",
    "rkl": "rkl",
    "js": "js",
    "nla": "nla",
    "lk_hybrid": "lk_hybrid",
}
DEFAULT_LOSSES = ("kl", "tv", "ce+tv", "js", "nla", "lk_hybrid")
BASELINE = {"demo": "ce+tv", "smollm2": "kl"}  # each recipe's default loss (quickstart.yaml / smollm2_sharegpt.yaml)
METRICS = ("teacher_tau", "teacher_greedy_tau", "measured_tau")
RECIPES = {  # --recipe -> (title of the report, base config)
    "demo": ("the demo target", "configs/quickstart.yaml"),
    "smollm2": ("SmolLM2-135M-Instruct + ShareGPT V3", "configs/smollm2_sharegpt.yaml"),
}


def loss_fit_args(loss: str, seed: int, dpace: bool = False) -> list[str]:
    """The ``fit`` arguments that select the loss (its config file), the seed and, optionally, D-PACE weighting."""
    if loss not in LOSS_CONFIGS:
        raise ValueError(f"unknown loss {loss!r} for the study; choose from {', '.join(LOSS_CONFIGS)}")
    args = [
        f"--config={REPO_ROOT / 'configs/losses' / LOSS_CONFIGS[loss]}.yaml",
        f"--seed_everything={seed}",
        f"--model.seed={seed}",
        f"--data.seed={seed}",
    ]
    return args + (["--model.position_weighting=dpace"] if dpace else [])


def train_and_evaluate_smollm2(runs_root: Path, head: str, budget: Budget, extra: Sequence[str], name: str) -> dict:
    """One SmolLM2 variant: ``report-smollm2``'s fit (from the feature cache) and measurement, without wall clock."""
    start = time.perf_counter()
    cli = fit_head(runs_root, head, budget.steps, extra, name=name)
    fit_seconds = time.perf_counter() - start
    start = time.perf_counter()
    row = evaluate_head(
        cli, num_prompts=budget.num_prompts, max_new_tokens=budget.max_new_tokens, k=budget.k,
        max_blocks=budget.max_blocks, wall_clock=False,
    )  # fmt: skip
    row.update(
        head=head, fit_seconds=fit_seconds, eval_seconds=time.perf_counter() - start, run_dir=cli.trainer.log_dir
    )
    return row


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
    return out


def significance(a: dict, b: dict, key: str) -> dict:
    """Difference of means a − b and whether it exceeds the sum of the two seed standard deviations."""
    delta = a[key] - b[key]
    spread = a[f"{key}_std"] + b[f"{key}_std"]
    significant = min(a["n"], b["n"]) > 1 and abs(delta) > spread
    return {"delta": delta, "spread": spread, "significant": bool(significant)}


def _clean(x):
    """NaN -> None so that results.json is strict JSON."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _pm(mean: float, std: float, n: int) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.3f} ± {std:.3f}" if n > 1 else f"{mean:.3f}"


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
    baseline = BASELINE[study.get("recipe", "demo")]
    base = next((g for g in groups if g["label"] == baseline), None)
    title, base_config = RECIPES[study.get("recipe", "demo")]
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
        + f" (torch {torch.__version__}, one thread, CPU). Every run: `{base_config}` + "
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
            f"| {g['label']} | {_pm(g['teacher_tau'], g['teacher_tau_std'], g['n'])} | {delta(g, 'teacher_tau')} "
            f"| {_pm(g['teacher_greedy_tau'], g['teacher_greedy_tau_std'], g['n'])} "
            f"| {_pm(g['measured_tau'], g['measured_tau_std'], g['n'])} | {delta(g, 'measured_tau')} "
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
    lines += ["", f"![loss study]({plot})", ""]
    return "\n".join(lines)


def run_study(
    output: str | Path,
    losses: Sequence[str] = DEFAULT_LOSSES,
    seeds: Sequence[int] = (0, 1),
    budget: Budget | None = None,
    *,
    head: str = "vanilla",
    block_size: int = 8,
    dpace: bool = True,
    runs_dir: str | Path | None = None,
    command: str = "dspark-lightning loss-study",
    recipe: str = "demo",
    extra: Sequence[str] = (),
) -> dict:
    """Train every (loss, seed), then the best loss with D-PACE; write the study into ``output``; return it."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r} for the loss study; choose from {', '.join(RECIPES)}")
    budget = budget or Budget()
    for loss in losses:
        loss_fit_args(loss, 0)  # unknown names fail before any training
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    log_file = output / "log.txt"
    log_file.write_text("")

    def log(message: str) -> None:
        print(message, flush=True)
        with log_file.open("a") as f:
            f.write(message + "\n")

    keep = runs_dir is not None
    runs_root = Path(runs_dir) if keep else Path(tempfile.mkdtemp(prefix="dspark-loss-study-"))
    start, cpu_start = time.perf_counter(), time.process_time()
    runs: list[dict] = []
    total = len(losses) * len(seeds) + (len(seeds) if dpace else 0)

    def train(label: str, loss: str, seed: int, with_dpace: bool) -> dict:
        name = f"{label.replace('+', '_')}_s{seed}"
        fit_args = [*loss_fit_args(loss, seed, with_dpace), *extra]
        if recipe == "demo":
            row = train_and_evaluate(runs_root, head, block_size, budget, fit_args, name)
        else:
            row = train_and_evaluate_smollm2(
                runs_root, head, budget, [*fit_args, f"--model.block_size={block_size}"], name
            )
        row.update(label=label, loss=loss, seed=seed, dpace=with_dpace)
        row["run_dir"] = row["run_dir"] if keep else None
        runs.append(row)
        log(
            f"[{len(runs)}/{total}] {label:14s} seed {seed} fit {row['fit_seconds']:.0f}s eval "
            f"{row['eval_seconds']:.0f}s | teacher-forced tau {row['teacher_tau']:.3f} | measured tau "
            f"{row['measured_tau']:.3f}"
        )
        return row

    def study_so_far() -> dict:
        labels = list(dict.fromkeys(r["label"] for r in runs))
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        return {
            "command": command,
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,  # this process, all its threads (the CLI runs in-process)
            "recipe": recipe,
            "head": head,
            "block_size": block_size,
            "seeds": list(seeds),
            "complete": len(runs) == total,
            "budget": vars(budget),
            "significance_rule": "|mean_a - mean_b| > std_a + std_b (sample std over seeds; needs >= 2 seeds)",
            "groups": [aggregate(label, [r for r in runs if r["label"] == label]) for label in labels],
            "runs": [{k: v for k, v in r.items() if k != "selector"} for r in runs],
        }

    def write(study: dict) -> None:
        plot = plot_study(study["groups"], output)
        (output / "report.md").write_text(markdown_report(study, plot))
        (output / "results.json").write_text(json.dumps(_clean(study), indent=2))

    log(f"{command}: {total} runs, head {head}, B = {block_size}, {budget.steps} steps each")
    # Seed-major order, the study rewritten after every run: a long study that is stopped keeps a complete report
    # of every seed pass that finished. The D-PACE loss is the best by teacher-forced tau after the first pass.
    best = None
    try:
        for seed in seeds:
            for loss in losses:
                train(loss, loss, seed, False)
                write(study_so_far())
            if dpace:
                if best is None:
                    best = max(study_so_far()["groups"], key=lambda g: g["teacher_tau"])["label"]
                    log(f"best teacher-forced tau after seed {seed}: {best}; retraining it with D-PACE weighting")
                train(f"{best}+dpace", best, seed, True)
                write(study_so_far())
    finally:
        if not keep:
            shutil.rmtree(runs_root, ignore_errors=True)
    study = study_so_far()
    write(study)
    log(f"wrote {output / 'report.md'} ({study['seconds'] / 60:.1f} min wall, {study['cpu_seconds'] / 60:.1f} min CPU)")
    return study


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


def loss_study_command(
    output: str,
    losses: list[str] = list(DEFAULT_LOSSES),  # noqa: B006 (read only; jsonargparse shows it)
    seeds: list[NonNegativeInt] = [0, 1],  # noqa: B006
    recipe: Literal["demo", "smollm2"] = "demo",
    head: str = "vanilla",
    block_size: PositiveInt = 8,
    dpace: bool = True,
    runs_dir: str | None = None,
    budget: Budget = Budget(),  # noqa: B008 (frozen: never changed)
    threads: PositiveInt = 1,
    rerender: bool = False,
    fit_args: list[str] = [],  # noqa: B006
) -> dict:
    """Train one head with each drafter loss (several seeds) and write a loss study.

    Args:
        output: directory for report.md, results.json, the PNG and log.txt
        losses: drafter losses (configs/losses/<name>.yaml; names as in LOSS_CONFIGS)
        seeds: seeds per loss
        recipe: demo (configs/quickstart.yaml) or smollm2 (configs/smollm2_sharegpt.yaml: SmolLM2-135M-Instruct from
            its feature cache; only budget.steps and the evaluation sizes apply)
        head: Markov head (configs/heads/<name>.yaml)
        block_size: draft block size B
        dpace: after the losses, train the best one once more with D-PACE position weighting
        runs_dir: keep the run directories here (default: a deleted temporary directory)
        budget: training and evaluation sizes of every run
        threads: torch CPU threads
        rerender: only rewrite report.md and the PNG from results.json
        fit_args: more fit options for every run, e.g. [--model.max_anchors=32]
    """
    if rerender:
        return rerender_study(output)
    command = command_line("loss-study", loss_study_command, dict(locals()))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with quieted():
            return run_study(
                output,
                losses,
                seeds,
                budget,
                head=head,
                block_size=block_size,
                dpace=dpace,
                runs_dir=runs_dir,
                command=command,
                recipe=recipe,
                extra=fit_args,
            )
    finally:
        torch.set_num_threads(previous)
