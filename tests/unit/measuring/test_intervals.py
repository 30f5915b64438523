"""Bootstrap intervals: their coverage properties, checked against closed forms, never against a re-implementation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dspark_lightning.measuring.intervals import (
    bootstrap_ci,
    ratio_bootstrap_ci,
    ratio_difference_bootstrap_ci,
    ratio_of_sums,
)


def test_identical_values_give_a_point_interval():
    low, high = bootstrap_ci([1.75] * 40)
    assert low == high == pytest.approx(1.75, abs=1e-15)
    assert bootstrap_ci([3.0]) == (3.0, 3.0)  # one prompt: nothing to resample
    assert ratio_bootstrap_ci([6] * 10, [4] * 10) == (1.5, 1.5)


@pytest.mark.parametrize("seed", range(5))
def test_the_interval_contains_the_point_estimate(seed):
    rng = np.random.default_rng(100 + seed)
    values = rng.exponential(2.0, size=30)  # skewed, like per-prompt tau
    low, high = bootstrap_ci(values, seed=seed)
    assert low < values.mean() < high
    low, high = bootstrap_ci(values, statistic=np.median, seed=seed)
    assert low <= np.median(values) <= high
    forwards = rng.integers(5, 60, size=30)
    emitted = forwards * rng.uniform(1.0, 4.0, size=30)
    low, high = ratio_bootstrap_ci(emitted, forwards, seed=seed)
    assert low < ratio_of_sums(emitted, forwards) < high


def test_the_mean_of_a_large_normal_sample_matches_the_normal_interval():
    rng = np.random.default_rng(7)
    values = rng.normal(5.0, 2.0, size=2000)
    half_width = 1.96 * values.std(ddof=1) / math.sqrt(values.size)
    low, high = bootstrap_ci(values)
    # the Monte Carlo error of a 2.5% quantile from 10,000 resamples is ~0.03 standard errors; 10% of the half width
    # is ~0.2 standard errors
    assert low == pytest.approx(values.mean() - half_width, abs=0.1 * half_width)
    assert high == pytest.approx(values.mean() + half_width, abs=0.1 * half_width)


def test_the_ratio_of_sums_interval_matches_the_delta_method():
    rng = np.random.default_rng(11)
    forwards = rng.integers(5, 60, size=2000).astype(float)
    emitted = forwards * rng.uniform(1.0, 3.0, size=forwards.size)
    ratio = emitted.sum() / forwards.sum()
    # linearised ratio estimator: Var(R) ~ sum((x - R y)^2) / (n * mean(y))^2
    standard_error = math.sqrt(((emitted - ratio * forwards) ** 2).sum()) / forwards.sum()
    low, high = ratio_bootstrap_ci(emitted, forwards)
    assert low == pytest.approx(ratio - 1.96 * standard_error, abs=0.2 * standard_error)
    assert high == pytest.approx(ratio + 1.96 * standard_error, abs=0.2 * standard_error)


def test_proportional_pairs_collapse_because_pairs_are_resampled_together():
    rng = np.random.default_rng(3)
    forwards = rng.integers(1, 200, size=25).astype(float)  # wildly different prompt lengths
    emitted = 2 * forwards  # tau exactly 2 on every prompt (doubling is exact in floating point)
    assert ratio_bootstrap_ci(emitted, forwards) == (2.0, 2.0)
    # the same two columns with the pairing broken: the same ratio of sums (2), but per-prompt ratios now spread
    # widely, and the interval has to show it
    shuffled = rng.permutation(forwards)
    assert ratio_of_sums(emitted, shuffled) == pytest.approx(2.0, rel=1e-12)
    low, high = ratio_bootstrap_ci(emitted, shuffled)
    assert low < 2.0 < high and high - low > 0.5


def test_a_wider_confidence_gives_a_wider_interval_and_a_seed_reproduces_it():
    values = np.random.default_rng(5).gamma(2.0, size=50)
    narrow, wide = bootstrap_ci(values, confidence=0.8), bootstrap_ci(values, confidence=0.99)
    assert wide[0] < narrow[0] < narrow[1] < wide[1]
    assert bootstrap_ci(values, seed=4) == bootstrap_ci(values, seed=4) != bootstrap_ci(values, seed=5)
    numerators, denominators = values * 3, values + 1
    assert ratio_bootstrap_ci(numerators, denominators, seed=2) == ratio_bootstrap_ci(numerators, denominators, seed=2)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bootstrap_ci([]), "non-empty"),
        (lambda: bootstrap_ci([1.0, float("nan")]), "finite"),
        (lambda: bootstrap_ci([1.0, 2.0], confidence=1.0), "confidence"),
        (lambda: bootstrap_ci([1.0, 2.0], resamples=0), "resamples"),
        (lambda: bootstrap_ci([1.0, 2.0], statistic=lambda a, axis: a), "one number per resample"),
        (lambda: ratio_bootstrap_ci([1.0, 2.0], [1.0]), "differ in length"),
        (lambda: ratio_bootstrap_ci([1.0, 2.0], [1.0, 0.0]), "positive"),
        (lambda: ratio_of_sums([1.0], [-1.0]), "positive"),
    ],
)
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_paired_difference_interval_matches_the_delta_method():
    rng = np.random.default_rng(13)
    forwards_a = rng.integers(5, 60, size=2000).astype(float)
    difficulty = rng.uniform(0.0, 2.0, size=forwards_a.size)  # shared by both drafters: cancels in the difference
    emitted_a = forwards_a * (1.0 + difficulty + rng.uniform(0.0, 0.5, size=forwards_a.size))
    forwards_b = rng.integers(5, 60, size=forwards_a.size).astype(float)
    emitted_b = forwards_b * (1.0 + difficulty + rng.uniform(0.0, 0.3, size=forwards_a.size))
    ratio_a, ratio_b = emitted_a.sum() / forwards_a.sum(), emitted_b.sum() / forwards_b.sum()
    # linearised: each prompt's influence on R_a - R_b, summed in quadrature
    influence = (emitted_a - ratio_a * forwards_a) / forwards_a.sum() - (
        emitted_b - ratio_b * forwards_b
    ) / forwards_b.sum()
    standard_error = math.sqrt((influence**2).sum())
    low, high = ratio_difference_bootstrap_ci(emitted_a, forwards_a, emitted_b, forwards_b)
    difference = ratio_a - ratio_b
    assert low == pytest.approx(difference - 1.96 * standard_error, abs=0.2 * standard_error)
    assert high == pytest.approx(difference + 1.96 * standard_error, abs=0.2 * standard_error)
    # two independent estimates' difference would be wider than either one's interval; paired, the shared
    # difficulty cancels and it is narrower than a's own interval
    a_low, a_high = ratio_bootstrap_ci(emitted_a, forwards_a)
    assert high - low < a_high - a_low


def test_a_constant_per_prompt_gain_gives_a_point_difference_and_unequal_prompt_counts_fail():
    rng = np.random.default_rng(17)
    forwards = rng.integers(1, 200, size=25).astype(float)
    emitted_b = forwards * rng.uniform(1.0, 2.0, size=forwards.size)
    emitted_a = emitted_b + 0.25 * forwards  # every prompt gains exactly 0.25 tau: every resample's difference is 0.25
    low, high = ratio_difference_bootstrap_ci(emitted_a, forwards, emitted_b, forwards)
    assert low == pytest.approx(0.25, abs=1e-12) and high == pytest.approx(0.25, abs=1e-12)
    with pytest.raises(ValueError, match="same prompts"):
        ratio_difference_bootstrap_ci(emitted_a, forwards, emitted_b[:-1], forwards[:-1])


def test_two_prompts_give_the_exact_bootstrap_law():
    """Two prompts, values 0 and 1: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so the 95%
    interval is [0, 1] (each end holds a quarter of the resamples, more than the 2.5% tail). Every prompt, the last
    one included, must be drawn: an interval that never reaches 1 lost the last prompt."""
    assert bootstrap_ci([0.0, 1.0], resamples=4000) == (0.0, 1.0)
    assert ratio_bootstrap_ci([0.0, 3.0], [1.0, 1.0], resamples=4000) == (0.0, 3.0)
    # paired difference: a gains 0 on prompt 1 and 4 on prompt 2; over the four equally likely index pairs a
    # resample's difference is 0, 2, 2 or 4, so the interval is [0, 4]
    pairs = [(i, j) for i in range(2) for j in range(2)]
    num_a, den, num_b = [1.0, 5.0], [1.0, 1.0], [1.0, 1.0]
    exact = sorted((num_a[i] + num_a[j]) / 2 - (num_b[i] + num_b[j]) / 2 for i, j in pairs)
    assert ratio_difference_bootstrap_ci(num_a, den, num_b, den, resamples=4000) == (exact[0], exact[-1]) == (0, 4)
