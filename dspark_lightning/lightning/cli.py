"""The LightningCLI of ``fit``, ``validate`` and ``test`` over ``DSparkModule`` and ``ShareGPTDataModule``.

Below the commands, so a command that trains (``report``, ``loss-study``, ``report-smollm2``) runs exactly what
``dspark-lightning fit`` runs without importing the command table above it.

Values that the data and the model share are linked, never repeated in YAML: the tokenizer is the target's
(``model.target`` -> ``data.tokenizer``), the block size goes to the data module (``model.block_size`` ->
``data.block_size``) and the mask token id comes from the tokenizer (``data.mask_token_id`` ->
``model.mask_token_id``).

Each run writes into its own versioned directory (the first logger's ``save_dir/name/version_N``), claimed with
``os.mkdir`` before anything is written (``lightning/run_dirs.py``), so runs of one name started together never share
or clobber one.

``--ckpt_path`` is read with ``weights_only=True`` and checked before anything is built: a file that is not a
checkpoint, or one holding NaN/inf weights, is refused. Resuming (or validating) never silently replaces model
arguments: a model argument whose value differs from the checkpoint's hyper-parameter is an error naming it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from lightning.pytorch.cli import LightningCLI

from dspark_lightning.checks import check_finite_state, read_checkpoint
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.lightning.module import DSparkModule
from dspark_lightning.lightning.run_dirs import ClaimRunDirectory
from dspark_lightning.models.markov import markov_config_from, markov_config_to_dict

LIGHTNING_COMMANDS = {
    "fit": "train a drafter (LightningCLI: --config YAML, --model.*, --data.*, --trainer.*)",
    "validate": "validate a checkpoint (--ckpt_path) on the validation data",
    "test": "test a checkpoint (--ckpt_path) on the test data",
}


class DSparkCLI(LightningCLI):
    def _parse_ckpt_path(self) -> None:
        """Lightning replaces the model config by the checkpoint's hyper-parameters; refuse when that changes any."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or (ckpt_path in ("last", "best", "hpc", "registry") and not os.path.exists(ckpt_path)):
            return super()._parse_ckpt_path()
        check_finite_state(read_checkpoint(ckpt_path)["state_dict"], f"--ckpt_path {ckpt_path}")
        given = self.config[subcommand].model.clone()
        super()._parse_ckpt_path()
        differing = model_argument_differences(given, self.config[subcommand].model)
        if differing:
            listed = "; ".join(
                f"--model.{key}: given {mine!r}, checkpoint {theirs!r}" for key, mine, theirs in differing
            )
            raise ValueError(
                f"--ckpt_path {ckpt_path} was trained with other model arguments, which it would silently replace: "
                f"{listed}. Drop these arguments (or set them to the checkpoint's values), or start a new run."
            )

    def instantiate_trainer(self, **kwargs):
        trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.insert(0, ClaimRunDirectory())  # before SaveConfigCallback reads trainer.log_dir
        return trainer

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.target", "data.tokenizer", apply_on="parse")
        parser.link_arguments("model.trust_remote_code", "data.trust_remote_code", apply_on="parse")
        parser.link_arguments("model.block_size", "data.block_size", apply_on="parse")
        parser.link_arguments("data.mask_token_id", "model.mask_token_id", apply_on="instantiate")


def model_argument_differences(given, from_checkpoint) -> list[tuple[str, object, object]]:
    """``(name, given value, checkpoint value)`` for every top-level model argument the checkpoint changes."""
    mine, theirs = given.as_dict(), from_checkpoint.as_dict()
    for values in (mine, theirs):
        values.pop("mask_token_id", None)  # linked from the data module when the model is built, never given
        if values.get("markov_head") is not None:  # class_path + init_args or the checkpoint's plain dict: one form
            values["markov_head"] = markov_config_to_dict(markov_config_from(values["markov_head"]))
    keys = sorted(k for k in set(mine) | set(theirs) if not k.startswith("_"))
    return [(key, mine.get(key), theirs.get(key)) for key in keys if mine.get(key) != theirs.get(key)]


def lightning_main(args: Sequence[str] | None = None, run: bool = True, epilog: str | None = None) -> DSparkCLI:
    """``fit`` / ``validate`` / ``test`` (``args`` as on the command line, default ``sys.argv[1:]``); the CLI object.

    ``run=False`` parses and builds the model, data module and trainer without running a subcommand (no subcommand
    word in ``args`` then).
    """
    return DSparkCLI(
        DSparkModule,
        ShareGPTDataModule,
        args=None if args is None else list(args),
        run=run,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": False},
        parser_kwargs={"epilog": epilog} if epilog else {},
    )
