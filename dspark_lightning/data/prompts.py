"""Eval prompts: the start of a validation conversation, up to its first assistant turn, for measured decoding."""

from __future__ import annotations

from collections.abc import Iterable

from dspark_lightning.data.sharegpt import Conversation
from dspark_lightning.data.splits import IdSplit
from dspark_lightning.data.tokenize import ConversationEncoder


def prompt_messages(conversation: Conversation) -> list[dict[str, str]]:
    """The messages before the first assistant turn (a validated conversation always has one)."""
    first_assistant = next(i for i, m in enumerate(conversation.messages) if m["role"] == "assistant")
    return conversation.messages[:first_assistant]


def choose_eval_conversations(
    conversations: Iterable[Conversation],
    count: int,
    encoder: ConversationEncoder,
    seq_len: int,
    id_split: IdSplit | None = None,
) -> list[Conversation]:
    """The first ``count`` conversations, in order, whose prompt ends with a user turn and is shorter than
    ``seq_len`` tokens (with ``id_split``: only those it assigns to validation)."""
    chosen = []
    for conversation in conversations:
        if len(chosen) >= count:
            break
        if id_split is not None and id_split.split_of(conversation.record_id) != "validation":
            continue
        prompt = prompt_messages(conversation)
        if prompt and prompt[-1]["role"] == "user" and len(encoder.prompt_ids(prompt)) < seq_len:
            chosen.append(conversation)
    return chosen
