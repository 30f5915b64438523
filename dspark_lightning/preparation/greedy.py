"""Batched generation for ``regenerate``: left-padded prompts in, each prompt's new tokens out (cut at eos).

Greedy by default; ``Sampling`` (``regenerate --temperature/--top_p/--top_k``) samples instead, as DeepSpec regenerates
its training answers (T = 0.7, top-p 0.8, top-k 20), from torch's global generator (seeded by ``regenerate --seed``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dspark_lightning.errors import OptionError


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a generation: the model's configured eos ids and the tokenizer's eos."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    ids.add(tokenizer.eos_token_id)
    return sorted(i for i in ids if i is not None)


def pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@dataclass(frozen=True)
class Sampling:
    """How ``regenerate`` samples replies: temperature > 0, nucleus ``top_p`` in (0, 1], ``top_k`` (0: no cut)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0

    def generate_kwargs(self) -> dict[str, Any]:
        return dict(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k or None)


def sampling_options(temperature: float, top_p: float, top_k: int) -> Sampling | None:
    """The ``Sampling`` of ``--temperature/--top_p/--top_k`` (None: greedy), checked before the model loads."""
    if not 0 <= temperature < float("inf"):
        raise OptionError(f"--temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise OptionError(f"--top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise OptionError(f"--top_k must be >= 0 (0 = no cut), got {top_k}")
    if temperature == 0:
        if top_p != 1 or top_k:
            raise OptionError("--top_p and --top_k shape sampling: give --temperature > 0 too (0 is greedy)")
        return None
    return Sampling(temperature, top_p, top_k)


@torch.no_grad()
def greedy_new_tokens(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    counts: Counter,
    truncated_key: str = "truncated_replies",
    sampling: Sampling | None = None,
) -> list[list[int]]:
    """Greedy (``do_sample=False``) new tokens of every prompt, or sampled ones with ``sampling``, generated together
    with left padding; each is cut before its first eos. One that reaches ``max_new_tokens`` without an eos is counted
    as ``truncated_key``. A ``model`` with ``new_tokens`` (``interop.vllm_engine.VllmGenerator``) generates them
    itself, with the same cut and count."""
    if callable(getattr(model, "new_tokens", None)):
        return model.new_tokens(prompts, max_new_tokens, eos_ids, counts, truncated_key, sampling)
    width = max(map(len, prompts))
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):  # left padding
        input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
        attention_mask[row, width - len(ids) :] = 1
    device = next(model.parameters()).device
    output = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        max_new_tokens=max_new_tokens,
        **(sampling.generate_kwargs() if sampling is not None else dict(do_sample=False)),
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
    )
    new = []
    for tokens in output[:, width:].tolist():
        ended = [i for i, t in enumerate(tokens) if t in eos_ids]
        if not ended:
            counts[truncated_key] += 1
        new.append(tokens[: ended[0]] if ended else tokens)
    return new
