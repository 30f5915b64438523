"""GPU path check: flex vs SDPA parity, a bf16-mixed quickstart fit, training throughput, Selector timing.

One prepared script for a lent CUDA machine. No downloads: synthetic tensors plus the repository's shipped demo target
and conversations (``HF_HUB_OFFLINE=1``, W&B disabled). On one H100/H200 the default run is expected to take 5-7
minutes; optional throughput cases are skipped once ``--budget-s`` (default 420 s) would be exceeded. On CPU (or with
``--cpu-smoke``) it runs small sizes in about 20 s. Every part is wrapped: a failure is recorded and the other parts
still run; the exit code is 1 if any part failed or raised. Results go to ``OUTPUT/gpu_check.{json,md}``
(``gpu_check_smoke.*`` for small-size runs, so a smoke run never overwrites GPU numbers), rewritten after every part so
a run cut short keeps what finished; a rich table is printed last.

    python scripts/gpu_check.py [--output DIR] [--cpu-smoke] [--only parity,fit,selector,throughput] [--no-compile]

1. parity: one synthetic drafter (GQA, several packed documents per row, padding, invalid anchors) built with
   ``attention_backend="flex"`` and ``"sdpa"`` (same weights via ``load_state_dict``, same anchors), run in fp32 and
   under bf16 autocast; forward + backward on CUDA, where flex runs through the project's own compiled path
   (``_compiled_flex_attention``); forward only on CPU (eager flex has no CPU backward). Loss = KL + confidence BCE
   (smooth; TV's kink could flip single gradient terms between two correct kernels). Error = ||a - b|| / ||b|| over the
   whole tensor in fp64 (logits; confidence logits; all parameter gradients concatenated). Bounds:
   - fp32, TF32 off (``float32_matmul_precision("highest")``): logits 1e-4, gradients 1e-3. Both sides round at
     u = 6e-8 and differ only in reduction order (online softmax vs materialised scores): expect ~1e-6.
   - bf16: logits 2e-2, gradients 5e-2, or flex no less accurate than SDPA against the fp32 SDPA reference
     (err_flex <= 1.5 err_sdpa). bf16 keeps 8 mantissa bits (u = 2^-8 = 3.9e-3) and about ten bf16 roundings sit on
     the path (projections, P cast to bf16 before P.V, residuals, LM head), so two correct kernels differ by a few u;
     backward doubles the roundings and the softmax gradient amplifies them.
   The fp32 comparison is the one that resolves subtle mask bugs: measured on this setup (fp32, CPU), letting one of
   the 128 blocks see one extra context position moves the logits by 2.3e-3 (23x the bound), all blocks by 1.1e-2 -
   below the bf16 bound, so the bf16 comparison checks the mixed-precision path (autocast casts into compiled flex,
   dtypes of q/k/v and gradients) and gross errors, not off-by-one masks.
2. fit: ``cli_main(["fit", "--config", "configs/quickstart.yaml", --trainer.accelerator=gpu,
   --trainer.precision=bf16-mixed, ...])`` on the demo target (attention ``auto`` = flex on CUDA), CSVLogger in a
   temporary directory, checkpointing and progress bar off, the quickstart's chart callbacks on. Passes if every logged
   ``train/loss`` (``metrics.csv``) is finite and the mean of the last quarter is < 0.95 x that of the first quarter.
3. throughput: a realistic drafter (hidden 2048, 16 / 8 KV heads, head_dim 128, Vd 32000, vanilla Markov rank 256,
   confidence head, block 16) with random ``nn.Embedding`` / ``nn.Linear`` embedding and LM head and a synthetic random
   bf16 target-feature stream. One step = ``DSparkModule.training_step`` minus the target forward: anchor sampling,
   ``BlockMask`` (or dense mask) creation, drafter forward, teacher log-probs at the A*B positions, chunked compound loss
   + confidence loss, backward, grad clipping, AdamW; bf16 autocast over fp32 weights (as ``bf16-mixed``), TF32 on for
   the fp32 matmuls autocast leaves (``float32_matmul_precision("high")``). Timing: CUDA events around each step,
   median over 10 steps after 3 warm-up steps (which include compilation; ``warmup_s``); ``wall_ms`` syncs every step.
   tokens/s = supervised draft tokens (valid anchor-block slots, b*A*B here) per second; context tokens/s = packed
   target positions (b*S) per second. ``peak_gib`` = ``torch.cuda.max_memory_allocated`` over the timed steps.
   ``mask_ms`` times mask creation alone (it is also inside the step). ``recompiles`` = dynamo graphs compiled during
   the timed steps (should be 0). Cases: flex; dense-mask SDPA; 5 layers at 8k context; ``torch.compile`` of the
   backbone (``--no-compile`` drops it).
4. selector: ``selector_decode`` (top-16 pair scores + walk; gated head also with its gate table) vs
   ``sequential_decode`` (full-vocabulary Markov decode): B=16, r=256, H=1024, Vd 32000 / 151936, batch 1 / 32, fp32,
   greedy, ``inference_mode``, interleaved repeats, median of CUDA-event times. On CUDA the walk's tokens are compared
   with the same walk on CPU (device consistency, >= 99% equal).

Dynamo's recompile limit is raised to 64: this one process compiles flex attention for many shapes (users run one shape
per process), and the default limit of 8 would silently fall back to unfused eager flex. In the fit, validation
batches carry varying numbers of evaluation anchors, so each new shape compiles flex once more.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch._dynamo
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

BACKBONE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")
PARITY_FULL = dict(zip(BACKBONE, (1024, 2, 8, 4, 128, 2816))) | dict(vocab=8192, rank=64, block=16, anchors=64)
PARITY_FULL |= dict(seq=1024, rows=2)
PARITY_SMOKE = dict(zip(BACKBONE, (64, 2, 4, 2, 16, 128))) | dict(
    vocab=256, rank=16, block=4, anchors=8, seq=96, rows=2
)
BOUNDS = {"fp32": {"logits": 1e-4, "grads": 1e-3}, "bf16": {"logits": 2e-2, "grads": 5e-2}}
BIG = dict(zip(BACKBONE, (2048, 1, 16, 8, 128, 6144))) | dict(vocab=32000, rank=256, block=16, rows=1)
SMALL = dict(zip(BACKBONE, (128, 1, 4, 2, 32, 256))) | dict(vocab=2048, rank=32, block=16, rows=1)
THROUGHPUT_FULL = [  # est_s: rough cost including compilation, checked against the time budget
    BIG | dict(name="flex L1 A512 S4096", backend="flex", anchors=512, seq=4096, est_s=60),
    BIG | dict(name="sdpa L1 A512 S4096", backend="sdpa", anchors=512, seq=4096, est_s=40),
    BIG | dict(name="flex L5 A1024 S8192", backend="flex", num_layers=5, anchors=1024, seq=8192, est_s=90),
    BIG | dict(name="flex+compile L1 A512 S4096", backend="flex", compile=True, anchors=512, seq=4096, est_s=180),
]
THROUGHPUT_SMOKE = [SMALL | dict(name="auto L1 A16 S512", backend="auto", anchors=16, seq=512, est_s=5)]
SELECTOR_FULL = dict(hidden=1024, rank=256, block=16, k=16, vocabs=(32000, 151936), batches=(1, 32), repeats=20)
SELECTOR_SMOKE = dict(hidden=64, rank=32, block=16, k=16, vocabs=(2048,), batches=(1, 4), repeats=3)


class Context:
    def __init__(self, args: argparse.Namespace) -> None:
        want = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(want)
        self.cuda = self.device.type == "cuda"
        self.smoke = args.cpu_smoke or not self.cuda
        self.args, self.start = args, time.perf_counter()

    def remaining(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.start)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def autocast(self, bf16: bool):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def cleanup(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ building blocks
def synthetic_drafter(c: dict, backend: str):
    """A DSparkDrafter with a random embedding / LM head (no target model); every trainable weight non-zero."""
    from dspark_lightning.models import DrafterConfig, DSparkDrafter, MarkovHeadConfig
    from dspark_lightning.models.backbone import BackboneConfig

    backbone = BackboneConfig(
        **{k: c[k] for k in BACKBONE}, num_context_layers=c["num_layers"], attention_backend=backend
    )
    config = DrafterConfig(
        block_size=c["block"],
        num_layers=c["num_layers"],
        max_anchors=c["anchors"],
        mask_token_id=c["vocab"] - 1,
        target_layer_ids=list(range(c["num_layers"])),
        markov_head=MarkovHeadConfig(rank=c["rank"]),
        attention_backend=backend,
    )
    hidden = c["hidden_size"]
    drafter = DSparkDrafter(config, backbone, nn.Embedding(c["vocab"], hidden), nn.Linear(hidden, c["vocab"], False))
    # both start at zero (W2 = 0 would also leave W1 without a gradient)
    nn.init.normal_(drafter.markov_head.markov_w2.weight, std=c["rank"] ** -0.5)
    nn.init.normal_(drafter.confidence_head.proj.weight, std=(hidden + c["rank"]) ** -0.5)
    return drafter


def packed_batch(c: dict, device, dtype, g: torch.Generator, *, short_last: int = 0, drop: float = 0.0) -> dict:
    """Rows of random-length documents packed back to back; the last row optionally one short document + padding."""
    rows, seq = c["rows"], c["seq"]
    ids = torch.randint(0, c["vocab"] - 1, (rows, seq), generator=g)
    doc, pos = torch.full((rows, seq), -1), torch.zeros(rows, seq, dtype=torch.long)
    for r in range(rows):
        end, start, d = (short_last if short_last and r == rows - 1 else seq), 0, 0
        while start < end:
            n = min(end - start, int(torch.randint(seq // 8 + 1, seq // 2 + 1, (1,), generator=g)))
            doc[r, start : start + n], pos[r, start : start + n] = d, torch.arange(n)
            start, d = start + n, d + 1
    mask = (doc >= 0) & (torch.rand(rows, seq, generator=g) >= drop)
    context = torch.randn(rows, seq, c["num_layers"] * c["hidden_size"], generator=g)
    final = torch.randn(rows, seq, c["hidden_size"], generator=g)
    batch = dict(input_ids=ids, loss_mask=mask, document_ids=doc, position_ids=pos)
    return {k: v.to(device) for k, v in batch.items()} | {
        "context_features": context.to(device, dtype),
        "final_hidden": final.to(device, dtype),
    }


def drafter_loss(out, block: int, spec: dict, weights=None) -> torch.Tensor:
    from dspark_lightning.losses import compound_loss, confidence_loss

    nb = out.logits.shape[0] * out.logits.shape[1]
    valid = out.slot_valid.view(nb, block)
    logits, teacher = out.logits.reshape(nb, block, -1), out.teacher_logprobs.reshape(nb, block, -1)
    lo = compound_loss(logits, teacher, weights, valid, spec)
    return lo.loss + confidence_loss(out.confidence_logits.reshape(nb, block), lo.alpha, lo.weights, valid)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().flatten().cpu(), b.detach().double().flatten().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def time_once(ctx: Context, fn) -> tuple[float, float]:
    """(CUDA-event ms on CUDA / wall ms on CPU, wall ms including a final sync)."""
    ctx.sync()
    t0 = time.perf_counter()
    if not ctx.cuda:
        fn()
        wall = (time.perf_counter() - t0) * 1e3
        return wall, wall
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end), (time.perf_counter() - t0) * 1e3


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# ------------------------------------------------------------------------------------------------ 1. parity
def check_parity(ctx: Context) -> dict:
    from dspark_lightning.models.anchors import sample_anchors

    c = PARITY_SMOKE if ctx.smoke else PARITY_FULL
    backward = ctx.cuda  # eager FlexAttention has no backward on CPU
    checks = ["logits", "confidence"] + (["grads"] if backward else [])
    torch.manual_seed(0)
    sdpa = synthetic_drafter(c, "sdpa").to(ctx.device)
    flex = synthetic_drafter(c, "flex").to(ctx.device)
    flex.load_state_dict(sdpa.state_dict())
    g = torch.Generator().manual_seed(0)
    batch = packed_batch(c, ctx.device, torch.float32, g, short_last=c["block"] + c["anchors"] // 2, drop=0.2)
    anchors = sample_anchors(batch["loss_mask"], batch["document_ids"], c["block"], c["anchors"], True, g)

    def run(model, bf16: bool) -> dict:
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(backward), ctx.autocast(bf16), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
            out = model(**batch, anchors=anchors)
            loss = drafter_loss(out, c["block"], {"kl": 1.0})
        if backward:
            loss.backward()
        grads = [p.grad.detach().float().clone() if p.grad is not None else None for p in model.parameters()]
        return {"logits": out.logits.detach().float(), "confidence": out.confidence_logits.detach().float(), "g": grads}

    def compare(a: dict, b: dict) -> dict:
        res = {k: rel(a[k], b[k]) for k in ("logits", "confidence")}
        if backward:
            pairs = [(n, x, y) for (n, _), x, y in zip(sdpa.named_parameters(), a["g"], b["g"]) if y is not None]
            res["grads"] = rel(
                torch.cat([x.flatten() for _, x, _ in pairs]), torch.cat([y.flatten() for *_, y in pairs])
            )
            res["worst_grad_rel"], res["worst_grad_tensor"] = max((rel(x, y), n) for n, x, y in pairs if y.norm() > 0)
        return res

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # TF32 off: the fp32 bounds assume IEEE fp32 matmuls
    try:
        reference = run(sdpa, False)
        rows = []
        for precision in ("fp32", "bf16"):
            bf16 = precision == "bf16"
            f, s = run(flex, bf16), (run(sdpa, True) if bf16 else reference)
            row = {"precision": precision, "backward": backward, **compare(f, s)}
            bound = BOUNDS[precision]
            ok = {k: row[k] <= bound["grads" if k == "grads" else "logits"] for k in checks}
            if bf16:  # or: flex is no less accurate than SDPA at the same precision
                to_ref, sdpa_ref = compare(f, reference), compare(s, reference)
                for k in checks:
                    row[f"flex_vs_fp32_{k}"], row[f"sdpa_vs_fp32_{k}"] = to_ref[k], sdpa_ref[k]
                    ok[k] = ok[k] or to_ref[k] <= 1.5 * sdpa_ref[k]
            rows.append(
                row | {"bound_logits": bound["logits"], "bound_grads": bound["grads"], "passed": all(ok.values())}
            )
    finally:
        torch.set_float32_matmul_precision(previous)
    summary = "; ".join(
        f"{r['precision']} logits {r['logits']:.1e}" + (f" grads {r['grads']:.1e}" if backward else "") for r in rows
    )
    if not backward:
        summary += "; backward skipped (no CUDA)"
    setup = c | {"invalid_anchors": int((~anchors.valid).sum()), "flex": "compiled" if ctx.cuda else "eager"}
    status = "passed" if all(r["passed"] for r in rows) else "failed"
    return {"status": status, "summary": summary, "rows": rows, "setup": setup}


# ------------------------------------------------------------------------------------------------ 2. fit
def check_fit(ctx: Context) -> dict:
    from dspark_lightning.cli import cli_main

    steps = ctx.args.fit_steps or (20 if ctx.smoke else 80)
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_check_fit_"))
    names = ("AcceptanceCurves", "CalibrationDiagram", "ValidationSummary")  # the quickstart's, minus bar/checkpoint
    callbacks = [{"class_path": f"dspark_lightning.lightning.callbacks.{name}"} for name in names]
    smoke = "--data.seq_len=128 --data.batch_size=2 --data.limit_val_samples=8 --model.drafter.max_anchors=8"
    fixed = (
        "--trainer.devices=1 --trainer.limit_val_batches=2 --trainer.log_every_n_steps=1 "
        "--model.training.lr_warmup_steps=5 --trainer.enable_checkpointing=false --trainer.enable_progress_bar=false"
    )
    argv = [
        "fit",
        f"--config={ROOT / 'configs/quickstart.yaml'}",
        f"--model.target.path={ROOT / 'assets/demo-target'}",
        f"--data.train_files={ROOT / 'assets/data/regenerated'}/train-*.jsonl",
        f"--data.val_files={ROOT / 'assets/data/sharegpt'}/validation-*.jsonl",
        f"--trainer.accelerator={'gpu' if ctx.cuda else 'cpu'}",
        f"--trainer.precision={'bf16-mixed' if ctx.cuda else '32-true'}",
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={steps}",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",  # before its init_args
        f"--trainer.logger.save_dir={run_dir}",
        "--trainer.logger.name=fit",
        f"--trainer.callbacks={json.dumps(callbacks)}",
        *fixed.split(),
        *(smoke.split() if ctx.smoke else []),
    ]
    t0 = time.perf_counter()
    cli = cli_main(argv)
    seconds = time.perf_counter() - t0
    metrics = sorted(run_dir.glob("fit/version_*/metrics.csv"))[-1]
    with metrics.open() as handle:
        losses = [float(r["train/loss"]) for r in csv.DictReader(handle) if r.get("train/loss")]
    q = max(1, len(losses) // 4)
    first, last = statistics.mean(losses[:q]), statistics.mean(losses[-q:])
    finite = all(math.isfinite(x) for x in losses)
    trainer = cli.trainer
    result = {
        "status": "passed" if finite and len(losses) >= 4 and last < 0.95 * first else "failed",
        "summary": f"train/loss {first:.3f} -> {last:.3f} (x{last / first:.2f}) in {trainer.global_step} steps",
        "steps": trainer.global_step,
        "loss_first_quarter": first,
        "loss_last_quarter": last,
        "finite": finite,
        "fit_s": seconds,
        "precision": str(trainer.precision),
        "device": str(trainer.strategy.root_device),
        "val_tau": float(trainer.callback_metrics.get("val/tau", float("nan"))),
        "metrics_csv": str(metrics),
        "losses": losses,
    }
    del cli, trainer
    ctx.cleanup()
    return result


# ------------------------------------------------------------------------------------------------ 3. throughput
def throughput_case(ctx: Context, c: dict, warmup: int, repeats: int) -> dict:
    from dspark_lightning.losses import position_weights
    from dspark_lightning.models.anchors import block_visibility, sample_anchors
    from dspark_lightning.models.attention import resolve_backend

    torch.manual_seed(0)
    drafter = synthetic_drafter(c, c["backend"]).to(ctx.device)
    if c.get("compile"):
        drafter.backbone.compile()
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(0)
    batches = [packed_batch(c, ctx.device, torch.bfloat16 if ctx.cuda else torch.float32, g) for _ in range(2)]
    weights = position_weights(c["block"], device=ctx.device)
    supervised = []

    def step(batch: dict) -> None:
        with ctx.autocast(ctx.cuda):
            out = drafter(**batch, generator=g)
            loss = drafter_loss(out, c["block"], {"ce": 0.1, "tv": 0.9}, weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        supervised.append(out.slot_valid.sum())  # a device tensor: no sync inside the step

    t0 = time.perf_counter()
    for i in range(warmup):
        step(batches[i % 2])
    ctx.sync()
    warmup_s, graphs = time.perf_counter() - t0, graphs_compiled()
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    times = [time_once(ctx, lambda i=i: step(batches[i % 2])) for i in range(repeats)]
    peak = torch.cuda.max_memory_allocated(ctx.device) / 2**30 if ctx.cuda else None
    recompiles = graphs_compiled() - graphs
    tokens = int(supervised[-1])
    batch, backend = batches[0], resolve_backend(c["backend"], ctx.device)
    anchors = sample_anchors(batch["loss_mask"], batch["document_ids"], c["block"], c["anchors"], True, g)
    mask = lambda: block_visibility(anchors, batch["document_ids"], c["block"]).build(backend)  # noqa: E731
    mask_ms = statistics.median(time_once(ctx, mask)[0] for _ in range(3))
    step_ms = statistics.median(t[0] for t in times)
    row = {k: c[k] for k in ("name", "num_layers", "anchors", "seq", "rows", "hidden_size", "vocab", "block")}
    return row | {
        "backend": backend,
        "compile": bool(c.get("compile")),
        "trainable_M": sum(p.numel() for p in params) / 1e6,
        "step_ms": step_ms,
        "step_min_ms": min(t[0] for t in times),
        "wall_ms": statistics.median(t[1] for t in times),
        "tokens_per_s": tokens / step_ms * 1e3,
        "context_tokens_per_s": c["rows"] * c["seq"] / step_ms * 1e3,
        "supervised_tokens": tokens,
        "peak_gib": peak,
        "warmup_s": warmup_s,
        "mask_ms": mask_ms,
        "recompiles": recompiles,
    }


def check_throughput(ctx: Context) -> dict:
    cases = THROUGHPUT_SMOKE if ctx.smoke else [c for c in THROUGHPUT_FULL if ctx.args.compile or not c.get("compile")]
    warmup, repeats = (1, 3) if ctx.smoke else (3, 10)
    if ctx.cuda:
        torch.set_float32_matmul_precision("high")  # TF32 for the fp32 matmuls that autocast leaves
    rows = []
    for c in cases:
        if not ctx.smoke and ctx.remaining() < c["est_s"]:
            rows.append({"name": c["name"], "status": f"skipped (time budget: {ctx.remaining():.0f} s left)"})
            continue
        try:
            rows.append({"status": "ok"} | throughput_case(ctx, c, warmup, repeats))
        except Exception as error:  # noqa: BLE001 - one case failing (e.g. out of memory) must not stop the rest
            rows.append({"name": c["name"], "status": "error", "error": f"{type(error).__name__}: {error}"[:2000]})
            traceback.print_exc()
        ctx.cleanup()
    done = [r for r in rows if r["status"] == "ok"]
    summary = "; ".join(
        f"{r['name']}: {r['tokens_per_s'] / 1e3:.1f}k tok/s" + (f", {r['peak_gib']:.1f} GiB" if r["peak_gib"] else "")
        for r in done
    )
    failed = not done or any(r["status"] == "error" for r in rows)
    return {
        "status": "failed" if failed else "passed",
        "summary": summary,
        "rows": rows,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
    }


# ------------------------------------------------------------------------------------------------ 4. selector
def selector_case(ctx: Context, s: dict, vocab: int, batch: int, kind: str) -> dict:
    from dspark_lightning.models import MarkovHead
    from dspark_lightning.selector import precompute_prev_gate_table, selector_decode, sequential_decode

    torch.manual_seed(0)
    B, K, R, H = s["block"], s["k"], s["rank"], s["hidden"]
    head = MarkovHead(verifier_vocab_size=vocab, draft_vocab_size=vocab, rank=R, hidden_size=H, kind=kind)
    nn.init.normal_(head.markov_w2.weight, std=R**-0.5)
    cpu = (torch.randn(batch, B, vocab), head.eval(), torch.randint(0, vocab, (batch,)), torch.randn(batch, B, H))
    base, dev_head, prev, hidden = (x.to(ctx.device) for x in cpu)  # (Module.to is in place: head is now on device)
    fns = {
        "sequential": lambda: sequential_decode(base, dev_head, prev, hidden),
        "walk": lambda: selector_decode(base, dev_head, prev, hidden, K),
    }
    if kind == "gated":
        table = precompute_prev_gate_table(dev_head)
        fns["walk_table"] = lambda: selector_decode(base, dev_head, prev, hidden, K, prev_gate_table=table)
    for fn in fns.values():  # warm-up
        fn()
    times = {name: [] for name in fns}
    for _ in range(s["repeats"]):  # interleaved, so drifting load hits every variant alike
        for name, fn in fns.items():
            times[name].append(time_once(ctx, fn)[0])
    row = {"head": kind, "vocab": vocab, "batch": batch} | {f"{n}_ms": statistics.median(t) for n, t in times.items()}
    walk, seq = fns["walk"](), fns["sequential"]()
    row |= {"speedup": row["sequential_ms"] / row["walk_ms"], "walk_eq_sequential": float((walk == seq).float().mean())}
    if ctx.cuda and vocab == s["vocabs"][0]:
        base_c, prev_c, hidden_c = cpu[0], cpu[2], cpu[3]
        cpu_walk = selector_decode(base_c, dev_head.cpu(), prev_c, hidden_c, K)
        row["walk_cuda_eq_cpu"] = float((walk.cpu() == cpu_walk).float().mean())
    return row


def check_selector(ctx: Context) -> dict:
    s = SELECTOR_SMOKE if ctx.smoke else SELECTOR_FULL
    rows = []
    with torch.inference_mode():
        for vocab in s["vocabs"]:
            for batch in s["batches"]:
                for kind in ("vanilla", "gated"):
                    rows.append(selector_case(ctx, s, vocab, batch, kind))
                    ctx.cleanup()
    big = max(rows, key=lambda r: (r["vocab"], r["batch"], r["head"] == "vanilla"))
    summary = (
        f"Vd {big['vocab']} batch {big['batch']} {big['head']}: walk {big['walk_ms']:.2f} ms vs sequential "
        f"{big['sequential_ms']:.2f} ms ({big['speedup']:.1f}x)"
    )
    consistent = all(r.get("walk_cuda_eq_cpu", 1.0) >= 0.99 for r in rows)
    return {"status": "passed" if consistent else "failed", "summary": summary, "rows": rows, "setup": s}


PARTS = {"parity": check_parity, "fit": check_fit, "selector": check_selector, "throughput": check_throughput}
ORDER = ("parity", "fit", "throughput", "selector")  # report order; PARTS is the run order (throughput last)


# ------------------------------------------------------------------------------------------------ reporting
def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e5 else f"{value:.4g}"
    return "—" if value is None else str(value)


def scalars(d: dict) -> dict:
    return {k: v for k, v in d.items() if not isinstance(v, dict | list)}


def write_markdown(path: Path, report: dict) -> None:
    meta = report["meta"]
    lines = [
        "# GPU path check",
        "",
        f"`{meta['command']}` on {meta['device_name']} (torch {meta['torch']}, CUDA {meta['cuda']}), "
        f"{meta['total_s']:.0f} s, overall **{'passed' if report['ok'] else 'FAILED'}**. Definitions, bounds and "
        "method: the docstring of `scripts/gpu_check.py`.",
    ]
    for name, part in report["checks"].items():
        lines += ["", f"## {name}: {part['status']}", ""]
        lines += [f"- {k}: {fmt(v)}" for k, v in scalars(part).items() if k not in ("status", "traceback")]
        if part.get("items"):
            lines.append(f"- items: {', '.join(part['items'])}")
        rows = [scalars(r) for r in part.get("rows", [])]
        if rows:
            columns = list(dict.fromkeys(k for r in rows for k in r))
            lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(fmt(r.get(k)) for k in columns) + " |" for r in rows]
    path.write_text("\n".join(lines) + "\n")


def print_tables(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    columns = {
        "throughput": ("name", "step_ms", "tokens_per_s", "context_tokens_per_s", "peak_gib", "mask_ms", "warmup_s"),
        "selector": ("head", "vocab", "batch", "sequential_ms", "walk_ms", "walk_table_ms", "speedup"),
    }
    for name, keys in columns.items():
        rows = [r for r in report["checks"][name].get("rows", []) if r.get("status", "ok") == "ok"]
        if rows:
            table = Table(*keys, title=name)
            for r in rows:
                table.add_row(*(fmt(r.get(k)) for k in keys))
            console.print(table)
    title = f"gpu_check on {report['meta']['device_name']}: {'passed' if report['ok'] else 'FAILED'}"
    table = Table("part", "status", "result", "s", title=title)
    for name, part in report["checks"].items():
        colour = {"passed": "green", "failed": "red", "error": "red"}.get(part["status"], "yellow")
        result = part.get("summary") or part.get("error", "")[-300:] or ", ".join(part.get("items", []))
        table.add_row(name, f"[{colour}]{part['status']}[/]", result, fmt(part.get("seconds")))
    console.print(table)


def write_report(ctx: Context, argv: list[str] | None, checks: dict) -> dict:
    checks = dict(checks)
    if not ctx.cuda:
        checks["cuda_only"] = {
            "status": "skipped (no CUDA)",
            "items": ["backward parity", "compiled flex", "bf16-mixed GPU fit", "torch.compile", "GPU memory/events"],
        }
    report = {
        "ok": not any(c["status"] in ("failed", "error") for c in checks.values()),
        "meta": {
            "command": " ".join(["python scripts/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]),
            "device_name": torch.cuda.get_device_name(ctx.device) if ctx.cuda else platform.processor() or "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "smoke": ctx.smoke,
            "torch_threads": torch.get_num_threads(),
            "total_s": time.perf_counter() - ctx.start,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "checks": checks,
    }
    ctx.args.output.mkdir(parents=True, exist_ok=True)
    stem = ctx.args.output / ("gpu_check_smoke" if ctx.smoke else "gpu_check")
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    write_markdown(stem.with_suffix(".md"), report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/gpu/results", help="result directory")
    parser.add_argument("--cpu-smoke", action="store_true", help="small sizes (automatic without CUDA)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts to run")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile case")
    parser.add_argument("--fit-steps", type=int, default=None, help="optimizer steps of the fit (20 smoke / 80 GPU)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="no optional throughput case past this")
    args = parser.parse_args(argv)
    only = [p.strip() for p in args.only.split(",") if p.strip()]
    if set(only) - set(PARTS):
        parser.error(f"unknown parts {sorted(set(only) - set(PARTS))}; choose from {list(PARTS)}")
    os.environ["WANDB_MODE"] = "disabled"
    ctx = Context(args)
    if ctx.cuda:
        torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)
    else:
        torch.set_num_threads(1)  # small shared CPUs: one thread avoids oversubscription
    checks = {name: {"status": "not run (cut short?)" if name in only else "skipped (not selected)"} for name in ORDER}
    for name, fn in PARTS.items():
        if name not in only:
            continue
        print(f"[gpu_check] {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            checks[name] = fn(ctx)
        except Exception as error:  # noqa: BLE001 - report it and carry on with the other parts
            checks[name] = {"status": "error", "error": f"{type(error).__name__}: {error}"[:2000]}
            checks[name]["traceback"] = traceback.format_exc()[-4000:]
            print(checks[name]["traceback"], file=sys.stderr, flush=True)
        ctx.cleanup()  # outside the except block, so the traceback's frames no longer pin GPU memory
        checks[name]["seconds"] = time.perf_counter() - t0
        print(f"[gpu_check] {name}: {checks[name]['status']} ({checks[name]['seconds']:.1f} s)", flush=True)
        write_report(ctx, argv, checks)  # after every part: a run cut short still leaves its results
    report = write_report(ctx, argv, checks)
    print(f"[gpu_check] wrote {ctx.args.output}/{'gpu_check_smoke' if ctx.smoke else 'gpu_check'}.{{json,md}}")
    print_tables(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
