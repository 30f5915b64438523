"""Recipe configs (``configs/recipes/<name>.yaml``): one target and data set for ``report-recipe`` and the loss study.

A recipe names the base ``fit`` config (which holds the target, data, caches and layer ids), how the reports title
it, its own head and loss, and the report's default heads, steps and decoding sizes. A new target is a new YAML.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from dspark_lightning.shipped import SHIPPED_ROOT

RECIPE_DIR = SHIPPED_ROOT / "configs/recipes"
HEADS = ("none", "vanilla", "gated", "rnn", "selector")  # configs/heads/<head>.yaml, in report order


@dataclass(frozen=True)
class Recipe:
    """One recipe file; see ``configs/recipes/smollm2.yaml`` for what each field means."""

    name: str
    title: str
    fit_config: str
    training_note: str
    default_head: str
    default_loss: str
    heads: tuple[str, ...]
    steps: int
    num_prompts: int
    max_new_tokens: int
    heldout_files: str | None  # the sharegpt_heldout eval set's conversations (None: the fit config's val_files)
    heldout_split_by_id: dict[str, float] | None  # ... of which only the validation part of this id split
    path: Path  # the file it was read from

    def fit_configs(self, head: str) -> list[str]:
        """The ``--config`` arguments that train ``head``: the fit config, plus the head's config unless it is the
        fit config's own head."""
        args = ["--config", str(repo_path(self.fit_config))]
        if head == self.default_head:
            return args
        return [*args, "--config", str(SHIPPED_ROOT / f"configs/heads/{head}.yaml")]


def repo_path(path: str | Path) -> Path:
    """``path`` itself when absolute, else relative to the shipped configs and assets (``shipped.py``)."""
    return Path(path) if Path(path).is_absolute() else SHIPPED_ROOT / path


def repo_relative(path: Path) -> Path:
    """``path`` relative to the shipped configs and assets when it lies inside them (what results files record), else as is."""
    return path.relative_to(SHIPPED_ROOT) if path.is_relative_to(SHIPPED_ROOT) else path


def recipe_path(recipe: str | Path) -> Path:
    """A recipe file: a path to a YAML file (as given, else relative to the repository root), or a bare name
    resolved to ``configs/recipes/<name>.yaml``."""
    text = str(recipe)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text) if Path(text).exists() else repo_path(text)
    else:
        path = RECIPE_DIR / f"{text}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"recipe {text!r}: {path} is not a file (recipes in {RECIPE_DIR}: {known})")
    return path.resolve()


def load_recipe(recipe: str | Path) -> Recipe:
    """The recipe named or pointed to by ``recipe`` (see ``recipe_path``); every key must be known and present."""
    path = recipe_path(recipe)
    values = yaml.safe_load(path.read_text()) or {}
    keys = {field.name for field in dataclasses.fields(Recipe)} - {"path"}
    unknown, missing = sorted(set(values) - keys), sorted(keys - set(values))
    if unknown or missing:
        raise ValueError(f"recipe {path}: unknown keys {unknown}, missing keys {missing}")
    bad_heads = sorted(set(values["heads"]) - set(HEADS))
    if bad_heads or values["default_head"] not in HEADS:
        raise ValueError(f"recipe {path}: unknown heads {bad_heads or [values['default_head']]}; choose from {HEADS}")
    return Recipe(**{**values, "heads": tuple(values["heads"])}, path=path)
