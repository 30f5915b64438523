"""Architecture checks: the import-layer contracts of pyproject.toml, and that code cites only the repository's docs/.

The contracts (``[tool.importlinter]``) are run with the ``lint-imports`` of this interpreter's environment. The
citation check parses every ``docs/design/<file>.md §n`` reference (any ``docs/<path>.md §n``) in the repository's
``.py`` and ``.md`` files and requires a heading numbered ``n`` in that file; a citation of a design note by its old
place (``docs/<file>.md``, before the notes moved to ``docs/design/``) and references to the design document that is
not in the repository are refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT as REPO

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

SECTION = r"\d+(?:\.\d+)*"
# a docs/ path followed by one or more section references: "§3", "§3.1, §4", "§7.1-§7.4", "§2 and §5"
CITATION = re.compile(rf"docs/(?P<file>[\w./-]+?\.md)(?P<refs>(?:\s*(?:,|-|–|and)?\s*§\s*{SECTION})+)")
SECTION_REF = re.compile(rf"§\s*({SECTION})")
HEADING = re.compile(rf"^#{{1,6}}\s+({SECTION})\.?\s")
# the external design document the code used to cite (the word DESIGN, then a section sign); built from parts so
# that this file does not match itself
OLD_CITATION = re.compile("DESIGN" + r"(?:\.md)?\s*§")
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist", "runs", "outputs", "lightning_logs", "wandb"}


def section_headings(markdown: Path) -> set[str]:
    """Section numbers of the headings of a markdown file (``## 3. Title`` -> ``3``, ``### 3.1 Title`` -> ``3.1``),
    ignoring fenced code blocks."""
    numbers, fenced = set(), False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            numbers.add(match.group(1))
    return numbers


def citations(text: str) -> list[tuple[int, str, str]]:
    """(line, docs file, section) for every section reference of every ``docs/<file>.md §n`` citation in ``text``."""
    found = []
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for section in SECTION_REF.findall(match.group("refs")):
            found.append((line, match.group("file"), section))
    return found


def source_files(root: Path) -> list[Path]:
    """The repository's .py and .md files (hidden directories, virtual environments and build outputs left out)."""
    files = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [
            d for d in subdirectories if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")
        ]
        files += [Path(directory, name) for name in names if name.endswith((".py", ".md"))]
    return sorted(files)


def citation_problems(root: Path) -> tuple[list[str], int]:
    """(problems, number of section references checked) over the repository rooted at ``root``."""
    problems, checked, headings = [], 0, {}
    for path in source_files(root):
        text = path.read_text(encoding="utf-8", errors="replace")
        where = path.relative_to(root)
        if path.suffix == ".py":
            for match in OLD_CITATION.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{where}:{line}: cites a DESIGN document that is not in the repository")
        for line, name, section in citations(text):
            checked += 1
            target = root / "docs" / name
            if name not in headings:
                headings[name] = section_headings(target) if target.is_file() else None
            if headings[name] is None and (root / "docs" / "design" / name).is_file():
                problems.append(f"{where}:{line}: cites docs/{name}, which moved to docs/design/{name}")
            elif headings[name] is None:
                problems.append(f"{where}:{line}: cites docs/{name}, which does not exist")
            elif section not in headings[name]:
                problems.append(f"{where}:{line}: cites docs/{name} §{section}, which has no such section heading")
    return problems, checked


# ---------------------------------------------------------------------------------------------------- imports
def run_lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    if not LINT_IMPORTS.is_file():
        pytest.fail(f"{LINT_IMPORTS} not found: install the dev extras (pip install -e '.[dev]' brings import-linter)")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_import_contracts_hold():
    result = run_lint_imports(REPO)
    assert result.returncode == 0, f"lint-imports failed:\n{result.stdout}\n{result.stderr}"
    assert "0 broken" in result.stdout, result.stdout


def test_a_new_layer_crossing_breaks_the_contracts(tmp_path):
    """The contracts are not vacuous: data/ importing models/ anew (not one of the listed crossings) fails."""
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(
        REPO / "dspark_lightning", tmp_path / "dspark_lightning", ignore=shutil.ignore_patterns("__pycache__")
    )
    tokenize = tmp_path / "dspark_lightning" / "data" / "tokenize.py"
    tokenize.write_text(tokenize.read_text() + "\nfrom dspark_lightning.models import vocab  # noqa: E402, F401\n")
    result = run_lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "dspark_lightning.data.tokenize -> dspark_lightning.models.vocab" in result.stdout, result.stdout


# ---------------------------------------------------------------------------------------------------- citations
def test_code_cites_only_existing_docs_sections():
    problems, checked = citation_problems(REPO)
    assert not problems, "\n".join(problems)
    assert checked >= 10, f"only {checked} docs/ citations found: is the citation pattern still right?"


def test_citation_checker_reports_every_kind_of_bad_citation(tmp_path):
    (tmp_path / "docs" / "design").mkdir(parents=True)
    (tmp_path / "docs" / "design" / "design.md").write_text(
        "# Title\n\n## 1. One\n\n### 1.2 One two\n\n```\n## 7. inside a code block\n```\n"
    )
    # the citations are assembled at run time so that this file's own text holds none of them
    bad, doc, missing = "DESIGN" + " §2", "docs/" + "design/design.md", "docs/" + "design/nothere.md"
    moved = "docs/" + "design.md"  # the note's place before docs/design/
    (tmp_path / "module.py").write_text(
        f'"""Good: {doc} §1 and {doc} §1.2, §1."""\n'
        f"# old style: {bad}\n"
        f"# missing section: {doc} §3\n"
        f"# range with a missing end: {doc} §1-§4\n"
        f"# missing file: {missing} §1\n"
        f"# heading only inside a code block: {doc} §7\n"
        f"# the old place: {moved} §1\n"
    )
    problems, checked = citation_problems(tmp_path)
    assert checked == 9
    assert sorted(problems) == sorted(
        [
            "module.py:2: cites a DESIGN document that is not in the repository",
            f"module.py:3: cites {doc} §3, which has no such section heading",
            f"module.py:4: cites {doc} §4, which has no such section heading",
            f"module.py:5: cites {missing}, which does not exist",
            f"module.py:6: cites {doc} §7, which has no such section heading",
            f"module.py:7: cites {moved}, which moved to {doc}",
        ]
    )
