"""Export a trained drafter to the DSpark (or DFlash) checkpoint format of ``speculators`` (served by vLLM).

The format itself (every ``config.json`` field and tensor name, and the decisions where it is silent) is documented
in ``interop/speculators_format.py``; loading an export back is ``interop/speculators_load.py``. Tensors are written
in bf16 or fp32 (``d2t``/``t2d`` keep int64/bool), only as safetensors; checkpoints are read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import PositiveInt
from safetensors.torch import save_file

from dspark_lightning import checks
from dspark_lightning.errors import UnsupportedError
from dspark_lightning.interop.dflash_format import dflash_config, dflash_tensors, resolve_format
from dspark_lightning.interop.speculators_format import (
    CONFIG_NAME,
    DFLASH2_FORM,
    SELECTOR_PREFIX,
    WEIGHTS_NAME,
    _dtype,
    _format_key,
    _gate_form,
    build_config,
)
from dspark_lightning.interop.support_matrix import check_servable, head_kind
from dspark_lightning.lightning.checkpoint import load_checkpoint_module
from dspark_lightning.models import DSparkDrafter
from dspark_lightning.selector.convert import to_candidate_selector


def exported_tensors(
    drafter: DSparkDrafter, dtype: str | torch.dtype = "bfloat16", candidate_selector: bool = False
) -> dict[str, torch.Tensor]:
    """The ``model.safetensors`` content for ``drafter`` (floating tensors cast to ``dtype``, all on CPU)."""
    dtype = _dtype(dtype)
    head = drafter.markov_head
    if candidate_selector and _gate_form(head) != DFLASH2_FORM:
        raise UnsupportedError(
            "--candidate_selector true needs a DFlash-2 form Markov head (kind 'gated', gate_input 'hidden', "
            f"gate_activation 'identity'); this drafter has {_gate_form(head) or 'no Markov head'}"
        )
    tensors = {}
    for name, tensor in drafter.state_dict().items():
        key = _format_key(name)
        if key is None or (candidate_selector and key.startswith("markov_head.")):
            continue
        tensors[key] = tensor
    vocab = drafter.draft_vocab
    if vocab is not None:
        tensors.setdefault("lm_head.weight", drafter.lm_head.weight[vocab.d2t])
        tensors["d2t"] = vocab.d2t - torch.arange(vocab.draft_vocab_size, device=vocab.d2t.device)
        tensors["t2d"] = vocab.t2d
    if candidate_selector:
        tensors.update(to_candidate_selector(head, prefix=SELECTOR_PREFIX, d2t=drafter.d2t))
    return {
        key: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).cpu().contiguous().clone()
        for key, t in tensors.items()
    }


def umask() -> int:
    """The process's file-creation mask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ordinary_modes(*paths: Path) -> None:
    """Give ``paths`` the modes a plain ``mkdir`` / ``open`` would (0755 / 0644 under the usual umask 022):
    ``tempfile.mkdtemp`` makes 0700 and safetensors writes 0600, which would leave an export that only its writer
    can read (a serving engine running as another user could not)."""
    mask = umask()
    for path in paths:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def export_drafter(
    drafter: DSparkDrafter,
    output_dir: str | os.PathLike,
    *,
    dtype: str | torch.dtype = "bfloat16",
    candidate_selector: bool = False,
    format: str = "dspark",
    target_engine: str | None = None,
    **config_options,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` for ``drafter`` into ``output_dir``; returns the directory.

    ``format`` is ``dspark``, ``dflash`` (``interop/dflash_format.py``) or ``auto`` (``resolve_format``);
    ``target_engine`` (``speculators`` | ``vllm``) refuses a head that engine serves in no version the support
    matrix knows (``interop/support_matrix.py``). ``config_options`` are ``build_config``'s:
    ``verifier_name_or_path`` (required), ``selector_top_k``, ``target_config`` and ``target_layer_ids``.
    """
    output = Path(output_dir)
    # the config first: a drafter the format (or the engine) cannot take is refused before anything is created
    format = resolve_format(drafter, format, candidate_selector)
    config = build_config(drafter, dtype=dtype, candidate_selector=candidate_selector, **config_options)
    config = dflash_config(config) if format == "dflash" else config
    if target_engine is not None:
        check_servable(config, target_engine)
    tensors = exported_tensors(drafter, dtype, candidate_selector)
    tensors = dflash_tensors(tensors) if format == "dflash" else tensors
    output.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(output / WEIGHTS_NAME), metadata={"format": "pt"})
    (output / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    ordinary_modes(output / WEIGHTS_NAME, output / CONFIG_NAME)
    return output


# ---------------------------------------------------------------------------------------------------------- checkpoints
def read_checkpoint(ckpt_path: str | os.PathLike) -> dict:
    """``torch.load(weights_only=True)``. Current checkpoints hold only plain data (the Markov head as a class_path
    dict); older ones pickled the head config object, so our own config classes (and nothing else) are allowed."""
    return checks.read_checkpoint(ckpt_path)


def export_checkpoint(
    ckpt_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    verifier_name_or_path: str | None = None,
    dtype: str = "bfloat16",
    candidate_selector: bool = False,
    selector_top_k: int | None = None,
    target: str | None = None,
    overwrite: bool = False,
    format: str = "auto",
    target_engine: str | None = None,
) -> Path:
    """Export the drafter of a Lightning checkpoint (``format`` and ``target_engine`` as in ``export_drafter``).

    The verifier defaults to the checkpoint's ``target``, recorded portably (``speculators_format.verifier_record``:
    a hub id as such; a local directory by name and config hash, its path kept apart for reloading here). A non-empty ``output_dir`` is refused unless ``overwrite``; then the export is
    written next to it and swapped in, so no file of the old export survives.
    """
    output = Path(output_dir)
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        raise FileExistsError(f"--output {str(output)!r} exists and is not empty: pass --overwrite true to replace it")
    module = load_checkpoint_module(ckpt_path, target)
    target_path = module.target_args.path
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    ordinary_modes(staging)  # it becomes the export directory
    try:
        export_drafter(
            module.drafter,
            staging,
            verifier_name_or_path=verifier_name_or_path or target_path,
            dtype=dtype,
            candidate_selector=candidate_selector,
            selector_top_k=selector_top_k or module.loss_args.candidate_k,
            target_config=module.target.config,
            format=format,
            target_engine=target_engine,
        )
        if output.is_dir():
            shutil.rmtree(output)
        elif output.exists():
            output.unlink()
        staging.rename(output)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return output


# ---------------------------------------------------------------------------------------------------------------- CLI
def export_command(
    ckpt_path: str,
    output: str,
    dtype: Literal["bfloat16", "float32"] = "bfloat16",
    verifier: str | None = None,
    candidate_selector: bool = False,
    selector_top_k: PositiveInt | None = None,
    target: str | None = None,
    overwrite: bool = False,
    format: Literal["auto", "dspark", "dflash"] = "auto",
    target_engine: Literal["speculators", "vllm"] | None = None,
) -> Path:
    """Write a checkpoint in the speculators DSpark or DFlash format (config.json + model.safetensors) for vLLM.

    Args:
        ckpt_path: Lightning checkpoint (e.g. last.ckpt)
        output: output directory
        dtype: tensor dtype
        verifier: verifier hub id or path to record (default: the target; a local directory is recorded by name
            and config hash, its path kept for reloading on this machine)
        candidate_selector: write a DFlash-2 form head in the CandidateSelector layout (predecessor/successor
            codebooks)
        selector_top_k: candidates of the CandidateSelector (default: candidate_k)
        target: load the target from here instead of the recorded path
        overwrite: replace a non-empty output directory (no stale files are left)
        format: dspark, dflash (no Markov head, sample_from_anchor false: vLLM's dflash method, served on CPU too)
            or auto (dflash when the drafter loses nothing in it: no Markov or confidence head, sample_from_anchor
            false; else dspark)
        target_engine: refuse a Markov head that no version of this engine (speculators or vllm) the support matrix
            knows serves (default: export it, with a one-line warning when vLLM cannot serve it)
    """
    written = export_checkpoint(
        ckpt_path,
        output,
        verifier_name_or_path=verifier,
        dtype=dtype,
        candidate_selector=candidate_selector,
        selector_top_k=selector_top_k,
        target=target,
        overwrite=overwrite,
        format=format,
        target_engine=target_engine,
    )
    config = json.loads((written / CONFIG_NAME).read_text())
    head = "candidate selector" if config.get("dflash2_candidate_selector") else head_kind(config)
    print(
        f"exported to {written} ({config['speculators_model_type']} format): {CONFIG_NAME} + {WEIGHTS_NAME} "
        f"({dtype}), verifier {config['speculators_config']['verifier']['name_or_path']!r}, block "
        f"{config['block_size']}, markov head {head}, draft vocab {config['draft_vocab_size']}"
    )
    warning = check_servable(config, None)
    if warning:
        print(warning)
    return written
