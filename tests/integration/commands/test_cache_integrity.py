"""A cache knows its shards: index.json records each one's byte size and BLAKE2b digest (checked against hashlib
here, not against the writer's own helper); a shard cut short is named when fit opens the cache, before a step; a
flipped byte when the shard is first read, and by ``cache --verify``; a cache from before the record still loads."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

import pytest
from helpers.paths import ROOT
from test_cache import DEMO_TARGET, TRAIN, VAL, write_cache

from dspark_lightning.cli import cli_main
from dspark_lightning.data.cache import CachedFeatureDataset
from dspark_lightning.data.cache_integrity import CacheDamagedError


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    write_cache(root / "train", TRAIN, 8)  # two shards of four samples
    write_cache(root / "val", VAL, 4)
    return root


def copy(written, tmp_path, name="train"):
    return shutil.copytree(written / name, tmp_path / name)


def fit_args(tmp_path, train, val):
    return [
        "fit", "--config", str(ROOT / "configs/quickstart.yaml"), "--config", str(ROOT / "configs/cache.yaml"),
        f"--model.target.path={DEMO_TARGET}", f"--data.train_cache={train}", f"--data.val_cache={val}",
        f"--data.val_files={VAL}", "--data.batch_size=2", "--model.drafter.max_anchors=8",
        "--model.training.anchor_budget=per_document", "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
        "--trainer.callbacks=[]", "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]  # fmt: skip


def test_the_index_records_each_shards_size_and_digest(written):
    index = json.loads((written / "train/index.json").read_text())
    assert len(index["shards"]) == 2 and not list((written / "train").glob("*.partial"))
    for shard in index["shards"]:
        data = (written / "train" / shard["file"]).read_bytes()
        assert shard["bytes"] == len(data) and shard["blake2b"] == hashlib.blake2b(data).hexdigest()


def test_a_shard_cut_short_is_named_before_the_first_step(written, tmp_path):
    train = copy(written, tmp_path)
    shard = train / "features-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4096])  # a copy that did not finish
    with pytest.raises(CacheDamagedError, match=r"features-00001\.safetensors: \d+ bytes, index.json records \d+ "
                                                r"\(cut short\); copy the shard again"):  # fmt: skip
        cli_main(fit_args(tmp_path, train, written / "val"))
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("*.ckpt"))
    shard.unlink()
    with pytest.raises(CacheDamagedError, match=r"features-00001\.safetensors: the cache shard is missing"):
        CachedFeatureDataset(str(train), batch_size=2)


def test_flipped_bytes_are_named_on_first_read_and_by_verify(written, tmp_path, capsys):
    train = copy(written, tmp_path)
    shard = train / "features-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-8192:-4096] = bytes(b ^ 0xFF for b in data[-8192:-4096])  # 4 KiB of flipped bytes, same size
    shard.write_bytes(bytes(data))
    dataset = CachedFeatureDataset(str(train), batch_size=2)  # sizes agree: opening the cache passes
    with pytest.raises(CacheDamagedError, match=r"features-00000\.safetensors: its blake2b digest differs"):
        next(iter(dataset))
    with pytest.raises(CacheDamagedError, match=r"1 damaged shards"):
        cli_main(["cache", "--verify", str(train)])
    out = capsys.readouterr().out
    assert "1 shards match their recorded size and blake2b digest, 1 damaged, 0 without" in out
    assert "damaged: " in out and "features-00000.safetensors" in out
    assert cli_main(["cache", "--verify", str(written / "train")])["ok"] == [
        "features-00000.safetensors", "features-00001.safetensors",
    ]  # fmt: skip


def test_a_cache_written_before_the_record_loads_with_one_line(written, tmp_path, caplog):
    train = copy(written, tmp_path)
    index = json.loads((train / "index.json").read_text())
    index["shards"] = [{"file": s["file"], "num_samples": s["num_samples"]} for s in index["shards"]]
    (train / "index.json").write_text(json.dumps(index))
    with caplog.at_level(logging.INFO):
        dataset = CachedFeatureDataset(str(train), batch_size=2)
    assert "written before index.json recorded shard sizes and digests" in caplog.text
    assert next(iter(dataset))["input_ids"].shape[0] == 2
    result = cli_main(["cache", "--verify", str(train)])
    assert result["unrecorded"] == ["features-00000.safetensors", "features-00001.safetensors"]


def test_cache_without_its_required_options_or_a_cache_to_verify_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"cache needs --data, --output \(or --verify PATH"):
        cli_main(["cache", "--target", DEMO_TARGET])
    with pytest.raises(ValueError, match=r"--verify .*: not a target cache \(no index.json\)"):
        cli_main(["cache", "--verify", str(tmp_path)])
