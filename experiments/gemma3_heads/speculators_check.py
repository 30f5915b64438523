"""The recipe's real Gemma 3 270M drafters, exported and loaded by the speculators package: the same logits?

    python3 -m venv /tmp/specvenv && /tmp/specvenv/bin/pip install -c constraints-cpu.txt speculators
    /tmp/specvenv/bin/pip uninstall -y torchvision torchaudio
    .venv/bin/python experiments/gemma3_heads/speculators_check.py --ckpt none=runs/gemma3-heads/none/version_0/checkpoints/last.ckpt

Each ``HEAD=CHECKPOINT`` (a ``last.ckpt`` of `bash experiments/gemma3_heads/run.sh report`, trained with ``block_embedding: lookup``, configs/gemma3_completion.yaml) is exported in
fp32, loaded by speculators' ``DSparkDraftModel`` in its own interpreter and run on one 8-token block after an
11-token prefix of the real target's features: base logits, Markov bias and confidence logits against our drafter's
(``dspark_lightning/interop/speculators_parity.py``, as the interop test). Writes experiments/gemma3_heads/speculators_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", nargs="+", required=True, help="HEAD=CHECKPOINT, one per drafter")
    parser.add_argument("--output", default=str(ROOT / "experiments/gemma3_heads/speculators_check.json"))
    parser.add_argument(
        "--python",
        default=os.environ.get("DSPARK_SPECULATORS_PYTHON", "/tmp/specvenv/bin/python"),
        help="an interpreter with speculators installed",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    from safetensors.torch import load_file

    from dspark_lightning.cli import cli_main
    from dspark_lightning.interop import load_exported
    from dspark_lightning.interop.speculators_parity import block_inputs, our_outputs, run_speculators
    from dspark_lightning.lightning.checkpoint import load_checkpoint_module

    results = {}
    for spec in args.ckpt:
        head, _, ckpt = spec.partition("=")
        work = Path(tempfile.mkdtemp(prefix=f"gemma-export-{head}-"))
        cli_main(["export", "--ckpt_path", str(ckpt), "--output", str(work / "export"), "--dtype", "float32"])
        module = load_checkpoint_module(str(ckpt), features="online")
        drafter, target = module.drafter.eval(), module.target
        inputs, anchors = block_inputs(
            target, work / "inputs.safetensors", target.vocab_size, drafter.config.mask_token_id, B=drafter.block_size
        )
        ours = our_outputs(drafter, inputs, anchors)
        job = {
            "name": head,
            "dir": str(work / "export"),
            "verifier": str(Path(module.target_args.path).resolve()),
        }
        loaded = run_speculators(
            args.python, work, [job | {"inputs": str(work / "inputs.safetensors"), "outputs": str(work / "theirs")}]
        )
        theirs = load_file(str(work / "theirs")) if loaded[head] == "ok" else {}
        results[head] = {
            "checkpoint": str(ckpt),
            "speculators_load": loaded[head],
            "max_abs_difference": {k: float((theirs[k] - v).abs().max()) for k, v in ours.items() if k in theirs},
            "max_abs_base_logit": float(ours["base"].abs().max()),
            "our_loader_max_abs_difference": max(
                float((o - ours[k]).abs().max())
                for k, o in our_outputs(load_exported(work / "export", target), inputs, anchors).items()
            ),
        }
        print(head, json.dumps(results[head]))
    Path(args.output).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
