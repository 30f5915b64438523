"""MkDocs hook: the tutorials and the analysis notebook (outside ``docs/``) join the site as pages."""

from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIRS = ("tutorials", "notebooks")


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files, config):
    for folder in NOTEBOOK_DIRS:
        for notebook in sorted((ROOT / folder).glob("*.ipynb")):
            # src_dir = the repository root, so the page keeps its path (tutorials/01_quickstart.ipynb); rendered
            # from the .ipynb, which is committed without outputs (its jupytext .py is the source)
            uri = notebook.relative_to(ROOT).as_posix()
            files.append(File(uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
