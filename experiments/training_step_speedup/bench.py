"""Training step from an offline feature cache on SmolLM2 shapes: before (an older revision) vs after (this tree).

Run: ``python -m experiments.training_step_speedup.bench [--target DIR] [--cache DIR]`` (2-4 minutes on 2 shared cores) or
``--quick`` (the demo target and a tiny synthetic cache, < 1 minute; the numbers mean nothing). Writes
``training_step.{json,md,csv}`` (``--quick``: ``training_step_quick.*``) under ``experiments/training_step_speedup/results``.

Design choices:
- Three sides, each a warm worker process (``_worker.py``): ``before`` = the package exported from git
  revision ``--before-rev`` (default ``BEFORE_REV``, the commit this work started from; ``--before-rev none`` uses
  this tree with a format 1 cache instead), reading the cache as it is (format 1: no teacher statistics);
  ``fallback`` = this tree reading the same format 1 cache (the full-vocabulary teacher it keeps for old caches);
  ``after`` = this tree reading a format 2 copy of the cache (the same rows plus the per-position logsumexp and
  argmax, computed by ``models.teacher.full_vocab_stats`` as ``dspark-lightning cache`` writes them).
- Setup = the SmolLM2 recipe (``configs/smollm2_sharegpt.yaml``) with A = 32 anchors: cached features of
  SmolLM2-135M-Instruct (H = 576, V = 49152, layers [1, 14, 27]), S = 1024, one packed row per step, one draft layer,
  B = 8, vanilla Markov head r = 64, confidence head on [h ; W1[prev]], draft vocabulary Vd = 8192
  (``assets/smollm2/draft_vocab.safetensors``), loss ``{"kl": 1.0}`` with exp(-k/4) slot weights, fp32, grad-norm clip
  1.0, and the optimizer as that revision's recipe configures it (``model.optimizer.init_args``). Without the target
  directory a random-weight stand-in of the same shapes is used (embedding = LM head, the only tensors cache mode
  reads), without the cache a synthetic one of the same shapes; the results say so.
- Alternation: after warm-up, rounds of ``--steps`` timed steps per side, the side order rotating every round, one
  worker running at a time, so load from other processes hits all sides alike. Reported: medians over all timed
  steps, tokens/s = packed tokens per step (b·S) / median step time, the ratio after / before of tokens/s and the
  median of the per-round ratios, the first (warm-up) step's loss of each side (same weights, rows and anchors, so it
  must agree), and the peak memory of one step = the peak of live tensor bytes during it (profiler memory timeline,
  as ``benchmarks.training.step_scaling``; not tracemalloc, which does not see tensor storage), next to each worker's peak RSS (VmHWM).
- Exactness: the first (warm-up) step has the same weights, row and anchors on every side; after the rounds the
  benchmark evaluates it in float64 (this tree, full-vocabulary teacher, in its own process so that no worker's peak
  memory includes it), and every side's float32 loss is compared with that.
- Profile: three more steps per side under ``torch.profiler`` (alternated; medians per part) with a scope per part
  (teacher, fused-feature projection, attention, MLP, draft LM head, Markov head, confidence, loss, optimizer);
  backward time is charged to the part whose forward op created the autograd node. Profiled steps run slower than
  timed ones (profiler overhead, most of it in ``other``).
- Online mode: the full target's forward over one row is timed on its own after the rounds (median of 3, no grad);
  online tokens/s = S / (step with the full-vocabulary teacher + that forward), for before and fallback.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.training.step_vs_speculators import Worker as LineWorker
from experiments.training_step_speedup._worker import Side
from experiments.training_step_speedup.inputs import (
    cache_copies,
    export_revision,
    random_target,
    recipe_optimizer,
    synthetic_cache,
    target_forward_ms,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
WORKER = Path(__file__).resolve().parent / "_worker.py"
BEFORE_REV = "45d632d"  # the last commit before the training-step work (teacher statistics, grouped attention)
SIDES = ("before", "fallback", "after")
SMOLLM2 = dict(hidden=576, vocab=49152, layers=30, heads=9, kv_heads=3, intermediate=1536, layer_ids=[1, 14, 27])
# fmt: off
FULL = dict(shape=SMOLLM2, seq_len=1024, rows=12, anchors=32, rank=64, draft_vocab=str(ROOT / "assets/smollm2/draft_vocab.safetensors"),
            target=str(ROOT / "targets/smollm2-135m-instruct"), cache=str(ROOT / "cache/smollm2/validation"))
QUICK = dict(shape=dict(hidden=128, vocab=2048, layers=4, heads=4, kv_heads=2, intermediate=256, layer_ids=[1, 2]),
             seq_len=256, rows=2, anchors=8, rank=16, draft_vocab=None, target=str(ROOT / "assets/demo-target"), cache=None)
COLUMNS = ["side", "revision", "tokens_per_second", "step_ms", "step_min_ms", "forward_ms", "backward_ms", "optimizer_ms",
           "peak_memory_mb", "peak_rss_mb", "first_loss", "steps"]
# fmt: on


# ------------------------------------------------------------------------------------------------ workers
class Worker(LineWorker):
    """A warm worker process of ``_worker.py`` (the ``@@ json`` line protocol of ``benchmarks.training.step_vs_speculators``),
    importing the package from ``pythonpath`` (a side's tree)."""

    def __init__(self, name: str, config: dict, pythonpath: list[Path], workdir: Path, threads: int) -> None:
        (workdir / f"{name}.json").write_text(json.dumps(config))
        env = {"WANDB_MODE": "disabled", "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
        command = [sys.executable, str(WORKER), str(workdir / f"{name}.json")]
        super().__init__(name, command, threads, workdir / f"{name}.log", workdir, env)
        self.ready: dict = {}


def _ms(step: dict) -> float:
    return (step["forward"] + step["backward"] + step["optimizer"]) * 1e3


def summarise(steps: list[dict], ready: dict, memory: dict, profile: dict, tokens: int, label: str) -> dict:
    totals = [_ms(s) for s in steps]
    median = statistics.median(totals)
    return {
        "revision": label,
        "tokens_per_second": tokens / (median / 1e3),
        "step_ms": median,
        "step_min_ms": min(totals),
        **{f"{phase}_ms": statistics.median(s[phase] * 1e3 for s in steps) for phase in ("forward", "backward", "optimizer")},
        "peak_memory_mb": memory["peak_tensor_mib"],
        "peak_rss_mb": memory["peak_rss_mib"],
        "first_loss": ready["first_losses"][0],
        "steps": len(steps),
        "trainable_params": ready["trainable_params"],
        "package": ready["package"],
        "batch_fields": ready["batch_fields"],
        "profile": profile,
    }  # fmt: skip


def median_profile(profiles: list[dict]) -> dict:
    """Per part and phase, the median over several profiled steps (one profiled step is noisy on a shared machine)."""
    parts = profiles[0]["parts"]
    return {
        "total_ms": statistics.median(p["total_ms"] for p in profiles),
        "steps": len(profiles),
        "parts": {part: {phase: statistics.median(p["parts"][part][phase] for p in profiles) for phase in phases}
                  for part, phases in parts.items()},
    }  # fmt: skip


def prepare(
    setup: dict, target: str, cache: str | None, workdir: Path, notes: list[str]
) -> tuple[str, str, Path, Path]:
    """(target, draft vocabulary file, format 1 cache, format 2 cache), with stand-ins for what is absent."""
    if not (Path(target) / "config.json").exists():
        notes.append(f"target {target} absent: random weights of the same shapes (embedding = LM head)")
        target = str(workdir / "target")
        random_target(setup["shape"], Path(target))
    if cache is None or not (Path(cache) / "index.json").exists():
        notes.append(f"cache {cache} absent: random features of the same shapes" if cache else "synthetic cache")
        cache = str(workdir / "synthetic")
        synthetic_cache(setup["shape"], setup["seq_len"], setup["rows"], Path(cache))
    draft_vocab = setup["draft_vocab"]
    if draft_vocab is None:  # quick: a random quarter of the demo vocabulary
        import torch
        from safetensors.torch import save_file

        draft_vocab = str(workdir / "draft_vocab.safetensors")
        ids = torch.randperm(setup["shape"]["vocab"], generator=torch.Generator().manual_seed(2))
        save_file({"d2t": ids[: setup["shape"]["vocab"] // 4].sort().values}, draft_vocab)
    setup["cache_source"] = cache
    return target, draft_vocab, *cache_copies(Path(cache), target, setup["rows"], workdir)


def measure(workers: dict[str, Worker], rounds: int, steps: int, profile_steps: int, log) -> dict:
    """Alternated timing rounds, then the profiled and the memory steps, side by side."""
    sides = list(workers)
    times: dict[str, list[dict]] = {side: [] for side in sides}
    round_ratios = []
    for r in range(rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        for side in order if r % 2 == 0 else order[::-1]:
            times[side] += workers[side].ask(f"run {steps}")["steps"]
        medians = {side: statistics.median(map(_ms, t[-steps:])) for side, t in times.items()}
        round_ratios.append(medians["before"] / medians["after"])
        log(f"  round {r + 1}/{rounds}: " + "  ".join(f"{s} {m:.0f} ms" for s, m in medians.items()))
    profiles: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(profile_steps):  # alternated too; the median per part
        for side in sides:
            profiles[side].append(workers[side].ask("profile"))
    memories = {side: workers[side].ask("memory") for side in sides}
    return {"times": times, "round_ratios": round_ratios, "memories": memories,
            "profiles": {side: median_profile(found) for side, found in profiles.items()}}  # fmt: skip


def run(
    quick: bool = False,
    out_dir: Path = RESULTS,
    target: str | None = None,
    cache: str | None = None,
    before_rev: str | None = BEFORE_REV,
    rounds: int | None = None,
    steps: int | None = None,
    threads: int = 1,
    log=print,
) -> dict:
    """Run the benchmark and write its results; returns the JSON record. Without an exported ``before_rev`` the
    before side is this tree with the format 1 cache, which is also the fallback side (one worker for both)."""
    from dspark_lightning.machine import machine_description
    from experiments.training_step_speedup.report import write_results

    setup = dict(QUICK if quick else FULL)
    rounds, steps, profile_steps = rounds or (1 if quick else 6), steps or (1 if quick else 3), 1 if quick else 3
    start, machine, notes = time.perf_counter(), machine_description(), []
    with tempfile.TemporaryDirectory(prefix="bench_training_step_") as tmp:
        workdir = Path(tmp)
        target, draft_vocab, v1, v2 = prepare(setup, target or setup["target"], cache or setup["cache"], workdir, notes)
        base = dict(target=target, seed=0, threads=threads, batch_size=1, warmup=2, loss={"kl": 1.0},
                    markov_head=dict(kind="vanilla", rank=setup["rank"]),
                    drafter=dict(target_layer_ids=setup["shape"]["layer_ids"], block_size=8, num_layers=1,
                                 max_anchors=setup["anchors"], sample_from_anchor=True, mask_token_id=2,
                                 confidence_head=True, confidence_with_markov=True, draft_vocab=draft_vocab))  # fmt: skip
        trees, labels = dict.fromkeys(SIDES, ROOT), dict.fromkeys(SIDES, f"this tree ({_head()})")
        try:
            if before_rev:
                trees["before"], labels["before"] = export_revision(before_rev, workdir / "before"), f"git {before_rev}"
        except (OSError, subprocess.CalledProcessError) as error:
            notes.append(f"could not export {before_rev} ({error})")
        what = {"before": "the code before this work, format 1 cache", "fallback": "this tree, format 1 cache "
                "(full-vocabulary teacher)", "after": "this tree, format 2 cache (teacher statistics)"}  # fmt: skip
        active = SIDES
        if trees["before"] == ROOT:
            notes.append("before = this tree with a format 1 cache (the full-vocabulary teacher), i.e. fallback")
            what["before"], active = what["fallback"], ("before", "after")
        workers: dict[str, Worker] = {}
        try:
            for side in active:
                config = {
                    **base,
                    "cache": str(v2 if side == "after" else v1),
                    "optimizer": recipe_optimizer(trees[side]),
                }
                log(f"starting {side} ({labels[side]}) ...")
                workers[side] = Worker(side, config, [trees[side], ROOT], workdir, threads)
            for worker in workers.values():  # started together: loading and warm-up overlap (nothing is timed yet)
                worker.ready = worker.read()
            measured = measure(workers, rounds, steps, profile_steps, log)
        finally:
            for worker in workers.values():
                worker.close()
        log("the first step in float64; the target's forward (online mode) ...")
        reference = Side({**base, "cache": str(v1), "optimizer": recipe_optimizer(ROOT)}).float64_loss()
        forward_ms = target_forward_ms(target, v1, threads, stand_in=target == str(workdir / "target"))
    tokens = setup["seq_len"]  # one packed row per step
    record = {}
    for side in SIDES:
        found = side if side in workers else "before"
        record[side] = summarise(
            measured["times"][found], workers[found].ready, measured["memories"][found], measured["profiles"][found],
            tokens, labels[side],
        ) | {"what": what[side]}  # fmt: skip
    record["ratio"] = record["after"]["tokens_per_second"] / record["before"]["tokens_per_second"]
    record["ratio_rounds"] = statistics.median(measured["round_ratios"])
    record["ratio_fallback"] = record["fallback"]["tokens_per_second"] / record["before"]["tokens_per_second"]
    record["first_loss_difference"] = abs(record["after"]["first_loss"] - record["before"]["first_loss"])
    record["first_loss_float64"] = reference
    record["target_forward_ms"] = forward_ms
    if forward_ms is not None:  # online mode runs the target, then the step with the full-vocabulary teacher
        online = {side: tokens / ((record[side]["step_ms"] + forward_ms) / 1e3) for side in ("before", "fallback")}
        record["online_tokens_per_second"] = online
        record["online_ratio"] = online["fallback"] / online["before"]
    for side in SIDES:
        record[side]["first_loss_error"] = abs(record[side]["first_loss"] - reference) / abs(reference)
    record["setup"] = {**{k: v for k, v in setup.items() if k not in ("target", "cache", "cache_source")},
                       "target": target, "cache": setup["cache_source"], "rounds": rounds, "steps_per_round": steps,
                       "threads": threads, "tokens_per_step": tokens, "notes": notes}  # fmt: skip
    record["machine"] = {**machine, "load_average_end": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    record["seconds"] = time.perf_counter() - start
    stem = "training_step_quick" if quick else "training_step"
    write_results(record, out_dir, stem, COLUMNS)
    log(f"after / before: {record['ratio']:.2f}x tokens/s (per round {record['ratio_rounds']:.2f}x); "
        f"wrote {out_dir}/{stem}.{{json,md,csv}}")  # fmt: skip
    return record


def _head() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "dspark_lightning"], cwd=ROOT, capture_output=True, text=True
    )
    return (done.stdout.strip() or "unknown") + (" + uncommitted changes" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="demo target, tiny synthetic cache, 1 round (smoke run)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the JSON/markdown/CSV go")
    parser.add_argument("--target", default=None, help="target directory (default: the recipe's targets/...)")
    parser.add_argument(
        "--cache", default=None, help="feature cache directory (default: the recipe's validation cache)"
    )
    parser.add_argument("--before-rev", default=BEFORE_REV, help="git revision of the before side ('none': this tree)")
    parser.add_argument("--rounds", type=int, default=None, help="alternation rounds (default 6; quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per side per round (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per side (default 1)")
    args = parser.parse_args(argv)
    before = None if args.before_rev.lower() == "none" else args.before_rev
    run(args.quick, args.out_dir, args.target, args.cache, before, args.rounds, args.steps, args.threads)


if __name__ == "__main__":
    main()
