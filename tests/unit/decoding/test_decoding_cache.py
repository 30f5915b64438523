"""The drafter's context cache (same drafts as re-projecting the prefix), phase times, the speedup measurement and
the verify-length cost model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers.drafters import decode_cached_and_uncached, random_gated_drafter
from helpers.targets import bigram_setup

import dspark_lightning.decoding.stats as stats_module
from dspark_lightning.decoding import DecodeStats, speculative_generate
from dspark_lightning.measuring import best_verify_length, measure_speedup


def context_dependent_bigram(noise: float = 0.7):
    """The bigram oracle of test_decoding with a live backbone: base logits, hidden states and confidences now depend
    on the drafter's context (so a wrong cache changes drafts), while acceptance stays high enough to exercise
    crops of every length."""
    model, target, drafter, _ = bigram_setup(noise=noise)
    with torch.no_grad():
        drafter.backbone.norm.weight.fill_(0.05)
    return model, target, drafter


def test_cached_draft_equals_reprojected_draft_after_extends_and_crops():
    """In float64, so the comparison is the cache's logic and not the summation order of this CPU's float32 kernels
    (AVX-512 and AVX2 builds round the chunked and the whole projection differently, by about 1e-6)."""
    _, target, drafter = random_gated_drafter()
    drafter = drafter.double()
    g = torch.Generator().manual_seed(1)
    width = drafter.backbone.fc.in_features
    features = torch.randn(1, 300, width, generator=g, dtype=torch.float64)
    cache = drafter.new_context_cache(capacity=4)  # tiny capacity: the buffers must grow several times
    length = 0
    for step, n in enumerate([7, 1, 3, 60, 2, 5, 100, 1, 6]):
        cache.extend(features[:, length : length + n + 2])
        cache.crop(-2)  # as the target's cache: the last two were rejected
        length += n
        assert cache.length == length
        anchor = torch.tensor([step % 40])
        cached = drafter.draft_cached(cache, anchor, torch.tensor([length]))
        reference = drafter.draft(features[:, :length], torch.arange(length)[None], anchor, torch.tensor([length]))
        for got, want in zip(cached, reference):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        assert torch.equal(cached[0].argmax(-1), reference[0].argmax(-1))
    torch.testing.assert_close(cache.fused_context(), drafter.backbone.fuse_context(features[:, :length]))
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(length + 1)
    with pytest.raises(ValueError, match="features must be"):
        cache.extend(features[0])


@pytest.mark.parametrize("mode", ["parallel", "markov", "selector"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("schedule", [None, "threshold", "cost"])
def test_cached_decoding_equals_uncached(mode, temperature, schedule):
    _, target, drafter = context_dependent_bigram()
    kwargs = dict(mode=mode, k=4, temperature=temperature, eos_token_id=[])
    if schedule == "threshold":
        kwargs["confidence_threshold"] = 0.5
    elif schedule == "cost":
        kwargs["cost_model"] = (1.0, 0.3)
    for trial, prompt in enumerate([torch.tensor([[3, 1, 4]]), torch.tensor([[2, 7, 1, 8, 2, 8, 1]])]):
        runs = []
        for drafter_cache in (True, False):
            generator = torch.Generator().manual_seed(trial)
            runs.append(
                speculative_generate(
                    target, drafter, prompt, 40, generator=generator, drafter_cache=drafter_cache, **kwargs
                )
            )
        (cached, cached_stats), (uncached, uncached_stats) = runs
        assert torch.equal(cached, uncached), (trial, cached, uncached)
        assert cached_stats.accepted_per_step == uncached_stats.accepted_per_step
        assert cached_stats.verified_per_step == uncached_stats.verified_per_step
        assert len(cached_stats.accepted_per_step) >= 8  # many steps
        if temperature == 0 and mode != "parallel":
            assert len(set(cached_stats.accepted_per_step)) > 1  # crops of different lengths happened


@pytest.mark.parametrize("mode", ["markov", "selector"])
def test_cached_decoding_equals_uncached_with_a_two_layer_gated_drafter(mode):
    model, target, drafter = random_gated_drafter()
    prompt = torch.tensor([[5, 9, 2, 33, 4]])
    for temperature in (0.0, 1.0):
        outputs = decode_cached_and_uncached(target, drafter, prompt, mode, temperature)
        assert torch.equal(*outputs)
        if temperature == 0:
            greedy = model.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=[], pad_token_id=0)
            assert torch.equal(outputs[0], greedy)


# the scripted phase clock: the prefill lasts PREFILL seconds; each decoding step reads the clock four times (the end
# of draft_backbone, draft_head, verify and bookkeeping), STEP seconds apart. Powers of two: every sum is exact, and a
# reading charged to the wrong phase shows as a wrong power.
PREFILL = 1024.0
STEP = (2.0, 4.0, 8.0, 16.0)  # draft_backbone, draft_head, verify, bookkeeping


class ScriptedPhaseClock:
    """Stands in for ``time.perf_counter`` in ``decoding.stats``: reading 0 is 0, reading 1 is PREFILL, each later
    reading advances by ``STEP[(i - 2) % 4]``. Keeps every reading it gave."""

    def __init__(self) -> None:
        self.readings: list[float] = []

    def __call__(self) -> float:
        i = len(self.readings)
        now = 0.0 if i == 0 else PREFILL if i == 1 else self.readings[-1] + STEP[(i - 2) % 4]
        self.readings.append(now)
        return now


def scripted_run(monkeypatch, prompt: list[int], new_tokens: int):
    _, target, drafter = context_dependent_bigram()
    clock = ScriptedPhaseClock()
    monkeypatch.setattr(stats_module, "time", SimpleNamespace(perf_counter=clock))
    _, stats = speculative_generate(target, drafter, torch.tensor([prompt]), new_tokens, mode="markov", eos_token_id=[])
    return stats, clock


def test_phase_times_charge_each_phase_its_own_interval_and_merge(monkeypatch):
    stats, clock = scripted_run(monkeypatch, [3, 1, 4], 30)
    steps = stats.target_forwards
    assert steps >= 3
    assert len(clock.readings) == 2 + 4 * steps  # prefill start/end, then four laps per step
    assert stats.prefill_seconds == PREFILL  # counted once
    assert (stats.draft_backbone_seconds, stats.draft_head_seconds, stats.verify_seconds) == (
        2.0 * steps,
        4.0 * steps,
        8.0 * steps,
    )
    assert stats.bookkeeping_seconds == 16.0 * steps
    assert stats.phase_ms_per_step() == {
        "draft_backbone": 2000.0,
        "draft_head": 4000.0,
        "verify": 8000.0,
        "bookkeeping": 16000.0,
    }
    # the phases cover the run from the first reading to the last: no interval is charged twice or left out
    span = clock.readings[-1] - clock.readings[0]
    assert span == PREFILL + sum(STEP) * steps
    assert stats.total_seconds == span

    other, _ = scripted_run(monkeypatch, [2, 7, 1, 8, 2, 8, 1], 17)
    merged = DecodeStats.merge([stats, other])
    assert merged.accepted_per_step == stats.accepted_per_step + other.accepted_per_step
    assert merged.new_tokens == 30 + 17 and merged.target_forwards == steps + other.target_forwards
    assert merged.prefill_seconds == 2 * PREFILL
    assert merged.verify_seconds == 8.0 * (steps + other.target_forwards)
    emitted = sum(stats.emitted_per_step) + sum(other.emitted_per_step)
    assert merged.as_dict()["tau"] == emitted / (steps + other.target_forwards)


def scripted_clock(durations: list[float]):
    """A clock whose n-th timed run (baseline, speculative, baseline, ... in measure_speedup's order) lasts
    ``durations[n]`` seconds (as in test_speedup_noise): each run reads the clock at its start and its end."""
    readings = iter([t for seconds in durations for t in (100.0, 100.0 + seconds)])
    return lambda: next(readings)


def test_measure_speedup_checks_outputs_against_generate():
    _, target, drafter = context_dependent_bigram()
    prompts = [[3, 1, 4], [2, 7, 1, 8]]
    baseline, speculative = [2.0, 1.5], [0.5, 1.0]
    durations = [baseline[0], speculative[0], baseline[1], speculative[1]]  # the warm-up runs are not timed
    result = measure_speedup(
        target, drafter, prompts, 20, mode="selector", k=4, eos_token_id=[], clock=scripted_clock(durations)
    )
    assert result.comparison.outputs_equal and result.comparison.mismatches == []
    assert result.new_tokens == result.baseline_new_tokens == 40
    assert result.baseline_prompt_seconds == baseline and result.speculative_prompt_seconds == speculative
    assert result.comparison.speedup == pytest.approx(3.5 / 1.5)
    assert result.speculative_tokens_per_second == pytest.approx(40 / 1.5)
    assert result.tau > 1.5  # the oracle-like drafter is accepted often

    # a drafter that is not lossless (a broken verifier) is reported, loudly
    import dspark_lightning.measuring.speedup as speedup

    original = speedup.speculative_generate

    def broken(*args, **kwargs):
        out, stats = original(*args, **kwargs)
        out = out.clone()
        out[0, -1] = (out[0, -1] + 1) % 12
        return out, stats

    speedup.speculative_generate = broken
    try:
        with pytest.warns(UserWarning, match="must be lossless"):
            result = measure_speedup(target, drafter, prompts, 5, mode="markov", eos_token_id=[], warmup=False)
    finally:
        speedup.speculative_generate = original
    assert not result.comparison.outputs_equal and result.comparison.mismatches == [0, 1]


def test_best_verify_length_from_measured_rates():
    # survival 0.9, 0.72, 0.36, 0 -> expected tokens 1.9, 2.62, 2.98, 2.98
    result = best_verify_length([0.9, 0.8, 0.5, math.nan], step_overhead_seconds=0.5, cost_model=(1.0, 0.25))
    expected = [1.9, 2.62, 2.98, 2.98]
    assert all(math.isclose(a, b) for a, b in zip(result["expected_tokens"], expected))
    seconds = [1.75, 2.0, 2.25, 2.5]
    assert all(math.isclose(a, b) for a, b in zip(result["step_seconds"], seconds))
    rates = [e / s for e, s in zip(expected, seconds)]
    assert result["best_n"] == rates.index(max(rates)) + 1 == 3
    # a verify cost that grows fast favours short blocks
    assert best_verify_length([0.9, 0.8, 0.5], 0.0, (0.1, 1.0))["best_n"] == 1
    with pytest.raises(ValueError, match="accepted_rate_per_slot"):
        best_verify_length([], 0.0, (1.0, 0.0))
    with pytest.raises(ValueError, match="step_overhead_seconds"):
        best_verify_length([0.5], -1.0, (1.0, 0.0))
