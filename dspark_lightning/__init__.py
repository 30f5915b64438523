"""dspark_lightning: train and study DSpark draft models for speculative decoding with PyTorch Lightning."""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"


def lazy_exports(package: str, exports: dict[str, str]):
    """A package's ``__getattr__`` that imports ``exports[name]`` (a module path) on first use (PEP 562), so that
    importing one submodule does not pull in its siblings' heavy dependencies (Lightning, datasets, transformers)."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
