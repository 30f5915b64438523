"""Offline target cache: written once, read sharded, and training from it equals training online."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.paths import ROOT
from torch.utils.data import DataLoader

from dspark_lightning.cli import cli_main
from dspark_lightning.data.cache import CachedFeatureDataset, bytes_per_sample
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.lightning.config import TargetArgs, TrainingArgs
from dspark_lightning.lightning.module import DSparkModule
from dspark_lightning.models import DrafterConfig
from dspark_lightning.models.target import FrozenTarget, TargetHeads

DEMO_TARGET = str(ROOT / "assets/demo-target")
TRAIN = str(ROOT / "assets/data/regenerated/train-00000.jsonl")
VAL = str(ROOT / "assets/data/sharegpt/validation-00000.jsonl")
SEQ_LEN = 128


def write_cache(output: Path, data: str = TRAIN, limit: int = 6, *extra: str) -> dict:
    args = ["--target", DEMO_TARGET, "--data", data, "--output", str(output), "--seq_len", str(SEQ_LEN)]
    return cli_main(
        ["cache", *args, "--batch_size", "2", "--shard_size", "4", "--limit", str(limit), "--device", "cpu", *extra]
    )


@pytest.fixture(scope="module")
def float32_cache(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("cache") / "fp32"
    write_cache(output, TRAIN, 6, "--dtype", "float32")
    return output


def online_rows(count: int) -> list[dict[str, torch.Tensor]]:
    datamodule = ShareGPTDataModule(tokenizer=DEMO_TARGET, train_files=TRAIN, seq_len=SEQ_LEN, shuffle_buffer=0)
    stream = datamodule.build_dataset("train", rank=0, world_size=1)
    return [row for _, row in zip(range(count), stream)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_trained_loss_equals_online_loss(tmp_path, float32_cache, dtype):
    cache = float32_cache
    if dtype == "bfloat16":
        cache = tmp_path / "bf16"
        write_cache(cache, TRAIN, 4)
    mask_token_id = ShareGPTDataModule(tokenizer=DEMO_TARGET).mask_token_id
    groups = dict(
        drafter=DrafterConfig(mask_token_id=mask_token_id, max_anchors=8),
        training=TrainingArgs(anchor_budget="per_document"),
    )
    online = DSparkModule(TargetArgs(DEMO_TARGET), **groups)
    cached = DSparkModule(TargetArgs(DEMO_TARGET, features="cache"), **groups)
    assert isinstance(cached.target, TargetHeads) and not hasattr(cached.target, "model")
    cached.drafter.load_state_dict(online.drafter.state_dict())

    rows = online_rows(4)
    online_batches = [{k: torch.stack([r[k] for r in rows[i : i + 2]]) for k in rows[0]} for i in (0, 2)]
    cached_batches = list(CachedFeatureDataset(cache, batch_size=2))
    for online_batch, cached_batch in zip(online_batches, cached_batches):
        for key, value in online_batch.items():  # same packed samples, same dtypes as the online stream
            assert torch.equal(cached_batch[key], value) and cached_batch[key].dtype == value.dtype, key
        loss_online = online.shared_step(online_batch, torch.Generator().manual_seed(3)).loss
        loss_cached = cached.shared_step(cached_batch, torch.Generator().manual_seed(3)).loss
        if dtype == "float32":
            torch.testing.assert_close(loss_cached, loss_online, rtol=1e-6, atol=1e-6)
        else:  # bf16 features: close, not equal
            torch.testing.assert_close(loss_cached, loss_online, rtol=2e-2, atol=2e-2)
        loss_cached.backward()  # the drafter trains from cached features
    assert cached.drafter.backbone.fc.weight.grad is not None


def test_cache_reader_shards_disjointly_across_two_ranks_and_workers(float32_cache):
    everything = set(range(6))
    for shuffle in (False, True):
        per_rank = [CachedFeatureDataset(float32_cache, 2, shuffle, seed=1, rank=r, world_size=2) for r in (0, 1)]
        samples = [[s for batch in ds.batches() for s in batch] for ds in per_rank]
        assert not set(samples[0]) & set(samples[1])
        assert len(samples[0]) == len(samples[1]) == 3
        assert set(samples[0]) | set(samples[1]) == everything
    # evaluation order (no shuffle) drops nothing even when the ranks get different counts
    uneven = [CachedFeatureDataset(float32_cache, 2, False, rank=r, world_size=4).sample_order() for r in range(4)]
    assert sorted(s for order in uneven for s in order) == sorted(everything)
    # training: same batch sequence with 0 or 2 DataLoader workers; epochs reshuffle
    dataset = CachedFeatureDataset(float32_cache, 2, shuffle=True, seed=1, rank=0, world_size=1)
    single = [b["input_ids"] for b in DataLoader(dataset, batch_size=None, num_workers=0)]
    workers = [b["input_ids"] for b in DataLoader(dataset, batch_size=None, num_workers=2)]
    assert len(single) == len(workers) == 3 and all(torch.equal(a, b) for a, b in zip(single, workers))
    first = dataset.sample_order()
    dataset.set_epoch(1)
    assert dataset.sample_order() != first and sorted(dataset.sample_order()) == sorted(first)
    dataset.skip_batches = 2  # resuming mid-epoch skips by index
    assert len(list(dataset)) == 1


def test_cache_writer_estimates_size_and_resumes(tmp_path, capsys):
    output = tmp_path / "cache"
    index = write_cache(output, TRAIN, 6)
    printed = capsys.readouterr().out
    per_sample = bytes_per_sample(SEQ_LEN, 128, 1, "bfloat16")
    assert f"size estimate: 6 packed samples x {per_sample / 1024:.1f} KiB" in printed
    shard_bytes = sum((output / s["file"]).stat().st_size for s in index["shards"])
    assert 6 * per_sample <= shard_bytes < 6 * per_sample + 8192  # estimate = data; headers are small
    assert [s["num_samples"] for s in index["shards"]] == [4, 2] and index["complete"]
    reference = CachedFeatureDataset(output, 6).read(range(6))

    # an interrupted run: the last shard never made it, the index says incomplete
    index["shards"], index["complete"] = index["shards"][:1], False
    (output / "index.json").write_text(json.dumps(index))
    (output / "features-00001.safetensors").unlink()
    write_cache(output, TRAIN, 6)
    assert "resuming: 4 samples in 1 finished shards are kept" in capsys.readouterr().out
    resumed = CachedFeatureDataset(output, 6).read(range(6))
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    with pytest.raises(ValueError, match="other settings"):
        write_cache(output, TRAIN, 5)


def test_target_heads_load_only_embedding_and_lm_head(tmp_path):
    from helpers.targets import make_tiny_qwen3

    model = make_tiny_qwen3()  # untied LM head, saved in several safetensors shards
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    heads = TargetHeads.from_pretrained(str(tmp_path), num_draft_layers=2)
    full = FrozenTarget(model, num_draft_layers=2)
    assert heads.target_layer_ids == full.target_layer_ids and heads.vocab_size == full.vocab_size
    assert torch.equal(heads.embed_tokens.weight, full.embed_tokens.weight)
    assert torch.equal(heads.lm_head.weight, full.lm_head.weight)
    assert heads.lm_head.weight is not heads.embed_tokens.weight
    assert sum(p.numel() for p in heads.parameters()) == 2 * 64 * 32
    tied = TargetHeads.from_pretrained(DEMO_TARGET)
    assert tied.lm_head.weight is tied.embed_tokens.weight and not tied.lm_head.weight.requires_grad


def test_fit_from_cache_with_the_cli(tmp_path):
    """README "Scaling up" at demo scale: write train and val caches, fit with configs/cache.yaml, validate."""
    write_cache(tmp_path / "train", TRAIN, 8)
    write_cache(tmp_path / "val", VAL, 4)
    args = [
        "--config", str(ROOT / "configs/quickstart.yaml"), "--config", str(ROOT / "configs/cache.yaml"),
        f"--model.target.path={DEMO_TARGET}", f"--data.train_cache={tmp_path / 'train'}",
        f"--data.val_cache={tmp_path / 'val'}", f"--data.val_files={VAL}", "--data.batch_size=2",
        "--model.drafter.max_anchors=8", "--model.training.anchor_budget=per_document", "--trainer.max_steps=3",
        "--trainer.val_check_interval=3", "--trainer.limit_val_batches=2", "--trainer.callbacks=[]",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
    ]  # fmt: skip
    cli = cli_main(["fit", *args])
    metrics = cli.trainer.callback_metrics
    assert isinstance(cli.model.target, TargetHeads)
    assert 0 < float(metrics["train/anchor_coverage"]) <= 1 and 0 < float(metrics["val/anchor_coverage"]) <= 1
    assert float(metrics["val/tau"]) >= 1.0
    with pytest.raises(ValueError, match="target layers"):
        cli_main(["validate", *args, "--model.drafter.target_layer_ids=[1]"])
