"""Eval prompts for measured decoding: the start of a validation conversation up to its first assistant turn, or
the prompt of a validation completion record."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dspark_lightning.data.sharegpt import Conversation
from dspark_lightning.data.splits import IdSplit
from dspark_lightning.data.tokenize import first_prompt


def prompt_messages(conversation: Conversation) -> list[dict[str, str]]:
    """The messages before the first assistant turn (a validated conversation always has one)."""
    return first_prompt(conversation.messages)


def choose_eval_conversations(
    examples: Iterable[Any],
    count: int,
    encoder: Any,
    seq_len: int,
    id_split: IdSplit | None = None,
) -> list[Any]:
    """The first ``count`` examples, in order, that have a prompt (``encoder.example_prompt_ids``: a conversation's
    messages before its first reply ending with a user turn, a completion record's non-blank prompt) shorter than
    ``seq_len`` tokens (with ``id_split``: only those it assigns to validation)."""
    chosen = []
    for example in examples:
        if len(chosen) >= count:
            break
        if id_split is not None and id_split.split_of(example.record_id) != "validation":
            continue
        prompt_ids = encoder.example_prompt_ids(example)
        if prompt_ids is not None and len(prompt_ids) < seq_len:
            chosen.append(example)
    return chosen
