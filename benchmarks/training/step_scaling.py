"""Scaling of the demo drafter's training step: step time and peak memory vs sequence length and vs anchors (CPU).

Run: ``python -m benchmarks.training.step_scaling`` (about 2-3 minutes on 2 shared cores) or ``--quick`` (2 points per
sweep, < 30 s). Writes ``scaling.csv`` / ``.md`` and the plots ``scaling_seq_len.png`` / ``scaling_anchors.png``
(``--quick``: ``scaling_quick.*``) under ``benchmarks/training/results``.

Design choices:
- The model is the quickstart drafter on the shipped demo target (``assets/demo-target``: hidden 128, vocab 2048,
  4 layers): 1 draft layer, B = 8, vanilla Markov head of rank 64, confidence head on [h ; W1[prev]], loss
  ``{"ce": 0.1, "tv": 0.9}``, AdamW; built through ``DSparkModule`` so the step is the real ``shared_step``.
- Sweeps: S in 512 ... 8192 at A = 128 anchors, and A in 64 ... 1024 at S = 4096, one packed row of 512-token
  documents (the first quarter of each is prompt, outside the loss mask), random token ids.
- The target's features are computed once per sequence length by the real demo target and timed on their own
  (``target_ms``, no grad, median of 3); the timed step (``step_ms``) is what the drafter adds: ``shared_step`` with
  those features in the batch (its offline-cache path), the ``AcceptanceMetrics`` update, backward, grad-norm clip
  1.0 and the optimizer step. Median of repeats after one warm-up step: at least 3, more for cheap points (about 2 s
  of timed steps per point, at most 15), 1 torch thread (a 2-core machine shared with other jobs: bursts of load
  from other processes need several samples to be outvoted).
- Peak memory = peak of live tensor bytes allocated during one step, from the profiler's memory timeline (the CPU
  analogue of ``torch.cuda.max_memory_allocated`` over the step; the same measure as ``benchmarks.memory.loss_peak``), so the
  parameters, optimizer state and inputs that exist before the step are not counted.
- For reference the table gives the sizes that grow with the sweeps: one fp32 (A·B) × Vd logits tensor, and the
  dense boolean SDPA mask of (A·B) × (S + A·B) that our CPU path builds (FlexAttention's block mask on CUDA).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "assets" / "demo-target"
BLOCK, RANK, DOC_LEN = 8, 64, 512
SEQ_LENS, SEQ_ANCHORS = (512, 1024, 2048, 4096, 8192), 128
ANCHORS, ANCHOR_SEQ = (64, 128, 256, 512, 1024), 4096
BUDGET_S, MAX_REPEATS = 2.0, 15  # timed seconds per point (full run) and the most repeats that buys
COLUMNS = [
    "sweep", "seq_len", "anchors", "rows", "repeats", "step_ms", "step_min_ms", "forward_ms", "backward_ms",
    "optimizer_ms", "target_ms", "peak_mib", "logits_fp32_mib", "dense_mask_mib",
]  # fmt: skip


def build_module(target: Path = TARGET):
    from dspark_lightning.lightning.config import LossArgs, TargetArgs
    from dspark_lightning.lightning.module import DSparkModule
    from dspark_lightning.models import DrafterConfig, MarkovHeadConfig

    drafter = DrafterConfig(
        block_size=BLOCK,
        num_layers=1,
        max_anchors=SEQ_ANCHORS,
        mask_token_id=_mask_token_id(target),
        markov_head=MarkovHeadConfig(rank=RANK),
        confidence_head=True,
        confidence_with_markov=True,
    )
    module = DSparkModule(TargetArgs(str(target), dtype="float32"), drafter, LossArgs(weights={"ce": 0.1, "tv": 0.9}))
    return module.train()


def _mask_token_id(target: Path) -> int:
    """The tokenizer's mask token (as the CLI links it), else the last id of the vocabulary."""
    try:
        from transformers import AutoTokenizer

        mask = AutoTokenizer.from_pretrained(str(target)).mask_token_id
        if mask is not None:
            return int(mask)
    except Exception:  # noqa: BLE001 - any tokenizer problem: fall back to a valid id
        pass
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(target)).vocab_size - 1


def make_batch(seq_len: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    doc_len = min(DOC_LEN, seq_len)
    document_ids = torch.arange(seq_len) // doc_len
    position_ids = torch.arange(seq_len) - document_ids * doc_len
    return {
        "input_ids": torch.randint(0, vocab, (1, seq_len), generator=g),
        "loss_mask": (position_ids >= doc_len // 4).long()[None],
        "document_ids": document_ids[None],
        "position_ids": position_ids[None],
    }


def target_features(module, batch: dict, repeats: int) -> tuple[dict[str, torch.Tensor], float]:
    """The demo target's features for ``batch`` (as the offline cache would hold them) and the forward's median ms."""
    times, features = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        features = module.target.features(batch["input_ids"], batch["position_ids"])
        times.append((time.perf_counter() - t0) * 1e3)
    cached = {"context_features": features.context_features, "final_hidden": features.final_hidden}
    return cached, statistics.median(times)


def measure(module, batch: dict, features: dict, anchors: int, repeats: int, adaptive: bool = True) -> dict:
    """Time the drafter's training step with precomputed target features; one more step under the profiler."""
    from benchmarks.memory.loss_peak import _tensor_peak
    from dspark_lightning.metrics import AcceptanceMetrics
    from dspark_lightning.models import TargetFeatures

    # the module samples the training anchors with the drafter's config
    module.drafter.config = dataclasses.replace(module.drafter.config, max_anchors=anchors)
    batch = {**batch, **features}  # the offline-cache path of ``shared_step``
    if not hasattr(module, "target_features"):  # a module without that path: serve them from the target instead
        cached = TargetFeatures(features["context_features"], features["final_hidden"])
        module.target.features = lambda input_ids, position_ids: cached
    params = [p for p in module.drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)

    def step() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        out = module.shared_step(batch, generator)
        total = out.loss
        with torch.no_grad():
            stats = AcceptanceMetrics(module.metric_block_size)
            stats.update(out.alpha, out.greedy_match, out.valid)
            stats.compute()
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        t2 = time.perf_counter()
        optimizer.step()
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    warm = sum(step())  # warm-up (also creates the optimizer state, which is then not counted in the peak)
    if adaptive:  # about BUDGET_S of timed steps per point, at least ``repeats``: cheap points get more samples
        repeats = max(repeats, min(MAX_REPEATS, int(BUDGET_S / max(warm, 1e-3))))
    samples = [step() for _ in range(repeats)]
    try:
        peak = _tensor_peak(step) / 2**20
    except Exception:  # noqa: BLE001 - private profiler API; leave the cell empty rather than fail the sweep
        peak = ""
    vars(module.target).pop("features", None)  # undo the fallback, if any
    totals = [sum(s) * 1e3 for s in samples]
    return {
        "repeats": repeats,
        "step_ms": statistics.median(totals),
        "step_min_ms": min(totals),
        "forward_ms": statistics.median(s[0] * 1e3 for s in samples),
        "backward_ms": statistics.median(s[1] * 1e3 for s in samples),
        "optimizer_ms": statistics.median(s[2] * 1e3 for s in samples),
        "peak_mib": peak,
    }


def plot(rows: list[dict], out_dir: Path, suffix: str) -> list[Path]:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for sweep, x_key, x_label, fixed in (
        ("seq_len", "seq_len", "sequence length S", f"A = {SEQ_ANCHORS} anchors"),
        ("anchors", "anchors", "anchors A", f"S = {ANCHOR_SEQ}"),
    ):
        points = [r for r in rows if r["sweep"] == sweep]
        if not points:
            continue
        xs = [r[x_key] for r in points]
        fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 3.8))
        ax_t.plot(xs, [r["step_ms"] for r in points], "o-", label="drafter step (fwd+bwd+opt)")
        ax_t.plot(xs, [r["target_ms"] for r in points], "s--", label="target forward (features)")
        ax_t.set(xscale="log", yscale="log", xlabel=x_label, ylabel="ms (median)", title=f"Step time, {fixed}")
        ax_m.plot(xs, [r["peak_mib"] or float("nan") for r in points], "o-", label="step peak (tensors)")
        ax_m.plot(xs, [r["logits_fp32_mib"] for r in points], ":", label="one fp32 (A·B)×Vd logits")
        ax_m.plot(xs, [r["dense_mask_mib"] for r in points], "--", label="dense attention mask")
        ax_m.set(xscale="log", yscale="log", xlabel=x_label, ylabel="MiB", title=f"Peak memory, {fixed}")
        for ax in (ax_t, ax_m):
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("Demo drafter (H = 128, Vd = 2048, 1 layer, B = 8, vanilla r = 64), CPU, 1 thread", fontsize=10)
        fig.tight_layout()
        path = out_dir / f"scaling_{sweep}{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_results(rows: list[dict], machine: dict, out_dir: Path, stem: str, total_s: float, plots) -> None:
    with open(out_dir / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in row.items()})

    def cell(value, spec=".1f"):
        return "—" if value == "" else format(value, spec)

    lines = [
        "# Training-step scaling of the demo drafter (CPU)",
        "",
        f"Quickstart drafter on `assets/demo-target` (H = 128, V = Vd = 2048, 1 draft layer, B = {BLOCK}, vanilla "
        f'Markov r = {RANK}, confidence head, loss `{{"ce": 0.1, "tv": 0.9}}`, AdamW), one packed row of '
        f"{DOC_LEN}-token documents. `step` = drafter forward (incl. loss and metrics) + backward + optimizer with "
        "precomputed target features (median of repeats after a warm-up); `target` = the demo target's forward that "
        "produces those features (median of 3, once per S); `peak` = peak live tensor bytes during one step (profiler "
        "memory timeline). Generated by `python -m benchmarks.training.step_scaling`.",
        "",
        f"Machine: {machine['cpu']} (flags: {machine.get('flags', 'not recorded')}), {machine['cores']} cores visible, torch {machine['torch']}, 1 torch thread; "
        f"load average {machine['load_average']} at start, {' '.join(f'{x:.2f}' for x in os.getloadavg())} at end "
        f"(shared machine). Total benchmark time {total_s:.0f} s. Plots: " + ", ".join(f"`{p.name}`" for p in plots),
        "",
        "| sweep | S | A | rows A·B | step ms | min ms | n | fwd ms | bwd ms | opt ms | target ms | peak MiB "
        "| fp32 logits MiB | dense mask MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['sweep']} | {r['seq_len']} | {r['anchors']} | {r['rows']} | {r['step_ms']:.1f} | "
            f"{r['step_min_ms']:.1f} | {r['repeats']} | "
            f"{r['forward_ms']:.1f} | {r['backward_ms']:.1f} | {r['optimizer_ms']:.1f} | {r['target_ms']:.1f} | "
            f"{cell(r['peak_mib'])} | {r['logits_fp32_mib']:.1f} | {r['dense_mask_mib']:.1f} |"
        )
    lines.append("")
    (out_dir / f"{stem}.md").write_text("\n".join(lines))


def run(quick: bool = False, out_dir: Path = RESULTS, threads: int = 1, repeats: int | None = None, log=print):
    """Run both sweeps and write the results; returns the rows."""
    from dspark_lightning.machine import machine_description

    torch.set_num_threads(threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_description()
    start = time.perf_counter()
    torch.manual_seed(0)
    module = build_module()
    vocab = module.drafter.draft_vocab_size
    repeats = repeats or (2 if quick else 3)
    points = [("seq_len", s, SEQ_ANCHORS) for s in (SEQ_LENS[:2] if quick else SEQ_LENS)]
    points += [("anchors", ANCHOR_SEQ if not quick else 1024, a) for a in (ANCHORS[:2] if quick else ANCHORS)]
    rows, cache = [], {}
    for sweep, seq_len, anchors in points:
        batch = make_batch(seq_len, vocab)
        if seq_len not in cache:  # one target forward timing per sequence length (median of 3)
            cache[seq_len] = target_features(module, batch, 3 if not quick else 1)
        features, target_ms = cache[seq_len]
        result = measure(module, batch, features, anchors, repeats, adaptive=not quick) | {"target_ms": target_ms}
        rows_ab = anchors * BLOCK
        row = {"sweep": sweep, "seq_len": seq_len, "anchors": anchors, "rows": rows_ab}
        row |= result
        row["logits_fp32_mib"] = rows_ab * vocab * 4 / 2**20
        row["dense_mask_mib"] = rows_ab * (seq_len + rows_ab) / 2**20
        rows.append({c: row[c] for c in COLUMNS})
        peak = "—" if row["peak_mib"] == "" else f"{row['peak_mib']:.0f} MiB"
        log(f"{sweep:8s} S={seq_len:5d} A={anchors:5d}: step {row['step_ms']:8.1f} ms, peak {peak}")
    stem = "scaling_quick" if quick else "scaling"
    plots = plot(rows, out_dir, "_quick" if quick else "")
    write_results(rows, machine, out_dir, stem, time.perf_counter() - start, plots)
    log(f"wrote {out_dir}/{stem}.{{csv,md}} and {len(plots)} plots")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 points per sweep (S=1024 for the anchor sweep)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="least timed steps per point (default 3, more for cheap points; quick 2)",
    )
    args = parser.parse_args(argv)
    run(args.quick, args.out_dir, args.threads, args.repeats)


if __name__ == "__main__":
    main()
