"""``DecodeStats`` against a table computed by hand: per-slot acceptance rates, tau, merging, the per-prompt record.

Six steps (drafted tokens verified, accepted, emitted). Slot k is *reached* by a step that verified more than k
slots and accepted the k before it; its rate is accepted / reached, never accepted / all steps.
"""

from __future__ import annotations

import math

import pytest
import torch

from dspark_lightning.decoding.stats import DecodeStats, PromptDecodeRecord

STEPS = [(4, 4, 5), (4, 1, 2), (2, 2, 3), (3, 0, 1), (4, 2, 3), (1, 1, 2)]
# slot 0: reached by all 6 steps, accepted in 5 (all but step 4)
# slot 1: verified by steps 1-5; reached by 1, 2, 3, 5 (step 4 stopped at slot 0); accepted in 1, 3, 5
# slot 2: verified by steps 1, 2, 4, 5; reached by 1 and 5; accepted in step 1
# slot 3: verified by steps 1, 2, 5; reached by step 1 only; accepted there
RATES = [5 / 6, 3 / 4, 1 / 2, 1 / 1]


def stats_of(steps, seconds: float = 0.0) -> DecodeStats:
    stats = DecodeStats("markov", 4, 0.0, None)
    for verified, accepted, emitted in steps:
        stats.record_step(torch.arange(verified), accepted, emitted, None)
    stats.verify_seconds = seconds
    stats.new_tokens = sum(emitted for *_, emitted in steps)
    return stats


def test_per_slot_rates_equal_the_hand_computed_table():
    stats = stats_of(STEPS)
    assert stats.accepted_rate_per_slot == pytest.approx(RATES, abs=1e-12)
    assert stats.as_dict()["accepted_rate_per_slot"] == pytest.approx(RATES, abs=1e-12)


def test_tau_and_mean_verified():
    stats = stats_of(STEPS)
    assert stats.target_forwards == 6
    assert stats.tau == pytest.approx(16 / 6, abs=1e-12)  # 5 + 2 + 3 + 1 + 3 + 2 tokens over 6 forwards
    assert stats.mean_verified == pytest.approx(18 / 6, abs=1e-12)  # 4 + 4 + 2 + 3 + 4 + 1
    assert math.isnan(DecodeStats("markov", 4, 0.0, None).tau)  # no verify step: undefined, not 0


def test_a_slot_no_step_reached_has_no_rate():
    """One step that verified 3 slots and rejected the first: slot 0 is 0 / 1, slots 1 and 2 were never reached."""
    rates = stats_of([(3, 0, 1)]).accepted_rate_per_slot
    assert rates[0] == 0.0 and math.isnan(rates[1]) and math.isnan(rates[2]) and len(rates) == 3


def test_merging_two_runs_is_one_run_over_all_their_steps():
    merged = DecodeStats.merge([stats_of(STEPS[:2], 1.5), stats_of(STEPS[2:], 2.0)])
    assert merged.accepted_rate_per_slot == pytest.approx(RATES, abs=1e-12)
    assert merged.tau == pytest.approx(16 / 6, abs=1e-12)
    assert merged.verify_seconds == 3.5 and merged.new_tokens == 16
    with pytest.raises(ValueError, match="at least one"):
        DecodeStats.merge([])


def test_the_prompt_record_counts_the_steps_that_accepted_each_slot():
    """Slot k counts the steps with more than k accepted drafts: [5, 3, 1, 1] of 6 forwards, 16 tokens."""
    record = PromptDecodeRecord.from_stats(stats_of(STEPS))
    assert record.accepted_per_slot == [5, 3, 1, 1]
    assert (record.target_forwards, record.emitted_tokens) == (6, 16)
