"""Transparent huge pages for PyTorch's large CPU tensors, which the command line turns on unless the user chose.

A training step allocates tensors of tens of MB (logits, their gradient, the teacher's rows) and frees them again; on
Linux each fresh allocation is then faulted in 4 KB page by page, which costs about as much as the arithmetic done on
it. PyTorch backs allocations of 2 MB or more with 2 MB pages when ``THP_MEM_ALLOC_ENABLE=1`` (read at its first large
allocation, so set before a model loads). Measured gains: benchmarks/training/README.md. In the bottom layer.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "THP_MEM_ALLOC_ENABLE"
SYSTEM_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def use_huge_pages() -> bool:
    """Turn PyTorch's huge-page allocation on unless ``THP_MEM_ALLOC_ENABLE`` is already set (``0`` keeps it off);
    returns whether it is on. A no-op where the kernel has THP set to ``never`` (PyTorch then gets small pages)."""
    os.environ.setdefault(ENV, "1")
    return huge_pages_on()


def huge_pages_on() -> bool:
    """Whether this process asks for huge pages (``THP_MEM_ALLOC_ENABLE=1``) and the kernel can give them."""
    if os.environ.get(ENV) != "1":
        return False
    try:
        return "[never]" not in SYSTEM_SETTING.read_text()
    except OSError:
        return False
