"""Wall-clock speedup of speculative decoding over the target's own ``generate`` (greedy, or sampled at the same
temperature), same process."""

from __future__ import annotations

import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dspark_lightning.decoding.kernels import PackedLinears
from dspark_lightning.decoding.loop import speculative_generate
from dspark_lightning.decoding.stats import DecodeStats, PromptDecodeRecord
from dspark_lightning.decoding.target_forwards import causal_lm
from dspark_lightning.measuring.results import GenerateComparison, PackedBaseline, SpeedupResult, Spread
from dspark_lightning.measuring.ties import TIE_ULPS, classify_difference
from dspark_lightning.measuring.turns import Conversation, decode_turns, first_turn_ids, reply_ids

# the baseline's per-prompt tokens/s varies across prompts by little on a quiet machine (same target, similar
# lengths); an interquartile range above this fraction of the median means other load moved the clock
NOISE_LIMIT = 0.25


def _as_ids(prompt, device) -> torch.Tensor:
    ids = prompt if isinstance(prompt, torch.Tensor) else torch.tensor(prompt)
    ids = ids.to(device=device, dtype=torch.long)
    return ids[None] if ids.ndim == 1 else ids


@dataclass
class _Turn:
    """What one turn of one prompt measured (a one-turn prompt has one)."""

    baseline_seconds: float
    baseline_tokens: int
    speculative_seconds: float = 0.0
    stats: DecodeStats | None = None
    packed_seconds: float = 0.0
    packed_equal: bool = True
    difference: dict | None = None  # how the speculative output differed from generate's (classify_difference)


def quartiles(values) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), interpolating linearly between order statistics (numpy's default
    percentile); one value is all three."""
    values = [float(v) for v in values]
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def load_average() -> list[float] | None:
    """``os.getloadavg()`` (1, 5 and 15 minutes), None where the platform has none."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def spread(prompt_baseline_tokens, baseline_seconds, speculative_seconds) -> Spread:
    """The noise of one measurement, from its per-prompt numbers: the interquartile range (IQR) of the per-prompt
    speedups and of the baseline's per-prompt tokens/s, and ``noisy`` when the latter's IQR exceeds ``NOISE_LIMIT``
    of its median (the baseline is the same target on every prompt, so its rate should barely move)."""
    speedups = [b / s if s > 0 else float("nan") for b, s in zip(baseline_seconds, speculative_seconds)]
    rates = [n / s if s > 0 else float("nan") for n, s in zip(prompt_baseline_tokens, baseline_seconds)]
    s1, _, s3 = quartiles(speedups)
    r1, rate_median, r3 = quartiles(rates)
    relative = (r3 - r1) / rate_median if rate_median > 0 else float("nan")
    return Spread(
        prompt_speedups=speedups,
        prompt_speedup_iqr=s3 - s1,
        baseline_prompt_tokens_per_second=rates,
        baseline_tokens_per_second_median=rate_median,
        baseline_tokens_per_second_iqr=r3 - r1,
        baseline_relative_spread=relative,
        noisy=not relative <= NOISE_LIMIT,  # NaN (no time measured) is not to be trusted either
        load_average=load_average(),
        torch_threads=torch.get_num_threads(),  # the target and the baseline ran on as many threads
    )


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
    on_prompt: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    temperature: float = 0.0,
    seed: int = 0,
) -> SpeedupResult:
    """Time ``generate`` (the baseline) and ``speculative_generate`` alternately, prompt by prompt.

    For each prompt the baseline runs first, then the speculative run, so load from other processes hits both
    alike; one untimed call of each on the first prompt warms them up. Both are timed around the whole call (prompt
    forward included). The outputs must be equal token for token (greedy speculative decoding is lossless) up to a
    float tie at the first differing token (``measuring.ties``): a tie is listed in ``ties``, any other difference
    in ``mismatches`` and raised as a warning; ``differences`` holds each one's position, logit gap and tolerance.
    ``packed_verify`` is passed to the speculative runs, and adds a second baseline: ``generate`` on the same
    packed kernels (every linear of the target, head included), timed between the two, so that what speculation gains is told apart from what the kernels gain (on
    2 CPU threads the packed kernels make ``generate`` itself ~10% faster). ``on_prompt()`` is called after each
    prompt's timed runs (a progress bar); ``clock`` is the timer (seconds). A prompt is token ids or a
    ``Conversation`` (``measuring.turns``): each of its turns is timed the same way, the next turn following the
    target's own (``generate``) reply, and the prompt's record pools its turns.

    ``temperature`` > 0: both sample at that temperature from the target's whole distribution (``generate`` with
    no top-k or top-p; the speculative run is lossless rejection sampling, seeded with ``seed``, ``generate`` with
    the global generator seeded the same way inside a forked RNG state). Two samples are two different replies, so
    outputs are not compared (``outputs_equal`` None) and each prompt's baseline seconds are its ``generate``
    seconds per new token times the speculative run's new tokens (``baseline_prompt_seconds`` keeps the raw ones):
    the speedup is a ratio of seconds per token, which at T = 0 (equal outputs) is the plain ratio of seconds.

    Returns a ``SpeedupResult`` (``measuring.results``; its fields are documented there): the speculative runs'
    numbers, their ``comparison`` with ``generate`` (speedup, equality, the ``Spread`` and, with ``packed_verify``,
    the ``PackedBaseline``) and each prompt's record. A noisy measurement is also a warning naming the load.
    """
    model = causal_lm(target)
    device = device if device is not None else next(model.parameters()).device
    if eos_token_id is None:
        eos_token_id = model.generation_config.eos_token_id
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    pad = eos[0] if eos else 0
    if not prompts:
        raise ValueError("measure_speedup needs at least one prompt")
    prompts = [p if isinstance(p, Conversation) else _as_ids(p, "cpu")[0].tolist() for p in prompts]
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    sampled = temperature > 0
    if sampled and packed_verify:
        raise ValueError("packed_verify times a second greedy baseline: use it at temperature 0")
    # the full distribution at `temperature`, as lossless speculative sampling draws from (no top-k / top-p warper)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sampled else dict(do_sample=False)
    generator = torch.Generator(device=device).manual_seed(seed) if sampled else None

    def baseline(ids):
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            eos_token_id=eos,
            pad_token_id=pad,
            **sampling,
        )

    # the target's linears on the kernels the verify forwards use (same batch hint: the packed weights are shared)
    packed_kernels = PackedLinears(model, drafter.block_size + 1) if packed_verify else None

    def packed_baseline(ids):
        with packed_kernels:
            return baseline(ids)

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
            temperature=temperature,
            generator=generator,
        )

    def timed(fn, ids):
        sync()
        start = clock()
        result = fn(ids)
        sync()
        return result, clock() - start

    def timed_turn(token_ids) -> tuple[_Turn, list[int]]:
        """One turn: baseline, packed baseline, speculative; the next turn follows the target's own reply."""
        ids = _as_ids(token_ids, device)
        reference, baseline_time = timed(baseline, ids)
        turn = _Turn(baseline_time, reference.shape[1] - ids.shape[1])
        if packed_kernels is not None:
            packed_output, turn.packed_seconds = timed(packed_baseline, ids)
            turn.packed_equal = torch.equal(packed_output, reference)  # unequal: a near-tie (~1e-5) the other way
        (output, turn.stats), turn.speculative_seconds = timed(speculative, ids)
        if not sampled and not torch.equal(output, reference):  # a float tie at the first difference, or a bug
            turn.difference = classify_difference(model, reference, output, ids.shape[1])
        return turn, reply_ids(reference, ids.shape[1])

    baseline_seconds, speculative_seconds, runs, mismatches, ties, differences = [], [], [], [], [], []
    packed_seconds, packed_mismatches = [], []
    prompt_baseline_tokens, prompt_speculative_tokens = [], []
    # generate samples from the global generator: seeded here, the caller's state restored afterwards
    with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
        torch.manual_seed(seed)
        if warmup:
            first = _as_ids(first_turn_ids(prompts[0]), device)
            baseline(first)
            if packed_kernels is not None:
                packed_baseline(first)
            speculative(first)
        for index, prompt in enumerate(prompts):
            turns = decode_turns(prompt, timed_turn)  # a multi-turn prompt is one question: its turns pooled
            baseline_seconds.append(sum(turn.baseline_seconds for turn in turns))
            prompt_baseline_tokens.append(sum(turn.baseline_tokens for turn in turns))
            prompt_speculative_tokens.append(sum(turn.stats.new_tokens for turn in turns))
            if packed_kernels is not None:
                packed_seconds.append(sum(turn.packed_seconds for turn in turns))
                if not all(turn.packed_equal for turn in turns):
                    packed_mismatches.append(index)
            speculative_seconds.append(sum(turn.speculative_seconds for turn in turns))
            runs.append(DecodeStats.merge([turn.stats for turn in turns]))
            kinds = set()
            for number, turn in enumerate(turns):
                if turn.difference is not None:
                    kinds.add(turn.difference["kind"])
                    differences.append(
                        {"prompt": index, **({"turn": number} if len(turns) > 1 else {}), **turn.difference}
                    )
            if kinds - {"tie"}:
                mismatches.append(index)
            elif kinds:
                ties.append(index)
            if on_prompt is not None:
                on_prompt()
    if mismatches:
        warnings.warn(
            f"speculative output differs from the target's greedy generate on prompts {mismatches} "
            f"(mode {mode}), not by a float tie: greedy speculative decoding must be lossless",
            stacklevel=2,
        )
    if ties:
        print(
            f"greedy outputs differ from generate by a float tie on prompts {ties} (mode {mode}): the target's top "
            f"two logits within {TIE_ULPS} ulps of {next(model.parameters()).dtype} at the first differing token"
        )
    if packed_mismatches:
        warnings.warn(
            f"generate on packed kernels differs from generate on the default ones on prompts {packed_mismatches}: "
            "two logits tied within the kernels' rounding (~1e-5); its times still count as the packed baseline",
            stacklevel=2,
        )
    # what generate would take for the speculative run's tokens (the same count at T = 0, outputs being equal)
    per_token_baseline = [
        b * n_spec / n_base if sampled and n_base > 0 else b
        for b, n_base, n_spec in zip(baseline_seconds, prompt_baseline_tokens, prompt_speculative_tokens)
    ]
    noise = spread(prompt_baseline_tokens, baseline_seconds, speculative_seconds)
    if noise.noisy:
        warnings.warn(
            f"the target's own generate ran at {noise.baseline_relative_spread:.0%} spread across prompts "
            f"(IQR {noise.baseline_tokens_per_second_iqr:.1f} of median "
            f"{noise.baseline_tokens_per_second_median:.1f} tokens/s, limit {NOISE_LIMIT:.0%}): this wall clock "
            f"is too noisy to trust; load average {noise.load_average} (os.getloadavg: 1, 5, 15 min)",
            stacklevel=3,  # measure_speedup's caller (torch.no_grad's wrapper is one frame)
        )
    merged = DecodeStats.merge(runs)
    baseline_tokens = sum(prompt_baseline_tokens)
    base_total, spec_total = sum(per_token_baseline), sum(speculative_seconds)
    packed = None
    if packed_kernels is not None:
        packed = PackedBaseline(
            packed_generate_seconds=sum(packed_seconds),
            speedup_vs_packed_generate=sum(packed_seconds) / spec_total if spec_total > 0 else float("nan"),
            packed_generate_mismatches=packed_mismatches,
        )
    comparison = GenerateComparison(
        speedup=base_total / spec_total if spec_total > 0 else float("nan"),
        median_prompt_speedup=statistics.median(noise.prompt_speedups),
        baseline_tokens_per_second=baseline_tokens / sum(baseline_seconds)
        if sum(baseline_seconds) > 0
        else float("nan"),
        # every output equals generate's, or differs from it by a float tie only; sampled: not compared
        outputs_equal=None if sampled else not mismatches,
        mismatches=mismatches,
        ties=ties,
        differences=differences,
        spread=noise,
        packed=packed,
    )
    return SpeedupResult(
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
        baseline_seconds=sum(baseline_seconds),  # raw; the speedup uses per_token_baseline
        speculative_seconds=spec_total,
        speculative_tokens_per_second=merged.new_tokens / spec_total if spec_total > 0 else float("nan"),
        tau=merged.tau,
        target_forwards=merged.target_forwards,
        mean_verified=merged.mean_verified,
        accepted_rate_per_slot=merged.accepted_rate_per_slot,
        phase_ms_per_step=merged.phase_ms_per_step(),
        prefill_seconds=merged.prefill_seconds,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        baseline_prompt_seconds=baseline_seconds,
        speculative_prompt_seconds=speculative_seconds,
        comparison=comparison,
        prompt_records=[
            PromptDecodeRecord.from_stats(
                run,
                baseline_seconds=b,
                speculative_seconds=s,
                outputs_equal=None if sampled else i not in mismatches,
                packed_generate_seconds=packed_seconds[i] if packed_seconds else None,
                output_tie=i in ties,
            )
            for i, (run, b, s) in enumerate(zip(runs, per_token_baseline, speculative_seconds))
            if run.target_forwards > 0
        ],
        stats=merged,
    )
