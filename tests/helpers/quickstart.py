"""The start every quickstart-run test shares: ``fit`` on configs/quickstart.yaml, the demo target, the shipped data."""

from __future__ import annotations

from helpers.paths import ROOT

VALIDATION = ROOT / "assets/data/sharegpt/validation-00000.jsonl"


def quickstart_fit_args(val_files=VALIDATION) -> list[str]:
    """``fit --config configs/quickstart.yaml`` on the demo target, the shipped on-policy training data and
    ``val_files``; callers append their own sizes, steps and callbacks."""
    return [
        "fit",
        "--config",
        str(ROOT / "configs/quickstart.yaml"),
        f"--model.target.path={ROOT / 'assets/demo-target'}",
        f"--data.train_files={ROOT / 'assets/data/regenerated/train-*.jsonl'}",
        f"--data.val_files={val_files}",
    ]
