"""Reading target caches without features: which caches may be read together, and each epoch's sample order over
ranks (``index.json`` files written here; no shard is opened)."""

from __future__ import annotations

import json

import pytest

from dspark_lightning.data.cache import INDEX_NAME, READABLE_FORMATS, CachedFeatureDataset, load_cache_indexes

META = dict(target_layer_ids=[1, 2], hidden_size=32, seq_len=64, dtype="bfloat16")


def cache_dir(tmp_path, name: str, samples: int = 10, **meta) -> str:
    directory = tmp_path / name
    directory.mkdir()
    shards = [dict(file="features-00000.safetensors", num_samples=samples)]
    index = dict(META, format=READABLE_FORMATS[-1], complete=True, shards=shards) | meta
    (directory / INDEX_NAME).write_text(json.dumps(index))
    return str(directory)


@pytest.mark.parametrize("key, value", [("target_layer_ids", [1, 3]), ("hidden_size", 64), ("seq_len", 32),
                                        ("dtype", "float32")])  # fmt: skip
def test_caches_of_different_features_are_not_read_together(tmp_path, key, value):
    first, second = cache_dir(tmp_path, "a"), cache_dir(tmp_path, "b", **{key: value})
    assert len(load_cache_indexes([first, cache_dir(tmp_path, "c")])) == 2
    with pytest.raises(ValueError, match=f"differ in {key}"):
        load_cache_indexes([first, second])


def test_every_epoch_has_its_own_order_and_ranks_share_none_of_it(tmp_path):
    directories = [cache_dir(tmp_path, "a", 13), cache_dir(tmp_path, "b", 8)]

    def order(epoch: int, rank: int, world_size: int = 1, seed: int = 0) -> list[int]:
        dataset = CachedFeatureDataset(directories, 4, shuffle=True, seed=seed, rank=rank, world_size=world_size)
        dataset.set_epoch(epoch)
        return dataset.sample_order()

    epochs = [order(epoch, 0) for epoch in range(3)]
    assert all(sorted(o) == list(range(21)) for o in epochs)  # both caches, every sample once
    assert len({tuple(o) for o in epochs}) == 3 and order(1, 0) == epochs[1]
    assert order(0, 0, seed=1) != epochs[0]
    ranks = [order(2, rank, world_size=2) for rank in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 10 and not set(ranks[0]) & set(ranks[1])
