"""The one table of tensor dtypes the package accepts by name (target loading, feature caches, export, GGUF import).

At the package root because models/, data/ and interop/ all name dtypes, and none of them may import the others.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dspark_lightning.errors import OptionError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str | torch.dtype, allowed: Iterable[str] = DTYPES, what: str = "dtype") -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16`` (a ``torch.dtype`` among ``allowed`` passes through); anything outside
    ``allowed`` raises a ValueError naming ``what``."""
    allowed = tuple(allowed)
    if isinstance(name, torch.dtype) and name in {DTYPES[a] for a in allowed}:
        return name
    if name not in allowed:
        raise OptionError(f"{what} must be one of {sorted(allowed)}, got {name!r}")
    return DTYPES[name]


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """bf16 / fp16 upcast to float32; float32 and float64 as they are. Probabilities that are sampled from and
    divided by (the draft's q, the target's p) are computed in it: bf16 ones would round p / q by up to 2^-8."""
    return x.to(torch.promote_types(x.dtype, torch.float32))
