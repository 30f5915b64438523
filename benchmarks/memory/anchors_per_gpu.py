"""Memory / throughput guidance: how many anchors per packed row fit on a GPU, for real target sizes.

Run: ``python -m benchmarks.memory.anchors_per_gpu`` (about 1-2 minutes on CPU; on a CUDA machine it also measures a
Qwen3-0.6B-shaped model and reports predicted vs measured). Writes ``benchmarks/memory/results/memory_guidance.{csv,md}``.

Method: measure at small scale, then extrapolate with a formula whose terms are the tensors the step holds.
- Measured (CPU, fp32, 1 thread): three small random Qwen3-shaped targets (hidden H, layers L, MLP width I, vocab V)
  × sequence length S × anchors A (B = 8), each through the real code: ``FrozenTarget.features`` (no grad) and
  ``DSparkModule.shared_step`` + backward with those features in the batch (the offline-cache path). Peak = peak of
  live tensor bytes during the call, from the profiler's memory timeline (CPU analogue of
  ``torch.cuda.max_memory_allocated``); parameters and inputs that exist before the call are not counted.
- Formula (bytes, one packed row, Q = A·B block rows, N_d draft layers, n target layers read, p bytes per
  activation element, K/V widths kv·hd):
      target forward  T(S)   = p·S·(k_hid·(L+1+n)·H + k_mlp·I) + k_causal·S²            (no grad; freed after)
      features        F(S)   = p·S·(n+1)·H                                              (kept for the drafter)
      drafter step    D(S,Q) = p·k_ctx·S·(H + N_d·kv·hd) + p·k_blk·Q·N_d·(H + I) + 4·k_voc·Q·(V + Vd)
                               + 4·k_chunk·C(Q·Vd) + 4·P_D                               (P_D = drafter params: grads)
  where C(x) = clamp(x / 32, 2^20, 2^23) elements is the loss's automatic chunk (``losses.compound_loss``): a floor
  that dominates at small scale and is a constant ~100 MB at GPU scale.
  The k's are dimensionless multipliers (how many tensors of that shape are alive at the peak), fitted by
  non-negative least squares on relative error; ``k_causal`` is transformers' packed causal mask. The CPU path's
  dense boolean attention mask and SDPA intermediates (O(Q·(S+Q)); FlexAttention's block mask on CUDA is negligible)
  get no term of their own: a separate term is not identifiable from these points (it trades off against k_blk), so
  they are folded into k_blk, which makes the GPU extrapolation err on the large side. The step's peak is not exactly
  linear in these terms (it moves between forward and backward); the largest measured/predicted ratio over the CPU
  points is applied as a safety factor to the extrapolated T and D.
  The CPU shapes span vocabulary / (H + I) from 0.6 to 43 (real targets: 9 to 37) so that the block-row and
  vocabulary terms, which both grow with Q, are told apart.
- GPU extrapolation (bf16-mixed, p = 2; the vocabulary term stays fp32 as the loss computes in fp32 chunks):
      online (DDP) peak = 2·P_T + 16·P_D + max(T(S), F(S) + D(S,Q)) + 2 GiB    (target weights bf16; drafter fp32
                                                                                 weights + grads + AdamW)
      cache peak        = 2·V·H·(1 or 2 if untied) + 16·P_D + F(S) + D(S,Q) + 2 GiB
  (2 GiB = CUDA context, allocator fragmentation and workspace). Halving the activation bytes is optimistic for the
  parts computed in fp32 under autocast (RMSNorm internals); the 10% headroom covers part of it, and on a CUDA
  machine the script checks the formula against a measured Qwen3-0.6B-shaped step. The table reports the largest A (multiple of 16,
  at most 2048) whose peak fits in 90% of the GPU's memory, for batch size 1 (rows add linearly).
- Throughput guidance: FLOPs per packed row. Target forward 2·P_T·S (+ 2·L·S²·nh·hd causal attention); drafter
  6·P_layers·Q + 6·N_d·Q·S·nh·hd (attention to the context) + 6·Q·H·Vd (LM head forward + input gradient + teacher)
  — the offline cache removes the target forward from every step.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
BLOCK, RANK, GIB = 8, 64, 2**30
GPU_BLOCK, GPU_RANK, GPU_DRAFT_LAYERS = 16, 256, 1
GPU_SIZES_GIB = (24, 48, 80, 141)
GPU_SEQ_LENS = (2048, 4096, 8192, 16384)
OVERHEAD_BYTES, USABLE = 2 * GIB, 0.9


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = True

    def target_params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * (
            attn + 3 * self.hidden * self.intermediate
        )

    def drafter_params(self, draft_layers: int, rank: int, context_layers: int) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        layer = attn + 3 * self.hidden * self.intermediate
        markov = self.vocab * rank + rank * self.vocab
        return context_layers * self.hidden**2 + draft_layers * layer + markov + self.hidden + rank + 1


CPU_SHAPES = (  # vocabulary / (H + I) from 0.6 to 43 so that the block and vocabulary terms separate
    Shape("tiny", 128, 4, 384, 2048, 4, 2, 32),
    Shape("vocab-heavy", 128, 4, 256, 16384, 4, 2, 32),
    Shape("mlp-heavy", 256, 4, 1536, 1024, 4, 2, 64),
    Shape("deep", 192, 8, 512, 4096, 4, 2, 48),
)
CPU_SEQ_LENS, CPU_ANCHORS = (256, 1024), (16, 64, 160)
GPU_TARGETS = (
    Shape("Qwen3-0.6B", 1024, 28, 3072, 151936, 16, 8, 128, tied=True),
    Shape("Qwen3-8B", 4096, 36, 12288, 151936, 32, 8, 128, tied=False),
    Shape("Qwen3-32B", 5120, 64, 25600, 151936, 64, 8, 128, tied=False),
    Shape("Llama-3.1-70B", 8192, 80, 28672, 128256, 64, 8, 128, tied=False),
)


def tensor_peak(fn) -> int:
    """Peak live tensor bytes allocated while ``fn`` runs (profiler memory timeline; as in loss_peak)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        fn()
    current = peak = 0
    for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
        current += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, current)
    return peak


def build_module(shape: Shape, directory: Path, device: str, dtype: torch.dtype, block: int, rank: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dspark_lightning.lightning.config import LossArgs, TargetArgs
    from dspark_lightning.lightning.module import DSparkModule
    from dspark_lightning.models import DrafterConfig, MarkovHeadConfig

    config = Qwen3Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, tie_word_embeddings=shape.tied, max_position_embeddings=32768,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(dtype).save_pretrained(directory)
    drafter = DrafterConfig(
        block_size=block, mask_token_id=shape.vocab - 1, markov_head=MarkovHeadConfig(rank=rank), max_anchors=16
    )
    module = DSparkModule(TargetArgs(str(directory), dtype="auto"), drafter, LossArgs(weights={"ce": 0.1, "tv": 0.9}))
    return module.to(device).train()


def packed_row(seq_len: int, vocab: int, device: str, doc_len: int = 512) -> dict[str, torch.Tensor]:
    """One packed row of ``doc_len``-token documents, the first quarter of each outside the loss mask."""
    g = torch.Generator().manual_seed(0)
    doc_len = min(doc_len, seq_len)
    documents = torch.arange(seq_len) // doc_len
    positions = torch.arange(seq_len) - documents * doc_len
    batch = {
        "input_ids": torch.randint(0, vocab - 1, (1, seq_len), generator=g),
        "loss_mask": (positions >= doc_len // 4)[None],
        "document_ids": documents[None],
        "position_ids": positions[None],
    }
    return {k: v.to(device) for k, v in batch.items()}


def measure(module, shape: Shape, seq_len: int, anchors: int, device: str) -> dict[str, float]:
    """Dynamic peak bytes and seconds of the target forward and of the drafter step (features in the batch)."""
    batch = packed_row(seq_len, shape.vocab, device)
    # the module samples the training anchors with the drafter's config
    module.drafter.config = dataclasses.replace(module.drafter.config, max_anchors=anchors)
    cuda = device.startswith("cuda")

    def target_forward():
        return module.target.features(batch["input_ids"], batch["position_ids"])

    features = target_forward()
    cached = {**batch, "context_features": features.context_features, "final_hidden": features.final_hidden}
    del features

    def drafter_step():
        with torch.autocast("cuda", torch.bfloat16, enabled=cuda):
            loss = module.shared_step(cached, torch.Generator().manual_seed(0)).loss
        loss.backward()

    def peak_and_time(fn) -> tuple[int, float]:
        fn()  # warm-up
        module.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            peak = torch.cuda.max_memory_allocated() - base
        else:
            start = time.perf_counter()
            fn()
            seconds = time.perf_counter() - start
            module.zero_grad(set_to_none=True)
            peak = tensor_peak(fn)
        module.zero_grad(set_to_none=True)
        return peak, seconds

    with torch.no_grad():
        target_peak, target_s = peak_and_time(target_forward)
    drafter_peak, drafter_s = peak_and_time(drafter_step)
    return {"target_peak": target_peak, "target_s": target_s, "drafter_peak": drafter_peak, "drafter_s": drafter_s}


# ------------------------------------------------------------------------------------------------------ formula
def target_terms(shape: Shape, seq_len: int, p: int, context_layers: int = 1) -> list[float]:
    return [
        p * seq_len * (shape.layers + 1 + context_layers) * shape.hidden,
        p * seq_len * shape.intermediate,
        float(seq_len) ** 2,
    ]


def drafter_terms(shape: Shape, seq_len: int, rows: int, p: int, draft_layers: int) -> list[float]:
    return [
        p * seq_len * (shape.hidden + draft_layers * shape.kv_heads * shape.head_dim),
        p * rows * draft_layers * (shape.hidden + shape.intermediate),
        4.0 * rows * 2 * shape.vocab,
        4.0 * min(1 << 23, max(1 << 20, rows * shape.vocab // 32)),
    ]


def fit(rows: list[list[float]], measured: list[float]) -> list[float]:
    """Non-negative least squares on relative error."""
    from scipy.optimize import nnls

    a = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(measured, dtype=torch.float64)
    coefficients, _ = nnls((a / y[:, None]).numpy(), torch.ones_like(y).numpy())
    return [float(c) for c in coefficients]


def dot(k: list[float], terms: list[float]) -> float:
    return sum(a * b for a, b in zip(k, terms))


@dataclass
class Fit:
    """Fitted multipliers and safety factors (largest measured / predicted over the CPU points)."""

    target: list[float]
    drafter: list[float]
    target_safety: float = 1.0
    drafter_safety: float = 1.0


def gpu_peak(shape: Shape, seq_len: int, anchors: int, fitted: Fit, mode: str) -> float:
    rows, p = anchors * GPU_BLOCK, 2
    drafter = shape.drafter_params(GPU_DRAFT_LAYERS, GPU_RANK, 1)
    features = p * seq_len * 2 * shape.hidden
    step = fitted.drafter_safety * dot(fitted.drafter, drafter_terms(shape, seq_len, rows, p, GPU_DRAFT_LAYERS))
    step += 4 * drafter
    if mode == "online":
        static = 2 * shape.target_params() + 16 * drafter
        forward = fitted.target_safety * dot(fitted.target, target_terms(shape, seq_len, p))
        return static + max(forward, features + step) + OVERHEAD_BYTES
    heads = 2 * shape.vocab * shape.hidden * (1 if shape.tied else 2)
    return heads + 16 * drafter + features + step + OVERHEAD_BYTES


def max_anchors(shape: Shape, seq_len: int, gib: int, fitted: Fit, mode: str) -> int:
    budget, best = USABLE * gib * GIB, 0
    for anchors in range(16, 2049, 16):
        if gpu_peak(shape, seq_len, anchors, fitted, mode) <= budget:
            best = anchors
    return best


def tflops(shape: Shape, seq_len: int, anchors: int) -> tuple[float, float]:
    """(target forward, drafter train step) TFLOP per packed row."""
    rows = anchors * GPU_BLOCK
    target = 2 * shape.target_params() * seq_len + 2 * shape.layers * seq_len**2 * shape.heads * shape.head_dim
    layer = (
        shape.hidden * shape.head_dim * (2 * shape.heads + 2 * shape.kv_heads) + 3 * shape.hidden * shape.intermediate
    )
    drafter = 6 * GPU_DRAFT_LAYERS * (layer * rows + rows * seq_len * shape.heads * shape.head_dim)
    drafter += 6 * rows * shape.hidden * shape.vocab + 2 * seq_len * shape.hidden**2
    return target / 1e12, drafter / 1e12


# ------------------------------------------------------------------------------------------------------ main
def run_measurements(shapes, seq_lens, anchors_grid, device: str, dtype: torch.dtype) -> list[dict]:
    records = []
    for shape in shapes:
        with tempfile.TemporaryDirectory() as directory:
            module = build_module(shape, Path(directory), device, dtype, BLOCK, RANK)
            for seq_len in seq_lens:
                for anchors in anchors_grid:
                    result = measure(module, shape, seq_len, anchors, device)
                    record = {"device": device, "shape": shape.name, **asdict(shape), "seq_len": seq_len}
                    record |= {"anchors": anchors, "rows": anchors * BLOCK, **result}
                    records.append(record)
                    print({k: record[k] for k in ("shape", "seq_len", "anchors", "target_peak", "drafter_peak")})
    return records


def write_results(records, fitted: Fit, gpu_check) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / "memory_guidance.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]) + ["target_pred", "drafter_pred"])
        writer.writeheader()
        for r in records:
            writer.writerow(r | {"target_pred": round(r["target_pred"]), "drafter_pred": round(r["drafter_pred"])})
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    lines = [
        "# Memory / throughput guidance (anchors × sequence length per GPU size)",
        "",
        "Generated by `python -m benchmarks.memory.anchors_per_gpu`; method and formula in its docstring. "
        f"Measured on {platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}, fp32, 1 thread.",
        "",
        "## Fitted multipliers",
        "",
        "target forward: "
        + ", ".join(f"{n} = {v:.3g}" for n, v in zip(("k_hid", "k_mlp", "k_causal"), fitted.target))
        + f"; safety factor {fitted.target_safety:.2f}",
        "",
        "drafter step: "
        + ", ".join(f"{n} = {v:.3g}" for n, v in zip(("k_ctx", "k_blk", "k_voc", "k_chunk"), fitted.drafter))
        + f"; safety factor {fitted.drafter_safety:.2f}",
        "",
        "## Small-scale measurements (CPU) vs the fitted formula",
        "",
        "| shape | H | L | V | S | A | target MiB | predicted | drafter MiB | predicted | target s | drafter s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['shape']} | {r['hidden']} | {r['layers']} | {r['vocab']} | {r['seq_len']} | {r['anchors']} | "
            f"{mib(r['target_peak'])} | {mib(r['target_pred'])} | {mib(r['drafter_peak'])} | {mib(r['drafter_pred'])}"
            f" | {r['target_s']:.3f} | {r['drafter_s']:.3f} |"
        )
    worst = max(
        max(abs(r["target_pred"] / r["target_peak"] - 1), abs(r["drafter_pred"] / r["drafter_peak"] - 1))
        for r in records
    )
    lines += ["", f"Largest relative error of the formula on these points: {worst:.1%}.", ""]
    lines += [
        "## Largest anchors per packed row that fit (batch 1, B = 16, 1 draft layer, Markov rank 256, bf16-mixed)",
        "",
        f"Peak ≤ {USABLE:.0%} of the GPU; `online` = the target runs every step on the same GPU (DDP; FSDP divides the "
        "target weights by the number of GPUs), `cache` = features from `dspark-lightning cache` (only the embedding "
        "and LM head loaded). 0 = does not fit even with 16 anchors; 2048 = the table's cap.",
        "",
        "| target | GPU GiB | mode | " + " | ".join(f"S = {s}" for s in GPU_SEQ_LENS) + " |",
        "|---|---:|---|" + "---:|" * len(GPU_SEQ_LENS),
    ]
    for shape in GPU_TARGETS:
        for gib in GPU_SIZES_GIB:
            for mode in ("online", "cache"):
                cells = [str(max_anchors(shape, s, gib, fitted, mode)) for s in GPU_SEQ_LENS]
                lines.append(f"| {shape.name} | {gib} | {mode} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Compute per packed row (TFLOP) at A = 512, B = 16",
        "",
        "| target | S | target forward | drafter step | share of the step the cache removes |",
        "|---|---:|---:|---:|---:|",
    ]
    for shape in GPU_TARGETS:
        for s in GPU_SEQ_LENS:
            target, drafter = tflops(shape, s, 512)
            lines.append(f"| {shape.name} | {s} | {target:.1f} | {drafter:.1f} | {target / (target + drafter):.0%} |")
    lines += ["", "Step time ≈ FLOPs / (GPU bf16 peak × MFU), e.g. H100 989 TFLOP/s dense at 40% MFU ≈ 400 TFLOP/s."]
    if gpu_check:
        lines += [
            "",
            "## GPU check (Qwen3-0.6B shape, random weights)",
            "",
            "```",
            json.dumps(gpu_check, indent=1),
            "```",
        ]
    else:
        lines += ["", "No CUDA device was available for this run: the GPU check (Qwen3-0.6B shape) was skipped."]
    (RESULTS / "memory_guidance.md").write_text("\n".join(lines) + "\n")


def gpu_check(fitted: Fit) -> list[dict]:
    """Measured vs predicted online peak for a Qwen3-0.6B-shaped target on the local GPU (bf16)."""
    shape = GPU_TARGETS[0]
    out = []
    with tempfile.TemporaryDirectory() as directory:
        module = build_module(shape, Path(directory), "cuda", torch.bfloat16, GPU_BLOCK, GPU_RANK)
        for seq_len, anchors in ((2048, 128), (4096, 256), (8192, 512)):
            result = measure(module, shape, seq_len, anchors, "cuda")
            rows, p = anchors * GPU_BLOCK, 2
            drafter = shape.drafter_params(1, GPU_RANK, 1)
            predicted = fitted.drafter_safety * dot(fitted.drafter, drafter_terms(shape, seq_len, rows, p, 1))
            predicted += 4 * drafter
            out.append({"seq_len": seq_len, "anchors": anchors, "drafter_peak_gib": result["drafter_peak"] / GIB,
                        "drafter_predicted_gib": predicted / GIB, "target_peak_gib": result["target_peak"] / GIB,
                        "target_predicted_gib": fitted.target_safety * dot(fitted.target, target_terms(shape, seq_len, p)) / GIB,
                        "drafter_step_s": result["drafter_s"], "target_forward_s": result["target_s"]})  # fmt: skip
            print(out[-1])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one shape (smoke run)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = CPU_SHAPES[:1] if args.quick else CPU_SHAPES
    records = run_measurements(shapes, CPU_SEQ_LENS, CPU_ANCHORS, "cpu", torch.float32)
    shape_of = {s.name: s for s in CPU_SHAPES}
    t_rows = [target_terms(shape_of[r["shape"]], r["seq_len"], 4) for r in records]
    d_rows = [drafter_terms(shape_of[r["shape"]], r["seq_len"], r["rows"], 4, 1) for r in records]
    grads = [4 * shape_of[r["shape"]].drafter_params(1, RANK, 1) for r in records]
    fitted = Fit(fit(t_rows, [r["target_peak"] for r in records]),
                 fit(d_rows, [r["drafter_peak"] - g for r, g in zip(records, grads)]))  # fmt: skip
    for r, t, d, g in zip(records, t_rows, d_rows, grads):
        r["target_pred"], r["drafter_pred"] = dot(fitted.target, t), dot(fitted.drafter, d) + g
    fitted.target_safety = max(1.0, max(r["target_peak"] / r["target_pred"] for r in records))
    fitted.drafter_safety = max(1.0, max(r["drafter_peak"] / r["drafter_pred"] for r in records))
    check = gpu_check(fitted) if torch.cuda.is_available() else None
    write_results(records, fitted, check)
    print((RESULTS / "memory_guidance.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
