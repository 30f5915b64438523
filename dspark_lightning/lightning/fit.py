"""The LightningCLI of ``fit``, ``validate`` and ``test`` over ``DSparkModule`` and ``ShareGPTDataModule``: below the
command table, so a command that trains (``report``, ``loss-study``, ``report-recipe``) runs what ``fit`` runs without
importing it. Options, linked values and run directories: docs/guides/train_and_evaluate.md; ``--ckpt_path`` checks,
the resume rule and run directories: docs/guides/reliability.md.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from jsonargparse import set_parsing_settings
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from dspark_lightning.checks import check_finite_state, read_checkpoint
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.errors import OptionError
from dspark_lightning.lightning.checkpoint import with_recorded_paths
from dspark_lightning.lightning.config import GROUPS, migrate_hparams
from dspark_lightning.lightning.frozen_state import WORKING_DIRECTORY
from dspark_lightning.lightning.module import DSparkModule
from dspark_lightning.lightning.precision import Trainer
from dspark_lightning.lightning.run_dirs import (
    DATA_FORMAT_FILE,
    ClaimRunDirectory,
    claim_config_file,
    claim_run_directories,
    remove_unstarted_config_files,
    remove_unstarted_run_directories,
    versioned_local_loggers,
)
from dspark_lightning.shipped import config_path

LIGHTNING_COMMANDS = {
    "fit": "train a drafter (LightningCLI: --config YAML, --model.*, --data.*, --trainer.*)",
    "validate": "validate a checkpoint (--ckpt_path) on the validation data",
    "test": "test a checkpoint (--ckpt_path) on the test data",
}


LINKED_MASK_TOKEN_ID = "--model.drafter.mask_token_id"


class SaveConfigAndDataFormat(SaveConfigCallback):
    """LightningCLI's ``config.yaml``, and next to it ``data_format.json``: the format the run reads its records in
    (``data.format`` with ``auto`` resolved, what was asked for, why, and whether the tokenizer has a chat template;
    docs/design/data.md §1.5). Written by rank 0, once, like the config.

    The config file is claimed first (``run_dirs.claim_config_file``): a versioned run's directory is new, but a run
    without a versioned logger writes into ``--trainer.default_root_dir`` itself, where an earlier run may be."""

    claimed_config: Path | None = None  # the config.yaml this run created (removed if it fails before a step)

    def setup(self, trainer, pl_module, stage: str) -> None:
        first = not self.already_saved
        # on every rank: trainer.log_dir broadcasts rank 0's directory, so asking on rank 0 alone (save_config runs
        # there only) deadlocks DDP
        log_dir = trainer.log_dir if first else None
        if first and self.save_to_log_dir and log_dir is not None:
            path = Path(log_dir) / self.config_filename
            claimed = claim_config_file(path) if trainer.is_global_zero else True
            if not trainer.strategy.broadcast(claimed):
                raise OptionError(
                    f"{log_dir} holds another run's {self.config_filename}: a run without a CSV/TensorBoard logger "
                    "(--trainer.logger false) writes straight into --trainer.default_root_dir; give a new folder, "
                    "or keep a logger (each run then gets a fresh version_N)"
                )
            # a version_N directory is removed whole when the run fails early; a shared folder loses only these files
            unversioned = trainer.is_global_zero and not versioned_local_loggers(trainer.loggers)
            self.claimed_config = path if unversioned else None
            self.overwrite = True  # the file is the empty one just claimed
        super().setup(trainer, pl_module, stage)
        datamodule = trainer.datamodule
        if first and trainer.is_global_zero and log_dir is not None and isinstance(datamodule, ShareGPTDataModule):
            path = Path(log_dir) / DATA_FORMAT_FILE
            path.write_text(json.dumps(datamodule.data_format.describe(), indent=2) + "\n")


class DSparkCLI(LightningCLI):
    """LightningCLI with the project's links between model and data options and its checks of ``--ckpt_path``."""

    def _parse_ckpt_path(self) -> None:
        """Lightning replaces the model config by the checkpoint's hyper-parameters; refuse when that changes any."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path and subcommand in ("validate", "test"):  # legal (an untrained baseline), rarely meant
            rank_zero_warn(
                f"{subcommand} without --ckpt_path measures the drafter as initialised, untrained; pass "
                "--ckpt_path runs/<name>/version_N/checkpoints/last.ckpt to measure a trained one"
            )
        if not ckpt_path or (ckpt_path in ("last", "best", "hpc", "registry") and not os.path.exists(ckpt_path)):
            return super()._parse_ckpt_path()
        data = self.config[subcommand].get("data")
        if subcommand in ("validate", "test") and data is not None and not (data.val_files or data.test_files):
            if not (data.train_files and data.split_by_id):  # Lightning restores the model's options, not the data's
                run_config = Path(ckpt_path).parent.parent / "config.yaml"
                given = f"--config {run_config} (the run's own)" if run_config.is_file() else "the run's --config"
                files = "data.val_files" if subcommand == "validate" else "data.test_files (or data.val_files)"
                raise OptionError(
                    f"{subcommand} --ckpt_path {ckpt_path}: no {files} configured (a checkpoint restores the "
                    f"model's options, not the data's); pass {given} or --{files.split()[0]}"
                )
        checkpoint = read_checkpoint(ckpt_path)
        check_finite_state(checkpoint["state_dict"], f"--ckpt_path {ckpt_path}")
        given = self.config[subcommand].model.clone()
        # what Lightning's own _parse_ckpt_path does, after moving old flat hyper-parameters into their groups
        hparams = migrate_hparams(checkpoint.get("hyper_parameters", {}))
        hparams = with_recorded_paths(hparams, checkpoint.get(WORKING_DIRECTORY))  # as decode reads them
        if hparams:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        # an option left at its default was not given: `validate --ckpt_path X` alone takes the checkpoint's values
        defaults = self._subcommand_parsers[subcommand].get_defaults().model
        differing = model_argument_differences(given, self.config[subcommand].model, defaults)
        if differing:
            listed = "; ".join(
                f"--model.{key}: given {mine!r}, checkpoint {theirs!r}" for key, mine, theirs in differing
            )
            raise OptionError(
                f"--ckpt_path {ckpt_path} was trained with other model arguments, which it would silently replace: "
                f"{listed}. Drop these arguments (or set them to the checkpoint's values), or start a new run."
            )

    def parse_arguments(self, parser, args) -> None:
        given = sys.argv[1:] if args is None else args
        if isinstance(given, (list, tuple)) and any(str(a).startswith(LINKED_MASK_TOKEN_ID) for a in given):
            # jsonargparse would say "int | None is not callable" about the link
            raise OptionError(
                f"{LINKED_MASK_TOKEN_ID} is linked from the tokenizer's mask token, not set directly; choose the "
                "token with --data.mask_token (a token string of the target's vocabulary)"
            )
        super().parse_arguments(parser, args)

    def instantiate_classes(self) -> None:
        # the data module is cheap to build (its tokenizer loads lazily): check the data this stage reads before the
        # model loads its target, which takes minutes for a large one
        checked = None
        if self.subcommand in LIGHTNING_COMMANDS:
            checked = ShareGPTDataModule(**self._get(self.config, "data").as_dict())
            checked.check_sources(self.subcommand, configured_only=True)
        try:
            super().instantiate_classes()
        except ValueError as error:
            raise (option_error_in_union(error) or error) from None
        if checked is not None and checked.resolved_format is not None:  # from the same options: logged once
            self.datamodule.adopt_format(checked.resolved_format)

    def instantiate_trainer(self, **kwargs):
        # the loggers exist (jsonargparse built them), nothing has read a version yet: claim the run directories now
        trainer_options = self._get(self.config_init, "trainer", default={})
        self.claimed_run_dirs = claim_run_directories(trainer_options.get("logger"))
        step_aside(trainer_options)
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ValueError) as error:  # e.g. --trainer.max_steps -5: one line, no traceback
            remove_unstarted_run_directories(self.claimed_run_dirs)  # nothing ran: leave no empty run behind
            raise OptionError(f"--trainer options: {str(error).splitlines()[0]}") from None
        trainer.callbacks.insert(0, ClaimRunDirectory())  # other ranks take rank 0's versions before anything writes
        return trainer

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            if self.trainer.global_step == 0:  # a run that never took a step leaves no directory behind
                for directory in remove_unstarted_run_directories(getattr(self, "claimed_run_dirs", [])):
                    logging.getLogger(__name__).info("removed %s: the run failed before its first step", directory)
                saving = [c for c in self.trainer.callbacks if isinstance(c, SaveConfigAndDataFormat)]
                claimed = [c.claimed_config for c in saving if c.claimed_config is not None]
                for file in remove_unstarted_config_files(claimed):
                    logging.getLogger(__name__).info("removed %s: the run failed before its first step", file)
            raise

    def add_arguments_to_parser(self, parser) -> None:
        # values the data and the model share are linked, never repeated in YAML
        parser.link_arguments("model.target.path", "data.tokenizer", apply_on="parse")
        parser.link_arguments("model.target.trust_remote_code", "data.trust_remote_code", apply_on="parse")
        parser.link_arguments("model.drafter.block_size", "data.block_size", apply_on="parse")
        parser.link_arguments("data.mask_token_id", "model.drafter.mask_token_id", apply_on="instantiate")


def step_aside(trainer_options) -> None:
    """Callbacks the trainer flags leave nothing to do for are dropped with one line each, instead of Lightning's
    exception: ``LearningRateMonitor`` without a logger (``--trainer.logger false``), a progress bar with
    ``--trainer.enable_progress_bar false``."""
    callbacks = trainer_options.get("callbacks")
    if not isinstance(callbacks, list):
        return
    drop = []
    if trainer_options.get("logger") in (False, None, []):
        drop += [(c, "--trainer.logger false: no logger to write learning rates to") for c in callbacks
                 if isinstance(c, LearningRateMonitor)]  # fmt: skip
    if trainer_options.get("enable_progress_bar") is False:
        drop += [(c, "--trainer.enable_progress_bar false") for c in callbacks if isinstance(c, ProgressBar)]
    for callback, reason in drop:
        callbacks.remove(callback)
        print(f"{type(callback).__name__} is off: {reason}", flush=True)


def option_error_in_union(error: ValueError) -> OptionError | None:
    """jsonargparse reports an ``OptionError`` raised inside an ``X | None`` option (the Markov head group) as a
    union mismatch listing every subtype's error: the one that names a ``model.`` option is the user's."""
    if not str(error).startswith("Does not validate against any of the Union subtypes"):
        return None
    ours = [line.strip().removeprefix("- ") for line in str(error).splitlines() if line.strip().startswith("- model.")]
    return OptionError(ours[0]) if ours else None


def model_argument_differences(given, from_checkpoint, defaults=None) -> list[tuple[str, object, object]]:
    """``(group.field, given value, checkpoint value)`` for every model option the checkpoint changes; with
    ``defaults``, options whose given value is the default count as not given."""
    mine, theirs = _flat_options(given.as_dict()), _flat_options(from_checkpoint.as_dict())
    unset = _flat_options(defaults.as_dict()) if defaults is not None else {}
    for values in (mine, theirs):
        values.pop("drafter.mask_token_id", None)  # linked from the data module when the model is built, never given
    keys = sorted(k for k in set(mine) | set(theirs) if not k.startswith("_"))
    return [
        (key, mine.get(key), theirs.get(key))
        for key in keys
        if mine.get(key) != theirs.get(key) and not (key in unset and mine.get(key) == unset[key])
    ]


def _flat_options(values: dict, prefix: str = "") -> dict:
    """``{"drafter": {"block_size": 8}}`` -> ``{"drafter.block_size": 8}`` (dicts of the loss weights stay whole)."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict) and key in (*GROUPS, "markov_head"):
            value = value.get("init_args", value) if "class_path" in value else value  # the parser's default's form
            flat |= _flat_options(value, f"{prefix}{key}.")
        else:
            flat[prefix + key] = value
    return flat


def wants_help(argv: Sequence[str]) -> bool:
    """Whether a command line prints option help: ``-h``/``--help``, ``--<key>.help CLASS`` or commented config."""
    return any(
        arg in ("-h", "--help") or arg.endswith(".help") or (arg.startswith("--print_config") and "comments" in arg)
        for arg in argv
    )


def shipped_configs(argv: list[str]) -> list[str]:
    """``--config`` values resolved by ``shipped.config_path``: a bare name (``quickstart``, ``heads/gated``) is the
    shipped config, and ``configs/...`` not found from here is the shipped file, so the commands work outside the
    checkout."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = config_path(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + config_path(arg.split("=", 1)[1])
    return out


def lightning_main(args: Sequence[str] | None = None, run: bool = True, epilog: str | None = None) -> DSparkCLI:
    """``fit`` / ``validate`` / ``test`` (``args`` as on the command line, default ``sys.argv[1:]``); the CLI object.

    ``run=False`` parses and builds the model, data module and trainer without running a subcommand (no subcommand
    word in ``args`` then).
    """
    argv = shipped_configs(sys.argv[1:] if args is None else list(args))
    # the config groups document each field by a string under it (lightning/config.py): show those in --help. Reading
    # them parses the source of every class on the command line (the Trainer's too) for each subcommand, about 1.5 s a
    # call, and only help text uses them, so only a call that prints help reads them.
    set_parsing_settings(docstring_parse_attribute_docstrings=wants_help(argv))
    return DSparkCLI(
        DSparkModule,
        ShareGPTDataModule,
        args=argv,
        run=run,
        trainer_class=Trainer,  # Lightning's, with precision "auto" (lightning/precision.py)
        seed_everything_default=0,
        save_config_callback=SaveConfigAndDataFormat,
        save_config_kwargs={"overwrite": False},
        parser_kwargs={"epilog": epilog} if epilog else {},
    )
