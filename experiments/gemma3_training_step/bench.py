"""One training step from cached features at Gemma 3 270M's shapes: a 32,768-token draft vocabulary vs all 262,144.

Run: ``python -m experiments.gemma3_training_step.bench [--rounds N] [--steps N] [--threads 1]`` (about 2-3 minutes on 2 shared cores)
or ``--quick`` (tiny shapes, < 1 minute; the numbers mean nothing). Writes ``gemma_step.{json,md}`` (``--quick``:
``gemma_step_quick.*``) under ``experiments/gemma3_training_step/results``.

Design choices:
- Target: random weights from a ``Gemma3TextConfig`` of the 270M shapes (hidden 640, 18 layers, 4 heads, 1 KV head,
  head_dim 256, MLP 2048, V = 262,144, window 512 in five layers of six, rotary bases 10k local / 1M global, tied and
  sqrt(hidden)-scaled embedding, no download); ``targets/gemma3-270m/config.json`` replaces the built-in shapes when
  it exists. Only what cache mode loads is written: the config and the embedding (= the LM head), in fp32 like the
  other step benchmarks.
- Cache: ``experiments.training_step_speedup``'s synthetic cache (random bf16 features of target layers [1, 8, 15], the DFlash
  spread of three layers over 18, and the final hidden state; S = 1024, rows of 4 documents) made format 2 by
  ``cache_copies``: the logsumexp and argmax per position that ``dspark-lightning cache`` stores.
- Step: the one of ``experiments/training_step_speedup/_worker.py`` (``shared_step``, metrics, zero_grad, backward, grad-norm clip 1.0,
  AdamW as ``configs/smollm2_sharegpt.yaml`` configures it), one packed row, A = 32 anchors, B = 8, one draft layer
  shaped by the target (4 heads, 1 KV head, head_dim 256, MLP 2048), vanilla Markov head r = 64, confidence head,
  loss ``{"kl": 1.0}``, fp32, mask id 4.
- Two sides, each a warm worker process: ``vd32k`` (a random sorted draft vocabulary of 32,768 ids) and ``full``
  (Vd = V). Alternated rounds after two warm-up steps; medians; tokens/s = S / median step. Peak memory as
  ``experiments.training_step_speedup.bench`` measures it: the peak of live tensor bytes during one step (profiler memory timeline; not
  tracemalloc, which does not see tensor storage), and the worker's peak RSS (VmHWM). One profiled step per side is
  split into parts as there.
- The full-vocabulary pass, which cache mode skips but online mode's teacher (at a step's 256 positions) and the
  cache writer (at every position: one 1024-token row) run: this tree's tiled pass against the row-chunked pass of git
  ``BEFORE_REV`` (its ``models/teacher.py``), alternated, medians, outputs compared.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from experiments.training_step_speedup.bench import Worker, _head, _ms, summarise
from experiments.training_step_speedup.inputs import cache_copies, export_revision, recipe_optimizer, synthetic_cache
from experiments.training_step_speedup.report import PART_NAMES

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
BEFORE_REV = "7889032"  # the last commit before the Gemma work (row-chunked full-vocabulary pass)
GEMMA_DIR = ROOT / "targets/gemma3-270m"
# fmt: off
GEMMA3_270M = dict(vocab=262_144, hidden=640, layers=18, heads=4, kv_heads=1, head_dim=256, intermediate=2048,
                   window=512, layer_ids=[1, 8, 15])
FULL = dict(shape=GEMMA3_270M, seq_len=1024, rows=2, anchors=32, rank=64, draft_vocab=32_768, rounds=3, steps=2,
            repeats=2, teacher_rows=256, writer_rows=1024)
QUICK = dict(shape=dict(vocab=4096, hidden=64, layers=6, heads=4, kv_heads=1, head_dim=16, intermediate=128, window=8,
                        layer_ids=[1, 2, 3]),
             seq_len=128, rows=2, anchors=8, rank=16, draft_vocab=1024, rounds=1, steps=1, repeats=1,
             teacher_rows=64, writer_rows=128)
# fmt: on
SIDES = ("vd32k", "full")


def gemma_config(shape: dict):
    from transformers import Gemma3TextConfig

    layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(shape["layers"])]
    return Gemma3TextConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
        query_pre_attn_scalar=shape["head_dim"], intermediate_size=shape["intermediate"],
        sliding_window=shape["window"], layer_types=layer_types, tie_word_embeddings=True,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}},
    )  # fmt: skip


def stand_in_target(shape: dict, directory: Path, notes: list[str], local_config: bool) -> dict:
    """Config + a random embedding (all that cache mode reads); returns the shape used. ``local_config``: take the
    config of ``targets/gemma3-270m`` when it exists."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    config = gemma_config(shape)
    if local_config and (GEMMA_DIR / "config.json").exists():
        config = AutoConfig.from_pretrained(GEMMA_DIR)
        config = getattr(config, "text_config", None) or config
        shape = {**shape, "vocab": config.vocab_size, "hidden": config.hidden_size}
        notes.append(f"config from {GEMMA_DIR}, random weights")
    config.save_pretrained(directory)
    weight = torch.randn(shape["vocab"], shape["hidden"], generator=torch.Generator().manual_seed(0)) * 0.05
    save_file({"model.embed_tokens.weight": weight}, str(directory / "model.safetensors"))
    return shape


def draft_vocab_file(shape: dict, size: int, path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    ids = torch.randperm(shape["vocab"], generator=torch.Generator().manual_seed(2))
    ids = torch.cat((ids[ids != 4][: size - 1], torch.tensor([4])))  # the mask id is always draftable
    save_file({"d2t": ids.sort().values}, str(path))
    return path


def measure_steps(workers: dict[str, Worker], rounds: int, steps: int, log) -> dict:
    times: dict[str, list[dict]] = {side: [] for side in workers}
    for r in range(rounds):
        order = list(workers) if r % 2 == 0 else list(workers)[::-1]
        for side in order:
            times[side] += workers[side].ask(f"run {steps}")["steps"]
        log(f"  round {r + 1}/{rounds}: " + "  ".join(f"{s} {_ms(t[-1]):.0f} ms" for s, t in times.items()))
    profiles = {side: worker.ask("profile") for side, worker in workers.items()}
    memories = {side: worker.ask("memory") for side, worker in workers.items()}
    return {"times": times, "profiles": profiles, "memories": memories}


def side_record(steps: list[dict], ready: dict, memory: dict, profile: dict, tokens: int, vocab: int) -> dict:
    """experiments.training_step_speedup.bench's summary of one side, keyed by its draft vocabulary instead of a revision."""
    record = summarise(steps, ready, memory, profile, tokens, label="")
    del record["revision"]
    return {"draft_vocab_size": vocab, **record}


def full_vocab_pass(setup: dict, d2t, before_rev: str | None, workdir: Path, threads: int, log) -> dict:
    """Online mode's teacher (``full_vocab_teacher`` at ``teacher_rows`` positions) and the cache writer's statistics
    (``full_vocab_stats`` over one row), this tree vs ``before_rev``'s ``models/teacher.py``, alternated."""
    import torch

    from dspark_lightning.models import teacher as after

    if before_rev is None:
        return {"measured": False, "why": "no before revision (quick run)"}
    tree = export_revision(before_rev, workdir / "before")
    spec = importlib.util.spec_from_file_location("teacher_before", tree / "dspark_lightning/models/teacher.py")
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    shape, g = setup["shape"], torch.Generator().manual_seed(3)
    weight = torch.randn(shape["vocab"], shape["hidden"], generator=g) * 0.05
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    cases = {
        "online teacher": (lambda m, h: m.full_vocab_teacher(h, weight, d2t), setup["teacher_rows"]),
        "cache writer statistics": (lambda m, h: m.full_vocab_stats(h, weight), setup["writer_rows"]),
    }
    results = {}
    try:
        for name, (call, rows) in cases.items():
            hidden = torch.randn(rows, shape["hidden"], generator=g)
            seconds: dict[str, list[float]] = {"before": [], "after": []}
            outputs = {}
            for r in range(setup["repeats"]):
                for side, module in (("before", before), ("after", after))[:: 1 if r % 2 == 0 else -1]:
                    start = time.perf_counter()
                    outputs[side] = call(module, hidden)
                    seconds[side].append(time.perf_counter() - start)
            results[name] = {
                "rows": rows,
                "before_ms": statistics.median(seconds["before"]) * 1e3,
                "after_ms": statistics.median(seconds["after"]) * 1e3,
                "max_abs_difference": float((outputs["after"][0] - outputs["before"][0]).abs().max()),
                "argmax_equal": bool(torch.equal(outputs["after"][1], outputs["before"][1])),
            }
            log(f"  {name}: {results[name]['before_ms']:.0f} -> {results[name]['after_ms']:.0f} ms")
    finally:
        torch.set_num_threads(previous)
    return {"measured": True, "revision": before_rev, "repeats": setup["repeats"], "cases": results}


def run(
    quick: bool = False,
    out_dir: Path = RESULTS,
    before_rev: str | None = BEFORE_REV,
    rounds: int | None = None,
    steps: int | None = None,
    threads: int = 1,
    log=print,
) -> dict:
    """Run the benchmark and write its results; returns the JSON record."""
    import torch
    from safetensors.torch import load_file

    from dspark_lightning.machine import machine_description

    setup = dict(QUICK if quick else FULL)
    setup["rounds"], setup["steps"] = rounds or setup["rounds"], steps or setup["steps"]
    start, machine, notes = time.perf_counter(), machine_description(), []
    with tempfile.TemporaryDirectory(prefix="bench_gemma_step_") as tmp:
        workdir = Path(tmp)
        (workdir / "target").mkdir()
        log("writing the stand-in target and the synthetic cache (its statistics over V) ...")
        setup["shape"] = shape = stand_in_target(setup["shape"], workdir / "target", notes, not quick)
        target = str(workdir / "target")
        synthetic_cache(shape, setup["seq_len"], setup["rows"], workdir / "synthetic")
        _, cache = cache_copies(workdir / "synthetic", target, setup["rows"], workdir)
        vocab_path = draft_vocab_file(shape, setup["draft_vocab"], workdir / "draft_vocab.safetensors")
        base = dict(target=target, cache=str(cache), seed=0, threads=threads, batch_size=1, warmup=2,
                    loss={"kl": 1.0}, optimizer=recipe_optimizer(ROOT),
                    markov_head=dict(kind="vanilla", rank=setup["rank"]),
                    drafter=dict(target_layer_ids=shape["layer_ids"], block_size=8, num_layers=1,
                                 max_anchors=setup["anchors"], sample_from_anchor=True, mask_token_id=4,
                                 confidence_head=True, confidence_with_markov=True))  # fmt: skip
        vocabularies = {"vd32k": str(vocab_path), "full": None}
        workers: dict[str, Worker] = {}
        try:
            for side in SIDES:
                config = {**base, "drafter": {**base["drafter"], "draft_vocab": vocabularies[side]}}
                log(f"starting {side} ...")
                workers[side] = Worker(side, config, [ROOT], workdir, threads)
            for worker in workers.values():  # loading and warm-up overlap (nothing is timed yet)
                worker.ready = worker.read()
            measured = measure_steps(workers, setup["rounds"], setup["steps"], log)
        finally:
            for worker in workers.values():
                worker.close()
        log("the full-vocabulary pass: before vs after ...")
        d2t = load_file(str(vocab_path))["d2t"]
        passes = full_vocab_pass(setup, d2t, before_rev, workdir, threads, log)
    sizes = {"vd32k": setup["draft_vocab"], "full": shape["vocab"]}
    record = {
        side: side_record(measured["times"][side], workers[side].ready, measured["memories"][side],
                          measured["profiles"][side], setup["seq_len"], sizes[side])
        for side in SIDES
    }  # fmt: skip
    record["full_vocab_pass"] = passes
    record["setup"] = {**setup, "threads": threads, "notes": notes, "code": _head(), "torch": torch.__version__}
    record["machine"] = {**machine, "load_average_end": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    record["seconds"] = time.perf_counter() - start
    stem = "gemma_step_quick" if quick else "gemma_step"
    write_results(record, out_dir, stem)
    log(f"vd32k {record['vd32k']['tokens_per_second']:.0f} tokens/s, full {record['full']['tokens_per_second']:.0f} "
        f"tokens/s; wrote {out_dir}/{stem}.{{json,md}}")  # fmt: skip
    return record


def write_results(record: dict, out_dir: Path, stem: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    setup, machine, shape = record["setup"], record["machine"], record["setup"]["shape"]
    w1 = shape["vocab"] * setup["rank"]
    lines = [
        "# Training step from cached features at Gemma 3 270M shapes (CPU)",
        "",
        f"One packed row of S = {setup['seq_len']} tokens per step from a synthetic format 2 cache (H = "
        f"{shape['hidden']}, V = {shape['vocab']:,}, target layers {shape['layer_ids']}), one draft layer (heads "
        f"{shape['heads']}, KV heads {shape['kv_heads']}, head_dim {shape['head_dim']}, MLP {shape['intermediate']}), "
        f"B = 8, A = {setup['anchors']}, vanilla Markov head r = {setup['rank']}, confidence head, loss "
        '`{"kl": 1.0}`, fp32, AdamW as the SmolLM2 recipe configures it, grad-norm clip 1.0; random weights from a '
        f"Gemma 3 config. {setup['rounds']} alternated rounds x {setup['steps']} steps per side after 2 warm-up steps; "
        "medians. Generated by `python -m experiments.gemma3_training_step.bench` (method in its docstring)."
        + ("" if not setup["notes"] else " " + "; ".join(setup["notes"]) + "."),
        f"Code: {setup['code']}. Machine: {machine['cpu']} (flags: {machine.get('flags', 'not recorded')}), {machine['cores']} cores, torch {setup['torch']}, "
        f"{setup['threads']} torch thread per side; load average {machine['load_average']} at start, "
        f"{machine['load_average_end']} at end (shared machine).",
        "",
        "| draft vocabulary | tokens/s | step ms (min) | forward / backward / optimizer ms | peak tensor memory MiB | "
        "peak RSS MiB | trainable parameters |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for side in SIDES:
        r = record[side]
        lines.append(
            f"| Vd = {r['draft_vocab_size']:,} | {r['tokens_per_second']:.0f} | {r['step_ms']:.0f} ({r['step_min_ms']:.0f})"
            f" | {r['forward_ms']:.0f} / {r['backward_ms']:.0f} / {r['optimizer_ms']:.0f} | {r['peak_memory_mb']:.0f} | "
            f"{r['peak_rss_mb']:.0f} | {r['trainable_params']:,} |"
        )
    ratio = record["vd32k"]["tokens_per_second"] / record["full"]["tokens_per_second"]
    lines += [
        "",
        f"The draft vocabulary makes the step {ratio:.1f}x faster. Peak tensor memory = peak of live tensor bytes "
        "during one step (profiler memory timeline; parameters, optimizer state and inputs that exist before the step "
        f"are not counted); peak RSS = the worker's VmHWM (includes the fp32 {shape['vocab']:,} x {shape['hidden']} "
        f"embedding = LM head, {shape['vocab'] * shape['hidden'] * 4 / 2**20:.0f} MiB, the optimizer state and the "
        f"cached rows). Both sides train the Markov head's W1 [V, r] = {w1:,} parameters, "
        "whose gradient is dense; Vd sets the draft LM head rows, W2 [Vd, r] and every [A·B, Vd] tensor of the loss.",
        "",
        "## Where the time goes",
        "",
        "One profiled step per side (`torch.profiler`, a scope per part; backward charged to the part whose forward "
        "op created the autograd node); ms forward + backward, `other` = the rest, profiler overhead included:",
        "",
        "| part | " + " | ".join(f"Vd = {record[s]['draft_vocab_size']:,}" for s in SIDES) + " |",
        "|---|" + "---:|" * len(SIDES),
    ]
    for part, name in PART_NAMES.items():
        cells = [sum(record[s]["profile"]["parts"][part].values()) for s in SIDES]
        lines.append(f"| {name} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    lines.append("| **profiled step** | " + " | ".join(f"{record[s]['profile']['total_ms']:.0f}" for s in SIDES) + " |")
    passes = record["full_vocab_pass"]
    lines += ["", "## The full-vocabulary pass", ""]
    if not passes["measured"]:
        lines.append(f"Not measured: {passes['why']}.")
    else:
        lines += [
            "Cache mode reads logZ and the argmax from the cache; online mode's teacher and the cache writer compute "
            f"them over all V. This tree's tiled pass vs git {passes['revision']}'s row-chunked one (16 MiB chunks = "
            f"{(1 << 22) // shape['vocab']} positions, each chunk reading the whole head again), fp32, random head and "
            f"rows, medians of {passes['repeats']} alternated runs:",
            "",
            "| pass | positions | before ms | after ms | speed-up | max abs difference | argmax equal |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for name, c in passes["cases"].items():
            lines.append(
                f"| {name} | {c['rows']} | {c['before_ms']:.0f} | {c['after_ms']:.0f} | "
                f"{c['before_ms'] / c['after_ms']:.2f}x | {c['max_abs_difference']:.1e} | {c['argmax_equal']} |"
            )
    lines += ["", f"Total benchmark time {record['seconds']:.0f} s.", ""]
    (out_dir / f"{stem}.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one round, no before side (smoke run)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the JSON and markdown go")
    parser.add_argument("--before-rev", default=BEFORE_REV, help="git revision of the row-chunked pass ('none': skip)")
    parser.add_argument("--rounds", type=int, default=None, help="alternation rounds (default 3; quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per side per round (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per side (default 1)")
    args = parser.parse_args(argv)
    before = None if args.quick or args.before_rev.lower() == "none" else args.before_rev
    run(args.quick, args.out_dir, before, args.rounds, args.steps, args.threads)


if __name__ == "__main__":
    main()
