"""``--trainer.precision auto``: bf16-mixed where the hardware has a bf16 matmul path, 32-true elsewhere, logged.

On a CPU the choice is ``bf16-mixed`` when it has AMX-BF16 or AVX512-BF16 (``machine.fast_bf16``; oneDNN runs bf16
matmuls there at about twice the fp32 rate) and ``32-true`` on one without (AVX2 only: bf16 converts to fp32 and back,
slower than fp32); on a CUDA device that supports bf16, ``bf16-mixed``. ``Trainer`` is Lightning's with ``auto`` added
to ``precision``, resolved before Lightning sees it, so every other option is Lightning's own.
"""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.pytorch.utilities import rank_zero_info

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
