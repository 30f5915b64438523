"""Wall-clock speedup of greedy speculative decoding over the target's own greedy ``generate``, same process."""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import asdict

import torch

from dspark_lightning.decoding.eval_report import PromptDecodeRecord
from dspark_lightning.decoding.loop import speculative_generate
from dspark_lightning.decoding.stats import DecodeStats
from dspark_lightning.decoding.target_forwards import causal_lm


def _as_ids(prompt, device) -> torch.Tensor:
    ids = prompt if isinstance(prompt, torch.Tensor) else torch.tensor(prompt)
    ids = ids.to(device=device, dtype=torch.long)
    return ids[None] if ids.ndim == 1 else ids


@torch.no_grad()
def measure_speedup(
    target,
    drafter,
    prompts,
    max_new_tokens: int,
    *,
    mode: str = "markov",
    k: int = 16,
    confidence_threshold: float | None = None,
    cost_model: tuple[float, float] | None = None,
    eos_token_id: int | list[int] | None = None,
    drafter_cache: bool = True,
    packed_verify: bool = False,
    warmup: bool = True,
    device=None,
) -> dict:
    """Time greedy ``generate`` (the baseline) and greedy ``speculative_generate`` alternately, prompt by prompt.

    For each prompt the baseline runs first, then the speculative run, so load from other processes hits both
    alike; one untimed call of each on the first prompt warms them up. Both are timed around the whole call (prompt
    forward included). The outputs must be equal token for token (greedy speculative decoding is lossless); a
    mismatch is listed in ``mismatches`` and raised as a warning. ``packed_verify`` is passed to the speculative
    runs only: the baseline keeps the target's default kernels.

    Returns a dict: ``speedup`` = total baseline seconds / total speculative seconds, ``median_prompt_speedup``,
    tokens/s of both, tau, the speculative run's phase times (``phase_ms_per_step``, ``prefill_seconds``),
    ``accepted_rate_per_slot``, ``outputs_equal``, ``mismatches`` (prompt indices), the per-prompt seconds and
    ``prompt_records`` (each prompt's ``PromptDecodeRecord`` as a dict, the input of ``summarize_eval_set``; a
    prompt with no verify step has none) and ``stats`` (the merged ``DecodeStats`` of the speculative runs; drop it
    before writing JSON).
    """
    model = causal_lm(target)
    device = device if device is not None else next(model.parameters()).device
    if eos_token_id is None:
        eos_token_id = model.generation_config.eos_token_id
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    pad = eos[0] if eos else 0
    prompts = [_as_ids(p, device) for p in prompts]
    if not prompts:
        raise ValueError("measure_speedup needs at least one prompt")
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def baseline(ids):
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )

    def speculative(ids):
        return speculative_generate(
            target,
            drafter,
            ids,
            max_new_tokens,
            mode=mode,
            k=k,
            confidence_threshold=confidence_threshold,
            cost_model=cost_model,
            eos_token_id=eos,
            drafter_cache=drafter_cache,
            packed_verify=packed_verify,
        )

    def timed(fn, ids):
        sync()
        start = time.perf_counter()
        result = fn(ids)
        sync()
        return result, time.perf_counter() - start

    if warmup:
        baseline(prompts[0])
        speculative(prompts[0])
    baseline_seconds, speculative_seconds, runs, mismatches = [], [], [], []
    baseline_tokens = 0
    for index, ids in enumerate(prompts):
        reference, seconds = timed(baseline, ids)
        baseline_seconds.append(seconds)
        baseline_tokens += reference.shape[1] - ids.shape[1]
        (output, stats), seconds = timed(speculative, ids)
        speculative_seconds.append(seconds)
        runs.append(stats)
        if not torch.equal(output, reference):
            mismatches.append(index)
    if mismatches:
        warnings.warn(
            f"speculative output differs from the target's greedy generate on prompts {mismatches} "
            f"(mode {mode}): greedy speculative decoding must be lossless",
            stacklevel=2,
        )
    merged = DecodeStats.merge(runs)
    base_total, spec_total = sum(baseline_seconds), sum(speculative_seconds)
    return dict(
        mode=mode,
        k=k,
        confidence_threshold=confidence_threshold,
        cost_model=list(cost_model) if cost_model is not None else None,
        drafter_cache=drafter_cache,
        packed_verify=packed_verify,
        prompts=len(prompts),
        max_new_tokens=max_new_tokens,
        new_tokens=merged.new_tokens,
        baseline_new_tokens=baseline_tokens,
        baseline_seconds=base_total,
        speculative_seconds=spec_total,
        speedup=base_total / spec_total if spec_total > 0 else float("nan"),
        median_prompt_speedup=statistics.median(b / s for b, s in zip(baseline_seconds, speculative_seconds)),
        baseline_tokens_per_second=baseline_tokens / base_total if base_total > 0 else float("nan"),
        speculative_tokens_per_second=merged.new_tokens / spec_total if spec_total > 0 else float("nan"),
        tau=merged.tau,
        target_forwards=merged.target_forwards,
        mean_verified=merged.mean_verified,
        accepted_rate_per_slot=merged.accepted_rate_per_slot,
        phase_ms_per_step=merged.phase_ms_per_step(),
        prefill_seconds=merged.prefill_seconds,
        outputs_equal=not mismatches,
        mismatches=mismatches,
        baseline_prompt_seconds=baseline_seconds,
        speculative_prompt_seconds=speculative_seconds,
        prompt_records=[
            asdict(
                PromptDecodeRecord.from_stats(
                    run, baseline_seconds=b, speculative_seconds=s, outputs_equal=i not in mismatches
                )
            )
            for i, (run, b, s) in enumerate(zip(runs, baseline_seconds, speculative_seconds))
            if run.target_forwards > 0
        ],
        stats=merged,
    )
