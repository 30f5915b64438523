"""MkDocs hook: the tutorials and the analysis notebook, the experiments and the benchmarks' results (all outside
``docs/``) join the site under their repository paths, so pages link to them as ``experiments/<name>/README.md``."""

from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIRS = ("tutorials", "notebooks")
RESULT_DIRS = ("experiments", "benchmarks")
RESULT_SUFFIXES = {".md", ".png", ".json", ".csv", ".sh", ".txt", ".py"}  # pages, plots, raw data, scripts


def repository_file(path: Path, config) -> File:
    # src_dir = the repository root, so the file keeps its repository path (tutorials/01_quickstart.ipynb)
    return File(path.relative_to(ROOT).as_posix(), str(ROOT), config["site_dir"], config["use_directory_urls"])


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files, config):
    for folder in NOTEBOOK_DIRS:  # rendered from the .ipynb, committed without outputs (its jupytext .py is the source)
        for notebook in sorted((ROOT / folder).glob("*.ipynb")):
            files.append(repository_file(notebook, config))
    for folder in RESULT_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in RESULT_SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                files.append(repository_file(path, config))
    return files
