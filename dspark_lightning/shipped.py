"""The configs and demo assets the package ships (``configs/``, ``assets/``), found the same way in a checkout and in
an installed wheel: ``dspark_lightning/shipped/`` links to them in the checkout and holds copies in the wheel.

A relative path that does not exist from the working directory is looked up there, so
``dspark-lightning fit --config configs/quickstart.yaml`` (or ``--config quickstart``) and the quickstart's
``assets/demo-target`` work from an empty directory; a path that exists from the working directory always wins.
"""

from __future__ import annotations

import glob
import os
from importlib.resources import files
from pathlib import Path

SHIPPED_ROOT = Path(str(files("dspark_lightning").joinpath("shipped")))
SHIPPED_DIRS = ("configs", "assets")  # what the package ships; a path under neither is never looked up


def shipped_path(relative: str | os.PathLike) -> Path:
    """The shipped file or folder at ``relative`` (e.g. ``configs/recipes``), whether or not it exists."""
    return SHIPPED_ROOT / relative


def local_or_shipped(path):
    """``path`` as given when it is found from the working directory (a glob with a match), absolute, a hub id or a
    ``pkg:`` source; else, when it names something under the shipped ``configs/`` or ``assets/``, that absolute
    path. Lists are resolved item by item; anything else (None, numbers) is returned unchanged."""
    if isinstance(path, (list, tuple)):
        return type(path)(local_or_shipped(item) for item in path)
    if not isinstance(path, (str, os.PathLike)):
        return path
    text = os.fspath(path)
    if os.path.isabs(text) or _found(text) or Path(text).parts[:1] not in {(d,) for d in SHIPPED_DIRS}:
        return path
    shipped = os.fspath(SHIPPED_ROOT / text)
    return shipped if _found(shipped) else path


def config_path(name: str) -> str:
    """A ``--config`` value: a file found from here wins; a bare name such as ``quickstart`` or ``heads/gated`` is
    the shipped ``configs/<name>.yaml``; a relative ``configs/...`` path not found here is the shipped one."""
    if _found(name) or os.path.isabs(name):
        return name
    if not name.endswith((".yaml", ".yml")) and not name.startswith("configs/"):
        bare = shipped_path(f"configs/{name}.yaml")
        if bare.is_file():
            return os.fspath(bare)
    return os.fspath(local_or_shipped(name))


def _found(path: str) -> bool:
    return os.path.exists(path) or (any(c in path for c in "*?[") and bool(glob.glob(path, recursive=True)))
