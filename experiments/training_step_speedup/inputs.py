"""Inputs of ``bench.py`` (and ``experiments/gemma3_training_step/bench.py``): stand-in target and cache, the format 1 / format 2 cache copies, the exported
older revision, the recipe's optimizer, and the target's forward time (what online mode adds per step)."""

from __future__ import annotations

import json
import statistics
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "configs/smollm2_sharegpt.yaml"


def random_target(shape: dict, directory: Path) -> None:
    """A stand-in target: a Llama config of the given shapes and one tied embedding (all cache mode reads)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        intermediate_size=shape["intermediate"], tie_word_embeddings=True,
    )  # fmt: skip
    config.save_pretrained(directory)
    weight = torch.randn(shape["vocab"], shape["hidden"], generator=torch.Generator().manual_seed(0)) * 0.05
    save_file({"model.embed_tokens.weight": weight}, str(directory / "model.safetensors"))


def synthetic_cache(shape: dict, seq_len: int, rows: int, directory: Path) -> None:
    """A format 1 cache of random features: rows of 4 documents, the first quarter of each outside the loss mask."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    length = seq_len // 4
    documents = (torch.arange(seq_len) // length).clamp(max=3)
    positions = torch.arange(seq_len) - documents * length
    H, n = shape["hidden"], len(shape["layer_ids"])
    tensors = {
        "input_ids": torch.randint(0, shape["vocab"], (rows, seq_len), generator=g, dtype=torch.int32),
        "loss_mask": (positions >= length // 4).expand(rows, -1).contiguous(),
        "document_ids": documents.int().expand(rows, -1).contiguous(),
        "position_ids": positions.int().expand(rows, -1).contiguous(),
        "context_features": torch.randn(rows, seq_len, n * H, generator=g).bfloat16(),
        "final_hidden": torch.randn(rows, seq_len, H, generator=g).bfloat16(),
    }
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "features-00000.safetensors"))
    index = {"format": "dspark-target-cache/1", "target_layer_ids": shape["layer_ids"], "hidden_size": H,
             "seq_len": seq_len, "dtype": "bfloat16", "shards": [{"file": "features-00000.safetensors",
             "num_samples": rows}], "complete": True}  # fmt: skip
    (directory / "index.json").write_text(json.dumps(index))


def cache_copies(source: Path, target: str, rows: int, workdir: Path) -> tuple[Path, Path]:
    """(format 1, format 2) caches of the first ``rows`` samples of ``source``: the statistics of format 2 are what
    the cache writer computes (``full_vocab_stats`` of the stored final hidden state with the target's LM head)."""
    from safetensors.torch import save_file

    from dspark_lightning.data.cache import TEACHER_STAT_FIELDS, CachedFeatureDataset
    from dspark_lightning.models.target import TargetHeads
    from dspark_lightning.models.teacher import full_vocab_stats

    dataset = CachedFeatureDataset(str(source), batch_size=rows)
    batch = dataset.read(range(min(rows, len(dataset.locations))))
    for name in ("input_ids", "document_ids", "position_ids"):  # stored as int32, read back as int64
        batch[name] = batch[name].int()
    for name in TEACHER_STAT_FIELDS:
        batch.pop(name, None)
    head = TargetHeads.from_pretrained(target, dataset.meta["target_layer_ids"]).lm_head.weight
    logsumexp, argmax = full_vocab_stats(batch["final_hidden"], head)
    copies = []
    for version, extra in ((1, {}), (2, dict(zip(TEACHER_STAT_FIELDS, (logsumexp, argmax.int()), strict=True)))):
        directory = workdir / f"cache-v{version}"
        directory.mkdir(parents=True)
        save_file(
            {k: v.contiguous() for k, v in {**batch, **extra}.items()}, str(directory / "features-00000.safetensors")
        )
        meta = {**dataset.meta, "format": f"dspark-target-cache/{version}", "complete": True,
                "shards": [{"file": "features-00000.safetensors", "num_samples": batch["input_ids"].shape[0]}]}  # fmt: skip
        (directory / "index.json").write_text(json.dumps(meta))
        copies.append(directory)
    return copies[0], copies[1]


def export_revision(revision: str, directory: Path) -> Path:
    """The package and recipe configs of a git revision, extracted into ``directory`` (the tree a worker imports)."""
    directory.mkdir(parents=True, exist_ok=True)
    archive = directory / "tree.tar"
    with open(archive, "wb") as handle:
        subprocess.run(["git", "archive", revision, "dspark_lightning", "configs"], cwd=ROOT, stdout=handle, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(directory, filter="data")
    return directory


def target_forward_ms(target: str, cache: Path, threads: int, stand_in: bool, repeats: int = 3) -> float | None:
    """Median ms of the full target's forward over one cached row (no grad): what online mode adds to every step.
    For the stand-in target (only its embedding is stored) a random-weight model of its config; None when neither
    loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dspark_lightning.data.cache import CachedFeatureDataset
    from dspark_lightning.models.target import FrozenTarget

    dataset = CachedFeatureDataset(str(cache), batch_size=1)
    layers = dataset.meta["target_layer_ids"]
    try:
        if stand_in:
            model = FrozenTarget(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(target)), layers)
        else:
            model = FrozenTarget.from_pretrained(target, layers, dtype="auto")
    except (OSError, ValueError, KeyError):
        return None
    batch, previous = dataset.read([0]), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model.features(batch["input_ids"], batch["position_ids"])  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.features(batch["input_ids"], batch["position_ids"])
            times.append((time.perf_counter() - start) * 1e3)
    finally:
        torch.set_num_threads(previous)
    return statistics.median(times)


def recipe_optimizer(tree: Path) -> dict:
    """``model.optimizer.init_args`` of the SmolLM2 recipe in ``tree`` (AdamW is the recipe's class)."""
    import yaml

    config = yaml.safe_load((tree / RECIPE).read_text())
    args = dict(config["model"]["optimizer"]["init_args"])
    return {**args, "betas": tuple(args.get("betas", (0.9, 0.999)))}
