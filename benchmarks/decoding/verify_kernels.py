"""The verify forward on packed kernels: its cost per row count, and the end-to-end speedup, against the default.

Run: ``python -m benchmarks.decoding.verify_kernels [--ckpt runs/.../last.ckpt] [--target DIR]`` (~3-6 minutes on the
SmolLM2-135M target with a checkpoint) or ``--quick`` (< 30 s, the demo target). Writes ``verify_kernels.{md,json}``
under ``benchmarks/decoding/results`` (``--quick``: ``verify_kernels_quick.*``).

Design choices:
- Forward cost: the target's decoder over n new tokens on a cached 192-token prefix, plus the LM head on the first
  row (as ``speculative_generate`` verifies), for n = 1 (what one ``generate`` step computes) up to B + 1; default
  kernels and packed kernels (``decoding.kernels.PackedLinears``) alternated at every repeat, median of repeats.
  The ratio T(n) / T(1) of the default kernels is the cost a verify pays over a ``generate`` step.
- End to end (``--ckpt``): ``measure_speedup`` on the checkpoint's held-out prompts, the default and the packed verify
  alternated prompt by prompt (each call times its own ``generate`` baseline beside it), outputs checked equal.
- One torch thread (``--threads``), as the SmolLM2 report measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dspark_lightning.decoding.kernels import PackedLinears
from dspark_lightning.measuring import measure_speedup
from dspark_lightning.measuring.results import SpeedupResult

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "targets" / "smollm2-135m-instruct"
DEMO = ROOT / "assets" / "demo-target"


@torch.no_grad()
def verify_forward_ms(model, prompt: torch.Tensor, tokens: torch.Tensor, packed: PackedLinears | None = None) -> float:
    """ms of one verify forward: the decoder over ``tokens`` [1, n] after the cached ``prompt`` [1, P] (prefilled
    here, untimed), plus the LM head on the first row; on ``packed`` kernels when given."""
    from transformers import DynamicCache

    body, head = model.model, model.get_output_embeddings()
    cache = DynamicCache()
    body(input_ids=prompt, use_cache=True, past_key_values=cache)
    positions = torch.arange(prompt.shape[1], prompt.shape[1] + tokens.shape[1])[None]
    start = time.perf_counter()
    if packed is not None:
        with packed:
            out = body(input_ids=tokens, position_ids=positions, use_cache=True, past_key_values=cache)
    else:
        out = body(input_ids=tokens, position_ids=positions, use_cache=True, past_key_values=cache)
    head(out.last_hidden_state[:, :1])
    return (time.perf_counter() - start) * 1e3


@torch.no_grad()
def forward_costs(model, max_rows: int, repeats: int, prefix: int = 192) -> list[dict]:
    """ms of the decoder over n rows (cached prefix) + the first head row, default vs packed, alternated."""
    body, head = model.model, model.get_output_embeddings()
    vocab = head.weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (1, prefix), generator=g)
    packed = PackedLinears(body, max_rows)
    rows = []
    for n in range(1, max_rows + 1):
        tokens = torch.randint(3, vocab, (1, n), generator=g)
        times: dict[str, list[float]] = {"default": [], "packed": []}
        for repeat in range(repeats + 1):  # the first round warms both up
            for name in ("default", "packed"):
                ms = verify_forward_ms(model, prompt, tokens, packed if name == "packed" else None)
                if repeat:
                    times[name].append(ms)
        rows.append({"rows": n, **{f"{k}_ms": statistics.median(v) for k, v in times.items()}})
    one = rows[0]["default_ms"]
    for row in rows:
        row["default_over_one_row"] = row["default_ms"] / one
        row["packed_over_one_row"] = row["packed_ms"] / one
        row["packed_over_default"] = row["packed_ms"] / row["default_ms"]
    return rows


def end_to_end(module, prompts, max_new_tokens: int, mode: str) -> dict[str, dict]:
    """measure_speedup with the default and the packed verify, alternated prompt by prompt; merged per variant."""
    runs: dict[str, list[SpeedupResult]] = {"default": [], "packed": []}
    for index, prompt in enumerate(prompts):
        for name in ("default", "packed"):
            result = measure_speedup(
                module.target, module.drafter, [prompt], max_new_tokens, mode=mode,
                packed_verify=name == "packed", warmup=index == 0,
            )  # fmt: skip
            runs[name].append(result)
    merged = {}
    for name, results in runs.items():
        base = sum(r.baseline_seconds for r in results)
        spec = sum(r.speculative_seconds for r in results)
        steps = sum(r.target_forwards for r in results)
        merged[name] = dict(
            speedup=base / spec,
            median_prompt_speedup=statistics.median(r.comparison.speedup for r in results),
            tau=sum(r.new_tokens for r in results) / steps,
            generate_tokens_per_second=sum(r.baseline_new_tokens for r in results) / base,
            speculative_tokens_per_second=sum(r.new_tokens for r in results) / spec,
            verify_ms_per_step=sum(r.phase_ms_per_step["verify"] * r.target_forwards for r in results) / steps,
            outputs_equal=all(r.comparison.outputs_equal for r in results),
        )
    return merged


def write_results(out_dir: Path, stem: str, report: dict) -> None:
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    m = report["machine"]
    lines = [
        "# The verify forward on packed kernels (`speculative_generate(packed_verify=True)`)",
        "",
        f"Target `{report['target']}`. Generated by `python -m benchmarks.decoding.verify_kernels"
        f"{' --quick' if report['quick'] else ''}{' --ckpt ' + report['ckpt'] if report['ckpt'] else ''}` in "
        f"{report['total_s']:.0f} s. Machine: {m['cpu']} (flags: {m.get('flags', 'not recorded')}), {m['cores']} cores visible, torch {m['torch']}, "
        f"{m['threads']} torch thread(s), load average {m['load_average']} at start (shared: compared variants were "
        "alternated).",
        "",
        "## Forward cost by row count",
        "",
        f"The decoder over n new tokens on a cached 192-token prefix + the LM head on the first row; median of "
        f"{report['repeats']} alternated repeats. n = 1 is a `generate` step; a verify of B drafts has n = B + 1.",
        "",
        "| rows n | default ms | packed ms | packed / default | default T(n) / T(1) | packed T(n) / default T(1) |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['rows']} | {r['default_ms']:.1f} | {r['packed_ms']:.1f} | {r['packed_over_default']:.2f} "
            f"| {r['default_over_one_row']:.2f} | {r['packed_over_one_row']:.2f} |"
            for r in report["forward_costs"]
        ),
    ]
    if report.get("end_to_end"):
        e = report["end_to_end"]
        lines += [
            "",
            f"## End to end: greedy `{report['mode']}` decoding, {report['prompts']} held-out prompts x "
            f"{report['max_new_tokens']} new tokens",
            "",
            "Each variant timed against its own `generate` baseline, prompt by prompt, the two variants alternated.",
            "",
            "| verify kernels | tau | generate tok/s | speculative tok/s | speedup (median per prompt) | verify ms/step "
            "| outputs = generate |",
            "|---|---:|---:|---:|---:|---:|---|",
            *(
                f"| {name} | {r['tau']:.3f} | {r['generate_tokens_per_second']:.1f} "
                f"| {r['speculative_tokens_per_second']:.1f} | **{r['speedup']:.2f}x** ({r['median_prompt_speedup']:.2f}x) "
                f"| {r['verify_ms_per_step']:.1f} | {'yes' if r['outputs_equal'] else '**NO**'} |"
                for name, r in e.items()
            ),
        ]
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")


def run(quick=False, out_dir=RESULTS, target=None, ckpt=None, mode="markov", threads=1, num_prompts=8, log=print):
    from transformers import AutoModelForCausalLM

    from dspark_lightning.machine import machine_description

    torch.set_num_threads(threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_description()
    start = time.perf_counter()
    module = prompts = None
    if ckpt:
        from dspark_lightning.measuring.loading import load_trained

        module, data = load_trained(ckpt, num_eval_prompts=num_prompts)
        prompts = data.eval_prompts()[:num_prompts]
        model, target = module.target.model, module.target_args.path
    else:
        target = str(target or (SMOLLM2 if SMOLLM2.is_dir() and not quick else DEMO))
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    repeats = 2 if quick else 15
    costs = forward_costs(model, 3 if quick else 9, repeats)
    for r in costs:
        log(f"rows {r['rows']}: default {r['default_ms']:.1f} ms, packed {r['packed_ms']:.1f} ms")
    max_new_tokens = 8 if quick else 64
    e2e = end_to_end(module, prompts[: 1 if quick else None], max_new_tokens, mode) if module is not None else None
    for name, r in (e2e or {}).items():
        log(f"{name}: speedup {r['speedup']:.2f}x, tau {r['tau']:.2f}, equal {r['outputs_equal']}")
    report = dict(
        quick=quick, target=str(target), ckpt=ckpt, machine=machine, repeats=repeats, forward_costs=costs,
        mode=mode, prompts=len(prompts or []), max_new_tokens=max_new_tokens, end_to_end=e2e,
        total_s=time.perf_counter() - start,
    )  # fmt: skip
    stem = "verify_kernels_quick" if quick else "verify_kernels"
    write_results(out_dir, stem, report)
    log(f"wrote {out_dir}/{stem}.{{md,json}}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="demo target, 3 row counts, 2 repeats")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--target", default=None, help="target directory (default: the SmolLM2 import, else demo)")
    parser.add_argument("--ckpt", default=None, help="a `fit` checkpoint: adds the end-to-end speedup A/B")
    parser.add_argument("--mode", default="markov", choices=["parallel", "markov", "selector"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.ckpt and not Path(args.ckpt).is_file():
        parser.error(f"--ckpt {args.ckpt!r} does not exist")
    run(args.quick, args.out_dir, args.target, args.ckpt, args.mode, args.threads, args.num_prompts)


if __name__ == "__main__":
    main()
