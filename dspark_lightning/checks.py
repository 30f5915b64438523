"""Checks shared by training and the tools: checkpoints read safely, weights finite, JSON without NaN.

At the package root because lightning/, measuring/, interop/ and studies/ all read checkpoints and write JSON.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dspark_lightning.errors import OptionError, UserError


class NonFiniteError(UserError, FloatingPointError):
    """A loss, gradient or stored tensor holds NaN or infinity."""


def read_checkpoint(path: str | os.PathLike, option: str = "--ckpt_path", mmap: bool = False) -> dict:
    """``torch.load(weights_only=True)`` of a Lightning checkpoint, with errors that name ``option`` and the file.

    Checkpoints hold only plain data (dicts, lists, numbers, strings and tensors), so nothing else is unpickled.
    ``mmap`` maps the tensors instead of reading them (for a look at the metadata of a large checkpoint).
    """
    path = Path(path)
    if not path.is_file():
        kind = "is a directory, not a checkpoint file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"{option} {str(path)!r} {kind}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # noqa: BLE001 - torch's own message suggests weights_only=False, which we never use
        raise OptionError(
            f"{option} {str(path)!r} is not a checkpoint written by `dspark-lightning fit` "
            f"(torch.load with weights_only=True failed: {_load_failure(error)})"
        ) from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise OptionError(f"{option} {str(path)!r} is not a Lightning checkpoint (no 'state_dict')")
    return checkpoint


def _load_failure(error: Exception) -> str:
    """What failed in a weights-only load, without torch's advice to retry unsafely: its ``WeightsUnpickler error``
    (e.g. "Unsupported operand 103" for a file that is no pickle at all), else the message's first line."""
    text = str(error).strip()
    found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\. |\n|$)", text)
    if found:
        return found.group(1).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def output_file(path: str | os.PathLike, option: str) -> Path:
    """``path``, a file a command writes late (at its end, or as its results come in), checked when it starts: its
    folder is made now, and a directory or a folder that cannot be made is refused now, not after an hour of work."""
    path = Path(path)
    if path.is_dir():
        raise OptionError(f"{option} {str(path)!r} is a directory; expected a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OptionError(
            f"{option} {str(path)!r}: cannot create its folder {str(path.parent)!r} ({error.strerror})"
        ) from None
    if not os.access(path.parent, os.W_OK):
        raise OptionError(f"{option} {str(path)!r}: its folder {str(path.parent)!r} is not writable")
    return path


def usable_device(device: str | None, option: str = "--device") -> str:
    """``device`` (default: cuda when visible, else cpu), refused now when this machine cannot run it: torch's own
    answer (an ``AssertionError`` from deep inside the model's ``.to``) names neither the option nor the fix."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device)
    except RuntimeError as error:
        raise OptionError(f"{option} {device!r} is not a torch device: {error}") from None
    if kind.type == "cuda" and not torch.cuda.is_available():
        raise OptionError(
            f"{option} {device!r}: no CUDA device is visible to this torch ({torch.__version__}); use cpu"
        )
    if kind.type == "cuda" and kind.index is not None and kind.index >= torch.cuda.device_count():
        raise OptionError(f"{option} {device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    if kind.type == "mps" and not torch.backends.mps.is_available():
        raise OptionError(f"{option} {device!r}: MPS is not available on this machine; use cpu")
    return device


def non_finite_names(tensors: Mapping[str, Any]) -> list[str]:
    """Names of the floating-point tensors in ``tensors`` that hold NaN or infinity."""
    return [
        name
        for name, value in tensors.items()
        if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all())
    ]


def check_finite_state(tensors: Mapping[str, Any], where: str) -> None:
    """Refuse weights with NaN/inf: exporting, decoding or calibrating them would only hide a diverged run."""
    bad = non_finite_names(tensors)
    if bad:
        raise NonFiniteError(
            f"{where}: {len(bad)} tensor(s) hold NaN or infinity ({', '.join(bad[:6])}{' ...' * (len(bad) > 6)}); "
            "the run diverged: retrain with a lower learning rate"
        )


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN/infinity float replaced by ``None`` (JSON ``null``), recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    return value


def dumps_json(value: Any, **kwargs: Any) -> str:
    """Strict JSON (never ``NaN``): non-finite floats become ``null``."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)


def write_json(path: str | os.PathLike, value: Any) -> None:
    """``dumps_json(value, indent=2)`` written beside ``path`` and renamed over it: a reader (or a stop) mid-write
    never sees half a file, which matters for files rewritten as results come in."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.partial")
    staging.write_text(dumps_json(value, indent=2))
    os.replace(staging, path)
