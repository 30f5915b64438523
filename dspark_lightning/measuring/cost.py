"""The cost model of a decoding step: measured verify cost T(n) = t0 + t1 * n, and the verify length it favours."""

from __future__ import annotations

import contextlib
import inspect
import math
import time

import torch

from dspark_lightning.decoding.kernels import PackedLinears
from dspark_lightning.decoding.target_cache import TargetCache
from dspark_lightning.decoding.target_forwards import causal_lm


@torch.no_grad()
def measure_verify_cost(
    target,
    prompt_length: int = 64,
    max_block: int = 16,
    repeats: int = 5,
    device: str | torch.device = "cpu",
    packed_verify: bool = False,
) -> tuple[float, float]:
    """Fit T(n) = t0 + t1 * n, the wall time of one verifying target forward over n+1 new tokens on a cached prefix.

    Timed as ``speculative_generate`` runs it: the decoder over the n+1 tokens and the LM head on the first row only
    (each accepted draft adds one head row: a cost per accepted token, not per verified slot), or on packed kernels
    the head over all n+1 rows (``packed_verify``: one packed head call). Times the real target
    (median of ``repeats`` per n, after a warm-up) for n = 1..max_block and fits t0, t1 by least squares; the
    result is the ``cost_model`` argument of ``speculative_generate``; ``packed_verify`` times the forward on the
    packed kernels that ``speculative_generate(packed_verify=True)`` verifies with.
    """
    model = causal_lm(target)
    vocab = model.get_input_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, prompt_length), generator=generator).to(device)
    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings()
    verify = body if body is not None and head is not None else model
    cache_kwarg = "cache" if "cache" in inspect.signature(verify.forward).parameters else "past_key_values"
    kernels = PackedLinears(verify, max_block + 1) if packed_verify else contextlib.nullcontext()
    head_rows, head_kernels = 1, contextlib.nullcontext()
    if packed_verify and verify is body and isinstance(head, torch.nn.Linear):
        head_rows, head_kernels = None, PackedLinears(head, max_block + 1)  # as TargetForwards verifies
    blocks = {n: torch.randint(0, vocab, (1, n + 1), generator=generator).to(device) for n in range(1, max_block + 1)}

    def timed_verify(n: int) -> float:
        target_cache = TargetCache(model)  # the cache speculative_generate verifies on (sliding layers too)
        cache = target_cache.cache
        verify(input_ids=prompt, use_cache=True, **{cache_kwarg: cache})
        target_cache.prompt_done()
        if torch.cuda.is_available() and torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with kernels:
            out = verify(input_ids=blocks[n], use_cache=True, **{cache_kwarg: cache})
        if verify is body:
            with head_kernels:
                head(out.last_hidden_state[:, :head_rows])
        if torch.cuda.is_available() and torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    timed_verify(1)  # warm-up
    # every round times each n once, so a stretch of load from another process slows a few samples of every n
    # rather than all samples of a few n (which bent the fit: a slope of 0 made whole blocks look free)
    times: dict[int, list[float]] = {n: [] for n in blocks}
    for _ in range(repeats):
        for n in blocks:
            times[n].append(timed_verify(n))
    x = torch.tensor(list(times), dtype=torch.float64)
    y = torch.tensor([sorted(t)[len(t) // 2] for t in times.values()], dtype=torch.float64)  # medians
    design = torch.stack((torch.ones_like(x), x), dim=1)
    t0, t1 = torch.linalg.lstsq(design, y[:, None]).solution[:, 0].tolist()
    return max(t0, 1e-9), max(t1, 0.0)


def best_verify_length(
    accepted_rate_per_slot: list[float],
    step_overhead_seconds: float,
    cost_model: tuple[float, float],
) -> dict:
    """Which verify length n maximises tokens per second, from measured numbers.

    Args:
        accepted_rate_per_slot: measured P(slot j accepted | slots < j accepted), from runs verifying whole blocks
            (``DecodeStats.accepted_rate_per_slot``); a slot never reached (nan) counts as never accepted.
        step_overhead_seconds: measured seconds per step outside the verify forward (drafter backbone + head walk
            + bookkeeping), taken as independent of n.
        cost_model: (t0, t1) of ``measure_verify_cost``.
    Returns:
        ``best_n``, and per n = 1..B: ``expected_tokens`` = 1 + sum_{j<=n} prod_{i<=j} a_i (tokens per step),
        ``step_seconds`` = overhead + t0 + t1 * n and ``tokens_per_second`` = their ratio.
    """
    if not accepted_rate_per_slot:
        raise ValueError("accepted_rate_per_slot is empty: measure a run that verifies at least one slot")
    if step_overhead_seconds < 0:
        raise ValueError(f"step_overhead_seconds must be >= 0, got {step_overhead_seconds}")
    t0, t1 = cost_model
    survival, expected, seconds, rates = 1.0, [], [], []
    tokens = 1.0  # the target's own token: every step emits it
    for n, rate in enumerate(accepted_rate_per_slot, start=1):
        survival *= 0.0 if math.isnan(rate) else rate
        tokens += survival
        expected.append(tokens)
        seconds.append(step_overhead_seconds + t0 + t1 * n)
        rates.append(tokens / seconds[-1])
    best = max(range(len(rates)), key=rates.__getitem__)
    return dict(best_n=best + 1, expected_tokens=expected, step_seconds=seconds, tokens_per_second=rates)
