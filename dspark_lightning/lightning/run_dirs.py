"""A run directory of its own for every run: ``version_N`` claimed with ``os.mkdir`` (atomic), never shared.

A run without a versioned logger (``--trainer.logger false``, or W&B alone) writes straight into its log directory
(``--trainer.default_root_dir``): it claims that directory's ``config.yaml`` by creating it exclusively
(``claim_config_file``), so a second run there is a one-line error instead of Lightning's traceback.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_only

_PREFIX = "version_"
DATA_FORMAT_FILE = "data_format.json"  # the run's resolved data format, written next to config.yaml (lightning/fit.py)


def claim_version_dir(root: str | os.PathLike) -> int:
    """Create ``root/version_N`` for the smallest free N above every existing one and return N.

    ``os.mkdir`` fails if the directory exists, so two processes that race for the same N never both get it: the
    loser tries N + 1.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)  # the parent is shared by every run of this name
    existing = [int(p.name[len(_PREFIX) :]) for p in root.glob(f"{_PREFIX}*") if p.name[len(_PREFIX) :].isdigit()]
    version = max(existing, default=-1) + 1
    while True:
        try:
            os.mkdir(root / f"{_PREFIX}{version}")
            return version
        except FileExistsError:
            version += 1


def versioned_local_loggers(loggers) -> list:
    """The CSV/TensorBoard-style loggers (a ``_version`` and a local ``root_dir``), in the trainer's order."""
    if loggers is None or isinstance(loggers, bool):
        return []
    loggers = loggers if isinstance(loggers, list | tuple) else [loggers]
    return [
        logger
        for logger in loggers
        if hasattr(logger, "_version") and "://" not in str(getattr(logger, "root_dir", "://"))
    ]


def claim_run_directories(loggers) -> list[Path]:
    """Claim ``version_N`` for every logger without a fixed version, before anything can resolve one; the paths.

    Called on rank 0 as soon as the loggers exist, before the Trainer: Lightning resolves a CSV logger's version by
    scanning the directory (not claiming it) when anything first reads ``log_dir``, and creates it only when the
    experiment starts, so two runs started moments apart were both given ``version_0``. Ranks above 0 (the DDP
    launcher re-runs the command with its rank in the environment) claim nothing and take rank 0's versions in
    :class:`ClaimRunDirectory`.
    """
    if rank_zero_only.rank != 0:
        return []
    claimed = []
    for logger in versioned_local_loggers(loggers):
        if logger._version is None:
            logger._version = claim_version_dir(logger.root_dir)
            claimed.append(Path(logger.root_dir) / f"{_PREFIX}{logger._version}")
    return claimed


def claim_config_file(path: str | os.PathLike) -> bool:
    """Create ``path`` empty, atomically (``O_EXCL``); False when it exists already (another run's config). A remote
    path (``s3://``) is not claimed (True): Lightning's own check covers it."""
    if "://" in str(path):
        return True
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def remove_unstarted_config_files(claimed: list[Path]) -> list[Path]:
    """Delete the claimed ``config.yaml`` (and the ``data_format.json`` beside it) of a run without a versioned
    directory that failed before its first step, so the same command can run again there; the files removed."""
    removed = []
    for path in claimed:
        for file in (path, path.parent / DATA_FORMAT_FILE):
            if file.is_file():
                file.unlink()
                removed.append(file)
    return removed


# What a run leaves in its directory before its first step: removing a directory with anything else would lose work.
_BEFORE_FIRST_STEP = {"config.yaml", DATA_FORMAT_FILE, "hparams.yaml", "metrics.csv"}


def remove_unstarted_run_directories(claimed: list[Path]) -> list[Path]:
    """Delete the claimed directories of a run that failed before its first step (nothing in them but the resolved
    config, hyper-parameters and an empty metrics file); the ones removed."""
    removed = []
    for directory in claimed:
        if not directory.is_dir():
            continue
        entries = list(directory.rglob("*"))
        files = [p for p in entries if p.is_file()]
        if all(p.parent == directory and p.name in _BEFORE_FIRST_STEP for p in files) and not any(
            p.is_dir() and any(p.iterdir()) for p in entries
        ):
            shutil.rmtree(directory)
            removed.append(directory)
    return removed


class ClaimRunDirectory(L.Callback):
    """First in ``setup``: every rank ends with rank 0's ``version_N`` for each CSV/TensorBoard logger. Rank 0 has
    claimed them already (:func:`claim_run_directories`) unless the loggers were made by the Trainer itself (its
    default logger), which are claimed here."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        loggers = versioned_local_loggers(trainer.loggers)
        if trainer.is_global_zero:
            for logger in loggers:
                if logger._version is None:
                    logger._version = claim_version_dir(logger.root_dir)
            versions = [logger._version for logger in loggers]
        else:
            versions = None
        versions = trainer.strategy.broadcast(versions)
        for logger, version in zip(loggers, versions):
            logger._version = version
