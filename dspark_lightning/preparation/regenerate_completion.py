"""``regenerate --format completion``: on-policy completion records for a base model (a target without a chat
template): plain-text prompts and the target's own greedy continuation of each.

The prompts (``first_turn``, ``code``), ids and counters: docs/design/data.md §6.1."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from dspark_lightning.data.completion import CompletionEncoder, completion_id, first_turn_prompt, record_kind
from dspark_lightning.data.formats import DATA_FORMATS, has_chat_template
from dspark_lightning.data.records import RawRecord
from dspark_lightning.data.sharegpt import DataFormatError, InvalidRecord, conversation_id, to_conversation
from dspark_lightning.measuring.eval_sets import HUMANEVAL_CHAT_FORMAT
from dspark_lightning.preparation.greedy import eos_token_ids, greedy_new_tokens, pad_token_id

logger = logging.getLogger(__name__)

PROMPT_KINDS = ("first_turn", "code")
_FENCE = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)```", re.S | re.I)
_DEF = re.compile(r"[ \t]*(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(")
_DOCSTRING_START = re.compile(r"[ \t]*[rRuU]?(\"\"\"|''')")
MAX_SIGNATURE_LINES = 12


def regenerate_format(requested: str, tokenizer: Any, target: str) -> str:
    """``chat`` or ``completion`` for ``--format`` (``auto``: chat when the target's tokenizer has a chat template,
    completion when it has none). ``chat`` without a template is an error: a chat template is never invented."""
    if requested not in DATA_FORMATS:
        raise DataFormatError(f"--format must be one of {', '.join(DATA_FORMATS)}, got {requested!r}")
    template = has_chat_template(tokenizer)
    if requested == "chat" and not template:
        raise DataFormatError(
            f"--format chat, but the target {target!r} has no chat template, and a chat template is never invented: "
            "use --format completion (or auto), which writes completion records of plain-text prompts and the "
            "target's own continuations (docs/design/data.md §1.5)"
        )
    chosen = requested if requested != "auto" else "chat" if template else "completion"
    log = logger.info if template else logger.warning
    log("regenerate: format %s (--format %s; the target %s)", chosen, requested,
        "has a chat template" if template else "has no chat template, and none is invented")  # fmt: skip
    return chosen


def _signature_end(lines: list[str], start: int) -> int | None:
    for index in range(start, min(len(lines), start + MAX_SIGNATURE_LINES)):
        if lines[index].split("#", 1)[0].rstrip().endswith(":"):
            return index
    return None


def _docstring_end(lines: list[str], after: int) -> int | None:
    """The last line of a docstring that starts on the first non-blank line after ``after``; ``after`` when there is
    none; None when it never closes (the block was cut inside it)."""
    index = next((i for i in range(after + 1, len(lines)) if lines[i].strip()), None)
    opening = _DOCSTRING_START.match(lines[index]) if index is not None else None
    if opening is None:
        return after
    quote = opening.group(1)
    rest = lines[index][opening.end() :]
    if quote in rest:
        return index
    return next((i for i in range(index + 1, len(lines)) if quote in lines[i]), None)


def code_prompt(messages: Sequence[dict[str, str]]) -> str | None:
    """The code prompt of a conversation (docs/design/data.md §6.1): the first fenced Python block of any turn that defines a
    function, up to the end of that function's signature and docstring; None when no turn has one."""
    for message in messages:
        for fence in _FENCE.finditer(message["content"]):
            lines = fence.group(1).split("\n")
            for start, line in enumerate(lines):
                if not _DEF.match(line):
                    continue
                signature = _signature_end(lines, start)
                end = None if signature is None else _docstring_end(lines, signature)
                if end is not None:
                    return "\n".join(lines[: end + 1]) + "\n"
    return None


def read_prompt_records(raws: Iterable[RawRecord], counts: Counter) -> Iterator[tuple[str, list | str]]:
    """``(id, messages)`` of every valid conversation and ``(id, prompt)`` of every completion record with a non-blank
    prompt, in order; anything else is counted as ``bad_record:<reason>``."""
    for raw in raws:
        try:
            if raw.json_error is None and record_kind(raw.record) == "completion":
                yield _prompt_record(raw.record)
            else:
                messages = to_conversation(raw).messages
                yield conversation_id(raw.record, messages), messages
        except InvalidRecord as bad:
            counts[f"bad_record:{bad.reason}"] += 1


def _prompt_record(record: dict) -> tuple[str, str]:
    if "prompt" not in record:
        raise InvalidRecord("missing_prompt", f"keys: {sorted(record)[:8]}")
    prompt = record["prompt"]
    if not isinstance(prompt, str):
        raise InvalidRecord("non_string_content", f"'prompt' is {type(prompt).__name__}")
    if not prompt.strip():
        raise InvalidRecord("empty_content", "'prompt' is empty or only whitespace: nothing to continue")
    return completion_id(record, prompt, ""), prompt


def record_prompts(
    records: Iterable[tuple[str, list | str]], kinds: Sequence[str], counts: Counter
) -> Iterator[tuple[str, str]]:
    """``(prompt id, prompt)`` of each record: a completion record's own prompt, or a conversation's ``kinds``."""
    unknown = sorted(set(kinds) - set(PROMPT_KINDS))
    if unknown or not kinds:
        raise DataFormatError(f"--prompts must name some of {', '.join(PROMPT_KINDS)}, got {list(kinds)}")
    makers = {"first_turn": first_turn_prompt, "code": code_prompt}
    for identifier, payload in records:
        if isinstance(payload, str):
            yield identifier, payload
            continue
        for kind in PROMPT_KINDS:
            if kind not in kinds:
                continue
            prompt = makers[kind](payload)
            if prompt is None:
                counts[f"records_without_{kind}_prompt"] += 1
            else:
                yield f"{identifier}#{kind}", prompt


def code_chat_prompts(
    conversations: Iterable[tuple[str, list[dict[str, str]]]], counts: Counter
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """``(<id>#code, [user turn, empty assistant turn])`` of each conversation that has a code prompt: that prompt as
    one user turn in HumanEval's chat form (``eval_sets.HUMANEVAL_CHAT_FORMAT``) and the reply for a chat target to
    write (``regenerate --format chat --prompts '[code]'``); the others are counted as ``records_without_code_prompt``."""
    for identifier, messages in conversations:
        prompt = code_prompt(messages)
        if prompt is None:
            counts["records_without_code_prompt"] += 1
            continue
        question = {"role": "user", "content": HUMANEVAL_CHAT_FORMAT.format(prompt=prompt)}
        yield f"{identifier}#code", [question, {"role": "assistant", "content": ""}]


class GreedyContinuation:
    """Batched greedy continuations of plain-text prompts with one target model and tokenizer."""

    def __init__(
        self, model: Any, tokenizer: Any, max_new_tokens: int, max_prompt_tokens: int | None = None, sampling=None
    ):
        self.model, self.tokenizer, self.encoder = model, tokenizer, CompletionEncoder(tokenizer)
        self.sampling = sampling  # greedy.Sampling, or None: greedy
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens
        self.pad_token_id, self.eos_token_ids = pad_token_id(tokenizer), eos_token_ids(model, tokenizer)

    def continuation_text(self, prompt_ids: list[int], new_tokens: list[int]) -> str:
        """The decoded text after the decoded prompt (a tokenizer that joins tokens with spaces, or drops a leading
        one, decodes a continuation differently alone than after its prompt)."""
        full = self.tokenizer.decode(prompt_ids + new_tokens, skip_special_tokens=True)
        head = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        if full.startswith(head):
            return full[len(head) :]
        return self.tokenizer.decode(new_tokens, skip_special_tokens=True)

    def continuations(self, prompts: Sequence[str], counts: Counter) -> list[str]:
        """One greedy continuation per prompt."""
        encoded = [self.encoder.prompt_ids(prompt) for prompt in prompts]
        new = greedy_new_tokens(
            self.model, encoded, self.max_new_tokens, self.eos_token_ids, self.pad_token_id, counts,
            truncated_key="truncated_continuations", sampling=self.sampling,
        )  # fmt: skip
        return [self.continuation_text(ids, tokens) for ids, tokens in zip(encoded, new)]

    def regenerate_batch(self, batch: Sequence[tuple[str, str]], counts: Counter) -> list[dict[str, str]]:
        """Completion records ``{"id", "prompt", "completion"}`` of a batch of ``(id, prompt)`` (input order)."""
        kept = []
        for identifier, prompt in batch:
            if self.max_prompt_tokens and len(self.encoder.prompt_ids(prompt)) > self.max_prompt_tokens:
                counts["skipped_prompt_over_max_prompt_tokens"] += 1
            else:
                kept.append((identifier, prompt))
        texts = self.continuations([prompt for _, prompt in kept], counts) if kept else []
        records = []
        for (identifier, prompt), text in zip(kept, texts):
            if not text.strip():
                counts["dropped_empty_continuation"] += 1
                continue
            records.append({"id": identifier, "prompt": prompt, "completion": text})
        return records
