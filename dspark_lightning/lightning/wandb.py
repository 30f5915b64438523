"""A WandbLogger that is offline unless the user asks for online logging.

``offline`` defaults to ``None``, read as: online only when ``WANDB_MODE=online`` is set in the environment. So a
config that names this logger never needs an API key or network by accident, and ``WANDB_MODE=disabled`` (what the
tests use) still turns W&B off entirely. Everything else is Lightning's own ``WandbLogger``.
"""

from __future__ import annotations

import os

from lightning.pytorch.loggers import WandbLogger


class OfflineFirstWandbLogger(WandbLogger):
    def __init__(self, *args, offline: bool | None = None, **kwargs) -> None:
        if offline is None:
            offline = os.environ.get("WANDB_MODE", "offline") != "online"
        super().__init__(*args, offline=offline, **kwargs)
