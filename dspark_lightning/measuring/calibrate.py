"""``dspark-lightning calibrate``: fit per-slot confidence temperatures and write a calibrated checkpoint.

Sequential temperature scaling (``calibration``) on validation blocks; the temperatures go into the drafter's
``confidence_temperature``, which ``speculative_generate`` schedules with. Design: docs/design/design.md §9; usage:
docs/guides/measuring_acceptance.md."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from jsonargparse.typing import PositiveInt

from dspark_lightning.checks import check_finite_state, dumps_json, output_file, read_checkpoint
from dspark_lightning.errors import UnsupportedError
from dspark_lightning.measuring.calibration import fit_sequential_temperatures
from dspark_lightning.measuring.loading import load_trained
from dspark_lightning.measuring.validation_blocks import collect_blocks


def calibrate_command(
    ckpt_path: str, output: str | None = None, max_batches: PositiveInt = 32, overwrite: bool = False
) -> dict:
    """Fit per-slot confidence temperatures (sequential temperature scaling) and write a calibrated checkpoint.

    Args:
        ckpt_path: checkpoint written by `dspark-lightning fit`
        output: calibrated checkpoint (default: <ckpt>.calibrated.ckpt)
        max_batches: validation batches used for fitting (at least 1)
        overwrite: replace an existing --output file (else refused before any work)
    """
    output = output or str(Path(ckpt_path).with_suffix(".calibrated.ckpt"))
    if Path(output).exists() and not overwrite:  # checked first: --output may name the training checkpoint itself
        raise FileExistsError(f"--output {output!r} exists: pass --overwrite true to replace it")
    output_file(output, "--output")  # a folder that cannot be written is refused before the fit, not after
    module, data = load_trained(ckpt_path)
    if module.drafter.confidence_head is None:
        raise UnsupportedError(f"--ckpt_path {ckpt_path!r}: this drafter has no confidence head, nothing to calibrate")
    data.setup("validate")
    blocks = collect_blocks(
        module, data.val_dataloader(), max_blocks=None, max_batches=max_batches, fields=["confidence_logits"]
    )
    temperatures, ece = fit_sequential_temperatures(blocks.confidence_logits, blocks.alpha, blocks.valid)
    module.drafter_config.trained_slots(module.drafter.confidence_temperature, dim=0).copy_(temperatures)
    check_finite_state({"confidence_temperature": module.drafter.confidence_temperature}, "calibrate")
    checkpoint = read_checkpoint(ckpt_path)
    checkpoint["state_dict"]["drafter.confidence_temperature"] = module.drafter.confidence_temperature.clone()
    # written beside the output and renamed over it: an interrupted save never leaves a truncated checkpoint
    handle, staging = tempfile.mkstemp(prefix=f".{Path(output).name}.", dir=Path(output).parent)
    os.close(handle)
    try:
        torch.save(checkpoint, staging)
        os.replace(staging, output)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    result = {"temperatures": temperatures.tolist(), **ece, "blocks": blocks.num_blocks, "output": output}
    print(dumps_json(result, indent=2))  # strict JSON: an undefined ECE is null, never NaN
    return result
