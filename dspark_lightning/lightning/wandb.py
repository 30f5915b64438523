"""A WandbLogger that is offline unless the user asks for online logging, and off when W&B is disabled.

``offline`` defaults to ``None``, read as: online only when ``WANDB_MODE=online`` is set in the environment. So a
config that names this logger never needs an API key or network by accident. ``WANDB_MODE=disabled`` (what the tests
use) turns W&B off entirely: Lightning's logger would otherwise overwrite it with its offline mode and write a run.
Everything else is Lightning's own ``WandbLogger``.
"""

from __future__ import annotations

import os

from lightning.pytorch.loggers import WandbLogger


class OfflineFirstWandbLogger(WandbLogger):
    """Lightning's ``WandbLogger``, offline unless ``WANDB_MODE=online`` (no key, no network), and a true no-op
    under ``WANDB_MODE=disabled``; every other argument is ``WandbLogger``'s."""

    def __init__(self, *args, offline: bool | None = None, **kwargs) -> None:
        mode = os.environ.get("WANDB_MODE", "offline")
        if mode == "disabled":
            # Lightning sets WANDB_MODE=dryrun whenever offline=True, which would undo "disabled": pass the mode to
            # wandb.init instead and leave offline off (wandb then makes a no-op run and writes no files)
            offline, kwargs["mode"] = False, "disabled"
        elif offline is None:
            offline = mode != "online"
        super().__init__(*args, offline=offline, **kwargs)
        if self._wandb_init.get("anonymous") is None:  # Lightning always passes it; wandb warns it has no effect
            self._wandb_init.pop("anonymous", None)
