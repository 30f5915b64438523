"""Offline target cache: written once, read sharded, and training from it equals training online."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.paths import ROOT
from torch.utils.data import DataLoader

import dspark_lightning.models.drafter as drafter_module
from dspark_lightning.cli import cli_main
from dspark_lightning.data.cache import CACHE_FORMAT, TEACHER_STAT_FIELDS, CachedFeatureDataset, bytes_per_sample
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.lightning.config import TargetArgs, TrainingArgs
from dspark_lightning.lightning.module import DSparkModule
from dspark_lightning.models import DrafterConfig
from dspark_lightning.models.target import FrozenTarget, TargetHeads, load_causal_lm
from dspark_lightning.models.teacher import full_vocab_stats

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


def test_cache_writer_stores_the_teacher_statistics(float32_cache):
    """Per position: logsumexp and argmax of the target's logits over its whole vocabulary (format 2)."""
    index = json.loads((float32_cache / "index.json").read_text())
    assert index["format"] == CACHE_FORMAT == "dspark-target-cache/2"
    batch = CachedFeatureDataset(float32_cache, 6).read(range(6))
    assert batch["final_logsumexp"].dtype == torch.float32 and batch["final_logsumexp"].shape == (6, SEQ_LEN)
    assert batch["final_argmax"].dtype == torch.long and batch["final_argmax"].shape == (6, SEQ_LEN)
    head = load_causal_lm(DEMO_TARGET).lm_head.weight.double()
    logits = batch["final_hidden"].double() @ head.T  # float64, from the stored final hidden state
    torch.testing.assert_close(batch["final_logsumexp"].double(), torch.logsumexp(logits, -1), rtol=1e-6, atol=1e-5)
    assert torch.equal(batch["final_argmax"], logits.argmax(-1))


def format_1_copy(cache: Path, output: Path) -> Path:
    """The same samples as a cache written before the teacher statistics existed (format 1)."""
    from safetensors.torch import load_file, save_file

    output.mkdir()
    index = json.loads((cache / "index.json").read_text()) | {"format": "dspark-target-cache/1"}
    # as format 1 was written: no byte sizes or digests either
    index["shards"] = [{"file": s["file"], "num_samples": s["num_samples"]} for s in index["shards"]]
    for shard in index["shards"]:
        tensors = load_file(str(cache / shard["file"]))
        save_file({k: v for k, v in tensors.items() if k not in TEACHER_STAT_FIELDS}, str(output / shard["file"]))
    (output / "index.json").write_text(json.dumps(index))
    return output


def test_format_1_cache_trains_through_the_full_vocabulary_teacher(tmp_path, float32_cache, monkeypatch):
    from safetensors.torch import save_file

    old = format_1_copy(float32_cache, tmp_path / "format1")
    assert not CachedFeatureDataset([old, float32_cache], 2).teacher_stats  # a mixed list falls back too
    vocab = tmp_path / "draft_vocab.safetensors"
    save_file({"d2t": torch.arange(0, 2048, 4)}, str(vocab))  # Vd = V / 4
    mask_token_id = ShareGPTDataModule(tokenizer=DEMO_TARGET).mask_token_id
    drafter = DrafterConfig(mask_token_id=mask_token_id, max_anchors=8, draft_vocab=str(vocab))
    module = DSparkModule(TargetArgs(DEMO_TARGET, features="cache"), drafter)
    results = {}
    for name, cache in (("format 1", old), ("format 2", float32_cache)):
        batch = next(iter(CachedFeatureDataset(cache, batch_size=2)))
        assert (TEACHER_STAT_FIELDS[0] in batch) == (name == "format 2")
        if name == "format 2":  # the LM head runs over the draft rows only
            monkeypatch.setattr(drafter_module, "full_vocab_teacher", None)
        module.zero_grad(set_to_none=True)
        loss = module.shared_step(batch, torch.Generator().manual_seed(3)).loss
        loss.backward()
        results[name] = loss.detach(), {n: p.grad for n, p in module.drafter.named_parameters() if p.grad is not None}
    (loss_1, grads_1), (loss_2, grads_2) = results.values()
    torch.testing.assert_close(loss_2, loss_1, rtol=1e-5, atol=1e-6)
    assert grads_1.keys() == grads_2.keys() and grads_1
    for name, grad in grads_2.items():
        torch.testing.assert_close(grad, grads_1[name], rtol=1e-4, atol=1e-6, msg=name)


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
    assert bytes_per_sample(SEQ_LEN, 128, 1, "bfloat16", teacher_stats=False) == per_sample - 8 * SEQ_LEN
    stored = CachedFeatureDataset(output, 6).read(range(6))  # statistics of the stored (bf16-rounded) final hidden
    head = TargetHeads.from_pretrained(DEMO_TARGET).lm_head.weight
    logsumexp, argmax = full_vocab_stats(stored["final_hidden"], head)
    torch.testing.assert_close(stored["final_logsumexp"], logsumexp, rtol=1e-6, atol=1e-6)
    assert torch.equal(stored["final_argmax"], argmax)
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


def test_cache_shows_progress_with_an_eta(tmp_path, capsys):
    write_cache(tmp_path / "progress", TRAIN, 6)
    err = capsys.readouterr().err
    assert "cache" in err and "6/6" in err and "samples" in err and "ETA" in err  # rich draws it once off a terminal
