"""The experiment pages a command writes whole (``report.md`` of ``report-recipe`` and ``loss-study``) are what that
command renders from the ``results.json`` beside them: each is re-rendered from a copy of its raw file (``--rerender``,
no training) and compared as text, so a figure edited by hand, or a renderer changed without re-rendering the pages,
fails here."""

from __future__ import annotations

import shutil

import pytest
from helpers.paths import ROOT

from dspark_lightning.cli import cli_main

RECIPE = ["report-recipe", "--recipe"]
GENERATED = {  # experiment folder -> the command that wrote its report.md (without --output)
    "gemma3_heads": [*RECIPE, "configs/recipes/gemma3.yaml"],
    "smollm2_heads/400steps": [*RECIPE, "configs/recipes/smollm2.yaml", "--steps", "400"],
    "smollm2_heads/1200steps": [*RECIPE, "configs/recipes/smollm2.yaml", "--steps", "1200"],
    "smollm2_heads/3000steps": [*RECIPE, "configs/recipes/smollm2.yaml", "--steps", "3000"],
    "loss_study/demo": ["loss-study"],
    "loss_study/smollm2": ["loss-study"],
}


def test_every_generated_page_is_listed():
    pages = {p.parent.relative_to(ROOT / "experiments").as_posix() for p in (ROOT / "experiments").rglob("report.md")}
    # demo_heads/ is written by `report`, which has no --rerender; its table is checked by test_doc_numbers
    assert pages - {"demo_heads"} == set(GENERATED)


@pytest.mark.parametrize("folder", GENERATED)
def test_generated_page_is_what_its_results_render(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the recipes' relative paths
    shutil.copy(ROOT / "experiments" / folder / "results.json", tmp_path / "results.json")
    cli_main([*GENERATED[folder], "--output", str(tmp_path), "--rerender", "true"])
    committed = (ROOT / "experiments" / folder / "report.md").read_text()
    assert (tmp_path / "report.md").read_text() == committed, f"experiments/{folder}/report.md"
