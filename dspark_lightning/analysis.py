"""Helpers shared by ``dspark-lightning report``, the tutorials and the analysis notebook.

They are thin layers over the framework's own entry points, so a notebook shows the real calls rather than copies:

- runs: ``demo_fit_args`` (the ``fit`` arguments of a CPU-sized demo run: ``configs/quickstart.yaml`` + a head
  config + overrides), ``shell_command`` (the same as a shell line), ``command_line`` (a tool call as the line that
  makes it), ``find_runs`` / ``run_label`` (discover run directories and name them by head and block size);
- output hygiene: ``quiet_logs`` / ``quieted`` (Lightning info lines, HF progress bars and a list of known harmless
  warnings off).

Design choices: every path handed to the CLI is absolute (``REPO_ROOT`` is the checkout the package is installed
from, an editable install), so notebooks work from any working directory and never write into the repository
unless told to; the demo budget defaults (sequence length 128, 4 rows, 16 anchors) are the ones that learn visibly
in a few hundred CPU steps.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from dspark_lightning.lightning.config import migrate_hparams
from dspark_lightning.models.markov import MarkovHeadConfig

REPO_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------- runs
def demo_fit_args(
    run_dir: str | Path,
    *,
    head: str = "vanilla",
    block_size: int = 8,
    steps: int = 200,
    seq_len: int = 128,
    batch_size: int = 4,
    max_anchors: int = 16,
    val_samples: int = 64,
    val_batches: int = 8,
    eval_prompts: int = 8,
    name: str | None = None,
    wandb: bool = False,
    progress_bar: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """``fit`` arguments: ``configs/quickstart.yaml`` + ``configs/heads/<head>.yaml`` shrunk to a CPU budget.

    Logs go to ``run_dir/<name>/version_N`` (CSV; plus an offline W&B run under ``run_dir/<name>/wandb`` when
    ``wandb``). Validation runs once, at the end. All paths are absolute, so the current directory does not matter.
    The quickstart's callbacks are replaced by checkpointing and the chart callbacks (no progress bar, no decoding
    during fit: the report measures decoding itself).
    """
    name = name or f"{head}_b{block_size}"
    loggers = [
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run_dir), "name": name}}
    ]
    if wandb:
        loggers.append(
            {
                "class_path": "dspark_lightning.lightning.wandb.OfflineFirstWandbLogger",
                "init_args": {"save_dir": str(Path(run_dir) / name), "project": "dspark-lightning"},
            }
        )
    callbacks = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True, "save_top_k": 0},
        },
        {"class_path": "dspark_lightning.lightning.callbacks.AcceptanceCurves"},
        {"class_path": "dspark_lightning.lightning.callbacks.CalibrationDiagram"},
    ]
    if progress_bar:
        callbacks.insert(0, {"class_path": "lightning.pytorch.callbacks.TQDMProgressBar"})
    root = REPO_ROOT
    return [
        f"--config={root / 'configs/quickstart.yaml'}",
        f"--config={root / 'configs/heads' / head}.yaml",
        f"--model.target.path={root / 'assets/demo-target'}",
        f"--data.train_files={root / 'assets/data/regenerated'}/train-*.jsonl",
        f"--data.val_files={root / 'assets/data/sharegpt'}/validation-*.jsonl",
        f"--model.drafter.block_size={block_size}",
        f"--data.seq_len={seq_len}",
        f"--data.batch_size={batch_size}",
        f"--data.limit_val_samples={val_samples}",
        f"--data.num_eval_prompts={eval_prompts}",
        f"--model.drafter.max_anchors={max_anchors}",
        f"--model.training.lr_warmup_steps={max(1, min(40, steps // 10))}",
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={steps}",
        f"--trainer.limit_val_batches={val_batches}",
        f"--trainer.log_every_n_steps={max(1, min(10, steps // 20))}",
        f"--trainer.logger={json.dumps(loggers)}",
        f"--trainer.callbacks={json.dumps(callbacks)}",
        f"--trainer.enable_progress_bar={str(progress_bar).lower()}",
        "--trainer.enable_model_summary=false",
        *extra,
    ]


def shell_command(args: Sequence[str]) -> str:
    """``args`` as a copy-pasteable ``dspark-lightning`` command line, one option per line."""
    import shlex

    words = [shlex.quote(a) for a in args]
    head = ["dspark-lightning " + words.pop(0)] if words and not args[0].startswith("-") else ["dspark-lightning"]
    return " \\\n    ".join(head + words)


def command_line(name: str, function, values: dict) -> str:
    """The one-line ``dspark-lightning NAME ...`` that calls ``function`` with ``values`` (defaults left out).

    What a report records as the command that made it; values are spelled as the command table parses them (YAML
    lists ``[a,b]``, ``true``/``false``, a dataclass as ``--name.field value``).
    """
    import dataclasses
    import inspect
    import re
    import shlex

    def spelled(value) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, (list, tuple)):
            items = [spelled(v) for v in value]
            if all(re.fullmatch(r"[^\[\]{},:\s\"']+", item) for item in items):
                return "[" + ",".join(items) + "]"
            return json.dumps(list(value))  # an item YAML would split or nest (brackets, commas, colons)
        return str(value)

    words = [f"dspark-lightning {name}"]
    for key, parameter in inspect.signature(function).parameters.items():
        value, default = values[key], parameter.default
        if dataclasses.is_dataclass(value):
            defaults = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else {}
            words += [
                f"--{key}.{field} {shlex.quote(spelled(v))}"
                for field, v in dataclasses.asdict(value).items()
                if defaults.get(field) != v
            ]
        elif value is not None and (parameter.default is inspect.Parameter.empty or value != default):
            words.append(f"--{key} {shlex.quote(spelled(value))}")
    return " ".join(words)


def run_label(model: dict) -> tuple[str, int]:
    """(head name, block size) from a run's ``model`` settings: the ``model:`` section of its ``config.yaml`` (as
    LightningCLI saved it) or the module's hyper-parameters (``module.hparams``)."""
    drafter = migrate_hparams(model).get("drafter") or {}
    head = MarkovHeadConfig.coerce(drafter.get("markov_head"))
    return ("none" if head is None else head.label), int(drafter.get("block_size", 8))


def find_runs(root: str | Path) -> list[Path]:
    """Every run directory (one holding ``metrics.csv``) at or below ``root``, sorted by path."""
    root = Path(root)
    return sorted(p.parent for p in root.rglob("metrics.csv"))


# ---------------------------------------------------------------------------------------------------- output
KNOWN_HARMLESS_WARNINGS = (  # regular expressions matched at the start of the message
    r"LightningCLI's args parameter is intended",  # cli_main(args=...) inside Jupyter, whose argv holds kernel flags
    r"Found keys that are in the model state dict but not in the checkpoint",  # the frozen target is not saved
    r"Found \d+ module\(s\) in eval mode",  # the frozen target stays in eval mode on purpose
    r'install "ipywidgets" for Jupyter support',  # rich progress bar without ipywidgets
    r"IProgress not found",  # tqdm without ipywidgets
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning vs newer torch
    r"The anonymous setting has no effect",  # wandb
)


QUIET_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning", "dspark_lightning")


def quiet_logs() -> None:
    """Keep console output to the results: Lightning info logs, HF progress bars and known harmless warnings off
    (used by the report and the notebooks; the training itself is unaffected).

    It also imports ``dspark_lightning.plotting``, which selects matplotlib's Agg backend on import: a notebook runs
    ``%matplotlib inline`` *after* this call, so a later first import of the plotting module cannot switch inline
    figures off.
    """
    import warnings

    import lightning.pytorch  # noqa: F401  (sets its own log level on import: import first, then lower it)
    from transformers.utils import logging as hf_logging

    from dspark_lightning import plotting  # noqa: F401  (deferred: matplotlib, only for figures; selects Agg)

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    for message in KNOWN_HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


@contextlib.contextmanager
def quieted():
    """``quiet_logs`` for the duration of a block (the report inside a longer-lived process, e.g. the tests)."""
    import warnings

    import lightning.pytorch  # noqa: F401  (import first: it sets its own log level on import)
    from transformers.utils import logging as hf_logging

    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    try:
        with warnings.catch_warnings():
            quiet_logs()
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
