"""Multi-turn prompts (MT-Bench): each later user turn is sent after the target's own reply to the turn before.

Every decoding loop that measures an evaluation set runs a prompt through ``decode_turns``; a one-turn prompt is a
list of token ids, a multi-turn one a ``Conversation``. Tau over a conversation pools the steps of all its turns, so
an interval over prompts is an interval over questions (docs/design/design.md §7.8)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dspark_lightning.data.tokenize import ConversationEncoder

Messages = list[dict[str, str]]
Result = TypeVar("Result")


@dataclass(frozen=True)
class Conversation:
    """A chat prompt of several user turns: ``messages`` (the first turn, ending in a user message), then each of
    ``follow_ups`` as the next user message after the target's reply. ``encoder`` formats every turn's input
    through the target's chat template; replies enter the conversation as their decoded text, as the field's
    multi-turn evaluations do (FastChat's MT-Bench runner), not as raw ids."""

    messages: Messages
    follow_ups: list[str]
    encoder: ConversationEncoder

    @property
    def turns(self) -> int:
        return 1 + len(self.follow_ups)

    def messages_after(self, replies: Sequence[Sequence[int]]) -> Messages:
        """The conversation whose last message is user turn ``len(replies)`` (0-based), given the target's replies
        (token ids, special tokens dropped when decoded) to the turns before it."""
        if len(replies) >= self.turns:
            raise ValueError(f"a conversation of {self.turns} turns has no turn {len(replies) + 1}")
        messages = list(self.messages)
        for reply, follow_up in zip(replies, self.follow_ups):
            text = self.encoder.tokenizer.decode(list(reply), skip_special_tokens=True)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": follow_up}]
        return messages

    def turn_ids(self, replies: Sequence[Sequence[int]]) -> list[int]:
        """Token ids of the input that asks for the reply to turn ``len(replies)``."""
        return self.encoder.prompt_ids(self.messages_after(replies))


Prompt = list[int] | Conversation


def first_turn_ids(prompt: Prompt) -> list[int]:
    """The ids that ask for a prompt's first reply (the whole prompt when it has one turn)."""
    return prompt.turn_ids([]) if isinstance(prompt, Conversation) else list(prompt)


def decode_turns(prompt: Prompt, decode: Callable[[list[int]], tuple[Result, list[int]]]) -> list[Result]:
    """Run ``decode(ids) -> (result, reply ids)`` on every turn of ``prompt``, each later turn's input built from the
    replies before it; returns the turns' results in order."""
    if not isinstance(prompt, Conversation):
        return [decode(list(prompt))[0]]
    results: list[Any] = []
    replies: list[list[int]] = []
    for _ in range(prompt.turns):
        result, reply = decode(prompt.turn_ids(replies))
        results.append(result)
        replies.append(list(reply))
    return results


def reply_ids(output, prompt_length: int) -> list[int]:
    """The new tokens of a ``generate`` / ``speculative_generate`` output (shape [1, prompt + new])."""
    return output[0, prompt_length:].tolist()
