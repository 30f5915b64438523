"""Where studies' runs come from and go: the checkout, the demo's ``fit`` arguments, finding and naming run directories.

Every path handed to the CLI is absolute (the shipped configs and demo assets: ``shipped.py``, in a checkout or a
wheel), so notebooks work from any working directory and never write into the repository unless told to; the demo
budget defaults (sequence length 128, 4 rows, 16 anchors) are the ones that learn visibly in a few hundred CPU steps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from dspark_lightning.lightning.config import migrate_hparams
from dspark_lightning.models.markov import MarkovHeadConfig
from dspark_lightning.shipped import SHIPPED_ROOT


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
    root = SHIPPED_ROOT
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
