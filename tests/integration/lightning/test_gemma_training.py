"""Training against a Gemma 3 target from an offline feature cache equals training online (docs/design/design.md §11).

A tiny random Gemma 3 (``helpers/targets.py``) with the demo tokenizer is saved as a target directory and cached by
``dspark-lightning cache`` (float32 features). In cache mode only its config, embedding and LM head are loaded: the
embedding must still scale by sqrt(hidden) as Gemma's does, or the drafter sees other block inputs than online. The
cache's teacher statistics must be those of the target's own logits (soft-capped where the target caps them).
"""

from __future__ import annotations

import pytest
import torch
from helpers.export import save_gemma_verifier
from helpers.paths import ASSETS

from dspark_lightning.cli import cli_main
from dspark_lightning.data.cache import TEACHER_STAT_FIELDS, TOKEN_FIELDS, CachedFeatureDataset
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.lightning.config import TargetArgs, TrainingArgs
from dspark_lightning.lightning.module import DSparkModule
from dspark_lightning.models import DrafterConfig
from dspark_lightning.models.target import TargetHeads

TRAIN = str(ASSETS / "data/regenerated/train-00000.jsonl")
LAYERS = [1, 3]


@pytest.mark.parametrize("softcap", [None, 0.3], ids=["gemma3", "softcapped"])
def test_cache_and_online_training_agree_on_a_gemma3_target(tmp_path, softcap):
    target = tmp_path / "gemma3"
    model = save_gemma_verifier(target, final_logit_softcapping=softcap)
    cache = tmp_path / "cache"
    cli_main(["cache", "--target", str(target), "--data", TRAIN, "--output", str(cache), "--seq_len", "128",
              "--batch_size", "2", "--limit", "4", "--device", "cpu", "--dtype", "float32", "--layers", str(LAYERS)])  # fmt: skip
    batches = list(CachedFeatureDataset(cache, batch_size=2))
    assert len(batches) == 2

    # the stored statistics are the target's own logits' (its forward soft-caps them when it has a cap)
    for batch in batches:
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        torch.testing.assert_close(batch[TEACHER_STAT_FIELDS[0]], torch.logsumexp(logits, -1), rtol=1e-5, atol=1e-5)
        picked = logits.gather(-1, batch[TEACHER_STAT_FIELDS[1]][..., None])[..., 0]
        torch.testing.assert_close(picked, logits.max(-1).values, rtol=0, atol=1e-5)  # the argmax, up to near-ties

    mask_token_id = ShareGPTDataModule(tokenizer=str(target)).mask_token_id
    groups = dict(
        drafter=DrafterConfig(mask_token_id=mask_token_id, max_anchors=8, target_layer_ids=LAYERS),
        training=TrainingArgs(anchor_budget="per_document"),
    )
    online = DSparkModule(TargetArgs(str(target)), **groups)
    cached = DSparkModule(TargetArgs(str(target), features="cache"), **groups)
    assert isinstance(cached.target, TargetHeads) and not hasattr(cached.target, "model")
    cached.drafter.load_state_dict(online.drafter.state_dict())
    anchors = torch.tensor([[3, 77], [120, 5]])
    torch.testing.assert_close(cached.drafter._block_embeddings(anchors), online.drafter._block_embeddings(anchors))
    for batch in batches:
        online_batch = {key: batch[key] for key in TOKEN_FIELDS}  # the online module runs the target itself
        loss_online = online.shared_step(online_batch, torch.Generator().manual_seed(3)).loss
        loss_cached = cached.shared_step(batch, torch.Generator().manual_seed(3)).loss
        torch.testing.assert_close(loss_cached, loss_online, rtol=1e-6, atol=1e-6)
        loss_cached.backward()  # the drafter trains from the cached features
    assert cached.drafter.backbone.fc.weight.grad is not None
