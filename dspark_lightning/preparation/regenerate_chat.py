"""Chat regeneration for ``regenerate``: every assistant turn of a conversation rewritten with the target's own reply,
in batches, one turn at a time (the completion form for base models is ``regenerate_completion.py``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dspark_lightning.data.shard_writer import to_sharegpt
from dspark_lightning.preparation.greedy import Sampling, eos_token_ids, greedy_new_tokens, pad_token_id


class GreedyRegenerator:
    """Batched greedy generation of assistant turns with one target model and tokenizer."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_new_tokens: int,
        max_prompt_tokens: int | None = None,
        template_kwargs: dict[str, Any] | None = None,
        max_turns: int | None = None,
        sampling: Sampling | None = None,
    ):
        self.model, self.tokenizer, self.max_turns, self.sampling = model, tokenizer, max_turns, sampling
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens
        self.template_kwargs = dict(template_kwargs or {})
        self.pad_token_id = pad_token_id(tokenizer)
        self.eos_token_ids = eos_token_ids(model, tokenizer)

    def generate_replies(self, prompts: Sequence[Sequence[dict[str, str]]], counts: Counter) -> list[str]:
        """One greedy reply per prompt (each prompt ends before the assistant turn to write)."""
        encoded = [
            self.tokenizer.apply_chat_template(
                list(p), tokenize=True, add_generation_prompt=True, return_dict=False, **self.template_kwargs
            )
            for p in prompts
        ]
        new = greedy_new_tokens(
            self.model, encoded, self.max_new_tokens, self.eos_token_ids, self.pad_token_id, counts,
            sampling=self.sampling,
        )  # fmt: skip
        return [self.tokenizer.decode(tokens, skip_special_tokens=True).strip() for tokens in new]

    def prompt_length(self, messages: Sequence[dict[str, str]]) -> int:
        return len(
            self.tokenizer.apply_chat_template(
                list(messages), tokenize=True, add_generation_prompt=True, return_dict=False, **self.template_kwargs
            )
        )

    def regenerate_batch(
        self, batch: Sequence[tuple[str, list[dict[str, str]]]], counts: Counter
    ) -> list[dict[str, Any]]:
        """Regenerate every assistant turn of a batch of conversations; returns ShareGPT records (input order)."""
        originals = [messages for _, messages in batch]
        rewritten: list[list[dict[str, str]]] = [[] for _ in batch]
        position = [0] * len(batch)  # next original message index per conversation
        finished = [False] * len(batch)
        while True:
            pending = []
            for i, messages in enumerate(originals):
                if finished[i]:
                    continue
                while position[i] < len(messages) and (
                    messages[position[i]]["role"] != "assistant" or not any(m["role"] == "user" for m in rewritten[i])
                ):
                    if messages[position[i]]["role"] == "assistant":  # a reply to no prompt: nothing to regenerate
                        counts["skipped_reply_without_prompt"] += 1
                    else:
                        rewritten[i].append(messages[position[i]])
                    position[i] += 1
                replies_written = sum(m["role"] == "assistant" for m in rewritten[i])
                if position[i] >= len(messages) or (self.max_turns and replies_written >= self.max_turns):
                    finished[i] = True
                elif self.max_prompt_tokens and self.prompt_length(rewritten[i]) > self.max_prompt_tokens:
                    counts["conversations_cut_at_max_prompt_tokens"] += 1
                    finished[i] = True
                else:
                    pending.append(i)
            if not pending:
                break
            replies = self.generate_replies([rewritten[i] for i in pending], counts)
            for i, reply in zip(pending, replies):
                if not reply:
                    counts["dropped_empty_reply"] += 1
                    finished[i] = True
                    rewritten[i] = []
                    continue
                rewritten[i].append({"role": "assistant", "content": reply})
                position[i] += 1
        records = []
        for (identifier, _), messages in zip(batch, rewritten):
            while messages and messages[-1]["role"] != "assistant":
                messages.pop()  # trailing turns after the last regenerated reply carry no supervision
            if not any(m["role"] == "assistant" for m in messages):
                counts["dropped_no_regenerated_turn"] += 1
                continue
            records.append(to_sharegpt(identifier, messages))
        return records
