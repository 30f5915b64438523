"""Bootstrap confidence intervals over the prompts of an evaluation set: a per-prompt statistic, or a ratio of sums.

A set's measured tau is total emitted tokens / total target forwards and its speedup is total baseline seconds /
total speculative seconds: ratios of sums, where long prompts weigh more, not means of per-prompt ratios. Their
uncertainty comes from which prompts happened to be in the set, so the bootstrap resamples prompts, keeping each
prompt's numerator and denominator together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
# Resamples are drawn in chunks of at most this many indices, so a large sample never needs resamples x n memory.
_CHUNK_ELEMENTS = 1 << 21


def _as_sample(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    sample = np.asarray(values, dtype=np.float64)
    if sample.ndim != 1 or sample.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of numbers, got shape {sample.shape}")
    if not np.all(np.isfinite(sample)):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return sample


def _check_settings(confidence: float, resamples: int) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")


def _resampled_indices(size: int, resamples: int, seed: int):
    """Chunks of bootstrap index rows, shape (rows, size): ``resamples`` rows in all, one Generator for all."""
    generator = np.random.default_rng(seed)
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // size)
    for start in range(0, resamples, rows_per_chunk):
        yield generator.integers(0, size, size=(min(rows_per_chunk, resamples - start), size))


def _percentile_interval(replicates: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return float(low), float(high)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    statistic: Callable[..., np.ndarray] = np.mean,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap ``(low, high)`` interval of ``statistic`` over per-prompt ``values``.

    Percentile bootstrap: draw ``resamples`` samples of the prompts with replacement, compute the statistic of each,
    and take the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of those replicates. It assumes
    nothing about the statistic's distribution (tau per prompt is skewed and bounded) and is transformation
    invariant; with the tens to hundreds of prompts of an evaluation set its coverage is close to nominal.

    ``statistic`` is a numpy reduction taking ``axis=`` (``np.mean``, ``np.median``, ...): it is applied to a
    (resamples, n) array along axis 1. Deterministic for a given ``seed`` (numpy ``Generator``).
    """
    _check_settings(confidence, resamples)
    sample = _as_sample(values, "values")
    replicates = []
    for rows in _resampled_indices(sample.size, resamples, seed):
        replicate = np.asarray(statistic(sample[rows], axis=1), dtype=np.float64)
        if replicate.shape != (rows.shape[0],):
            raise ValueError(f"statistic must reduce axis 1 to one number per resample, got shape {replicate.shape}")
        replicates.append(replicate)
    return _percentile_interval(np.concatenate(replicates), confidence)


def _paired_sample(numerators, denominators) -> tuple[np.ndarray, np.ndarray]:
    numerator, denominator = _as_sample(numerators, "numerators"), _as_sample(denominators, "denominators")
    if numerator.shape != denominator.shape:
        raise ValueError(f"numerators and denominators differ in length: {numerator.size} != {denominator.size}")
    # every prompt ran at least one target forward and took some time, so a resample's denominator is never 0
    if not np.all(denominator > 0):
        raise ValueError("every denominator must be positive (target forwards or seconds of one prompt)")
    return numerator, denominator


def ratio_of_sums(numerators: Sequence[float] | np.ndarray, denominators: Sequence[float] | np.ndarray) -> float:
    """``sum(numerators) / sum(denominators)``: the pooled ratio (measured tau, speedup) of a set of prompts."""
    numerator, denominator = _paired_sample(numerators, denominators)
    return float(numerator.sum() / denominator.sum())


def ratio_bootstrap_ci(
    numerators: Sequence[float] | np.ndarray,
    denominators: Sequence[float] | np.ndarray,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap ``(low, high)`` interval of ``sum(numerators) / sum(denominators)`` over prompts.

    Pairs are resampled together: one draw of prompt indices picks both the numerator and the denominator of each
    prompt, because a prompt's emitted tokens and target forwards (or its baseline and speculative seconds) move
    together; resampling them independently would add spread that is not there. Percentile bootstrap as in
    :func:`bootstrap_ci` (the ratio's distribution is skewed, which the percentile interval follows). Use it for
    measured tau (emitted tokens / target forwards) and for speedup (baseline seconds / speculative seconds).
    """
    _check_settings(confidence, resamples)
    numerator, denominator = _paired_sample(numerators, denominators)
    replicates = [
        numerator[rows].sum(axis=1) / denominator[rows].sum(axis=1)
        for rows in _resampled_indices(numerator.size, resamples, seed)
    ]
    return _percentile_interval(np.concatenate(replicates), confidence)


def ratio_difference_bootstrap_ci(
    numerators_a: Sequence[float] | np.ndarray,
    denominators_a: Sequence[float] | np.ndarray,
    numerators_b: Sequence[float] | np.ndarray,
    denominators_b: Sequence[float] | np.ndarray,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``ratio_of_sums(a) - ratio_of_sums(b)`` when a and b ran on the SAME prompts.

    Two drafters measured on one evaluation set share its prompts, and a prompt that is easy for one is easy for the
    other: one draw of prompt indices resamples both (a paired bootstrap), so the prompt-to-prompt spread that both
    share cancels in the difference. That makes the interval of a difference much narrower than the two drafters'
    own intervals suggest, which is what a study comparing configurations needs. Prompt i of a must be prompt i of b.
    """
    _check_settings(confidence, resamples)
    num_a, den_a = _paired_sample(numerators_a, denominators_a)
    num_b, den_b = _paired_sample(numerators_b, denominators_b)
    if num_a.size != num_b.size:
        raise ValueError(f"a and b must be measured on the same prompts: {num_a.size} != {num_b.size} prompts")
    replicates = [
        num_a[rows].sum(axis=1) / den_a[rows].sum(axis=1) - num_b[rows].sum(axis=1) / den_b[rows].sum(axis=1)
        for rows in _resampled_indices(num_a.size, resamples, seed)
    ]
    return _percentile_interval(np.concatenate(replicates), confidence)
