"""``dspark-lightning loss-study``: train the same head with each drafter loss, over several seeds, and compare.

    dspark-lightning loss-study --output /tmp/s --losses '[kl,nla]' --seeds '[0]' --budget.steps 4   # a quick look

Variants, seeds, D-PACE, the numbers and the significance rule: docs/design/design.md §12.3."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt

from dspark_lightning.checks import dumps_json
from dspark_lightning.errors import OptionError
from dspark_lightning.machine import machine_description
from dspark_lightning.measuring.eval_set_tables import DEFAULT_MAX_NEW_TOKENS
from dspark_lightning.measuring.eval_sets import EvalSetName, check_eval_sets
from dspark_lightning.shipped import SHIPPED_ROOT
from dspark_lightning.studies.command_lines import command_line
from dspark_lightning.studies.loss_study_results import (
    aggregate,
    eval_set_summary,
    markdown_report,
    plot_study,
    rerender_study,
)
from dspark_lightning.studies.quiet_output import quieted
from dspark_lightning.studies.recipes import Recipe, load_recipe, repo_relative
from dspark_lightning.studies.report import Budget, train_and_evaluate
from dspark_lightning.studies.report_recipe import eval_set_rows, evaluate_head, fit_head
from dspark_lightning.studies.table_cells import format_number

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


@dataclass(frozen=True)
class EvalSetPlan:
    """The evaluation sets every run is measured on (``--eval_sets`` and the options that go with it).

    ``heldout_files`` / ``heldout_split``: ``sharegpt_heldout``'s conversations and id split (default: the
    recipe's, else the fit's ``data.val_files`` and ``data.split_by_id``)."""

    names: tuple[str, ...]
    limit: int | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    heldout_files: str | None = None
    heldout_split: dict[str, float] | None = None

    def measure(self, module, datamodule, mode: str, k: int) -> list[dict]:
        """Greedy decoding of ``module`` in ``mode`` on each set (``report_recipe.eval_set_rows``, untimed)."""
        return eval_set_rows(
            module, datamodule, self.names, mode, k=k, limit=self.limit, max_new_tokens=self.max_new_tokens,
            baseline=False, heldout_files=self.heldout_files, heldout_split=self.heldout_split,
        )  # fmt: skip


def loss_fit_args(loss: str, seed: int, dpace: bool = False) -> list[str]:
    """The ``fit`` arguments that select the loss (its config file), the seed and, optionally, D-PACE weighting."""
    if loss not in LOSS_CONFIGS:
        raise OptionError(f"--losses: unknown loss {loss!r} for the study; choose from {', '.join(LOSS_CONFIGS)}")
    args = [
        f"--config={SHIPPED_ROOT / 'configs/losses' / LOSS_CONFIGS[loss]}.yaml",
        f"--seed_everything={seed}",
        f"--model.training.seed={seed}",
        f"--data.seed={seed}",
    ]
    return args + (["--model.loss.position_weighting=dpace"] if dpace else [])


def train_and_evaluate_recipe(
    recipe: Recipe,
    runs_root: Path,
    head: str,
    budget: Budget,
    extra: Sequence[str],
    name: str,
    eval_sets: EvalSetPlan | None = None,
) -> dict:
    """One variant on a recipe: ``report-recipe``'s fit and measurement, without the wall clock."""
    plan = eval_sets or EvalSetPlan(())
    start = time.perf_counter()
    cli, checkpoint = fit_head(recipe, runs_root, head, budget.steps, extra, name=name)
    fit_seconds = time.perf_counter() - start
    start = time.perf_counter()
    row = evaluate_head(
        cli, checkpoint, num_prompts=budget.num_prompts, max_new_tokens=budget.max_new_tokens, k=budget.k,
        max_blocks=budget.max_blocks, wall_clock=False, eval_sets=plan.names, eval_set_limit=plan.limit,
        eval_max_new_tokens=plan.max_new_tokens, recipe=recipe, heldout_files=plan.heldout_files,
        heldout_split=plan.heldout_split,
    )  # fmt: skip
    row.update(
        head=head, fit_seconds=fit_seconds, eval_seconds=time.perf_counter() - start, run_dir=cli.trainer.log_dir
    )
    return row


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
    eval_sets: EvalSetPlan | None = None,
) -> dict:
    """Train every (loss, seed), then the best loss with D-PACE; write the study into ``output``; return it.

    ``recipe``: "demo", or a recipe file or name (``recipes.load_recipe``); ``eval_sets``: also measure every run
    on these evaluation sets."""
    loaded = None if recipe == "demo" else load_recipe(recipe)  # an unknown recipe fails before any training
    if eval_sets is not None and eval_sets.names:  # a missing set or file fails before any training too
        heldout = eval_sets.heldout_files or (loaded.heldout_files if loaded else None)
        check_eval_sets(eval_sets.names, limit=eval_sets.limit, heldout_files=heldout)
    else:
        eval_sets = None
    budget = budget or Budget()
    for loss in losses:
        loss_fit_args(loss, 0)  # unknown names fail before any training
    if not seeds:
        raise OptionError("--seeds must name at least one seed")
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

    def measure_eval_sets(module, datamodule, row: dict) -> dict:
        """A demo run's numbers on the evaluation sets, in the mode its measured tau was decoded in."""
        return {"eval_sets": eval_sets.measure(module, datamodule, row["measured_mode"], budget.k)}

    def train(label: str, loss: str, seed: int, with_dpace: bool) -> dict:
        name = f"{label.replace('+', '_')}_s{seed}"
        fit_args = [*loss_fit_args(loss, seed, with_dpace), *extra]
        if loaded is None:
            measure = None if eval_sets is None else measure_eval_sets
            row = train_and_evaluate(runs_root, head, block_size, budget, fit_args, name, measure)
        else:
            row = train_and_evaluate_recipe(
                loaded, runs_root, head, budget, [*fit_args, f"--model.drafter.block_size={block_size}"], name,
                eval_sets,
            )  # fmt: skip
        row.update(label=label, loss=loss, seed=seed, dpace=with_dpace)
        row["run_dir"] = row["run_dir"] if keep else None
        runs.append(row)
        log(
            f"[{len(runs)}/{total}] {label:14s} seed {seed} fit {row['fit_seconds']:.0f}s eval "
            f"{row['eval_seconds']:.0f}s | teacher-forced tau {row['teacher_tau']:.3f} | measured tau "
            f"{row['measured_tau']:.3f}"
            + "".join(
                f" | {s.eval_set} tau {format_number(s.measured_tau)}"
                for s in (eval_set_summary(e, row["loss"]) for e in row.get("eval_sets", []))
            )
        )
        return row

    def study_so_far() -> dict:
        labels = list(dict.fromkeys(r["label"] for r in runs))
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        return {
            "command": command,
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,  # this process, all its threads (the CLI runs in-process)
            "machine": machine_description(),
            "recipe": "demo" if loaded is None else loaded.name,
            "recipe_file": None if loaded is None else str(repo_relative(loaded.path)),
            "head": head,
            "block_size": block_size,
            "seeds": list(seeds),
            "complete": len(runs) == total,
            "budget": vars(budget),
            "significance_rule": "|mean_a - mean_b| > std_a + std_b (sample std over seeds; needs >= 2 seeds)",
            **({} if eval_sets is None else {"eval_sets": vars(eval_sets) | {"names": list(eval_sets.names)}}),
            "groups": [aggregate(label, [r for r in runs if r["label"] == label]) for label in labels],
            "runs": [{k: v for k, v in r.items() if k != "selector"} for r in runs],
        }

    def write(study: dict) -> None:
        plot = plot_study(study["groups"], output)
        (output / "report.md").write_text(markdown_report(study, plot))
        (output / "results.json").write_text(dumps_json(study, indent=2))  # strict: NaN is null

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


def loss_study_command(
    output: str,
    losses: list[str] = list(DEFAULT_LOSSES),  # noqa: B006 (read only; jsonargparse shows it)
    seeds: list[NonNegativeInt] = [0, 1],  # noqa: B006
    recipe: str = "demo",
    head: str = "vanilla",
    block_size: PositiveInt = 8,
    dpace: bool = True,
    runs_dir: str | None = None,
    budget: Budget = Budget(),  # noqa: B008 (frozen: never changed)
    threads: PositiveInt = 1,
    rerender: bool = False,
    fit_args: list[str] = [],  # noqa: B006
    eval_sets: list[EvalSetName] = [],  # noqa: B006
    eval_set_limit: PositiveInt | None = None,
    eval_max_new_tokens: PositiveInt = DEFAULT_MAX_NEW_TOKENS,
    heldout_files: str | None = None,
    heldout_split_by_id: dict[str, float] | None = None,
) -> dict:
    """Train one head with each drafter loss (several seeds) and write a loss study.

    Args:
        output: directory for report.md, results.json, the PNG and log.txt
        losses: drafter losses (configs/losses/<name>.yaml; names as in LOSS_CONFIGS)
        seeds: seeds per loss
        recipe: demo (configs/quickstart.yaml), or a recipe: a YAML file, or a name for configs/recipes/<name>.yaml
            (e.g. smollm2: its fit config; only budget.steps and the evaluation sizes apply)
        head: Markov head (configs/heads/<name>.yaml)
        block_size: draft block size B
        dpace: after the losses, train the best one once more with D-PACE position weighting
        runs_dir: keep the run directories here (default: a deleted temporary directory)
        budget: training and evaluation sizes of every run
        threads: torch CPU threads
        rerender: only rewrite report.md and the PNG from results.json
        fit_args: more fit options for every run, e.g. [--model.drafter.max_anchors=32]
        eval_sets: also measure every run on these evaluation sets (sharegpt_heldout: held-out conversation
            prompts; humaneval: the 164 HumanEval problems): per set measured tau with its 95% bootstrap interval
            over prompts, as decode --eval_sets (greedy, no wall clock)
        eval_set_limit: only the first this many prompts of each evaluation set
        eval_max_new_tokens: tokens generated per evaluation-set prompt
        heldout_files: sharegpt_heldout's conversations (default: the recipe's heldout_files, else the fit's
            data.val_files)
        heldout_split_by_id: keep only the conversations this id split assigns to validation (default: the
            recipe's, else the fit's data.split_by_id)
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
                eval_sets=EvalSetPlan(
                    tuple(eval_sets), eval_set_limit, eval_max_new_tokens, heldout_files, heldout_split_by_id
                ),
            )
    finally:
        torch.set_num_threads(previous)
