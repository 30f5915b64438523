"""The one way to rebuild a trained ``DSparkModule`` from a checkpoint written by ``fit`` (export, decode, calibrate).

Checkpoints hold only the trainable drafter state (the frozen target is dropped on save), so the module is rebuilt
from the recorded hyper-parameters, which re-loads the target, and the drafter state is loaded on top; every trainable
tensor must be present and nothing unexpected may be left over. Relative paths among the hyper-parameters (target,
draft vocabulary, data files) are read from the directory ``fit`` ran in when they are not found from here.
"""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path

from safetensors.torch import save_file

from dspark_lightning.checks import check_finite_state, read_checkpoint
from dspark_lightning.errors import OptionError
from dspark_lightning.lightning.config import migrate_hparams
from dspark_lightning.lightning.frozen_state import WORKING_DIRECTORY
from dspark_lightning.lightning.module import DSparkModule


def load_checkpoint_module(
    ckpt_path: str | os.PathLike,
    target: str | None = None,
    *,
    checkpoint: dict | None = None,
    where: str | None = None,
    features: str | None = None,
) -> DSparkModule:
    """Rebuild the ``DSparkModule`` of a Lightning checkpoint, in eval mode, on the CPU.

    ``target`` overrides the recorded target path and ``features`` the recorded ``target.features`` (``online`` to
    decode with a drafter trained from a feature cache). ``checkpoint`` is the already-read checkpoint dict, if the
    caller has it; ``where`` names it in the non-finite error. Checkpoints written before the config groups load too
    (``lightning/config.py: migrate_hparams``).
    """
    checkpoint = read_checkpoint(ckpt_path) if checkpoint is None else checkpoint
    where = where or f"checkpoint {ckpt_path}"
    if not isinstance(checkpoint.get("hyper_parameters"), dict):  # a bare state dict, or another LightningModule's
        raise OptionError(
            f"{where}: no hyper_parameters in the file, so no drafter can be rebuilt from it "
            "(expected a checkpoint written by `dspark-lightning fit`, which records them)"
        )
    hparams = {name: dict(group) for name, group in migrate_hparams(checkpoint["hyper_parameters"]).items()}
    hparams["training"]["compile"] = False
    hparams = with_recorded_paths(hparams, checkpoint.get(WORKING_DIRECTORY))
    if target is not None:
        hparams["target"]["path"] = target
    if features is not None:
        hparams["target"]["features"] = features
    state = checkpoint["state_dict"]
    # never export, decode or calibrate a diverged drafter (checked before the target is loaded)
    check_finite_state(state, where)
    with tempfile.TemporaryDirectory() as tmp:
        drafter = hparams["drafter"]
        vocab_path = drafter.get("draft_vocab")
        if vocab_path and not Path(vocab_path).is_file() and "drafter.draft_vocab.d2t" in state:
            drafter["draft_vocab"] = str(Path(tmp) / "draft_vocab.safetensors")  # the file moved: use the ckpt's d2t
            save_file({"d2t": state["drafter.draft_vocab.d2t"].contiguous()}, drafter["draft_vocab"])
        module = DSparkModule(**hparams)
    mismatch = module.trainable_state_mismatch(state)
    if mismatch:
        raise OptionError(f"{where} does not match the drafter its hyper-parameters describe: {mismatch}")
    module.load_state_dict(state, strict=False)
    return module.eval()


MODEL_PATH_OPTIONS = (("target", "path"), ("drafter", "draft_vocab"))  # model options that may name local paths


def with_recorded_paths(hparams: dict, base: str | None) -> dict:
    """``hparams`` (groups of a checkpoint's model options) with each relative path of ``MODEL_PATH_OPTIONS`` read as
    ``recorded_path`` reads it; the groups are copied, the checkpoint's own dicts are left as they were."""
    hparams = dict(hparams)
    for group, option in MODEL_PATH_OPTIONS:
        if isinstance(hparams.get(group), dict) and hparams[group].get(option):
            hparams[group] = hparams[group] | {option: recorded_path(hparams[group][option], base)}
    return hparams


def recorded_path(value, base: str | None):
    """A path (glob, or list of them) that ``fit`` recorded relative to its working directory ``base``, as a path
    from here: unchanged when it is found from here (or is absolute, a hub id, a ``pkg:`` source, or None)."""
    if isinstance(value, list):
        return [recorded_path(item, base) for item in value]
    if not isinstance(value, str) or base is None or os.path.isabs(value) or _found(value):
        return value
    rebased = os.path.join(base, value)
    return rebased if _found(rebased) else value  # not there either: a hub id, or a file that is gone (named later)


def _found(path: str) -> bool:
    return os.path.exists(path) or bool(glob.glob(path))
