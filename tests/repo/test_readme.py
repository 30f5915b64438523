"""README and the docs say what is true: their commands write nothing the repository tracks and read what an
earlier step of the same page wrote (or a shipped asset), recipes run on one torch thread, and README's command table,
counts and lists match the repository.

The commands are the ``bash``/``sh`` code blocks of README.md and of every page under ``docs/``, parsed as the command
table parses them (``helpers/readme.py``); tracked files are ``git ls-files``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from helpers.paths import ROOT
from helpers.readme import code_blocks, documents, readme_commands

from dspark_lightning.cli import TOOL_COMMANDS

README = (ROOT / "README.md").read_text()
OUTPUTS = ("--output", "--json", "--gap_table", "--runs_dir")  # where a command writes
INPUTS = ("--data", "--held_out", "--target", "--tokenizer")  # what a command reads (besides --config)
NUMBERS = {word: n for n, word in enumerate("zero one two three four five six seven eight nine ten".split())}


def tracked_files() -> set[str]:
    result = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"git ls-files failed (this test needs a git checkout): {result.stderr}")
    return set(result.stdout.split("\0")) - {""}


def values(words: list[str], options: tuple[str, ...]) -> list[str]:
    """The values of ``options`` in a command line (``--opt value`` or ``--opt=value``)."""
    found = []
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        if name in options:
            found.append(value if equals else words[index + 1])
    return found


def path_prefix(value: str) -> str:
    """A path, or the directory of a glob: ``data/x/train-*.jsonl`` -> ``data/x``."""
    head, *wildcard = re.split(r"[*?\[]", value, maxsplit=1)
    return (Path(head).parent if wildcard else Path(head)).as_posix().removeprefix("./")


def under(path: str, files: set[str]) -> list[str]:
    return sorted(f for f in files if f == path or f.startswith(path + "/"))


def test_doc_commands_never_write_a_tracked_file():
    tracked = tracked_files()
    outputs = [(words[0], value) for words in readme_commands() for value in values(words, OUTPUTS)]
    assert len(outputs) >= 15, outputs  # the parser still finds the docs' commands
    for command, value in outputs:
        assert not under(path_prefix(value), tracked), f"the docs' `{command} ... {value}` overwrites tracked files"


@pytest.mark.parametrize("page", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_doc_commands_read_what_an_earlier_step_wrote_or_a_shipped_asset(page):
    tracked = tracked_files()
    written: list[str] = []  # a page read from the top: a later block may use what an earlier one made
    for block in code_blocks(page.read_text()):
        for words in readme_commands(f"```bash\n{block}```"):
            for value in values(words, INPUTS):
                prefix = path_prefix(value)
                if value.startswith("pkg:") or "/" not in value or under(prefix, tracked):
                    continue  # a package, a hub id, or something the repository ships
                assert any(prefix == w or prefix.startswith(w + "/") for w in written), (
                    f"{page.name}: `{words[0]}` reads {value}, which no earlier command writes and the repository lacks"
                )
            written += [path_prefix(value) for value in values(words, OUTPUTS)]


def test_recipe_blocks_run_on_one_torch_thread_like_the_makefile():
    recipes = [block for block in code_blocks() if "--recipe" in block or "smollm2" in block]
    assert len(recipes) >= 3
    for block in recipes:
        assert "OMP_NUM_THREADS=1" in block, block


def readme_section(heading: str) -> str:
    return README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_stays_a_front_door():
    """Short enough to read in five minutes; the manual lives in docs/."""
    assert len(README.splitlines()) <= 250 and len(README.encode()) <= 20_000


def test_readme_counts_and_lists_match_the_repository():
    tutorials = sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
    count, listed = re.search(r"`tutorials/` holds (\w+) numbered tutorials \(([^)]*)\)", README).groups()
    assert NUMBERS[count] == len(tutorials) == len(listed.split(", ")), (count, listed, tutorials)
    table = (ROOT / "tutorials" / "README.md").read_text()
    assert all(f"[{name}]({name}.ipynb)" in table for name in tutorials)


def test_the_command_table_names_every_command_its_module_and_an_existing_guide():
    rows = [line for line in readme_section("Commands").splitlines() if line.startswith("| `")]
    names, modules, guides = [], [], []
    for line in rows:
        command, _, module, guide = [cell.strip() for cell in line.strip("|").split("|")]
        names += re.findall(r"`([\w-]+)`", command)
        modules.append((re.findall(r"`([\w-]+)`", command), module.strip("`")))
        guides += re.findall(r"\]\(([^)#]+)", guide)
    assert names == ["fit", "validate", "test", *TOOL_COMMANDS]  # every command, in the command table's order
    for commands, module in modules:
        expected = {"fit": "lightning/fit.py"}.get(commands[0])
        expected = expected or TOOL_COMMANDS[commands[0]].__module__.removeprefix("dspark_lightning.").replace(".", "/")
        assert module == expected.removesuffix(".py") + ".py", (commands, module)
    assert guides and all((ROOT / guide).is_file() for guide in guides), guides


def test_layout_tables_name_every_module_of_the_package():
    package = ROOT / "dspark_lightning"
    folders = sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    roots = sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")
    glance = readme_section("Library at a glance")
    assert [f for f in folders if not re.search(rf"(?<![\w/]){f}/", glance)] == []
    assert [r for r in roots if not re.search(rf"(?<![\w/]){re.escape(r)}", glance)] == []
    design = (ROOT / "docs" / "design" / "design.md").read_text()
    count, listed = re.search(
        r"and (\w+) shared utilities, each with its reason at its top:\s*(.*?)\.\s", design, re.S
    ).groups()
    utilities = sorted(re.findall(r"`(\w+\.py)`", listed))
    assert utilities == sorted(set(roots) - {"cli.py", "__main__.py"}) and NUMBERS[count] == len(utilities)
