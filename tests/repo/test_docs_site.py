"""The documentation site builds with ``mkdocs build --strict``: a broken internal link, an unknown anchor or a nav
entry naming a missing page fails ``make test``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from helpers.paths import ROOT

MKDOCS = Path(sys.executable).parent / "mkdocs"


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        cwd=root, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )  # fmt: skip


def test_the_site_builds_strict(tmp_path):
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "guides" / "train_and_evaluate" / "index.html").is_file()
    assert (tmp_path / "site" / "tutorials" / "01_quickstart" / "index.html").is_file()


def test_a_broken_internal_link_fails_the_build(tmp_path):
    """The strict build is not vacuous: a copy of the docs with one link to a missing page does not build."""
    copy = tmp_path / "repo"
    for name in ("docs", "tutorials", "notebooks", "dspark_lightning", "experiments", "benchmarks"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "mkdocs_hooks.py", copy / "scripts")
    shutil.copy(ROOT / "mkdocs.yml", copy)
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[a page that is not there](guides/not_there.md)\n")
    result = build(copy, tmp_path / "site")
    assert result.returncode != 0 and "not_there.md" in result.stderr, result.stderr[-4000:]
