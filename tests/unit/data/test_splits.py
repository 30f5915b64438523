"""How records and samples are divided: train / validation / test by conversation id (``IdSplit``), and an epoch's
samples over DDP ranks (``split_for_rank``). Checked against counts and brute force, not against the formulas."""

from __future__ import annotations

import pytest

from dspark_lightning.data.cache import split_for_rank
from dspark_lightning.data.splits import IdSplit

IDS = [f"conversation-{i}" for i in range(4000)]


def test_fractions_are_the_ones_asked_for():
    """validation 0.3, test 0.2 over 4,000 ids: each share within 4 standard deviations of the fraction."""
    split = IdSplit(validation=0.3, test=0.2)
    shares = {name: sum(split.split_of(i) == name for i in IDS) / len(IDS) for name in ("validation", "test", "train")}
    for name, fraction in (("validation", 0.3), ("test", 0.2), ("train", 0.5)):
        assert shares[name] == pytest.approx(fraction, abs=4 * (fraction * (1 - fraction) / len(IDS)) ** 0.5), shares


def test_the_split_depends_on_the_id_alone():
    a, b = IdSplit(validation=0.1, test=0.1), IdSplit(validation=0.1, test=0.1)
    assert [a.split_of(i) for i in IDS[:500]] == [b.split_of(i) for i in reversed(IDS[:500])][::-1]
    # a larger validation fraction only moves ids into validation, never out of it
    wider = IdSplit(validation=0.2, test=0.1)
    assert all(wider.split_of(i) == "validation" for i in IDS if a.split_of(i) == "validation")


def test_every_part_of_a_conversation_lands_in_its_split():
    """ShareGPT parts ``<id>_0`` .. ``<id>_11`` (two-digit parts too) and ``#kind`` records stay together."""
    split = IdSplit(validation=0.5)
    for identifier in IDS[:300]:
        whole = split.split_of(identifier)
        parts = {split.split_of(f"{identifier}_{n}") for n in range(12)}
        kinds = {split.split_of(f"{identifier}_{n}#first_turn") for n in (0, 10)}
        assert parts == kinds == {whole}, identifier
    assert len({split.split_of(i) for i in IDS[:300]}) == 2  # the ids themselves do land in both splits


@pytest.mark.parametrize("num_samples", [0, 1, 7, 12, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_ranks_read_disjoint_samples_and_even_ranks_read_equal_counts(num_samples, world_size):
    for even in (False, True):
        parts = [list(split_for_rank(num_samples, rank, world_size, even)) for rank in range(world_size)]
        read = sorted(s for part in parts for s in part)
        assert len(read) == len(set(read)) and set(read) <= set(range(num_samples))
        if even:  # equal counts (a rank with fewer batches would hang the others), dropping fewer than world_size
            assert {len(part) for part in parts} == {num_samples // world_size}
        else:
            assert read == list(range(num_samples))
