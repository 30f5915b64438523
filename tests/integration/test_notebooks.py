"""The tutorials and the analysis notebook: in sync with their sources, committed clean, and executing end to end.

Every notebook is a jupytext pair (``tutorials/README.md``): ``NAME.py`` in percent format is the source of truth and
``NAME.ipynb`` is generated from it and committed without outputs. Each ``.ipynb`` is executed in a real Jupyter
kernel with ``nbclient`` (what ``pytest --nbmake`` does), working directory = the notebook's directory as in Jupyter,
runs into a per-test temporary directory (``DSPARK_TUTORIAL_DIR``) with few training steps and decoding prompts
(``DSPARK_TUTORIAL_STEPS``, ``DSPARK_TUTORIAL_PROMPTS``); the analysis notebook gets two tiny runs made here
(``DSPARK_RUN_DIR``). A notebook must leave nothing behind in the repository; a cell that hangs fails at the
client's per-cell timeout (how long the tutorials take is measured, not asserted: tests never check wall clock).
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat
import pytest
from helpers.paths import ROOT
from nbclient import NotebookClient

from dspark_lightning.cli import cli_main
from dspark_lightning.studies.runs import demo_fit_args

NOTEBOOK_DIRS = (ROOT / "tutorials", ROOT / "notebooks")
NOTEBOOKS = sorted(p for d in NOTEBOOK_DIRS for p in d.glob("*.ipynb"))
SOURCES = sorted(p for d in NOTEBOOK_DIRS for p in d.glob("*.py"))
IDS = [f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS]


def repository_snapshot() -> set[str]:
    """Top-level entries plus everything under the notebook folders and ``runs/``: where a stray write would land."""
    entries = {p.name for p in ROOT.iterdir()}
    for folder in (*NOTEBOOK_DIRS, ROOT / "runs"):
        if folder.exists():
            entries |= {str(p.relative_to(ROOT)) for p in folder.rglob("*") if "__pycache__" not in p.parts}
    return entries


def test_the_notebook_dependencies_are_declared():
    """The tutorials run in JupyterLab, where rich's progress bars need ipywidgets (without it rich only warns
    'install "ipywidgets" for Jupyter support' and shows no bar)."""
    import tomllib

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=\[ ]", dependency, maxsplit=1)[0] for dependency in dependencies}
    assert {"jupyterlab", "ipywidgets", "rich"} <= names


def test_every_notebook_is_a_jupytext_pair():
    assert {p.stem for p in NOTEBOOKS} >= {"01_quickstart", "02_markov_heads", "03_selector", "04_confidence"}
    assert any(p.parent.name == "notebooks" for p in NOTEBOOKS)
    assert [p.with_suffix("") for p in SOURCES] == [p.with_suffix("") for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_matches_its_source_and_has_no_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    source = jupytext.read(path.with_suffix(".py"))
    cells = [(c.cell_type, c.source) for c in notebook.cells]
    assert cells == [(c.cell_type, c.source) for c in source.cells], (
        f"{path.name} is out of sync with {path.with_suffix('.py').name}: run "
        f"`jupytext --to ipynb --update {path.with_suffix('.py').relative_to(ROOT)} -o {path.relative_to(ROOT)}`"
    )
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code), (
        f"{path.name} is committed with outputs: `jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)}`"
    )
    assert notebook.metadata["kernelspec"]["name"] == "python3"


@pytest.fixture(scope="module")
def analysis_runs(tmp_path_factory) -> Path:
    """Two tiny finished runs (no Markov head, vanilla head) for the analysis notebook."""
    runs = tmp_path_factory.mktemp("analysis_runs")
    for head in ("none", "vanilla"):
        cli_main(["fit", *demo_fit_args(runs, head=head, steps=30, val_samples=32, val_batches=4, eval_prompts=2)])
    return runs


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_executes(path, tmp_path, monkeypatch, request):
    monkeypatch.setenv("DSPARK_TUTORIAL_DIR", str(tmp_path))
    # a few training steps per fit and two prompts per decoding demo: this test checks that every cell runs (and the
    # tutorials' own asserts hold, which compare decoders with each other, not against a quality bar), not how well a
    # 200-step drafter learns or how precisely 8 prompts measure its tau
    monkeypatch.setenv("DSPARK_TUTORIAL_STEPS", "20")
    monkeypatch.setenv("DSPARK_TUTORIAL_PROMPTS", "2")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    if path.parent.name == "notebooks":
        monkeypatch.setenv("DSPARK_RUN_DIR", str(request.getfixturevalue("analysis_runs")))
    if "smollm2" in path.stem:  # the GGUF import is shared with tests/integration/commands/test_smollm2_recipe.py
        monkeypatch.setenv("DSPARK_SMOLLM2_DIR", str(request.getfixturevalue("smollm2_target")[0]))
    before = repository_snapshot()
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell; a cell past `timeout` fails (a hang guard)
    assert repository_snapshot() - before == set(), "the notebook wrote into the repository"
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
