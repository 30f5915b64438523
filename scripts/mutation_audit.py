"""Mutation audit: apply realistic bugs one at a time to a copy of the package and see whether a test fails.

Each entry of ``MUTATIONS`` (``scripts/mutations.py``) names a file, an exact text that must occur there exactly once
(so the table fails loudly once the code changes under it), its replacement, and the few fast test files that cover
it. The tree (package, tests, configs, assets) is copied once to a temporary directory; each mutation is written
there, its tests run with ``pytest -x -q -n 0`` under a timeout, and the original is restored.

    python scripts/mutation_audit.py            # every mutation: results.json + README.md in experiments/mutation_audit
    python scripts/mutation_audit.py --check    # only check that every old text occurs exactly once
    python scripts/mutation_audit.py --only verify-d2t-placement stats-slot-denominator  # prints only
    python scripts/mutation_audit.py --only ID ... --merge   # reruns those and updates them in results.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import MUTATIONS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "experiments/mutation_audit"
COPIED = ("dspark_lightning", "tests", "configs", "assets", "docs", "pyproject.toml")  # docs: tests read its tables
TIMEOUT_S = 300


def check_table() -> None:
    """Every id unique, every old text present exactly once, every test path present."""
    ids = [m.id for m in MUTATIONS]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SystemExit(f"duplicate mutation ids: {duplicates}")
    problems = []
    for m in MUTATIONS:
        count = (ROOT / m.file).read_text().count(m.old)
        if count != 1:
            problems.append(f"{m.id}: the old text occurs {count} times in {m.file} (must be exactly once)")
        if m.old == m.new:
            problems.append(f"{m.id}: old and new are equal")
        for test in m.tests:
            if not (ROOT / test.split("::")[0]).is_file():
                problems.append(f"{m.id}: no test file {test}")
    if problems:
        raise SystemExit("the mutation table no longer matches the code:\n  " + "\n  ".join(problems))


def pytest(tree: Path, tests: list[str], timeout: float) -> tuple[int | None, str, float]:
    """(return code or None on timeout, output, seconds) of the tests in ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a restored file must never be read from a mutant's stale bytecode
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-rfE", *tests]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or ""
        return None, out if isinstance(out, str) else out.decode(errors="replace"), time.perf_counter() - start
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def first_failure(output: str) -> str | None:
    found = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return found.group(1) if found else None


def run(selected, log) -> list[dict]:
    tree = Path(tempfile.mkdtemp(prefix="mutation_audit_"))
    try:
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(source, tree / name)
        where = subprocess.run(
            [sys.executable, "-c", "import dspark_lightning; print(dspark_lightning.__file__)"],
            cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if not where.startswith(str(tree)):
            raise SystemExit(f"the copy imports dspark_lightning from {where}, not from {tree}")
        union = sorted({test for m in selected for test in m.tests})
        code, output, seconds = pytest(tree, union, TIMEOUT_S * 3)
        log(f"baseline: {len(union)} test paths, rc={code}, {seconds:.0f} s")
        if code != 0:
            raise SystemExit(f"the unmutated tests do not pass (rc={code}):\n{output[-3000:]}")
        results = []
        for index, m in enumerate(selected, 1):
            path = tree / m.file
            original = path.read_text()
            path.write_text(original.replace(m.old, m.new, 1))
            try:
                code, output, seconds = pytest(tree, list(m.tests), TIMEOUT_S)
            finally:
                path.write_text(original)
            if code is None:
                status, caught_by = "caught", "timeout"
            elif code == 0:
                status, caught_by = "missed", None
            elif code == 5:
                raise SystemExit(f"{m.id}: no tests collected from {m.tests}")
            else:
                status, caught_by = "caught", first_failure(output) or f"pytest rc={code}"
            results.append(dict(m.as_dict(), status=status, caught_by=caught_by, seconds=round(seconds, 1)))
            log(f"[{index}/{len(selected)}] {m.id}: {status} {caught_by or ''} ({seconds:.0f} s)")
        return results
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "⏎")


def short(code: str, width: int = 60) -> str:
    code = " ".join(code.split())
    return code if len(code) <= width else code[: width - 1] + "…"


def readme(results: list[dict]) -> str:
    caught = sum(r["status"] == "caught" for r in results)
    missed = [r for r in results if r["status"] == "missed"]
    rows = []
    for r in results:
        if r["status"] == "caught":
            verdict = f"caught by `{r['caught_by']}`"
        else:
            verdict = "**MISSED**" + (f": harmless, {r['harmless']}" if r.get("harmless") else "")
        change = f"`{short(r['old'])}` → `{short(r['new'])}`"
        rows.append(
            f"| `{r['file'].removeprefix('dspark_lightning/')}` | `{r['id']}` | {cell(r['what'])} | {cell(change)} | {cell(verdict)} |"
        )
    lines = [
        "# Mutation audit: would a test catch the bugs a user would suffer?",
        "",
        "**Question.** For the functions a user's result depends on (the verify rule, acceptance and tau counting,",
        "intervals, losses and weights, the teacher, caches and rollback, export fields, seeds, data selection and",
        "splits, preflight, the draft-induced-state options), does some test fail when a realistic bug is put in? Each bug (off by one, a dropped mask,",
        "a swapped ratio, a `<` / `<=` boundary, a stale key, only the first file) is applied alone to a copy of the",
        "package and the few unit test files that cover it are run (`pytest -x -q -n 0`).",
        "",
        f"**Rerun** (about {sum(r['seconds'] for r in results) / 60:.0f} minutes of mutated test runs on one core of an AMD EPYC here, the sum of "
        "results.json's `seconds`, plus about 1 for the unmutated baseline (no raw file); the table: `scripts/mutations.py`):",
        "",
        "```",
        "python scripts/mutation_audit.py           # writes results.json and this README",
        "python scripts/mutation_audit.py --check   # only checks that every mutation still applies",
        "```",
        "",
        "The three bugs of issue 42 are `verify-d2t-placement`, `cache-trim-only-on-rejection` and",
        "`stats-slot-denominator`. A test file listed for a mutation runs whole, in the listed order, up to its first",
        "failure; *caught by* names that failure. `--only ID ... --merge` reruns some mutations (after a test was",
        "added for them) and keeps the other rows as recorded.",
        "",
        f"**Result.** {len(results)} mutations, {caught} caught, {len(missed)} missed"
        + (f" ({caught / len(results):.0%} caught)." if results else "."),
        "",
        "| file (in `dspark_lightning/`) | mutation | what the bug does | change | verdict |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the table against the code")
    parser.add_argument("--only", nargs="*", help="mutation ids to run (results are then not written)")
    parser.add_argument("--merge", action="store_true", help="with --only: replace those ids' rows in results.json")
    parser.add_argument("--readme", action="store_true", help="only rewrite README.md (and the harmless notes)")
    args = parser.parse_args()
    check_table()
    if args.check:
        print(f"{len(MUTATIONS)} mutations, every old text found exactly once")
        return
    if args.readme:
        write(json.loads((OUTPUT / "results.json").read_text())["results"])
        return
    selected = [m for m in MUTATIONS if not args.only or m.id in args.only]
    if args.only and len(selected) != len(args.only):
        raise SystemExit(f"unknown ids: {sorted(set(args.only) - {m.id for m in selected})}")

    def log(line: str) -> None:
        print(time.strftime("%H:%M:%S"), line, flush=True)

    results = run(selected, log)
    caught = sum(r["status"] == "caught" for r in results)
    log(f"{len(results)} mutations, {caught} caught, {len(results) - caught} missed")
    if args.only and not args.merge:
        return
    if args.merge:  # the other rows as last recorded, in the table's order
        rerun = {r["id"]: r for r in results}
        kept = {r["id"]: r for r in json.loads((OUTPUT / "results.json").read_text())["results"]}
        results = [rerun.get(m.id) or kept[m.id] for m in MUTATIONS]
    write(results)


def write(results: list[dict]) -> None:
    """results.json and README.md; each row's harmless note is the table's current one."""
    notes = {m.id: m.harmless for m in MUTATIONS}
    results = [dict(r, harmless=notes.get(r["id"], r.get("harmless", ""))) for r in results]
    caught = sum(r["status"] == "caught" for r in results)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    summary = dict(mutations=len(results), caught=caught, missed=len(results) - caught)
    (OUTPUT / "results.json").write_text(json.dumps(dict(summary, results=results), indent=1) + "\n")
    (OUTPUT / "README.md").write_text(readme(results))


if __name__ == "__main__":
    main()
