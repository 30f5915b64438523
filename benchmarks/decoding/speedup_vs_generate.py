"""Speculative decoding at serving speed: wall-clock speedup over the target's own greedy ``generate``, per-phase
step times, and the drafter's cost per step vs context length with and without its context cache.

Run: ``python -m benchmarks.decoding.speedup_vs_generate [--ckpt runs/.../last.ckpt]`` (2-4 minutes on 2 shared cores) or
``--quick`` (< 30 s). Writes ``decode.{md,json,csv}`` and ``decode_context.png`` under ``benchmarks/decoding/results``
(``--quick``: ``decode_quick.*``). ``--target`` / ``--ckpt`` point it at another target (e.g. a 135M model) and a
drafter trained for it.

Design choices:
- Drafter: ``--ckpt`` (a ``fit`` checkpoint; its target and eval prompts come with it) or, without one, an untrained
  quickstart-shaped drafter for ``--target`` (1 layer, B = 8, vanilla r = 64, confidence head) fed random-token
  prompts: a pure cost measurement whose drafts are almost never accepted, so its speedup is a lower bound.
- Speedup (``measure_speedup``): per mode, greedy, prompt by prompt the baseline ``generate`` then the speculative
  run (alternated so load from other jobs hits both alike), outputs checked equal; cached and uncached drafter.
- Context sweep: for each context length L the drafter's step (backbone forward for one block) is timed on random
  target features, cached (``draft_cached`` on a ``DraftContextCache`` holding L tokens, plus extending it by 3
  accepted tokens and cropping back) and uncached (``draft`` re-projecting all L tokens), the two alternated,
  median of repeats after a warm-up; 1 torch thread.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from pathlib import Path

import torch

from dspark_lightning.measuring import best_verify_length, measure_verify_cost
from dspark_lightning.measuring.results import SpeedupResult, from_json, to_json

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "assets" / "demo-target"
LENGTHS = (128, 256, 512, 1024, 2048, 4096)
COLUMNS = ["context", "repeats", "cached_ms", "uncached_ms", "ratio", "cached_min_ms", "uncached_min_ms"]


def load_models(target: Path, ckpt: str | None, num_prompts: int, prompt_length: int):
    """(target, drafter, prompts, description) from a checkpoint, or an untrained drafter for ``target``."""
    if ckpt:
        from dspark_lightning.measuring.loading import load_trained

        module, data = load_trained(ckpt, num_eval_prompts=num_prompts)
        prompts = data.eval_prompts()[:num_prompts]
        steps = torch.load(ckpt, map_location="cpu", weights_only=True).get("global_step")
        head = module.drafter.markov_head
        description = (
            f"drafter trained for {steps} steps (checkpoint `{Path(ckpt).name}`: {module.drafter.config.num_layers} "
            f"layer(s), B = {module.drafter.block_size}, {head.config.kind if head else 'no'} Markov head) on "
            f"`{module.target_args.path}`, its validation eval prompts"
        )
        return module.target, module.drafter, prompts, description
    from benchmarks.training.step_scaling import _mask_token_id
    from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig

    frozen = FrozenTarget.from_pretrained(str(target), num_draft_layers=1)
    torch.manual_seed(0)
    config = DrafterConfig(block_size=8, mask_token_id=_mask_token_id(target), markov_head=MarkovHeadConfig(rank=64))
    drafter = DSparkDrafter.for_target(config, frozen).eval()
    vocab = frozen.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (prompt_length,), generator=g).tolist() for _ in range(num_prompts)]
    return frozen, drafter, prompts, f"untrained drafter (cost only) on `{target}`, random-token prompts"


def speedup_rows(target, drafter, prompts, modes, max_new_tokens, log) -> list[SpeedupResult]:
    from dspark_lightning.measuring import measure_speedup

    head = drafter.markov_head
    rows = []
    for mode in modes:
        if mode != "parallel" and (head is None or (mode == "selector" and head.is_path_dependent)):
            continue
        for cached in (True, False):
            result = measure_speedup(target, drafter, prompts, max_new_tokens, mode=mode, drafter_cache=cached)
            rows.append(result)
            compared = result.comparison
            log(
                f"{mode:8s} cache={cached!s:5s} speedup {compared.speedup:.2f}x  tau {result.tau:.2f}  "
                f"{result.speculative_tokens_per_second:.0f} vs {compared.baseline_tokens_per_second:.0f} tok/s  "
                f"equal={compared.outputs_equal}"
            )
    return rows


def verify_length_rows(speedup: list[SpeedupResult], cost: tuple[float, float]) -> list[dict]:
    """Per mode (cached runs): the verify length maximising predicted tokens/s from the measured acceptance and
    drafter cost per step under the measured T(n) (``best_verify_length``)."""
    rows = []
    for r in speedup:
        if not r.drafter_cache or not r.accepted_rate_per_slot:
            continue
        p = r.phase_ms_per_step
        overhead = (p["draft_backbone"] + p["draft_head"] + p["bookkeeping"]) / 1e3
        rows.append(
            dict(
                mode=r.mode,
                overhead_ms=overhead * 1e3,
                **best_verify_length(r.accepted_rate_per_slot, overhead, cost),
            )
        )
    return rows


def _time_step(drafter, length: int, features: torch.Tensor, repeats: int) -> dict[str, list[float]]:
    """ms of the cached and the uncached drafter step after ``length`` context tokens, alternated."""
    positions = torch.arange(length)[None]
    anchor, anchor_position = torch.tensor([5]), torch.tensor([length])
    cache = drafter.new_context_cache(capacity=length + 3 + 2 * drafter.block_size)
    cache.extend(features[:, :length])

    def cached():
        drafter.draft_cached(cache, anchor, anchor_position)
        cache.extend(features[:, length : length + 3])  # a step's accepted tokens ...
        cache.crop(length)  # ... taken back so that every repeat sees the same context length

    def uncached():
        drafter.draft(features[:, :length], positions, anchor, anchor_position)

    times = {"cached": [], "uncached": []}
    cached(), uncached()  # warm-up
    for _ in range(repeats):
        for name, fn in (("cached", cached), ("uncached", uncached)):
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


@torch.inference_mode()
def context_sweep(drafter, lengths, repeats: int, log) -> list[dict]:
    width = drafter.backbone.fc.in_features
    g = torch.Generator().manual_seed(0)
    rows = []
    for length in lengths:
        times = _time_step(drafter, length, torch.randn(1, length + 3, width, generator=g), repeats)
        row = {"context": length, "repeats": repeats}
        for name, values in times.items():
            row[f"{name}_ms"], row[f"{name}_min_ms"] = statistics.median(values), min(values)
        row["ratio"] = row["uncached_ms"] / row["cached_ms"]
        rows.append({c: row[c] for c in COLUMNS})
        log(f"context {length:5d}: cached {row['cached_ms']:.3f} ms, uncached {row['uncached_ms']:.3f} ms")
    return rows


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(xs, [r["uncached_ms"] for r in rows], "s--", color="C1", label="uncached (re-project the prefix), median")
    ax.plot(xs, [r["cached_ms"] for r in rows], "o-", color="C0", label="context cache, median")
    ax.plot(xs, [r["uncached_min_ms"] for r in rows], "s:", color="C1", alpha=0.6, label="uncached, minimum")
    ax.plot(xs, [r["cached_min_ms"] for r in rows], "o:", color="C0", alpha=0.6, label="context cache, minimum")
    ax.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="drafter ms per step")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(out_dir: Path, stem: str, report: dict) -> None:
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    with open(out_dir / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(report["context_sweep"])
    machine = report["machine"]
    lines = [
        "# Speculative decoding: speedup over `generate`, phase times, drafter cost vs context",
        "",
        f"{report['drafter']}; {report['prompts']} prompts, {report['max_new_tokens']} new tokens each, greedy. "
        f"Generated by `python -m benchmarks.decoding.speedup_vs_generate{' --quick' if report['quick'] else ''}` in "
        f"{report['total_s']:.0f} s. Machine: {machine['cpu']} (flags: {machine.get('flags', 'not recorded')}), {machine['cores']} cores visible, torch "
        f"{machine['torch']}, {machine['threads']} torch thread(s), load average {machine['load_average']} at start "
        f"(shared: expect noise; compared variants were alternated).",
        "",
        "## Speedup over the target's greedy `generate`",
        "",
        "Baseline and speculative run alternated prompt by prompt in one process; speedup = total baseline time / "
        "total speculative time (median of per-prompt ratios in brackets). Phase columns: mean ms per step; "
        "break-even tau = step ms / `generate` ms per token (the tau at which the two run equally fast).",
        "",
        "| mode | drafter cache | tau | generate tok/s | speculative tok/s | speedup | backbone ms | head ms "
        "| verify ms | bookkeeping ms | step ms | break-even tau | outputs = generate |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in (from_json(SpeedupResult, row, "speedup row") for row in report["speedup"]):
        p, c = r.phase_ms_per_step, r.comparison
        step = sum(p[k] for k in ("draft_backbone", "draft_head", "verify", "bookkeeping"))
        lines.append(
            f"| {r.mode} | {'yes' if r.drafter_cache else 'no'} | {r.tau:.2f} "
            f"| {c.baseline_tokens_per_second:.0f} | {r.speculative_tokens_per_second:.0f} "
            f"| **{c.speedup:.2f}×** ({c.median_prompt_speedup:.2f}×) | {p['draft_backbone']:.2f} "
            f"| {p['draft_head']:.2f} | {p['verify']:.2f} | {p['bookkeeping']:.2f} | {step:.1f} "
            f"| {step * c.baseline_tokens_per_second / 1e3:.2f} "
            f"| {'yes' if c.outputs_equal else '**NO** ' + str(c.mismatches)} |"
        )
    lines += [
        "",
        "## Verify length from the measured costs",
        "",
        f"T(n) = {report['verify_cost_ms'][0]:.2f} + {report['verify_cost_ms'][1]:.3f}·n ms (`measure_verify_cost` on "
        "the target: the decoder over n+1 tokens and the LM head on the first row, as the loop verifies; each accepted "
        "draft adds one head row, not counted here); predicted tokens/s(n) = (1 + Σ_{j≤n} prefix survival_j) / (drafter + bookkeeping ms per step + "
        "T(n)), from the cached runs above (whole blocks verified).",
        "",
        "| mode | drafter + bookkeeping ms/step | best n | tokens/step at best n | predicted tokens/s, n = 1…B |",
        "|---|---:|---:|---:|---|",
        *(
            f"| {v['mode']} | {v['overhead_ms']:.2f} | {v['best_n']} | {v['expected_tokens'][v['best_n'] - 1]:.2f} "
            f"| {' '.join(f'{x:.0f}' for x in v['tokens_per_second'])} |"
            for v in report["verify_lengths"]
        ),
        "",
        "## Drafter step vs context length",
        "",
        "One block's backbone forward (B = "
        f"{report['block_size']}); cached = `draft_cached` + extending the cache by 3 tokens; uncached = `draft` over "
        f"the whole prefix. The two alternated, {report['context_sweep'][0]['repeats']} repeats each: median and "
        "minimum ms (on a loaded machine the minimum is the steadier estimate of the cost itself).",
        "",
        "| context | cached ms (median) | uncached ms (median) | uncached / cached (medians) | cached ms (min) "
        "| uncached ms (min) | uncached / cached (minima) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["context_sweep"]:
        lines.append(
            f"| {r['context']} | {r['cached_ms']:.3f} | {r['uncached_ms']:.3f} | {r['ratio']:.1f}× "
            f"| {r['cached_min_ms']:.3f} | {r['uncached_min_ms']:.3f} | {r['uncached_min_ms'] / r['cached_min_ms']:.1f}× |"
        )
    lines += ["", f"![drafter ms per step vs context]({stem}_context.png)" if not report["quick"] else "", ""]
    (out_dir / f"{stem}.md").write_text("\n".join(lines))


def run(
    quick: bool = False,
    out_dir: Path = RESULTS,
    target: Path | str = TARGET,
    ckpt: str | None = None,
    modes=("parallel", "markov", "selector"),
    threads: int = 1,
    log=print,
) -> dict:
    from dspark_lightning.machine import machine_description

    torch.set_num_threads(threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_description()
    start = time.perf_counter()
    num_prompts, max_new_tokens = (2, 16) if quick else (6, 48)
    target_model, drafter, prompts, description = load_models(target, ckpt, num_prompts, 96)
    speedup = speedup_rows(target_model, drafter, prompts, ["markov"] if quick else modes, max_new_tokens, log)
    verify_cost = measure_verify_cost(target_model, max_block=drafter.block_size, repeats=3 if quick else 7)
    verify_lengths = verify_length_rows(speedup, verify_cost)
    lengths = LENGTHS[:2] if quick else LENGTHS
    sweep = context_sweep(drafter, lengths, 3 if quick else 31, log)
    stem = "decode_quick" if quick else "decode"
    report = dict(
        quick=quick,
        drafter=description,
        prompts=len(prompts),
        max_new_tokens=max_new_tokens,
        block_size=drafter.block_size,
        machine=machine,
        speedup=[to_json(result) for result in speedup],
        context_sweep=sweep,
        verify_cost_ms=[verify_cost[0] * 1e3, verify_cost[1] * 1e3],
        verify_lengths=verify_lengths,
        total_s=time.perf_counter() - start,
    )
    bc = drafter.backbone.config
    title = f"Drafter step vs context: H = {bc.hidden_size}, {bc.num_layers} layer(s), B = {drafter.block_size}, CPU"
    plot(sweep, out_dir / f"{stem}_context.png", title)
    write_results(out_dir, stem, report)
    log(f"wrote {out_dir}/{stem}.{{md,json,csv}} and {stem}_context.png")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 prompts x 16 tokens, markov only, 2 context lengths")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--target", default=str(TARGET), help="target for the untrained drafter (no --ckpt)")
    parser.add_argument("--ckpt", default=None, help="a `fit` checkpoint: its drafter, target and eval prompts")
    parser.add_argument("--modes", nargs="+", default=["parallel", "markov", "selector"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.ckpt and not Path(args.ckpt).is_file():
        parser.error(f"--ckpt {args.ckpt!r} does not exist")
    run(args.quick, args.out_dir, args.target, args.ckpt, tuple(args.modes), args.threads)


if __name__ == "__main__":
    main()
