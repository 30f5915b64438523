"""Per-rank, per-step anchor generators never share a seed or a stream, at any number of ranks."""

from types import SimpleNamespace

import torch

from dspark_lightning.lightning.module import DSparkModule


def _generator(seed: int, step: int, rank: int) -> torch.Generator:
    # the module's own method on a stand-in that has just the attributes it reads
    stub = SimpleNamespace(training_args=SimpleNamespace(seed=seed), global_step=step, global_rank=rank)
    return DSparkModule._generator(stub)


def test_a_thousand_ranks_by_a_thousand_steps_never_share_a_seed():
    # the old (seed * 1_000_003 + step) * 64 + rank gave rank 64 at step s the seed of rank 0 at step s + 1
    seeds = {_generator(0, step, rank).initial_seed() for rank in range(1000) for step in range(1000)}
    assert len(seeds) == 1000 * 1000


def test_streams_differ_where_the_affine_seed_collided():
    # the pairs the old formula made identical draw different anchors; 8 int64 draws each
    for step in range(0, 1000, 97):
        first = torch.randint(2**62, (8,), generator=_generator(7, step + 1, 0))
        second = torch.randint(2**62, (8,), generator=_generator(7, step, 64))
        assert not torch.equal(first, second)


def test_one_rank_is_deterministic_and_the_seed_matters():
    draws = [torch.rand(16, generator=_generator(3, 5, 0)) for _ in range(2)]
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], torch.rand(16, generator=_generator(4, 5, 0)))
    assert not torch.equal(draws[0], torch.rand(16, generator=_generator(3, 6, 0)))
