"""Conversations -> token ids + assistant loss mask (chat template), and packing into fixed-length rows.

The loss mask and truncation: docs/design/data.md §3; packing: §4; the per-document reasons: §2."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dspark_lightning.data.records import RawRecord
from dspark_lightning.data.sharegpt import Conversation, DataFormatError, InvalidRecord, to_conversation
from dspark_lightning.errors import OptionError

logger = logging.getLogger(__name__)

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(chat_template: str | None) -> bool:
    """Whether a chat template wraps assistant content in ``{% generation %}`` ... ``{% endgeneration %}``."""
    return bool(chat_template) and bool(_GENERATION_TAG.search(chat_template))


def choose_mask_token(tokenizer: Any) -> str:
    """An unused special token to serve as the drafter's mask token, for tokenizers that define none.

    Candidates are the tokenizer's added special tokens that are none of its named special tokens (bos, eos, pad,
    unk, ...) and never appear in its chat template, so the token cannot occur in rendered training text. A name
    saying it is meant for this (``mask``, then ``unused`` / ``reserved``) wins; otherwise the highest id, which in
    practice is the most obscure of the tokenizer's extras (SmolLM2: ``<empty_output>``). Deterministic.
    """
    named = set(tokenizer.all_special_tokens)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    candidates = [
        (token_id, added.content)
        for token_id, added in sorted(tokenizer.added_tokens_decoder.items())
        if added.special and added.content not in named and added.content not in template
    ]
    if not candidates:
        raise ValueError(
            "the tokenizer has no mask token and no unused special token to use as one: add a token to the "
            "tokenizer (and resize the target's embeddings) or pass mask_token=<an existing token that never occurs>"
        )
    for hint in ("mask", "unused", "reserved"):
        named_for_it = [content for _, content in candidates if hint in content.lower()]
        if named_for_it:
            return named_for_it[0]
    return candidates[-1][1]


def resolve_mask_token(tokenizer: Any, mask_token: str | None, name: str) -> tuple[str, int]:
    """The drafter's mask token and its id: ``mask_token`` if given, else the tokenizer's mask token, else an unused
    special token picked by :func:`choose_mask_token` (logged as a warning)."""
    token = mask_token or tokenizer.mask_token
    if token is None:
        token = choose_mask_token(tokenizer)
        logger.warning(
            "tokenizer %r has no mask token: using the unused special token %r (id %d) as the drafter's mask "
            "token; set data.mask_token to choose another",
            name,
            token,
            tokenizer.convert_tokens_to_ids(token),
        )
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise OptionError(
            f"data.mask_token: tokenizer {name!r} has no token {token!r}; pass an unused token of its vocabulary"
        )
    return token, int(token_id)


def resolve_pad_token_id(tokenizer: Any, name: str) -> int:
    """Id written on padding positions: the tokenizer's pad token, else its eos token."""
    token_id = tokenizer.pad_token_id
    token_id = tokenizer.eos_token_id if token_id is None else token_id
    if token_id is None:
        raise ValueError(f"tokenizer {name!r} has neither a pad nor an eos token")
    return int(token_id)


@dataclass(frozen=True)
class TokenizedConversation:
    """Token ids of one rendered conversation and its assistant (loss) mask."""

    input_ids: list[int]
    loss_mask: list[bool]
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.input_ids)


def finish_document(
    input_ids: list[int],
    loss_mask: list[bool],
    max_lengths: Sequence[int | None],
    min_supervised_tokens: int,
    block_size: int,
    supervised_name: str = "assistant",
) -> TokenizedConversation:
    """Truncate to the smallest of ``max_lengths`` (keeping the head) and apply the rules every document shares
    (``over_max_length``, ``too_few_supervised_tokens``, ``no_anchor_room``); raises InvalidRecord."""
    limit = min(x for x in (*max_lengths, len(input_ids)) if x is not None)
    truncated = limit < len(input_ids)
    input_ids, loss_mask = input_ids[:limit], loss_mask[:limit]
    supervised = sum(loss_mask)
    if truncated and supervised == 0:
        raise InvalidRecord("over_max_length", f"no {supervised_name} token within the first {limit} tokens")
    if supervised < min_supervised_tokens:
        raise InvalidRecord("too_few_supervised_tokens", f"{supervised} < {min_supervised_tokens}")
    if block_size > 0 and not any(loss_mask[: max(0, len(loss_mask) - block_size)]):
        raise InvalidRecord("no_anchor_room", f"no {supervised_name} token before the last {block_size} tokens")
    return TokenizedConversation(input_ids, loss_mask, truncated)


def mask_from_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """True for every token whose character range overlaps one of the (sorted, disjoint) spans."""
    mask = [False] * len(offsets)
    span_index = 0
    for token_index, (start, end) in enumerate(offsets):
        while span_index < len(spans) and start >= spans[span_index][1]:
            span_index += 1
        if span_index == len(spans):
            break
        if end > spans[span_index][0] and end > start:
            mask[token_index] = True
    return mask


def assistant_spans_by_search(text: str, messages: Sequence[dict[str, str]], end_of_turn: str | None):
    """Character spans of the assistant contents (plus a directly following ``end_of_turn``) inside ``text``."""
    spans = []
    cursor = 0
    for index, message in enumerate(messages):
        content = message["content"]
        start = text.find(content, cursor)
        if start < 0 and content.strip() != content:
            content = content.strip()
            start = text.find(content, cursor)
        if start < 0:
            raise InvalidRecord("chat_template_error", f"turn {index} content not found in the rendered template")
        end = start + len(content)
        cursor = end
        if message["role"] != "assistant":
            continue
        if end_of_turn and text.startswith(end_of_turn, end):
            end += len(end_of_turn)
        spans.append((start, end))
    return spans


class ConversationEncoder:
    """Render, tokenise, mask and truncate conversations with one tokenizer (docs/design/data.md §3)."""

    format = "chat"

    def __init__(
        self,
        tokenizer: Any,
        max_length: int | None = None,
        min_supervised_tokens: int = 1,
        block_size: int = 0,
        template_kwargs: dict[str, Any] | None = None,
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise DataFormatError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template, and a chat template "
                "is never invented: train a base model on completion records (data.format: completion, docs/design/data.md "
                "§1.5)"
            )
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.min_supervised_tokens = min_supervised_tokens
        self.block_size = block_size
        self.template_kwargs = dict(template_kwargs or {})
        self.uses_generation_markers = has_generation_markers(tokenizer.chat_template)

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **self.template_kwargs
        )

    def _ids_and_mask(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[bool]]:
        if self.uses_generation_markers:
            encoded = self.tokenizer.apply_chat_template(
                list(messages),
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                **self.template_kwargs,
            )
            return list(encoded["input_ids"]), [bool(m) for m in encoded["assistant_masks"]]
        text = self.render(messages)
        spans = assistant_spans_by_search(text, messages, self.tokenizer.eos_token)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoded["input_ids"]), mask_from_spans(encoded["offset_mapping"], spans)

    def encode(self, messages: Sequence[dict[str, str]], max_length: int | None = None) -> TokenizedConversation:
        """Token ids and assistant mask, truncated to ``min(self.max_length, max_length)``; raises InvalidRecord."""
        try:
            input_ids, loss_mask = self._ids_and_mask(messages)
        except InvalidRecord:
            raise
        except Exception as error:  # jinja2 TemplateError from raise_exception(), or anything the template trips on
            raise InvalidRecord("chat_template_error", f"{type(error).__name__}: {error}") from None
        return finish_document(
            input_ids, loss_mask, (self.max_length, max_length), self.min_supervised_tokens, self.block_size
        )

    def prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Ids of ``messages`` followed by the generation prompt (the input that asks for the next reply)."""
        return list(
            self.tokenizer.apply_chat_template(
                list(messages), tokenize=True, add_generation_prompt=True, return_dict=False, **self.template_kwargs
            )
        )

    # the interface the record stream and the eval prompts use for either format (``completion.CompletionEncoder``)
    @staticmethod
    def parse(raw: RawRecord) -> Conversation:
        return to_conversation(raw)

    def encode_example(self, example: Conversation, max_length: int | None = None) -> TokenizedConversation:
        return self.encode(example.messages, max_length)

    def example_prompt_ids(self, example: Conversation) -> list[int] | None:
        """Ids of the messages before the first assistant turn plus the generation prompt; None unless they end
        in a user turn."""
        prompt = first_prompt(example.messages)
        return self.prompt_ids(prompt) if prompt and prompt[-1]["role"] == "user" else None

    def example_reference(self, example: Conversation) -> TokenizedConversation:
        """The prompt and the first assistant turn, tokenised and masked as in training."""
        return self.encode(example.messages[: len(first_prompt(example.messages)) + 1])


def first_prompt(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The messages before the first assistant turn (a validated conversation always has one)."""
    first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return list(messages[:first_assistant])


@dataclass
class _OpenRow:
    documents: list[TokenizedConversation] = field(default_factory=list)
    length: int = 0


class SequencePacker:
    """First-fit packing of tokenised documents into rows of exactly ``seq_len`` tokens (docs/design/data.md §4)."""

    def __init__(self, seq_len: int, pad_token_id: int, open_rows: int = 4):
        if seq_len < 1 or open_rows < 1:
            raise ValueError("seq_len and open_rows must be positive")
        self.seq_len, self.pad_token_id, self.open_rows = seq_len, pad_token_id, open_rows
        self._rows: list[_OpenRow] = []

    def add(self, document: TokenizedConversation) -> list[dict[str, torch.Tensor]]:
        """Place one document (≤ seq_len tokens); returns the rows this completes (possibly none)."""
        if len(document) > self.seq_len:
            raise ValueError(f"document of {len(document)} tokens exceeds seq_len={self.seq_len}; truncate first")
        if len(document) == 0:
            return []
        for row in self._rows:
            if row.length + len(document) <= self.seq_len:
                row.documents.append(document)
                row.length += len(document)
                return [self._emit(row)] if row.length == self.seq_len else []
        emitted = []
        if len(self._rows) >= self.open_rows:
            emitted.append(self._emit(max(self._rows, key=lambda r: r.length)))
        self._rows.append(_OpenRow([document], len(document)))
        if len(document) == self.seq_len:
            emitted.append(self._emit(self._rows[-1]))
        return emitted

    def flush(self) -> list[dict[str, torch.Tensor]]:
        """Emit every open row (fullest first)."""
        rows = sorted(self._rows, key=lambda r: -r.length)
        return [self._emit(row) for row in rows]

    def _emit(self, row: _OpenRow) -> dict[str, torch.Tensor]:
        self._rows.remove(row)
        return build_packed_row(row.documents, self.seq_len, self.pad_token_id)


def build_packed_row(
    documents: Sequence[TokenizedConversation], seq_len: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    """One row of the batch contract (see ``dspark_lightning.data``) from documents that fit in ``seq_len``."""
    input_ids = torch.full((seq_len,), pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros(seq_len, dtype=torch.bool)
    document_ids = torch.full((seq_len,), -1, dtype=torch.long)
    position_ids = torch.zeros(seq_len, dtype=torch.long)
    offset = 0
    for index, document in enumerate(documents):
        end = offset + len(document)
        if end > seq_len:
            raise ValueError(f"documents need {end} tokens > seq_len={seq_len}")
        input_ids[offset:end] = torch.tensor(document.input_ids, dtype=torch.long)
        loss_mask[offset:end] = torch.tensor(document.loss_mask, dtype=torch.bool)
        document_ids[offset:end] = index
        position_ids[offset:end] = torch.arange(len(document))
        offset = end
    return {"input_ids": input_ids, "loss_mask": loss_mask, "document_ids": document_ids, "position_ids": position_ids}
