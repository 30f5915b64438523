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
