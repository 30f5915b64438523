"""What the recurrent-state rollback adds to a decoding step on a hybrid linear-attention target (tiny Qwen3-Next).

    python -m benchmarks.decoding.rollback_cost [--quick] [--out-dir DIR]

A verify forward over the anchor and n drafts must let a rejection restore the Gated DeltaNet layers' state after the
accepted tokens: transformers' ``recurrent_states_to_keep`` runs the last n + 1 tokens through the per-token recurrent
kernel (instead of the chunked one), clones each state and keeps the convolution inputs, and ``crop`` reassigns the
kept state. Three things are timed in each round, interleaved, from the same prefilled prompt:

- ``step``: one decoding step as ``speculative_generate`` runs it (its phase times over a 32-token decode with a
  random drafter, so most drafts are rejected and the rollback runs at almost every step, divided by its steps);
- ``verify recorded``: the verify forward over n + 1 tokens with recording on, then the crop of all n drafts;
- ``verify plain``: the same forward on a cache that records nothing (what the step would cost if no rollback were
  needed; its state after a rejection would be wrong).

rollback = verify recorded - verify plain; its share of a step = rollback / step. Medians over rounds (``--quick``:
fewer). The cache copies that give both forwards the same start are made outside the timed region. Results:
``rollback.{md,json,csv}``, naming the machine (CPU model, torch version, threads).
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = {  # name -> Qwen3NextConfig sizes (the tests' tiny target, and one 8x wider)
    "tiny": dict(hidden_size=32, intermediate_size=64, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8),
    "small": dict(
        hidden_size=256, intermediate_size=512, head_dim=64, linear_key_head_dim=32, linear_value_head_dim=32
    ),
}


def hybrid_target(size: str):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    config = Qwen3NextConfig(
        vocab_size=512, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, linear_num_key_heads=2,
        linear_num_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, full_attention_interval=2, **SIZES[size],
    )  # fmt: skip
    return Qwen3NextForCausalLM(config).eval()


def random_drafter(target, block_size: int):
    from dspark_lightning.models import DrafterConfig, DSparkDrafter, MarkovHeadConfig

    config = DrafterConfig(
        block_size=block_size, num_layers=1, mask_token_id=511, markov_head=MarkovHeadConfig("gated", 8)
    )
    torch.manual_seed(1)
    drafter = DSparkDrafter.for_target(config, target).eval()
    for p in drafter.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.3)
    return drafter


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(size: str, rounds: int, block_size: int = 8, prompt_len: int = 64) -> dict:
    from transformers import DynamicCache

    from dspark_lightning.decoding import speculative_generate
    from dspark_lightning.models import FrozenTarget

    model = hybrid_target(size)
    target = FrozenTarget(model, num_draft_layers=1)
    drafter = random_drafter(target, block_size)
    prompt = torch.randint(0, 500, (1, prompt_len), generator=torch.Generator().manual_seed(2))
    block = torch.randint(0, 500, (1, block_size + 1), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(prompt_len, prompt_len + block_size + 1)[None]
    prefilled = {}
    for recorded in (True, False):
        cache = DynamicCache(config=model.config)
        model.model(input_ids=prompt, cache=cache, use_cache=True)
        if recorded:
            cache.activate_past_recording(recurrent_states_to_keep=block_size + 1)
        prefilled[recorded] = cache

    def verify(recorded: bool) -> float:
        cache = copy.deepcopy(prefilled[recorded])

        def run():
            model.model(input_ids=block, position_ids=positions, cache=cache, use_cache=True)  # the decoder only
            if recorded:
                cache.crop(-block_size)  # every draft rejected: the restore of the anchor's state

        return _timed(run)

    samples = {"step": [], "verify_recorded": [], "verify_plain": [], "tau": []}
    with torch.inference_mode():
        for _ in range(rounds):
            _, stats = speculative_generate(target, drafter, prompt, 32, mode="markov", k=4, eos_token_id=[])
            steps = max(1, stats.target_forwards)
            samples["step"].append((stats.total_seconds - stats.prefill_seconds) * 1e3 / steps)
            samples["tau"].append(stats.tau)
            samples["verify_recorded"].append(verify(True))
            samples["verify_plain"].append(verify(False))
    median = {name: statistics.median(values) for name, values in samples.items()}
    rollback = median["verify_recorded"] - median["verify_plain"]
    paired = statistics.median(a - b for a, b in zip(samples["verify_recorded"], samples["verify_plain"], strict=True))
    return {
        "size": size, "hidden_size": model.config.hidden_size, "block_size": block_size, "prompt_len": prompt_len,
        "rounds": rounds, "step_ms": median["step"], "verify_recorded_ms": median["verify_recorded"],
        "verify_plain_ms": median["verify_plain"], "rollback_ms": rollback, "rollback_share": rollback / median["step"],
        "rollback_paired_ms": paired,
        "tau": median["tau"],
    }  # fmt: skip


def write(rows: list[dict], machine: dict, out_dir: Path, stem: str, total_s: float) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps({"machine": machine, "rows": rows, "total_s": total_s}, indent=1))
    with open(out_dir / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*rows[0], "cpu", "torch", "threads"])
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "cpu": machine["cpu"], "torch": machine["torch"], "threads": machine["threads"]})
    lines = [
        "# Rollback cost of the recurrent-state snapshot on hybrid targets (random Qwen3-Next, tiny and small)",
        "",
        "Generated by `python -m benchmarks.decoding.rollback_cost` (method: its module docstring). Medians over rounds, the "
        "three measurements interleaved in each round; float32, greedy, B = 8 (verify forwards of 9 tokens), "
        "64-token prompt, 4 layers (2 Gated DeltaNet, 2 full attention), MoE MLPs, random weights.",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores visible, torch {machine['torch']}, "
        f"{machine['threads']} torch thread(s); load average {machine['load_average']} at start, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at end (a shared machine: expect noise). "
        f"Total {total_s:.0f} s.",
        "",
        "| target | rounds | step ms | verify, recorded + restore ms | verify, plain ms | rollback ms | share of a step |"
        " rollback, median of per-round differences ms | tau |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} (H = {r['hidden_size']}) | {r['rounds']} | {r['step_ms']:.2f} "
            f"| {r['verify_recorded_ms']:.2f} | {r['verify_plain_ms']:.2f} | {r['rollback_ms']:.2f} "
            f"| {100 * r['rollback_share']:.0f}% | {r['rollback_paired_ms']:.2f} | {r['tau']:.2f} |"
        )
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    from dspark_lightning.machine import machine_description

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, the tiny target only (a smoke run)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    start, machine = time.perf_counter(), machine_description()
    rounds = args.rounds or (3 if args.quick else 25)
    rows = [measure(size, rounds) for size in (("tiny",) if args.quick else ("tiny", "small"))]
    write(rows, machine, args.out_dir, "rollback_quick" if args.quick else "rollback", time.perf_counter() - start)
    for r in rows:
        print(f"{r['size']}: step {r['step_ms']:.2f} ms, rollback {r['rollback_ms']:.2f} ms "
              f"({100 * r['rollback_share']:.0f}%)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
