"""A run directory of its own for every run: ``version_N`` claimed with ``os.mkdir`` (atomic), never shared."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L

_PREFIX = "version_"


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


class ClaimRunDirectory(L.Callback):
    """Before anything writes (first in ``setup``): each CSV/TensorBoard logger without a fixed version gets a freshly
    created ``version_N`` (claimed on rank 0, broadcast to the other ranks)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        loggers = [
            logger
            for logger in trainer.loggers
            if getattr(logger, "_version", 0) is None and "://" not in str(getattr(logger, "root_dir", "://"))
        ]
        versions = [claim_version_dir(logger.root_dir) for logger in loggers] if trainer.is_global_zero else None
        versions = trainer.strategy.broadcast(versions)
        for logger, version in zip(loggers, versions):
            logger._version = version
