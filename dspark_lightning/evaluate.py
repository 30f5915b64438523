"""Post-training tools over a Lightning checkpoint: ``decode`` (measured speculative decoding) and ``calibrate``.

    dspark-lightning decode --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt
        [--modes '[parallel,markov,selector]'] [--temperature 0.7] [--thresholds '[0.3,0.6]'] [--num_prompts 16]
        [--max_new_tokens 64]
    dspark-lightning calibrate --ckpt_path ... [--output calibrated.ckpt]

Both rebuild the model (``lightning.checkpoint.load_checkpoint_module``, read with ``weights_only=True``: our
checkpoints hold only tensors and plain hyper-parameters; the frozen target is re-loaded from its recorded path) and
the data module from the hyper-parameters stored in the same checkpoint, so a run directory is all they need.

``decode`` prints one row per (mode, threshold): tau = tokens per target forward, tokens/s, mean verified length and
the accepted rate per slot, over the data module's fixed eval prompts. ``calibrate`` fits per-slot confidence
temperatures with sequential temperature scaling on validation blocks, reports the prefix-survival ECE before and
after, and writes a checkpoint whose drafter carries the temperatures (``confidence_temperature``), which
``speculative_generate`` uses for confidence scheduling.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import ClosedUnitInterval, PositiveInt, restricted_number_type

from dspark_lightning.checks import check_finite_state, dumps_json, read_checkpoint
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.data.prompts import prompt_messages
from dspark_lightning.decoding import (
    DecodeStats,
    best_verify_length,
    measure_speedup,
    speculative_generate,
    supported_modes,
)
from dspark_lightning.decoding.gap import gap_decomposition, gap_markdown
from dspark_lightning.decoding.identity import check_identity as replay_decode  # the option is check_identity
from dspark_lightning.lightning.checkpoint import load_checkpoint_module
from dspark_lightning.lightning.step import evaluation_steps


def load_trained(ckpt_path: str, map_location: str = "cpu", **data_overrides):
    """(DSparkModule in eval mode, ShareGPTDataModule) rebuilt from a checkpoint written by ``fit``."""
    checkpoint = read_checkpoint(ckpt_path)  # a clear error for a missing or non-checkpoint file
    # decoding needs the whole target, also for a drafter trained from an offline feature cache
    module = load_checkpoint_module(
        ckpt_path, checkpoint=checkpoint, where=f"--ckpt_path {ckpt_path}", features="online"
    ).to(map_location)
    data_kwargs = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    data_kwargs.pop("_instantiator", None)
    data_kwargs.setdefault("tokenizer", module.target_args.path)
    data_kwargs.update({k: v for k, v in data_overrides.items() if v is not None})
    return module, ShareGPTDataModule(**data_kwargs)


def decode_table(
    module,
    prompts: list[list[int]],
    modes,
    temperature,
    thresholds,
    max_new_tokens,
    k,
    seed=0,
    baseline=False,
    packed_verify=False,
):
    """Run speculative generation over ``prompts`` for each mode x threshold; one summary dict per row.

    With ``baseline`` (greedy only) every row is measured by ``measure_speedup``: the target's own ``generate``
    timed alternately with the speculative run, prompt by prompt, and the outputs checked equal.
    """
    rows = []
    for mode in modes:
        for threshold in thresholds:
            schedule = dict(
                confidence_threshold=None if isinstance(threshold, tuple) else threshold,
                cost_model=threshold[1:] if isinstance(threshold, tuple) else None,
                packed_verify=packed_verify,
            )
            extra = {}
            if baseline and temperature == 0:
                result = measure_speedup(
                    module.target, module.drafter, prompts, max_new_tokens, mode=mode, k=k, **schedule
                )
                stats = result.pop("stats")
                extra = {
                    key: result[key]
                    for key in (
                        "speedup",
                        "median_prompt_speedup",
                        "baseline_tokens_per_second",
                        "outputs_equal",
                        "mismatches",
                    )
                }
            else:
                generator = torch.Generator().manual_seed(seed)
                runs = []
                for prompt in prompts:
                    _, run = speculative_generate(
                        module.target,
                        module.drafter,
                        torch.tensor([prompt]),
                        max_new_tokens,
                        mode=mode,
                        k=k,
                        temperature=temperature,
                        generator=generator,
                        **schedule,
                    )
                    runs.append(run)
                stats = DecodeStats.merge(runs)
            rows.append(
                dict(
                    mode=mode,
                    threshold=threshold,
                    tau=stats.tau,
                    tokens_per_second=result["speculative_tokens_per_second"] if extra else stats.tokens_per_second,
                    mean_verified=stats.mean_verified,
                    accepted_rate_per_slot=stats.accepted_rate_per_slot,
                    phase_ms_per_step=stats.phase_ms_per_step(),
                    **extra,
                )
            )
    return rows


def verify_length_table(rows, cost_model: tuple[float, float]) -> list[dict]:
    """For each mode's whole-block row: the verify length that maximises predicted tokens/s (``best_verify_length``)
    from its measured per-slot acceptance and drafter cost per step, under T(n) = t0 + t1 * n."""
    table = []
    for row in rows:
        if row["threshold"] is not None or not row["accepted_rate_per_slot"]:
            continue
        phases = row["phase_ms_per_step"]
        overhead = (phases["draft_backbone"] + phases["draft_head"] + phases["bookkeeping"]) / 1e3
        best = best_verify_length(row["accepted_rate_per_slot"], overhead, cost_model)
        row["verify_length"] = best
        table.append(dict(mode=row["mode"], overhead_ms=overhead * 1e3, **best))
    return table


def print_verify_length_table(table, cost_model) -> None:
    from rich.console import Console
    from rich.table import Table

    t0, t1 = cost_model
    title = f"predicted tokens/s per verify length n (T(n) = {t0 * 1e3:.2f} + {t1 * 1e3:.3f} n ms)"
    out = Table(title=title)
    for column in ("mode", "draft+bookkeeping ms/step", "best n", "tokens/step at best n", "tokens/s by n"):
        out.add_column(column, justify="left" if column in ("mode", "tokens/s by n") else "right")
    for row in table:
        n = row["best_n"]
        out.add_row(
            row["mode"],
            f"{row['overhead_ms']:.2f}",
            str(n),
            f"{row['expected_tokens'][n - 1]:.2f}",
            " ".join(f"{v:.0f}" for v in row["tokens_per_second"]),
        )
    Console().print(out)


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
    with_baseline = any("speedup" in row for row in rows)
    columns = ["mode", "threshold", "tau", "tokens/s"]
    columns += ["generate tokens/s", "speedup", "= generate"] if with_baseline else []
    columns += ["verified", "accepted rate per slot"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("mode", "accepted rate per slot") else "right")
    phases = Table(title="where the time goes: ms per step")
    for column in ("mode", "threshold", "draft backbone", "draft head", "verify", "bookkeeping"):
        phases.add_column(column, justify="left" if column == "mode" else "right")
    mismatched = []
    for row in rows:
        label = _schedule_label(row["threshold"])
        cells = [row["mode"], label, f"{row['tau']:.3f}", f"{row['tokens_per_second']:.1f}"]
        if with_baseline:
            equal = row.get("outputs_equal", True)
            cells += [f"{row['baseline_tokens_per_second']:.1f}", f"{row['speedup']:.2f}x"]
            cells.append("yes" if equal else "[bold red]NO[/]")
            if not equal:
                mismatched.append(row)
        cells += [
            f"{row['mean_verified']:.2f}",
            " ".join("-" if math.isnan(v) else f"{v:.2f}" for v in row["accepted_rate_per_slot"]),
        ]
        table.add_row(*cells)
        ms = row["phase_ms_per_step"]
        phases.add_row(
            row["mode"], label, *(f"{ms[p]:.2f}" for p in ("draft_backbone", "draft_head", "verify", "bookkeeping"))
        )
    console = Console()
    console.print(table)
    console.print(phases)
    for row in mismatched:
        console.print(
            f"[bold red]MISMATCH: {row['mode']} / {_schedule_label(row['threshold'])} differs from the target's greedy "
            f"generate on prompts {row['mismatches']}: greedy speculative decoding must be lossless[/]"
        )


# jsonargparse checks these at parse time, naming the option and the restriction (nan fails every comparison)
Temperature = restricted_number_type("FiniteNonNegativeFloat", float, [(">=", 0), ("<", math.inf)])
Mode = Literal["parallel", "markov", "selector"]


def decode_command(
    ckpt_path: str,
    modes: list[Mode] = ["parallel", "markov", "selector"],  # noqa: B006 (read only; jsonargparse shows it)
    k: PositiveInt = 16,
    temperature: Temperature = 0.0,
    thresholds: list[ClosedUnitInterval] = [],  # noqa: B006
    cost_model: bool = False,
    baseline: bool = True,
    packed_verify: bool = False,
    num_prompts: PositiveInt = 8,
    max_new_tokens: PositiveInt = 64,
    val_files: str | None = None,
    json: str | None = None,
    check_identity: bool = False,
    gap_table: str | None = None,
) -> list[dict]:
    """Measured speculative decoding of a checkpoint on the eval prompts (a table per mode and threshold).

    Args:
        ckpt_path: checkpoint written by `dspark-lightning fit`
        modes: draft modes to run (a mode the Markov head does not support is skipped)
        k: Selector candidates per slot
        temperature: 0 = greedy; > 0 = lossless rejection sampling
        thresholds: confidence thresholds in [0, 1], each one more row per mode
        cost_model: also schedule by the cost model: verify the n maximising (1 + sum a_j) / T(n), T measured on
            the target
        baseline: greedy only: time the target's own generate alternately with each run, report speedup, check
            outputs
        packed_verify: run the verify forwards on oneDNN-packed weights (float32 CPU targets; faster at a few
            rows, one more copy of the decoder weights; the baseline keeps the default kernels)
        num_prompts: eval prompts from the validation data
        max_new_tokens: tokens generated per prompt (at least 1: one verify step)
        val_files: override the checkpoint's validation files
        json: also write the rows to this JSON file
        check_identity: replay each greedy decode through the training forward (same anchors, own previous tokens):
            blocks and tau must agree on every prompt, else exit non-zero; with gap_table also write the gap table
        gap_table: with check_identity: write the train/serve gap decomposition (markdown) to this file
    """
    module, data = load_trained(ckpt_path, val_files=val_files, num_eval_prompts=num_prompts)
    head = module.drafter.markov_head
    runnable = [m for m in modes if m in supported_modes(head)]
    skipped = sorted(set(modes) - set(runnable))
    if skipped:
        print(f"skipping modes {skipped}: the drafter's Markov head does not support them")
    prompts = data.eval_prompts()[:num_prompts]
    if not prompts:
        raise ValueError("no eval prompt: the validation data has no valid conversation with a user prompt")
    if check_identity:
        return identity_main(module, data, prompts, runnable, max_new_tokens, k, gap_table)
    schedules = [None, *thresholds]
    if cost_model:
        from dspark_lightning.decoding import measure_verify_cost

        cost = measure_verify_cost(
            module.target, max_block=module.drafter_config.block_size, packed_verify=packed_verify
        )
        print(f"measured verify cost T(n) = {cost[0] * 1e3:.2f} ms + {cost[1] * 1e3:.3f} ms * n")
        schedules.append(("cost", *cost))
    if baseline and temperature > 0:
        print("--baseline compares greedy outputs: skipped at temperature > 0")
    rows = decode_table(
        module, prompts, runnable, temperature, schedules, max_new_tokens, k, baseline=baseline,
        packed_verify=packed_verify,
    )  # fmt: skip
    print_decode_table(rows, f"speculative decoding, {len(prompts)} prompts, temperature {temperature}")
    if cost_model:
        print_verify_length_table(verify_length_table(rows, cost), cost)
    if json:
        Path(json).write_text(dumps_json(rows, indent=2))
    return rows


def identity_main(module, data, prompts, modes, max_new_tokens: int, k: int, gap_table: str | None) -> list[dict]:
    """``decode --check_identity``: per prompt and mode, training-forward replay vs greedy decode; raises on any
    disagreement. With ``gap_table``: the (a)-(d) gap decomposition (``decoding.gap``) as a markdown file."""
    rows = []
    for index, prompt in enumerate(prompts):
        for mode in modes:
            result = replay_decode(module.target, module.drafter, prompt, max_new_tokens, mode, k)
            rows.append(dict(prompt=index, **vars(result), ok=result.ok))
            print(
                f"prompt {index} {mode}: {result.steps} blocks {'equal' if result.blocks_equal else 'DIFFER'}, "
                f"measured tau {result.measured_tau:.4f}, replayed {result.teacher_forced_tau:.4f}, "
                f"training metric {result.metric_greedy_tau:.4f}"
            )
    if gap_table:
        references = []
        for conversation in data.eval_conversations()[: len(prompts)]:
            first_reply = len(prompt_messages(conversation))  # the prompt, then the first assistant turn
            encoded = data.encoder.encode(conversation.messages[: first_reply + 1])
            references.append((encoded.input_ids, encoded.loss_mask))
        # every reply position is an anchor (stride 1): the per-position mean with the least noise
        table = gap_markdown(gap_decomposition(module.target, module.drafter, prompts, references, max_new_tokens, k=k))
        Path(gap_table).parent.mkdir(parents=True, exist_ok=True)
        Path(gap_table).write_text(table)
        print(table)
    bad = [row for row in rows if not row["ok"]]
    if bad:
        raise SystemExit(f"train/serve identity broken on {len(bad)} of {len(rows)} (prompt, mode) pairs: {bad[:3]}")
    return rows


@torch.no_grad()
def collect_confidence_blocks(module, dataloader, max_batches: int):
    """Confidence logits, acceptance and validity [Nb, B'] over validation batches (evaluation anchors)."""
    logits, alphas, valids = [], [], []
    for step in evaluation_steps(module, dataloader, max_batches):
        logits.append(step.trained_slots(step.drafter_output.confidence_logits).float())
        alphas.append(step.alpha.float())
        valids.append(step.valid)
    if not logits:
        raise ValueError("the validation data yielded no batch to calibrate on")
    return torch.cat(logits), torch.cat(alphas), torch.cat(valids)


def calibrate_command(ckpt_path: str, output: str | None = None, max_batches: PositiveInt = 32) -> dict:
    """Fit per-slot confidence temperatures (sequential temperature scaling) and write a calibrated checkpoint.

    Args:
        ckpt_path: checkpoint written by `dspark-lightning fit`
        output: calibrated checkpoint (default: <ckpt>.calibrated.ckpt)
        max_batches: validation batches used for fitting (at least 1)
    """
    from dspark_lightning.calibration import fit_sequential_temperatures
    from dspark_lightning.checks import read_checkpoint

    module, data = load_trained(ckpt_path)
    if module.drafter.confidence_head is None:
        raise SystemExit("this drafter has no confidence head: nothing to calibrate")
    data.setup("validate")
    logits, alpha, valid = collect_confidence_blocks(module, data.val_dataloader(), max_batches)
    if not bool(valid.any()):
        raise ValueError("no valid validation block to calibrate on: check val_files / --max_batches")
    temperatures, ece = fit_sequential_temperatures(logits, alpha, valid)
    first = module.drafter_config.first_trained_slot
    module.drafter.confidence_temperature[first:] = temperatures
    check_finite_state({"confidence_temperature": module.drafter.confidence_temperature}, "calibrate")
    checkpoint = read_checkpoint(ckpt_path)
    checkpoint["state_dict"]["drafter.confidence_temperature"] = module.drafter.confidence_temperature.clone()
    output = output or str(Path(ckpt_path).with_suffix(".calibrated.ckpt"))
    torch.save(checkpoint, output)
    result = {"temperatures": temperatures.tolist(), **ece, "blocks": int(logits.shape[0]), "output": output}
    print(dumps_json(result, indent=2))  # strict JSON: an undefined ECE is null, never NaN
    return result
