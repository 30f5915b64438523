"""fp32 against bf16 on this CPU, side by side in one run: the training step, the verify forward, ``generate``.

Run: ``python -m benchmarks.precision.bf16_vs_fp32 [--shape smollm2] [--threads 1]`` (the demo target by default, ~1-2 minutes on
one thread) or ``--quick`` (a smoke run). Writes ``bf16[_<shape>][_<suffix>][_quick].{md,json}`` under
``benchmarks/precision/results``, each naming the machine (``dspark_lightning.machine``): bf16 pays only where the CPU
has AMX or AVX512-BF16. ``--suffix amx`` keeps an AMX machine's run beside the AVX2 one instead of replacing it.

Design choices:
- Training step: the quickstart's real ``DSparkModule.shared_step`` on one batch of the demo data (online target
  features), forward + backward + AdamW, fp32 against ``torch.autocast("cpu", bfloat16)`` (what ``bf16-mixed`` runs);
  tokens/s = the batch's tokens / step time.
- Verify forward T(n): the target's decoder over n = 1..17 new tokens on a cached 192-token prefix plus the first LM
  head row (as ``bench_verify_kernels`` times it; the prefix prefilled once, cropped back each call), the model cast
  to each dtype; T(n)/T(1) per dtype.
- ``generate``: greedy, a fixed number of new tokens, ms per token, on the same model in each dtype.
- ``--shape smollm2``: a randomly initialised Llama of SmolLM2-135M's shape instead of the demo target (no download).
- Every measurement alternates the two dtypes repeat by repeat (a shared machine's load hits both); medians.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from dspark_lightning.machine import machine_description, machine_line

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo-target"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SMOLLM2_SHAPE = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    vocab_size=49152, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
)  # fmt: skip


def target_model(shape: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if shape == "demo":
        return AutoModelForCausalLM.from_pretrained(DEMO, dtype=torch.float32).eval()
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).eval()


def alternate(fns: dict, repeats: int) -> dict[str, float]:
    """The median seconds of each callable, called in turn ``repeats`` times after one untimed warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for repeat in range(repeats + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if repeat:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def train_step_rows(repeats: int) -> list[dict]:
    """Tokens/s of the quickstart's training step (forward, backward, AdamW) in fp32 and under bf16 autocast."""
    from dspark_lightning.cli import cli_main

    args = ["--config", str(ROOT / "configs/quickstart.yaml"), f"--model.target.path={DEMO}", "--trainer.logger=false"]
    cli = cli_main([*args, "--trainer.callbacks=[]", "--data.seq_len=256", "--data.batch_size=2"], run=False)
    module, data = cli.model, cli.datamodule
    module.configure_model()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    tokens = int(batch["input_ids"].numel())
    optimizer = torch.optim.AdamW([p for p in module.drafter.parameters() if p.requires_grad], lr=1e-4)
    module.train()

    def step(dtype):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                loss = module.shared_step(batch, torch.Generator().manual_seed(0)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return run

    seconds = alternate({name: step(name) for name in DTYPES}, repeats)
    return [
        {"dtype": name, "tokens": tokens, "ms": s * 1e3, "tokens_per_second": tokens / s} for name, s in seconds.items()
    ]


@torch.no_grad()
def verify_rows(models: dict, max_rows: int, repeats: int, prefix: int = 192) -> list[dict]:
    """T(n) per dtype for n = 1..max_rows and its ratio to T(1): the decoder over n new tokens after a cached
    ``prefix``-token prompt, plus the LM head on the first row (as ``bench_verify_kernels`` times it). The prompt is
    prefilled once per dtype; each timed forward starts from that cache cut back to the prompt."""
    from transformers import DynamicCache

    vocab = models["float32"].get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (1, prefix), generator=g)
    caches = {}
    for name, model in models.items():
        caches[name] = DynamicCache()
        model.model(input_ids=prompt, use_cache=True, past_key_values=caches[name])
    positions = {n: torch.arange(prefix, prefix + n)[None] for n in range(1, max_rows + 1)}

    def forward_ms(name: str, tokens: torch.Tensor) -> float:
        model, cache = models[name], caches[name]
        extra = cache.get_seq_length() - prefix  # the previous call's tokens
        if extra:
            cache.crop(-extra)  # this transformers' crop takes the number of tokens to remove, negated
        start = time.perf_counter()
        out = model.model(
            input_ids=tokens, position_ids=positions[tokens.shape[1]], use_cache=True, past_key_values=cache
        )
        model.get_output_embeddings()(out.last_hidden_state[:, :1])
        return (time.perf_counter() - start) * 1e3

    rows = []
    for n in range(1, max_rows + 1):
        tokens = torch.randint(3, vocab, (1, n), generator=g)
        times: dict[str, list[float]] = {name: [] for name in models}
        for repeat in range(repeats + 1):  # the first round warms both up
            for name in models:
                ms = forward_ms(name, tokens)
                if repeat:
                    times[name].append(ms)
        rows.append({"rows": n, **{f"{name}_ms": statistics.median(v) for name, v in times.items()}})
    for row in rows:
        for name in models:
            row[f"{name}_ratio"] = row[f"{name}_ms"] / rows[0][f"{name}_ms"]
    return rows


@torch.no_grad()
def generate_rows(models: dict, new_tokens: int, repeats: int) -> list[dict]:
    """Greedy ``generate`` ms per new token in each dtype (same prompt), and whether the outputs agree."""
    vocab = models["float32"].get_output_embeddings().weight.shape[0]
    prompt = torch.randint(3, vocab, (1, 64), generator=torch.Generator().manual_seed(1))
    outputs = {}

    def run(name):
        def call():
            outputs[name] = models[name].generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip

        return call

    seconds = alternate({name: run(name) for name in models}, repeats)
    same = torch.equal(outputs["float32"], outputs["bfloat16"])
    return [
        {"dtype": name, "ms_per_token": s * 1e3 / new_tokens, "new_tokens": new_tokens, "equal_to_fp32": same}
        for name, s in seconds.items()
    ]


def write_results(report: dict, stem: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    train = {r["dtype"]: r for r in report["train_step"]}
    generate = {r["dtype"]: r for r in report["generate"]}
    verify = report["verify"]
    lines = [
        f"# fp32 vs bf16 on this CPU ({report['shape']} target)",
        "",
        f"Generated by `{report['command']}` in {report['total_s']:.0f} s. {machine_line(report['machine'])} Load "
        f"average {report['machine']['load_average']} at start, {report['load_average_end']} at end (a shared "
        "machine). The two dtypes alternate at every repeat; medians. bf16 has a hardware path only with AMX-BF16 "
        f"or AVX512-BF16 (this CPU: {'yes' if report['machine']['fast_bf16'] else 'no'}).",
        "",
        "| | fp32 | bf16 | bf16 / fp32 |",
        "|---|---:|---:|---:|",
    ]
    if train:
        t32, t16 = train["float32"]["tokens_per_second"], train["bfloat16"]["tokens_per_second"]
        lines.append(
            f"| training step tokens/s (demo quickstart, {train['float32']['tokens']} tokens, autocast) "
            f"| {t32:.0f} | {t16:.0f} | {t16 / t32:.2f} |"
        )
    one32, one16 = verify[0]["float32_ms"], verify[0]["bfloat16_ms"]
    lines.append(f"| 1-row verify forward ms | {one32:.2f} | {one16:.2f} | {one16 / one32:.2f} |")
    g32, g16 = generate["float32"]["ms_per_token"], generate["bfloat16"]["ms_per_token"]
    lines.append(f"| `generate` ms/token | {g32:.2f} | {g16:.2f} | {g16 / g32:.2f} |")
    lines += [
        "",
        f"bf16 `generate` output equal to fp32's: {generate['bfloat16']['equal_to_fp32']} (random prompt; a "
        "different token is rounding, not a bug).",
        "",
        "T(n) / T(1): the cost of verifying n tokens over one `generate` step, per dtype.",
        "",
        "| n | fp32 ms | fp32 T(n)/T(1) | bf16 ms | bf16 T(n)/T(1) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in verify:
        lines.append(
            f"| {row['rows']} | {row['float32_ms']:.2f} | {row['float32_ratio']:.2f} | {row['bfloat16_ms']:.2f} "
            f"| {row['bfloat16_ratio']:.2f} |"
        )
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: n up to 3, 1 repeat, no training step")
    parser.add_argument("--shape", choices=("demo", "smollm2"), default="demo", help="the target measured")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per measurement")
    parser.add_argument("--new_tokens", type=int, default=32, help="generate's new tokens per call")
    parser.add_argument("--suffix", default="", help="appended to the result files' stem (e.g. amx: the machine kind)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start, machine = time.perf_counter(), machine_description()
    repeats = 1 if args.quick else args.repeats
    fp32 = target_model(args.shape)
    models = {"float32": fp32, "bfloat16": copy.deepcopy(fp32).to(torch.bfloat16)}
    report = {
        "command": " ".join(["python -m benchmarks.precision.bf16_vs_fp32", *(sys.argv[1:] if argv is None else argv)]),
        "shape": args.shape,
        "machine": machine,
        "threads": args.threads,
        "train_step": [] if args.quick else train_step_rows(repeats),
        "verify": verify_rows(models, 3 if args.quick else 17, repeats),
        "generate": generate_rows(models, 4 if args.quick else args.new_tokens, repeats),
    }
    report["total_s"] = time.perf_counter() - start
    report["load_average_end"] = machine_description()["load_average"]
    stem = "_".join(["bf16", *([args.shape] if args.shape != "demo" else []), *([args.suffix] if args.suffix else [])])
    stem += "_quick" if args.quick else ""
    write_results(report, stem)
    print((RESULTS / f"{stem}.md").read_text())
    return report


if __name__ == "__main__":
    main()
