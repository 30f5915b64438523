"""A "base model" made of the demo target: the same files without its chat template (as Gemma 3 270M ships), and
optionally a tokenizer that puts a BOS before plain text (as Gemma's does; the demo tokenizer adds nothing)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers.paths import DEMO_TARGET

BOS_TOKEN = "<|endoftext|>"  # the demo tokenizer's pad token, doubling as a BOS in the BOS variant


def base_model_copy(directory: Path, *, weights: bool = True, bos: bool = False) -> Path:
    """The demo target copied to ``directory`` with no chat template (``weights=False``: the tokenizer files only);
    ``bos``: its tokenizer also adds :data:`BOS_TOKEN` in front of every plain text (a post-processor)."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in DEMO_TARGET.iterdir():
        if path.name == "chat_template.jinja" or (path.name == "model.safetensors" and not weights):
            continue
        shutil.copy(path, directory / path.name)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if bos:
        from tokenizers import Tokenizer
        from tokenizers.processors import TemplateProcessing

        backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        special = [(BOS_TOKEN, backend.token_to_id(BOS_TOKEN))]
        backend.post_processor = TemplateProcessing(
            single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=special
        )
        backend.save(str(directory / "tokenizer.json"))
        config["bos_token"] = BOS_TOKEN
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return directory
