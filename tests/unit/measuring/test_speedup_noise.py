"""``measure_speedup`` reports its own noise: the spread of per-prompt speedups and of the baseline's tokens/s, and a
flag (and a warning naming the load average) when the baseline's spread is too wide to trust.

The clock is scripted (each timed run lasts exactly what the test says), so the spread is checked against an
independent computation (numpy's percentiles) and never depends on this machine's load.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers.targets import bigram_setup

from dspark_lightning.decoding.kernels import packed_kernels_available
from dspark_lightning.measuring import measure_speedup

NEW_TOKENS = 6


def scripted_clock(durations: list[float]):
    """A clock whose n-th timed run (baseline, speculative, baseline, ... in measure_speedup's order) lasts
    ``durations[n]`` seconds: each run reads the clock twice, at its start and its end."""
    readings = iter([t for seconds in durations for t in (100.0, 100.0 + seconds)])
    return lambda: next(readings)


def measure(baseline_seconds: list[float], speculative_seconds: list[float]) -> dict:
    _, target, drafter, _ = bigram_setup(noise=0.7)
    prompts = [[3, 1, 4], [2, 7, 1, 8], [5, 9], [2, 6, 5]][: len(baseline_seconds)]
    durations = [t for pair in zip(baseline_seconds, speculative_seconds) for t in pair]
    calls = []
    result = measure_speedup(
        target, drafter, prompts, NEW_TOKENS, mode="markov", eos_token_id=[], warmup=False,
        clock=scripted_clock(durations), on_prompt=lambda: calls.append(1),
    )  # fmt: skip
    assert len(calls) == len(prompts)  # one progress tick per prompt
    return result


def test_spread_of_speedups_and_baseline_rate_matches_numpy_and_a_noisy_baseline_is_flagged():
    baseline, speculative = [1.0, 2.0, 1.5, 4.0], [0.5, 1.0, 1.0, 1.0]
    with pytest.warns(UserWarning, match=r"too noisy to trust; load average") as caught:
        result = measure(baseline, speculative)
    speedups = np.array(baseline) / np.array(speculative)
    rates = NEW_TOKENS / np.array(baseline)  # eos_token_id=[]: every baseline run makes exactly NEW_TOKENS tokens
    q1, median, q3 = np.percentile(rates, [25, 50, 75])
    assert result.comparison.spread.prompt_speedups == pytest.approx(speedups.tolist())
    assert result.comparison.spread.prompt_speedup_iqr == pytest.approx(np.subtract(*np.percentile(speedups, [75, 25])))
    assert result.comparison.spread.baseline_tokens_per_second_median == pytest.approx(median)
    assert result.comparison.spread.baseline_tokens_per_second_iqr == pytest.approx(q3 - q1)
    assert (
        result.comparison.spread.baseline_relative_spread == pytest.approx((q3 - q1) / median)
        and (q3 - q1) / median > 0.25
    )
    assert result.comparison.spread.noisy is True
    assert result.comparison.speedup == pytest.approx(sum(baseline) / sum(speculative))
    assert result.comparison.median_prompt_speedup == pytest.approx(np.median(speedups))
    assert len(result.comparison.spread.load_average) == 3 and str(result.comparison.spread.load_average) in str(
        caught[0].message
    )


def test_a_steady_baseline_is_trusted_whatever_the_speculative_runs_do():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no noise warning (nor any other)
        result = measure([1.0, 1.05, 0.95, 1.0], [0.5, 2.0, 0.25, 1.0])
    assert result.comparison.spread.noisy is False and result.comparison.spread.baseline_relative_spread <= 0.25
    assert result.comparison.spread.prompt_speedup_iqr == pytest.approx(
        np.subtract(*np.percentile([2.0, 0.525, 3.8, 1.0], [75, 25]))
    )


@pytest.mark.skipif(not packed_kernels_available(), reason="this torch build has no oneDNN packed linear")
def test_packed_verify_also_times_generate_on_the_packed_kernels():
    _, target, drafter, _ = bigram_setup(noise=0.7)
    prompts = [[3, 1, 4], [2, 7, 1, 8], [5, 9]]
    baseline, packed, speculative = [2.0, 1.0, 1.5], [1.5, 1.0, 1.0], [1.0, 1.0, 0.5]
    durations = [t for runs in zip(baseline, packed, speculative) for t in runs]  # the order measure_speedup times
    calls = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scripted baseline spread is wide: that warning is another test's
        result = measure_speedup(
            target, drafter, prompts, NEW_TOKENS, mode="markov", eos_token_id=[], warmup=False, packed_verify=True,
            clock=scripted_clock(durations), on_prompt=lambda: calls.append(1),
        )  # fmt: skip
    assert len(calls) == len(prompts)
    assert result.comparison.speedup == pytest.approx(4.5 / 2.5)
    assert result.comparison.packed.packed_generate_seconds == pytest.approx(3.5)
    assert result.comparison.packed.speedup_vs_packed_generate == pytest.approx(3.5 / 2.5)
    assert result.comparison.packed.packed_generate_mismatches == [] and result.comparison.outputs_equal is True
    assert [r.packed_generate_seconds for r in result.prompt_records] == packed
    model = target.model if hasattr(target, "model") else target
    assert not any("forward" in m.__dict__ for m in model.modules())  # generate's own kernels are restored


def test_a_sampled_speedup_is_a_ratio_of_seconds_per_token(monkeypatch):
    """At T = 1 both runs sample, their replies differ in length (EOS), and each prompt's generate seconds are
    scaled to the speculative reply's length: checked against the lengths the two runs really returned."""
    from dspark_lightning.measuring import speedup as module

    model, target, drafter, _ = bigram_setup(noise=0.7)
    lengths = {"baseline": [], "speculative": []}
    generate, speculative = model.generate, module.speculative_generate

    def counted_generate(ids, **kwargs):
        assert kwargs["do_sample"] and kwargs["temperature"] == 1.0 and kwargs["top_k"] == 0
        out = generate(ids, **kwargs)
        lengths["baseline"].append(out.shape[1] - ids.shape[1])
        return out

    def counted_speculative(target, drafter, ids, *args, **kwargs):
        out, stats = speculative(target, drafter, ids, *args, **kwargs)
        lengths["speculative"].append(out.shape[1] - ids.shape[1])
        return out, stats

    monkeypatch.setattr(model, "generate", counted_generate)
    monkeypatch.setattr(module, "speculative_generate", counted_speculative)
    prompts = [[3, 1, 4], [2, 7, 1, 8], [5, 9], [2, 6, 5], [1, 1], [4, 2, 2]]
    baseline, spec = [1.0, 2.0, 1.5, 4.0, 1.0, 3.0], [0.5, 1.0, 1.0, 1.0, 0.8, 0.7]
    durations = [t for pair in zip(baseline, spec) for t in pair]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scripted baseline is noisy on purpose
        result = measure_speedup(
            target, drafter, prompts, 12, mode="markov", eos_token_id=[0, 5], warmup=False, temperature=1.0,
            seed=3, clock=scripted_clock(durations),
        )  # fmt: skip
    nb, ns = np.array(lengths["baseline"]), np.array(lengths["speculative"])
    assert (nb != ns).any()  # two samples: different lengths, else the scaling is not tested
    assert result.baseline_prompt_seconds == pytest.approx(baseline)  # the raw seconds are kept
    expected = np.sum(np.array(baseline) * ns / nb) / np.sum(spec)
    assert result.comparison.speedup == pytest.approx(expected)
    scaled = (np.array(baseline) * ns / nb).tolist()  # records: the prompts with a verify step, in order
    assert all(any(r.baseline_seconds == pytest.approx(x) for x in scaled) for r in result.prompt_records)
    assert result.comparison.outputs_equal is None and all(r.outputs_equal is None for r in result.prompt_records)
    assert result.baseline_new_tokens == nb.sum() and result.new_tokens == ns.sum()
    with pytest.raises(ValueError, match="packed_verify .* temperature 0"):
        measure_speedup(target, drafter, prompts, 4, temperature=1.0, packed_verify=True, warmup=False)
