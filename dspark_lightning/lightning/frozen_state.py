"""Checkpoints of trainable state only, for ``DSparkModule``: the frozen target is dropped on save, re-filled on load.

A mixin for a LightningModule whose frozen tensors (the target, and the input embedding / LM head that the drafter
shares with it) are loaded from ``model.target`` when the module is built. They are left out of every checkpoint and,
on load, taken from the module itself, after checking that every trainable tensor is in the checkpoint (the module
runs with ``strict_loading=False``, so this check is ours).
"""

from __future__ import annotations

import logging
import os

from dspark_lightning.checks import check_finite_state, read_checkpoint
from dspark_lightning.errors import OptionError

log = logging.getLogger(__name__)

WORKING_DIRECTORY = "fit_working_directory"


class TrainableStateCheckpoints:
    """``on_save_checkpoint`` / ``on_load_checkpoint`` that keep the frozen tensors out of checkpoints."""

    def frozen_state_keys(self) -> set[str]:
        """State-dict keys of frozen parameters (buffers count as trainable state, except the target's)."""
        trainable = {name for name, p in self.named_parameters() if p.requires_grad}
        buffers = {name for name, _ in self.named_buffers() if not name.startswith("target.")}
        return set(self.state_dict().keys()) - trainable - buffers

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        for key in self.frozen_state_keys():
            checkpoint["state_dict"].pop(key, None)
        # the recorded target, data and vocabulary paths may be relative to it (lightning/checkpoint.py reads them)
        checkpoint[WORKING_DIRECTORY] = os.getcwd()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state, frozen = self.state_dict(), self.frozen_state_keys()
        missing = sorted(set(state) - frozen - set(checkpoint["state_dict"]))
        if missing:
            raise KeyError(f"checkpoint lacks trainable drafter tensors (different model config?): {missing[:8]}")
        for key in frozen:  # the target's tensors, already loaded from model.target: not "missing" from the checkpoint
            checkpoint["state_dict"].setdefault(key, state[key])

    def trainable_state_mismatch(self, state: dict) -> str:
        """What keeps ``state`` from being this module's trainable state ("" when nothing does): trainable tensors it
        lacks, tensors this module has not, and tensors of another shape (the first few of each)."""
        own = self.state_dict()
        needed = set(own) - self.frozen_state_keys()
        differences = (
            ("missing", sorted(needed - set(state))),
            ("unexpected", sorted(set(state) - set(own))),
            ("other shapes", sorted(k for k in needed & set(state) if tuple(state[k].shape) != tuple(own[k].shape))),
        )
        return ", ".join(f"{name} {keys[:8]}" for name, keys in differences if keys)

    def load_initial_weights(self, path: str | os.PathLike) -> None:
        """Start from the trainable tensors of the ``fit`` checkpoint ``path`` (``training.init_weights``: a new stage
        with its own optimizer and schedule). Every trainable tensor must be there with this module's shape."""
        option = "model.training.init_weights"
        state = read_checkpoint(path, option=option).get("state_dict")
        if not isinstance(state, dict):
            raise OptionError(f"{option} {str(path)!r} has no state_dict (expected a checkpoint written by fit)")
        check_finite_state(state, f"{option} {path}")
        mismatch = self.trainable_state_mismatch(state)
        if mismatch:
            raise OptionError(
                f"{option} {str(path)!r} does not hold this drafter's tensors (set the drafter options it was trained "
                f"with): {mismatch}"
            )
        trainable = {key: value for key, value in state.items() if key not in self.frozen_state_keys()}
        self.load_state_dict(trainable, strict=False)  # never the frozen target's tensors, whatever the file holds
        log.info("starting from the drafter weights of %s (%d tensors)", path, len(trainable))
