"""The drafter's context cache (same drafts as re-projecting the prefix), phase times, the speedup measurement and
the verify-length cost model."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.drafters import decode_cached_and_uncached, random_gated_drafter
from helpers.targets import bigram_setup

from dspark_lightning.decoding import DecodeStats, best_verify_length, measure_speedup, speculative_generate


def context_dependent_bigram(noise: float = 0.7):
    """The bigram oracle of test_decoding with a live backbone: base logits, hidden states and confidences now depend
    on the drafter's context (so a wrong cache changes drafts), while acceptance stays high enough to exercise
    crops of every length."""
    model, target, drafter, _ = bigram_setup(noise=noise)
    with torch.no_grad():
        drafter.backbone.norm.weight.fill_(0.05)
    return model, target, drafter


def test_cached_draft_equals_reprojected_draft_after_extends_and_crops():
    _, target, drafter = random_gated_drafter()
    g = torch.Generator().manual_seed(1)
    width = drafter.backbone.fc.in_features
    features = torch.randn(1, 300, width, generator=g)
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
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
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


def test_phase_times_cover_the_run_and_merge():
    _, target, drafter = context_dependent_bigram()
    _, stats = speculative_generate(target, drafter, torch.tensor([[3, 1, 4]]), 30, mode="markov", eos_token_id=[])
    phases = stats.phase_ms_per_step()
    assert set(phases) == {"draft_backbone", "draft_head", "verify", "bookkeeping"}
    assert all(value > 0 for value in phases.values()) and stats.prefill_seconds > 0
    assert stats.draft_seconds == stats.draft_backbone_seconds + stats.draft_head_seconds
    assert math.isclose(
        stats.total_seconds,
        stats.draft_seconds + stats.verify_seconds + stats.bookkeeping_seconds + stats.prefill_seconds,
    )
    merged = DecodeStats.merge([stats, stats])
    assert merged.accepted_per_step == stats.accepted_per_step * 2 and merged.new_tokens == 2 * stats.new_tokens
    assert math.isclose(merged.verify_seconds, 2 * stats.verify_seconds)
    assert merged.as_dict()["tau"] == stats.tau


def test_measure_speedup_checks_outputs_against_generate():
    _, target, drafter = context_dependent_bigram()
    prompts = [[3, 1, 4], [2, 7, 1, 8]]
    result = measure_speedup(target, drafter, prompts, 20, mode="selector", k=4, eos_token_id=[])
    assert result["outputs_equal"] and result["mismatches"] == []
    assert result["new_tokens"] == result["baseline_new_tokens"] == 40
    assert len(result["baseline_prompt_seconds"]) == len(result["speculative_prompt_seconds"]) == 2
    assert result["speedup"] == result["baseline_seconds"] / result["speculative_seconds"] > 0
    assert result["tau"] > 1.5  # the oracle-like drafter is accepted often

    # a drafter that is not lossless (a broken verifier) is reported, loudly
    import dspark_lightning.decoding.speedup as speedup

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
    assert not result["outputs_equal"] and result["mismatches"] == [0, 1]


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
