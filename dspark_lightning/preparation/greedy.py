"""Batched greedy generation for ``regenerate``: left-padded prompts in, each prompt's new tokens out (cut at eos)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a generation: the model's configured eos ids and the tokenizer's eos."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    ids.add(tokenizer.eos_token_id)
    return sorted(i for i in ids if i is not None)


def pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.no_grad()
def greedy_new_tokens(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    counts: Counter,
    truncated_key: str = "truncated_replies",
) -> list[list[int]]:
    """Greedy (``do_sample=False``) new tokens of every prompt, generated together with left padding; each is cut
    before its first eos. One that reaches ``max_new_tokens`` without an eos is counted as ``truncated_key``."""
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
        do_sample=False,
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
