"""A fit's console carries no warning about what is on purpose: the frozen target's eval mode, W&B's anonymous key."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
from helpers import hostile

from dspark_lightning.lightning.module import DSparkModule
from dspark_lightning.lightning.wandb import OfflineFirstWandbLogger

EVAL_MODE = "module(s) in eval mode at the start of training"


def fit_warnings(tmp_path, leave_in_eval: str | None) -> tuple[list[str], DSparkModule]:
    data = hostile.datamodule(hostile.TRAIN)
    module = DSparkModule(target={"path": hostile.TARGET}, drafter={"mask_token_id": data.mask_token_id})
    if leave_in_eval:
        module.get_submodule(leave_in_eval).eval()  # a user's mistake that the warning exists for
    trainer = L.Trainer(
        max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=data)
    return [str(w.message) for w in caught], module


def test_the_frozen_target_in_eval_mode_is_not_warned_about(tmp_path):
    messages, module = fit_warnings(tmp_path, None)
    assert not [m for m in messages if EVAL_MODE in m]
    assert not module.target.model.training  # still frozen: the warning was silenced, not the mode changed


def test_a_drafter_module_left_in_eval_mode_still_is(tmp_path):
    messages, module = fit_warnings(tmp_path, "drafter.backbone")
    (message,) = [m for m in messages if EVAL_MODE in m]
    in_eval = [name for name, m in module.named_modules() if not m.training]
    assert message.startswith(f"Found {len(in_eval)} module(s)") and "drafter.backbone" in in_eval


@pytest.mark.parametrize(("anonymous", "kept"), [(None, False), (True, True)])
def test_the_wandb_logger_passes_anonymous_only_when_asked(anonymous, kept, tmp_path):
    logger = OfflineFirstWandbLogger(save_dir=str(tmp_path), anonymous=anonymous)
    assert ("anonymous" in logger._wandb_init) is kept
