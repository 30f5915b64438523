"""Build the demo ShareGPT corpus from CPython's own standard library (docstrings and source).

Design choices:
- Source text is whatever ``inspect`` finds in the running interpreter, so the corpus needs no download. It is
  byte-for-byte reproducible for a given Python version (docstrings change between versions; the version is recorded
  in ``assets/data/sharegpt/metadata.json``).
- Everything is driven by a fixed module list, sorted attribute names and one ``random.Random(seed)``; nothing that
  depends on the machine leaks in (memory addresses in signatures are filtered, source paths are made relative to the
  standard library directory).
- Responses are kept short (docstring summaries ≤ ~320 characters, source excerpts ≤ ~420 characters, ≲ 200 tokens)
  and the module list is small (~600 documented objects, each seen in several conversations) so that a tiny
  CPU-trained target can memorise much of it and answer validation prompts coherently.
- Conversation kinds: "what does X do" (docstring summary), signatures, source excerpts, module overviews, lists of
  a module's public names; about a third are multi-turn follow-ups, about a third start with a system turn.
- The split is by conversation (a random validation subset). The same library object can appear in several
  conversations, so validation text overlaps training text in content though never in wording of a whole dialogue;
  this keeps the demo target's validation prompts answerable.
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import re
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path

MODULES = (
    "abc base64 calendar collections contextlib copy csv dataclasses datetime difflib enum fnmatch fractions "
    "functools glob graphlib hashlib heapq html itertools json math operator pathlib posixpath pprint queue random re "
    "secrets shlex shutil statistics string tempfile textwrap urllib.parse uuid"
).split()

SYSTEM_PROMPTS = (
    "You are a helpful assistant for Python programmers.",
    "You are an expert on the Python standard library. Answer briefly.",
    "You answer questions about Python modules with their documentation.",
    "You are a concise coding assistant.",
)

DOC_QUESTIONS = (
    "What does `{q}` do?",
    "Explain `{q}`.",
    "What is `{q}` used for?",
    "Can you describe `{q}` from the `{m}` module?",
    "Tell me about {q}.",
    "I found `{q}` in some code. What does it do?",
)
SIGNATURE_QUESTIONS = (
    "What is the signature of `{q}`?",
    "Which arguments does `{q}` take?",
    "How do I call `{q}`?",
)
SOURCE_QUESTIONS = (
    "Show me the source of `{q}`.",
    "How is `{q}` implemented?",
    "Can I see the code of `{q}` in the `{m}` module?",
)
MODULE_QUESTIONS = (
    "What is the `{m}` module for?",
    "Give me an overview of the `{m}` module.",
    "What does the Python module `{m}` provide?",
)
LIST_QUESTIONS = (
    "Which public names does `{m}` define?",
    "List the functions and classes in `{m}`.",
)
FOLLOW_UP_SOURCE = ("Show me the code.", "How is it implemented?", "Can I see its source?")
FOLLOW_UP_SIGNATURE = ("What is its signature?", "Which arguments does it take?", "How do I call it?")
FOLLOW_UP_LIST = ("Which names does it define?", "What functions and classes are in it?")

MAX_DOC_CHARS = 320
MAX_SOURCE_CHARS = 420
MAX_LISTED_NAMES = 24


@dataclass(frozen=True)
class LibraryObject:
    """One documented function, class or method of a standard-library module."""

    module: str
    qualname: str
    summary: str | None
    signature: str | None
    source: str | None
    source_file: str | None

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclass(frozen=True)
class LibraryModule:
    """A module with its docstring summary and the library objects it defines."""

    name: str
    summary: str | None
    objects: tuple[LibraryObject, ...]


def summarise_docstring(doc: str | None, max_chars: int = MAX_DOC_CHARS) -> str | None:
    """First paragraph(s) of a docstring on one line, cut at a sentence end so it stays ≤ ``max_chars``."""
    if not doc:
        return None
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]
    paragraphs = [p for p in paragraphs if not p.startswith(">>>")]
    if not paragraphs:
        return None
    text = paragraphs[0]
    for extra in paragraphs[1:]:
        if len(text) >= 80 or len(text) + len(extra) + 1 > max_chars:
            break
        text = f"{text} {extra}"
    if len(text) > max_chars:
        cut = text[:max_chars]
        sentence_end = max(cut.rfind(". "), cut.rfind(".\n"))
        text = cut[: sentence_end + 1] if sentence_end > max_chars // 3 else cut.rsplit(" ", 1)[0] + " ..."
    return text if len(text) >= 12 else None


def excerpt_source(source: str, max_chars: int = MAX_SOURCE_CHARS) -> str:
    """Whole lines of ``source`` up to ``max_chars``; an elided tail is marked with an indented ``...`` line."""
    lines = textwrap.dedent(source).rstrip().splitlines()
    kept: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > max_chars and kept:
            indent = len(kept[-1]) - len(kept[-1].lstrip()) if kept[-1].strip() else 4
            kept.append(" " * max(indent, 4) + "...")
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept)


def _signature(obj: object) -> str | None:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None
    if " at 0x" in text or len(text) > 200:  # memory addresses are not reproducible; very long ones are noise
        return None
    return text


def _source(obj: object, stdlib_dir: Path) -> tuple[str | None, str | None]:
    try:
        source = inspect.getsource(obj)
        path = Path(inspect.getsourcefile(obj) or "")
    except (OSError, TypeError):
        return None, None
    try:
        relative = path.resolve().relative_to(stdlib_dir.resolve()).as_posix()
    except ValueError:
        return None, None
    return excerpt_source(source), relative


def _is_public_definition(name: str, obj: object, module_name: str) -> bool:
    if name.startswith("_"):
        return False
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
        return False
    return getattr(obj, "__module__", None) == module_name


def collect_library(modules: tuple[str, ...] | list[str] = MODULES) -> list[LibraryModule]:
    """Import each module and collect its public functions, classes and their public methods (sorted by name)."""
    stdlib_dir = Path(sysconfig.get_paths()["stdlib"])
    collected = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        objects = []
        for name, obj in sorted(vars(module).items()):
            if not _is_public_definition(name, obj, module.__name__):
                continue
            members = [(name, obj)]
            if inspect.isclass(obj):
                members += [
                    (f"{name}.{method_name}", method)
                    for method_name, method in sorted(vars(obj).items())
                    if not method_name.startswith("_") and inspect.isfunction(method)
                ]
            for qualname, member in members:
                source, source_file = _source(member, stdlib_dir)
                objects.append(
                    LibraryObject(
                        module=module_name,
                        qualname=qualname,
                        summary=summarise_docstring(inspect.getdoc(member)),
                        signature=_signature(member),
                        source=source,
                        source_file=source_file,
                    )
                )
        collected.append(LibraryModule(module_name, summarise_docstring(inspect.getdoc(module)), tuple(objects)))
    return collected


def _doc_answer(obj: LibraryObject) -> str:
    return f"`{obj.dotted}`: {obj.summary}"


def _signature_answer(obj: LibraryObject) -> str:
    return f"Call it as `{obj.dotted}{obj.signature}`."


def _source_answer(obj: LibraryObject) -> str:
    return f"Here is `{obj.dotted}` from `{obj.source_file}`:\n```python\n{obj.source}\n```"


def _list_answer(module: LibraryModule) -> str:
    names = sorted({o.qualname.split(".")[0] for o in module.objects})
    shown = ", ".join(f"`{n}`" for n in names[:MAX_LISTED_NAMES])
    more = f" and {len(names) - MAX_LISTED_NAMES} more" if len(names) > MAX_LISTED_NAMES else ""
    return f"`{module.name}` defines {shown}{more}."


def _turn(role: str, value: str) -> dict[str, str]:
    return {"from": role, "value": value}


def make_conversation(rng: random.Random, library: list[LibraryModule]) -> list[dict[str, str]]:
    """One conversation (ShareGPT turns) of a randomly chosen kind."""
    documented = [o for m in library for o in m.objects if o.summary]
    pools = {
        "doc": documented,
        "signature": [o for o in documented if o.signature],
        "source": [o for o in documented if o.source],
    }
    kind = rng.choices(
        ["doc", "signature", "source", "module", "list", "doc+source", "doc+signature", "module+list"],
        weights=[30, 10, 12, 6, 4, 16, 14, 8],
    )[0]
    turns: list[dict[str, str]] = []
    if rng.random() < 0.33:
        turns.append(_turn("system", rng.choice(SYSTEM_PROMPTS)))
    if kind in ("module", "list", "module+list"):
        module = rng.choice([m for m in library if m.summary and m.objects])
        if kind == "list":
            return turns + [
                _turn("human", rng.choice(LIST_QUESTIONS).format(m=module.name)),
                _turn("gpt", _list_answer(module)),
            ]
        turns += [
            _turn("human", rng.choice(MODULE_QUESTIONS).format(m=module.name)),
            _turn("gpt", f"The `{module.name}` module: {module.summary}"),
        ]
        if kind == "module+list":
            turns += [_turn("human", rng.choice(FOLLOW_UP_LIST)), _turn("gpt", _list_answer(module))]
        return turns
    first, _, follow_up = kind.partition("+")
    obj = rng.choice(pools[follow_up or first])
    fields = {"q": obj.dotted, "m": obj.module}
    questions = {"doc": DOC_QUESTIONS, "signature": SIGNATURE_QUESTIONS, "source": SOURCE_QUESTIONS}[first]
    answers = {"doc": _doc_answer, "signature": _signature_answer, "source": _source_answer}
    turns += [_turn("human", rng.choice(questions).format(**fields)), _turn("gpt", answers[first](obj))]
    if follow_up:
        follow_ups = FOLLOW_UP_SOURCE if follow_up == "source" else FOLLOW_UP_SIGNATURE
        turns += [_turn("human", rng.choice(follow_ups)), _turn("gpt", answers[follow_up](obj))]
    return turns


def build_conversations(num_conversations: int, seed: int) -> list[dict]:
    """``num_conversations`` records ``{"id", "conversations"}`` from one seeded generator."""
    library = collect_library()
    rng = random.Random(seed)
    return [
        {"id": f"stdlib-{index:05d}", "conversations": make_conversation(rng, library)}
        for index in range(num_conversations)
    ]


def write_jsonl_shards(records: list[dict], directory: Path, prefix: str, num_shards: int) -> list[Path]:
    """Write ``records`` round-robin into ``num_shards`` files ``{prefix}-{i:05d}.jsonl`` (one JSON object a line)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{prefix}-{i:05d}.jsonl" for i in range(num_shards)]
    for shard_index, path in enumerate(paths):
        lines = [json.dumps(r, ensure_ascii=False) for r in records[shard_index::num_shards]]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths
