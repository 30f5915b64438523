"""The command lines of README.md and the docs site's pages as argument lists, for the tests that parse them and
check what they write."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from helpers.paths import ROOT


def documents() -> list[Path]:
    """README.md and every page of the documentation site (``docs/**/*.md``): the files whose commands are checked."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_documents_text() -> str:
    return "\n\n".join(path.read_text() for path in documents())


def expand(line: str, variables: dict[str, str]) -> str:
    """``$NAME`` replaced by the value assigned earlier in the same code block: ``"$NAME"`` (a whole quoted word) by
    the shell-quoted value, ``$NAME`` elsewhere (inside a quoted word such as ``"$R/train-*.jsonl"``) by the value."""
    line = re.sub(r'"\$(\w+)"', lambda m: shlex.quote(variables[m[1]]) if m[1] in variables else m[0], line)
    return re.sub(r"\$(\w+)", lambda m: variables.get(m[1], m[0]), line)


def code_blocks(text: str | None = None) -> list[str]:
    """The ``bash`` and ``sh`` code blocks of README and the docs (or of ``text``), continuation lines joined."""
    text = all_documents_text() if text is None else text
    return [block.replace("\\\n", " ") for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S)]


def readme_commands(text: str | None = None) -> list[list[str]]:
    """Every ``dspark-lightning`` command line of the code blocks of README and the docs (or of ``text``) (``$B``/``$T``-style variables expanded,
    ``[--optional ...]`` groups dropped)."""
    commands = []
    for block in code_blocks(text):
        variables: dict[str, str] = {}
        for line in block.splitlines():
            for name, value in re.findall(r"(\w+)=('[^']*'|[^;\s]+)", line.split("#")[0]):
                variables[name] = value.strip("'")
            words = shlex.split(expand(line, variables), comments=True)
            # the program itself, not an assignment that names it (export DSPARK=.venv/bin/dspark-lightning)
            starts = [i for i, word in enumerate(words) if word.endswith("dspark-lightning") and "=" not in word]
            if starts:
                words = words[starts[0] + 1 :]
                optional = [i for i, w in enumerate(words) if w.startswith("[--")]
                for i in reversed(optional):  # "[--config X]": documented as optional, parsed without it
                    end = next(j for j in range(i, len(words)) if words[j].endswith("]"))
                    del words[i : end + 1]
                commands.append(words)
    return commands


def documented_import() -> list[str]:
    """The ``import-gguf`` line of the docs (every page that shows one shows this one): the session's SmolLM2 fixture
    runs it, its ``--output`` moved into a temporary directory."""
    (line,) = {tuple(words) for words in readme_commands() if words[0] == "import-gguf"}
    return list(line)


DOCUMENTED_IMPORT = documented_import()
