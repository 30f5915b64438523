"""A trained drafter and its data module, rebuilt from a checkpoint written by ``fit``."""

from __future__ import annotations

from dspark_lightning.checks import read_checkpoint
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.dtypes import torch_dtype
from dspark_lightning.lightning.checkpoint import load_checkpoint_module, recorded_path
from dspark_lightning.lightning.frozen_state import WORKING_DIRECTORY

# data options that name local files: relative ones are read from the directory fit ran in when not found from here
DATA_PATH_OPTIONS = ("tokenizer", "train_files", "val_files", "test_files", "train_cache", "val_cache")


def in_dtype(module, dtype: str = "auto"):
    """``module`` (target and drafter, which shares the target's embedding and head) cast to ``dtype`` for
    decoding; ``auto`` keeps the dtypes it was loaded in (the checkpoint's ``target.dtype``). The baseline
    ``generate`` runs on this same target, so a speedup is always speculation against the same dtype and kernels."""
    if dtype == "auto":
        return module
    return module.to(torch_dtype(dtype, ("float32", "bfloat16"), what="--dtype"))


def load_trained(ckpt_path: str, map_location: str = "cpu", **data_overrides):
    """(DSparkModule in eval mode, ShareGPTDataModule) rebuilt from a checkpoint written by ``fit``.

    The model is read with ``weights_only=True`` (our checkpoints hold only tensors and plain hyper-parameters; the
    frozen target is re-loaded from its recorded path); the data module from the hyper-parameters in the same file,
    so a run directory is all that is needed. ``data_overrides`` that are not None replace data module arguments.
    """
    checkpoint = read_checkpoint(ckpt_path)  # a clear error for a missing or non-checkpoint file
    # decoding needs the whole target, also for a drafter trained from an offline feature cache
    module = load_checkpoint_module(
        ckpt_path, checkpoint=checkpoint, where=f"--ckpt_path {ckpt_path}", features="online"
    ).to(map_location)
    data_kwargs = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    data_kwargs.pop("_instantiator", None)
    for option in DATA_PATH_OPTIONS:
        if option in data_kwargs:
            data_kwargs[option] = recorded_path(data_kwargs[option], checkpoint.get(WORKING_DIRECTORY))
    data_kwargs.setdefault("tokenizer", module.target_args.path)
    data_kwargs.update({k: v for k, v in data_overrides.items() if v is not None})
    return module, ShareGPTDataModule(**data_kwargs)
