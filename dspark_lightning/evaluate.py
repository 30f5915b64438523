"""Post-training tools over a Lightning checkpoint: ``decode`` (measured speculative decoding) and ``calibrate``.

    dspark-lightning decode --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt [--modes parallel markov selector]
                            [--temperature 0.7] [--thresholds 0.3 0.6] [--num_prompts 16] [--max_new_tokens 64]
    dspark-lightning calibrate --ckpt_path ... [--output calibrated.ckpt]

Both rebuild the model (``DSparkModule.load_from_checkpoint`` with ``weights_only=True``: our checkpoints hold only
tensors and plain hyper-parameters; the frozen target is re-loaded from its recorded path) and the data module from
the hyper-parameters stored in the same checkpoint, so a run directory is all they need.

``decode`` prints one row per (mode, threshold): tau = tokens per target forward, tokens/s, mean verified length and
the accepted rate per slot, over the data module's fixed eval prompts. ``calibrate`` fits per-slot confidence
temperatures with sequential temperature scaling on validation blocks, reports the prefix-survival ECE before and
after, and writes a checkpoint whose drafter carries the temperatures (``confidence_temperature``), which
``speculative_generate`` uses for confidence scheduling.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from dspark_lightning.checks import dumps_json


def load_trained(ckpt_path: str, map_location: str = "cpu", **data_overrides):
    """(DSparkModule in eval mode, ShareGPTDataModule) rebuilt from a checkpoint written by ``fit``."""
    from dspark_lightning.checks import check_finite_state, read_checkpoint
    from dspark_lightning.data.datamodule import ShareGPTDataModule
    from dspark_lightning.lightning.module import DSparkModule

    checkpoint = read_checkpoint(ckpt_path)  # a clear error for a missing or non-checkpoint file
    check_finite_state(checkpoint["state_dict"], f"--ckpt_path {ckpt_path}")
    with warnings.catch_warnings():  # the target's weights are absent on purpose: they come from model.target
        warnings.filterwarnings(
            "ignore", message="Found keys that are in the model state dict but not in the checkpoint"
        )
        module = DSparkModule.load_from_checkpoint(ckpt_path, map_location=map_location, weights_only=True)
    module.eval()
    data_kwargs = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    data_kwargs.pop("_instantiator", None)
    data_kwargs.setdefault("tokenizer", module.hparams.target)
    data_kwargs.update({k: v for k, v in data_overrides.items() if v is not None})
    return module, ShareGPTDataModule(**data_kwargs)


def decode_table(module, prompts: list[list[int]], modes, temperature, thresholds, max_new_tokens, k, seed=0):
    """Run speculative generation over ``prompts`` for each mode x threshold; one summary dict per row."""
    from dspark_lightning.decoding import speculative_generate

    rows = []
    for mode in modes:
        for threshold in thresholds:
            generator = torch.Generator().manual_seed(seed)
            emitted = forwards = new_tokens = 0
            seconds = 0.0
            verified: list[int] = []
            accepted: list[int] = []
            for prompt in prompts:
                _, stats = speculative_generate(
                    module.target,
                    module.drafter,
                    torch.tensor([prompt]),
                    max_new_tokens,
                    mode=mode,
                    k=k,
                    temperature=temperature,
                    confidence_threshold=None if isinstance(threshold, tuple) else threshold,
                    cost_model=threshold[1:] if isinstance(threshold, tuple) else None,
                    generator=generator,
                )
                emitted += sum(stats.emitted_per_step)
                forwards += stats.target_forwards
                new_tokens += stats.new_tokens
                seconds += stats.draft_seconds + stats.verify_seconds + stats.prefill_seconds
                verified += stats.verified_per_step
                accepted += stats.accepted_per_step
            per_slot = []
            for slot in range(max(verified, default=0)):
                tried = [a for v, a in zip(verified, accepted) if v > slot and a >= slot]
                per_slot.append(sum(a > slot for a in tried) / len(tried) if tried else math.nan)
            rows.append(
                dict(
                    mode=mode,
                    threshold=threshold,
                    tau=emitted / max(1, forwards),
                    tokens_per_second=new_tokens / seconds if seconds else math.nan,
                    mean_verified=sum(verified) / max(1, len(verified)),
                    accepted_rate_per_slot=per_slot,
                )
            )
    return rows


def _schedule_label(schedule) -> str:
    if schedule is None:
        return "-"
    if isinstance(schedule, (tuple, list)):
        return "cost model"
    return f"{schedule:.2f}"


def print_decode_table(rows, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("mode", "threshold", "tau", "tokens/s", "verified", "accepted rate per slot"):
        table.add_column(column, justify="right" if column not in ("mode", "accepted rate per slot") else "left")
    for row in rows:
        table.add_row(
            row["mode"],
            _schedule_label(row["threshold"]),
            f"{row['tau']:.3f}",
            f"{row['tokens_per_second']:.1f}",
            f"{row['mean_verified']:.2f}",
            " ".join("-" if math.isnan(v) else f"{v:.2f}" for v in row["accepted_rate_per_slot"]),
        )
    Console().print(table)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"a confidence threshold must be a number in [0, 1], got {text!r}")
    return value


def _temperature(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def decode_main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="dspark-lightning decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="checkpoint written by `dspark-lightning fit`")
    parser.add_argument("--modes", nargs="+", default=["parallel", "markov", "selector"], help="draft modes to run")
    parser.add_argument("--k", type=_positive_int, default=16, help="Selector candidates per slot")
    parser.add_argument(
        "--temperature", type=_temperature, default=0.0, help="0 = greedy; > 0 = lossless rejection sampling"
    )
    parser.add_argument(
        "--thresholds", nargs="*", type=_probability, default=[], help="confidence thresholds in [0, 1]"
    )
    parser.add_argument(
        "--cost_model",
        action="store_true",
        help="also schedule by the cost model: verify the n maximising (1 + sum a_j) / T(n), T measured on the target",
    )
    parser.add_argument("--num_prompts", type=_positive_int, default=8, help="eval prompts from the validation data")
    parser.add_argument("--max_new_tokens", type=_positive_int, default=64, help="at least 1 (one verify step)")
    parser.add_argument("--val_files", default=None, help="override the checkpoint's validation files")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    module, data = load_trained(args.ckpt_path, val_files=args.val_files, num_eval_prompts=args.num_prompts)
    head = module.drafter.markov_head
    modes = [
        m
        for m in args.modes
        if m == "parallel" or (head is not None and (m != "selector" or not head.is_path_dependent))
    ]
    skipped = sorted(set(args.modes) - set(modes))
    if skipped:
        print(f"skipping modes {skipped}: the drafter's Markov head does not support them")
    prompts = data.eval_prompts()[: args.num_prompts]
    if not prompts:
        raise ValueError("no eval prompt: the validation data has no valid conversation with a user prompt")
    schedules = [None, *args.thresholds]
    if args.cost_model:
        from dspark_lightning.decoding import measure_verify_cost

        cost = measure_verify_cost(module.target, max_block=module.hparams.block_size)
        print(f"measured verify cost T(n) = {cost[0] * 1e3:.2f} ms + {cost[1] * 1e3:.3f} ms * n")
        schedules.append(("cost", *cost))
    rows = decode_table(module, prompts, modes, args.temperature, schedules, args.max_new_tokens, args.k)
    print_decode_table(rows, f"speculative decoding, {len(prompts)} prompts, temperature {args.temperature}")
    if args.json:
        Path(args.json).write_text(dumps_json(rows, indent=2))
    return rows


@torch.no_grad()
def collect_confidence_blocks(module, dataloader, max_batches: int):
    """Confidence logits, acceptance and validity [Nb, B'] over validation batches (evaluation anchors)."""
    logits, alphas, valids = [], [], []
    for index, batch in enumerate(dataloader):
        if index >= max_batches:
            break
        _, _, alpha, _, valid, _, out = module.shared_step(batch, anchors=module.evaluation_anchors(batch))
        first = module.drafter_config.first_trained_slot
        logits.append(out.confidence_logits.flatten(0, 1)[:, first:].float())
        alphas.append(alpha.float())
        valids.append(valid)
    if not logits:
        raise ValueError("the validation data yielded no batch to calibrate on")
    return torch.cat(logits), torch.cat(alphas), torch.cat(valids)


def calibrate_main(argv: Sequence[str] | None = None) -> dict:
    from dspark_lightning.calibration import fit_sequential_temperatures
    from dspark_lightning.checks import check_finite_state, read_checkpoint

    parser = argparse.ArgumentParser(prog="dspark-lightning calibrate", description="sequential temperature scaling")
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--output", default=None, help="calibrated checkpoint (default: <ckpt>.calibrated.ckpt)")
    parser.add_argument(
        "--max_batches", type=_positive_int, default=32, help="validation batches used for fitting (at least 1)"
    )
    args = parser.parse_args(argv)

    module, data = load_trained(args.ckpt_path)
    if module.drafter.confidence_head is None:
        raise SystemExit("this drafter has no confidence head: nothing to calibrate")
    data.setup("validate")
    logits, alpha, valid = collect_confidence_blocks(module, data.val_dataloader(), args.max_batches)
    if not bool(valid.any()):
        raise ValueError("no valid validation block to calibrate on: check val_files / --max_batches")
    temperatures, ece = fit_sequential_temperatures(logits, alpha, valid)
    first = module.drafter_config.first_trained_slot
    module.drafter.confidence_temperature[first:] = temperatures
    check_finite_state({"confidence_temperature": module.drafter.confidence_temperature}, "calibrate")
    checkpoint = read_checkpoint(args.ckpt_path)
    checkpoint["state_dict"]["drafter.confidence_temperature"] = module.drafter.confidence_temperature.clone()
    output = args.output or str(Path(args.ckpt_path).with_suffix(".calibrated.ckpt"))
    torch.save(checkpoint, output)
    result = {"temperatures": temperatures.tolist(), **ece, "blocks": int(logits.shape[0]), "output": output}
    print(dumps_json(result, indent=2))  # strict JSON: an undefined ECE is null, never NaN
    return result
