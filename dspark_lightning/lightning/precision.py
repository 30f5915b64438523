"""``--trainer.precision auto``: bf16-mixed where the hardware has a bf16 matmul path, 32-true elsewhere, logged.

On a CPU: ``bf16-mixed`` with AMX-BF16 or AVX512-BF16 (``machine.fast_bf16``; oneDNN runs bf16 matmuls in hardware),
``32-true`` with AVX2 only (bf16 would be emulated, slower than fp32); on a CUDA device with bf16, ``bf16-mixed``.
``Trainer`` is Lightning's with ``auto`` added to ``precision``; under ``bf16-mixed`` it also clips the gradients of a
fused optimizer (``BF16MixedPrecision``), which Lightning's plugin refuses.
"""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.plugins.precision.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_info

from dspark_lightning.machine import FAST_BF16_FLAGS, fast_bf16, machine_description


def resolve_precision(precision, accelerator="auto", machine: dict | None = None) -> tuple[object, str]:
    """(the precision Lightning gets, why) for ``precision`` (``auto`` resolved, anything else passed through)."""
    if precision != "auto":
        return precision, "given"
    gpu = str(accelerator) in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    if gpu:
        chosen = "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
        return chosen, f"CUDA device {'with' if chosen == 'bf16-mixed' else 'without'} bf16 support"
    machine = machine_description() if machine is None else machine
    if fast_bf16(machine):
        flags = ", ".join(flag for flag in FAST_BF16_FLAGS if machine.get(flag))
        return "bf16-mixed", f"CPU {machine['cpu']} has {flags}"
    return "32-true", f"CPU {machine['cpu']} has neither {' nor '.join(FAST_BF16_FLAGS)} (bf16 would be emulated)"


class BF16MixedPrecision(MixedPrecision):
    """Lightning's ``bf16-mixed`` plugin, clipping gradients of fused optimizers too.

    Lightning refuses to clip when the optimizer "handles unscaling" (``fused=True`` AdamW), a rule for fp16's gradient
    scaler. bf16 autocast has no scaler: the gradients are already unscaled, so clipping them is plain norm clipping.
    """

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=GradClipAlgorithmType.NORM) -> None:
        if self.scaler is not None:  # a scaler (fp16): Lightning's check stands
            return super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)
        return Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)


class Trainer(pl.Trainer):
    """Lightning's ``Trainer``; ``precision`` also takes ``auto`` (``resolve_precision``), logged in one line."""

    def __init__(self, *, precision: _PRECISION_INPUT | Literal["auto"] | None = None, **kwargs) -> None:
        """
        Args:
            precision: Lightning's precision (``32-true``, ``bf16-mixed``, ...), or ``auto``: ``bf16-mixed`` on a CPU
                with AMX-BF16 or AVX512-BF16 (or a bf16 CUDA device), ``32-true`` elsewhere.
        """
        if precision == "auto":
            precision, why = resolve_precision(precision, kwargs.get("accelerator", "auto"))
            rank_zero_info(f"precision auto: {precision} ({why})")
        super().__init__(precision=precision, **kwargs)
        plugin = self.strategy.precision_plugin
        if type(plugin) is MixedPrecision and plugin.precision == "bf16-mixed" and plugin.scaler is None:
            # the configs' fused AdamW with gradient_clip_val would stop at the first step on an AMX CPU otherwise
            self.strategy.precision_plugin = BF16MixedPrecision("bf16-mixed", device=plugin.device)
