"""The numbers of README.md and the docs against the raw files they quote, so that no page can drift from its results.

The pages checked: README.md, every page under ``docs/`` and the experiments ledger (``experiments/README.md``),
read as one text (each page starts with its own ``#`` heading). Every markdown table there is listed below, by the
section it sits in and its position there:

- a results table maps each column to a field of the results file it quotes (json path or csv column, formatted
  as the page prints it); every numeric cell is compared as text, and the table's rows must be exactly the
  file's rows, so a new run with another row or a changed value fails here until the page follows;
- the Performance table's cells are prose: each row (keyed by its file column) lists the figures it quotes as
  claims, a template whose ``{}`` are filled from the raw files; every digit of the row must then belong to a
  claim, to a setup fact (``context``: targets, sizes, machine) or to a figure with no raw file (``unbacked``),
  which the page marks "no raw file" next to it;
- prose paragraphs that quote a raw file are checked the same way (``PROSE``);
- ``PROSE_ONLY`` names the tables without figures (why each needs no file); any other table fails.

The pages quote no count of tests (it drifted: "543 tests" with ~600 collected); ``test_no_test_count`` keeps it so.
Raw files parsed from generated markdown (``gap.json``, ``memory_guidance_*.csv``) must equal what
``experiments/tools/results_from_reports.py`` makes of their markdown today.

A failure names the table (or paragraph), the row and the expected text; fix the page (or the mapping, when a
file's layout changed) — never the raw file. The experiments' own READMEs are checked the same way, with these helpers,
by ``test_experiment_numbers``.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from helpers.paths import ROOT
from helpers.readme import documents

# the pages that quote results (the design notes and the API reference define things; they quote none)
DEFINITIONS = (ROOT / "docs/design", ROOT / "docs/api")
PAGES = [
    *(page for page in documents() if not any(map(page.is_relative_to, DEFINITIONS))),
    ROOT / "experiments/README.md",
]
TEXT = "\n\n".join(page.read_text() for page in PAGES)  # every checked page, each from its own "# " heading
# pages may still name an old reports/* or benchmarks/* path: read those as their new homes
for _old, _new in sorted(
    (line.split("\t") for line in (ROOT / "experiments/moves.tsv").read_text().splitlines()), key=lambda m: -len(m[0])
):
    TEXT = re.sub(re.escape(_old) + r"(?![A-Za-z0-9_])", _new, TEXT)
NO_RAW_FILE = "no raw file"


# --------------------------------------------------------------------------------------------- raw files, formats
@functools.cache
def load_json(path: str):
    return json.loads((ROOT / path).read_text())


@functools.cache
def load_csv(path: str) -> tuple[dict, ...]:
    with open(ROOT / path, newline="") as f:
        return tuple(csv.DictReader(f))


def row(path: str, **where) -> dict:
    """The one row of a csv whose fields equal ``where`` (compared as text)."""
    found = [r for r in load_csv(path) if all(r[k] == str(v) for k, v in where.items())]
    assert len(found) == 1, f"{path}: {len(found)} rows match {where}"
    return found[0]


def path_get(data, path: str):
    """``data`` at a dotted path; integer parts index lists (``rows.2.ece_after``)."""
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def fmt(value, spec: str) -> str:
    """``value`` formatted as the README prints it; "n/a" for a value that was not measured."""
    if value is None:
        return "n/a"
    return format(float(value), spec)


def span(values, spec: str, unit: str = "") -> str:
    """ "lo–hi" (en dash) of ``values``, each formatted; the one value when they print the same."""
    lo, hi = fmt(min(map(float, values)), spec), fmt(max(map(float, values)), spec)
    return f"{lo}{unit}" if lo == hi else f"{lo}{unit}–{hi}{unit}"


def same(values, spec: str) -> str:
    """The one printed value of ``values`` (a README figure that stands for several rows at once)."""
    printed = {fmt(v, spec) for v in values}
    assert len(printed) == 1, f"one figure quoted for values that print differently: {sorted(printed)}"
    return printed.pop()


def search(path: str, pattern: str, group: int = 1) -> str:
    """A figure stated in the text of a generated file (a benchmark header, a command line)."""
    found = re.search(pattern, (ROOT / path).read_text())
    assert found, f"{path}: no {pattern!r}"
    return found[group]


def safetensors_metadata(path: str) -> dict:
    with open(ROOT / path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))["__metadata__"]


# -------------------------------------------------------------------------------------------------- page parsing
@dataclass
class Table:
    section: str  # the heading it sits under
    index: int  # its position among that section's tables
    header: list[str]
    rows: list[list[str]]
    before: str  # the text between the previous heading or table and this one


def split_cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def readme_tables(text: str = TEXT) -> list[Table]:
    tables, section, index, before, block, fenced = [], "", 0, [], [], False

    def close():
        nonlocal block, before, index
        if block:
            tables.append(Table(section, index, split_cells(block[0]), [split_cells(b) for b in block[2:]],
                                "\n".join(before)))  # fmt: skip
            index, block, before = index + 1, [], []

    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            block.append(line)
            continue
        close()
        if not fenced and re.match(r"#{1,6} ", line):
            section, index, before = line.lstrip("#").strip(), 0, []
        else:
            before.append(line)
    close()
    return tables


def paragraph(start: str, text: str = TEXT) -> str:
    """The paragraph (or list item) of the README that begins with ``start``."""
    at = text.index(start)
    end = re.compile(r"\n\s*\n|\n- ").search(text, at + len(start))
    assert text.count(start) == 1, f"the pages: {start!r} is not unique"
    return text[at : end.start() if end else len(text)]


def bare(cell: str) -> str:
    """A cell without markdown emphasis."""
    return cell.replace("**", "")


# ------------------------------------------------------------------------------------------------- results tables
@dataclass
class ResultsTable:
    """A README table whose rows are the records of one results file."""

    source: str  # the raw file
    named: str  # how the README names it in the text before the table
    records: Callable[[object], dict]  # the file's records by the README row key (the key columns' text)
    columns: Callable[[object], dict[str, Callable[[dict], str]]]  # header -> the cell's text from a record


def num(path: str, digits: int = 3, suffix: str = "") -> Callable[[dict], str]:
    return lambda r: fmt(path_get(r, path), f".{digits}f") + ("" if path_get(r, path) is None else suffix)


DEMO_HEADS = {"none": "none (DFlash)"}
MEMORY_ANCHORS = "benchmarks/memory/results/memory_guidance_anchors.csv"  # parsed from memory_guidance.md


def demo_columns(d):
    k = d["budget"]["k"]
    return {
        "head": lambda r: DEMO_HEADS.get(r["head"], r["head"]),
        "B": lambda r: str(r["block_size"]),
        "teacher-forced tau": num("teacher_tau"),
        "measured tau (greedy, with the target)": num("measured_tau"),
        f"Selector tau, k={k}": num("measured_selector_tau"),
        f"agreement@{k}": num("agreement_at_k"),
        f"coverage@{k}": num("coverage_at_k"),
        "prefix ECE raw → calibrated": lambda r: f"{r['ece_before']:.3f} → {r['ece_after']:.3f}",
    }


def smollm2_columns(d):
    k = d["rows"][0]["wall_clock"]["k"]
    return {
        "head": lambda r: r["head"],
        "teacher-forced tau": num("teacher_tau"),
        "TF greedy tau": num("teacher_greedy_tau"),
        "measured tau": lambda r: f"{r['measured_tau']:.3f} ({r['measured_mode']})",
        f"Selector tau (k={k})": num("measured_selector_tau"),
        f"agreement@{k}": num("agreement_at_k"),
        f"coverage@{k}": num("coverage_at_k"),
        "prefix ECE raw -> calibrated": lambda r: f"{r['ece_before']:.4f} -> {r['ece_after']:.4f}",
        "generate tok/s": num("wall_clock.baseline_tokens_per_second", 1),
        "speculative tok/s": num("wall_clock.speculative_tokens_per_second", 1),
        "speedup": num("wall_clock.speedup", 2, "x"),
        "speedup, cost-model schedule (drafts verified per step)": lambda r: (
            f"{r['wall_clock_scheduled']['speedup']:.2f}x ({r['wall_clock_scheduled']['mean_verified']:.2f})"
        ),
        "draft / verify ms per step": lambda r: "{:.1f} / {:.1f}".format(
            r["wall_clock"]["phase_ms_per_step"]["draft_backbone"] + r["wall_clock"]["phase_ms_per_step"]["draft_head"],
            r["wall_clock"]["phase_ms_per_step"]["verify"],
        ),
        "outputs equal": lambda r: (
            "yes" if r["wall_clock"]["outputs_equal"] and r["wall_clock_scheduled"]["outputs_equal"] else "no"
        ),
    }


def loss_columns(labels: dict[str, str]):
    def columns(d):
        def mean_std(key):
            return lambda g: f"{g[key]:.3f} ± {g[key + '_std']:.3f}"

        return {
            "loss": lambda g: labels[g["label"]],
            "teacher-forced tau": mean_std("teacher_tau"),
            "TF greedy tau": mean_std("teacher_greedy_tau"),
            "measured tau (greedy, with the target)": mean_std("measured_tau"),
        }

    return columns


# The README quotes four (target, GPU) rows of memory_guidance.md, its S = 4096 column in both modes.
MEMORY_ROWS = (("Qwen3-0.6B", 80), ("Qwen3-8B", 80), ("Qwen3-8B", 141), ("Qwen3-32B", 80))


def memory_guidance_records(rows):
    def anchors(target, gib, mode):
        return int(row(MEMORY_ANCHORS, target=target, gpu_gib=gib, mode=mode, seq_len=4096)["max_anchors"])

    return {
        (target, f"{gib} GB"): {
            "target": target,
            "gpu": gib,
            **{m: anchors(target, gib, m) for m in ("online", "cache")},
        }
        for target, gib in MEMORY_ROWS
    }


def anchors_cell(mode):
    return lambda r: "does not fit" if r[mode] == 0 else str(r[mode])


DEMO_LOSSES = {"kl": "kl", "tv": "tv", "ce+tv": "ce + tv (default, 0.1/0.9)", "js": "js", "nla": "nla",
               "lk_hybrid": "lk_hybrid", "nla+dpace": "nla + D-PACE"}  # fmt: skip
SMOLLM2_LOSSES = {"kl": "kl (the recipe's default)", "tv": "tv", "ce+tv": "ce + tv (0.1/0.9)", "js": "js",
                  "nla": "nla", "lk_hybrid": "lk_hybrid", "js+dpace": "js + D-PACE"}  # fmt: skip


def interval(value: str, bounds: str, suffix: str = "") -> Callable[[dict], str]:
    """A figure and its 95% interval as the pages print them: ``1.502 [1.396, 1.641]`` (``x`` after speedups)."""
    return lambda r: "{:.3f}{s} [{:.3f}, {:.3f}]".format(r[value], *r[bounds], s=suffix)


SCHEDULES = {False: "whole blocks", True: "cost model"}


PER_BENCHMARK = "experiments/per_benchmark/results.json"


def per_benchmark_smollm2() -> list[dict]:
    return [r for r in load_json(PER_BENCHMARK)["eval_sets"] if r["drafter"] == "smollm2"]


def only(rows: list[dict], **fields) -> dict:
    """The one row whose fields have these values."""
    (r,) = [r for r in rows if all(r[key] == value for key, value in fields.items())]
    return r


def per_benchmark_row(drafter: str, temperature: float, eval_set: str) -> dict:
    return only(load_json(PER_BENCHMARK)["eval_sets"], drafter=drafter, temperature=temperature, eval_set=eval_set)


def per_benchmark_head(eval_set: str) -> Callable[[], str]:
    """A thunk: the vanilla head minus no heads on one set, ``+0.101 [+0.066, +0.138]``."""

    def value():
        d = only(load_json(PER_BENCHMARK)["head_differences"], eval_set=eval_set)
        return "{:+.3f} [{:+.3f}, {:+.3f}]".format(d["delta_tau"], *d["delta_tau_ci"])

    return value


def per_benchmark_vllm_row(batch_size: int, dtype: str = "float32", engine: str = "vLLM") -> dict:
    return only(load_json(PER_BENCHMARK)["vllm"], dtype=dtype, engine=engine, batch_size=batch_size)


def per_benchmark_vllm(batch_size: int, dtype: str = "float32") -> Callable[[], str]:
    return lambda: "{:.3f}x [{:.3f}, {:.3f}]".format(
        (r := per_benchmark_vllm_row(batch_size, dtype))["speedup"], *r["speedup_ci"]
    )


def per_benchmark_rows(data: dict) -> dict:
    """The SmolLM2 vanilla drafter's rows of experiments/per_benchmark/results.json by set, each {0.0: row, 1.0: row}."""
    rows: dict = {}
    for r in data["eval_sets"]:
        if r["drafter"] == "smollm2":
            rows.setdefault((r["eval_set"],), {"eval_set": r["eval_set"]})[r["temperature"]] = r
    return rows


RESULTS_TABLES = {
    ("Results", 0): ResultsTable(  # README's headline: the per-benchmark table's SmolLM2 vanilla rows, T = 0 and 1
        PER_BENCHMARK,
        "experiments/per_benchmark/",
        per_benchmark_rows,
        lambda d: {
            "eval set": lambda r: r["eval_set"],
            "greedy (T = 0): measured tau [95% CI]": lambda r: interval("measured_tau", "measured_tau_ci")(r[0.0]),
            "speedup vs bf16 `generate` [95% CI]": lambda r: interval("speedup", "speedup_ci", "x")(r[0.0]),
            "sampled (T = 1): measured tau [95% CI]": lambda r: interval("measured_tau", "measured_tau_ci")(r[1.0]),
            "speedup vs sampling bf16 `generate` [95% CI]": lambda r: interval("speedup", "speedup_ci", "x")(r[1.0]),
        },
    ),
    ("The demo target: every head and block size", 0): ResultsTable(
        "experiments/demo_heads/results.json",
        "experiments/demo_heads/report.md",
        lambda d: {(DEMO_HEADS.get(r["head"], r["head"]), str(r["block_size"])): r for r in d["rows"]},
        demo_columns,
    ),
    ("SmolLM2-135M-Instruct + ShareGPT V3", 0): ResultsTable(
        "experiments/smollm2_heads/1200steps/results.json",
        "experiments/smollm2_heads/1200steps/report.md",
        lambda d: {(r["head"],): r for r in d["rows"]},
        smollm2_columns,
    ),
    ("Drafter losses", 0): ResultsTable(
        "experiments/loss_study/demo/results.json",
        "experiments/loss_study/demo/report.md",
        lambda d: {(DEMO_LOSSES[g["label"]],): g for g in d["groups"]},
        loss_columns(DEMO_LOSSES),
    ),
    ("Drafter losses", 1): ResultsTable(
        "experiments/loss_study/smollm2/results.json",
        "experiments/loss_study/smollm2/report.md",
        lambda d: {(SMOLLM2_LOSSES[g["label"]],): g for g in d["groups"]},
        loss_columns(SMOLLM2_LOSSES),
    ),
    ("How many anchors fit", 0): ResultsTable(
        MEMORY_ANCHORS,
        "benchmarks/memory/results/memory_guidance.md",
        memory_guidance_records,
        lambda rows: {
            "target": lambda r: r["target"],
            "GPU": lambda r: f"{r['gpu']} GB",
            "online, S = 4096": anchors_cell("online"),
            "cache, S = 4096": anchors_cell("cache"),
        },
    ),
}

# Tables without a single figure: the only ones that need no raw file.
PROSE_ONLY = {
    ("Scaling up", 0): "which option to use for which need: names of configs and commands, no figures",
    ("Commands", 0): "README's command table: names, modules and guides",
    ("Guides", 0): "the docs site's index of guides",
    ("Tests", 0): "what each test folder holds",
    ("Refused targets", 0): "which model types the loop refuses and why",
    ("Precision and the anchors", 0): "what each recipe overlay sets (settings, not results)",
    ("The two methods, and what runs where", 0): "which vLLM runner serves which method where",
    ("Support matrix", 0): "which head each engine serves (engine versions are names, not results)",
    ("Field mapping", 0): "which of our config fields each vLLM reader takes",
}
VERSIONS = (
    r"(?:speculators|vLLM|transformers) \d+(?:\.\d+)+"  # an engine version in a prose-only table names it, not a result
)
# Tables checked against something other than a raw results file, by the test named.
CHECKED_ELSEWHERE = {
    ("Supported targets", 0): "tests/repo/test_supported_targets_doc.py: the architecture matrix's own table",
    ("Targets", 0): "tests/repo/test_supported_targets_doc.py: README's families are the matrix's",
}
PROSE_ONLY_NAMES = {  # digits that are part of a name or a rule, not a result
    ("Guides", 0): ["Gemma 3 270M", "a 262k vocabulary", "SmolLM2"],
    ("Support matrix", 0): ["`markov_rank` 0"],
    ("Field mapping", 0): ["ours + 1", "aux - 1", "block - 1"],
    ("Precision and the anchors", 0): ["lr 1e-2, ~10x", "(1e-3, the recipes' own lr)", "2-D"],
}


# ------------------------------------------------------------------------------------ prose cells and paragraphs
@dataclass
class Figures:
    """The figures of one prose cell or paragraph: every digit in it must belong to one of these lists."""

    claims: list[tuple] = field(default_factory=list)  # (template with {}, *values: thunks giving the printed text)
    context: list[str] = field(default_factory=list)  # setup facts, targets and names, not results
    unbacked: list[str] = field(default_factory=list)  # figures with no raw file; "no raw file" stands next to each


TRAIN_STEP = "benchmarks/training/results/train_step.csv"
BF16_STEP = "benchmarks/training/results/train_step_bf16_avx512bf16.csv"
BF16_STEP_NO_THP = "benchmarks/training/results/train_step_bf16_avx512bf16_thp_none.csv"
LOSS_MEMORY = "benchmarks/memory/results/loss_memory.csv"
SELECTOR, SELECTOR_MD = "benchmarks/decoding/results/selector.csv", "benchmarks/decoding/results/selector.md"
DECODE = "benchmarks/decoding/results/decode.json"
SMOLLM2_DECODE = "benchmarks/decoding/results/smollm2/decode.json"
VERIFY, VERIFY_MD = "benchmarks/decoding/results/verify_kernels.json", "benchmarks/decoding/results/verify_kernels.md"
QUICKSTART = "benchmarks/training/results/quickstart.csv"
SCALING = "benchmarks/training/results/scaling.csv"
SMOLLM2_DRAFT_VOCAB = "assets/smollm2/draft_vocab.safetensors"


def step(config: str, column: str, spec: str | None = None, path: str = TRAIN_STEP) -> Callable[[], str]:
    """A column of one config of a training-step benchmark file (the fp32 AVX2 one unless ``path``)."""
    return lambda: fmt(row(path, config=config)[column], spec) if spec else row(path, config=config)[column]


def sel(head: str, vocab: int, batch: int, column: str, spec: str) -> Callable[[], str]:
    return lambda: fmt(row(SELECTOR, head=head, vocab=vocab, batch=batch)[column], spec)


def sel_ratios(column: str, over: str, vocab: int, batch: int) -> list[float]:
    """column / over of the vanilla and the gated row."""
    rows = [row(SELECTOR, head=h, vocab=vocab, batch=batch) for h in ("vanilla", "gated")]
    return [float(r[column]) / float(r[over]) for r in rows]


def speedup_rows(path: str, cached: bool | None = None) -> list[dict]:
    return [r for r in load_json(path)["speedup"] if cached is None or r["drafter_cache"] == cached]


def phases(r: dict) -> dict:
    return r["phase_ms_per_step"]


def drafter_ms(r: dict) -> float:
    return phases(r)["draft_backbone"] + phases(r)["draft_head"]


def generate_ms(r: dict) -> float:
    """ms per token of the `generate` baseline."""
    return 1000 / r["baseline_tokens_per_second"]


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def sweep(path: str, end: int, column: str, spec: str | None = None) -> Callable[[], str]:
    """The first (end=0) or last (end=-1) context length of a drafter-step sweep, or a column there."""
    point = lambda: load_json(path)["context_sweep"][end]  # noqa: E731
    return lambda: fmt(point()[column], spec) if spec else str(point()[column])


def forward(rows: int, column: str, spec: str = ".1f") -> Callable[[], str]:
    """A column of the verify-kernel benchmark's forward cost over ``rows`` rows."""
    return lambda: fmt(next(c for c in load_json(VERIFY)["forward_costs"] if c["rows"] == rows)[column], spec)


def scaling(sweep_name: str, end: int, column: str, spec: str | None = None) -> Callable[[], str]:
    """The first (end=0) or last (end=-1) point of a scaling sweep, or a column there."""
    point = lambda: [r for r in load_csv(SCALING) if r["sweep"] == sweep_name][end]  # noqa: E731
    return lambda: fmt(point()[column], spec) if spec else point()[column]


# One entry per row of the Performance table, by its file column. Kept one claim a line (ruff format off).
# fmt: off
PERFORMANCE = {
    "benchmarks/training/results/train_step.md": Figures(
        claims=[
            ("the `speculators` {} DSpark implementation",
             lambda: row(TRAIN_STEP, config="vanilla-B8")["reference"].split(",")[0].removeprefix("speculators ")),
            ("**{}×** its step time ({} vs {} ms, vanilla B={})", step("vanilla-B8", "ratio", ".2f"),
             step("vanilla-B8", "ours_ms", ".0f"), step("vanilla-B8", "theirs_ms", ".0f"),
             step("vanilla-B8", "block_size")),
            ("**{}×** ({} vs {} ms, gated B={})", step("gated-B16", "ratio", ".2f"),
             step("gated-B16", "ours_ms", ".0f"), step("gated-B16", "theirs_ms", ".0f"),
             step("gated-B16", "block_size")),
            ("{} vs {} MiB peak RSS", step("vanilla-B8", "ours_peak_rss_mib", ".0f"),
             step("vanilla-B8", "theirs_peak_rss_mib", ".0f")),
        ],
        context=["fp32"],
        unbacked=["0.61–0.76× over five runs", "0.72× in the quietest"],
    ),
    "benchmarks/training/results/train_step_bf16_avx512bf16.md": Figures(
        claims=[
            ("**{}×** its step time ({} vs {} ms, vanilla B={})", step("vanilla-B8", "ratio", ".2f", BF16_STEP),
             step("vanilla-B8", "ours_ms", ".0f", BF16_STEP), step("vanilla-B8", "theirs_ms", ".0f", BF16_STEP),
             step("vanilla-B8", "block_size", path=BF16_STEP)),
            ("**{}×** ({} vs {} ms, gated B={})", step("gated-B16", "ratio", ".2f", BF16_STEP),
             step("gated-B16", "ours_ms", ".0f", BF16_STEP), step("gated-B16", "theirs_ms", ".0f", BF16_STEP),
             step("gated-B16", "block_size", path=BF16_STEP)),
            ("huge pages {}× and {}×", step("vanilla-B8", "ratio", ".2f", BF16_STEP_NO_THP),
             step("gated-B16", "ratio", ".2f", BF16_STEP_NO_THP)),
        ],
        context=["AVX512-BF16", "bf16", "0.4×"],
    ),
    "benchmarks/memory/results/loss_memory.md": Figures(
        claims=[
            ("{} rows of bf16 logits", lambda: same([r["rows"] for r in load_csv(LOSS_MEMORY)], ".0f")),
            ("**{}×** one bf16 logits tensor (gradient included) at Vd = {}k and {}k, vs {}× unchunked",
             lambda: same([r["x_bf16_logits"] for r in load_csv(LOSS_MEMORY)
                           if (r["mode"], r["impl"]) == ("train", "chunked")], ".2f"),
             lambda: str(int(load_csv(LOSS_MEMORY)[0]["vocab"]) // 1000),
             lambda: str(int(load_csv(LOSS_MEMORY)[-1]["vocab"]) // 1000),
             lambda: same([r["x_bf16_logits"] for r in load_csv(LOSS_MEMORY)
                           if (r["mode"], r["impl"]) == ("train", "reference")], ".0f")),
        ],
    ),
    "benchmarks/decoding/results/selector.md": Figures(
        claims=[
            ("{}", lambda: search(SELECTOR_MD, r"(B = \d+, k = \d+, r = \d+)")),
            ("Vd = 32k: **{}×** (vanilla) / **{}×** (gated) for one block; **{}×** / **{}×** at batch 32",
             sel("vanilla", 32768, 1, "speedup", ".0f"), sel("gated", 32768, 1, "speedup", ".0f"),
             sel("vanilla", 32768, 32, "speedup", ".1f"), sel("gated", 32768, 32, "speedup", ".1f")),
            ("(load average ≈ {} on the 2 cores; minima {}× / {}×;",
             lambda: fmt(search(SELECTOR_MD, r"load average ([\d.]+)"), ".0f"),
             sel("vanilla", 32768, 32, "speedup_of_minima", ".1f"), sel("gated", 32768, 32, "speedup_of_minima", ".1f")),
            ("(`--compare {}`, identical tokens): {}× / {}× faster at batch 32",
             lambda: search(SELECTOR_MD, r"against the walk at `(\w+)`"),
             sel("vanilla", 32768, 32, "old_over_new", ".2f"), sel("gated", 32768, 32, "old_over_new", ".2f")),
            ("the committed run's batch-1 ratios, {}× / {}×, are preemption noise: medians {}× the minima",
             sel("vanilla", 32768, 1, "old_over_new", ".2f"), sel("gated", 32768, 1, "old_over_new", ".2f"),
             lambda: span(sel_ratios("walk_ms", "walk_min_ms", 32768, 1)
                          + sel_ratios("walk_old_ms", "walk_old_min_ms", 32768, 1), ".1f")),
            ("top-k over B·Vd logits ({}% of the walk at Vd = 32k, {}% at 152k, batch 32",
             lambda: span([100 * x for x in sel_ratios("topk_ms", "walk_ms", 32768, 32)], ".0f"),
             lambda: span([100 * x for x in sel_ratios("topk_ms", "walk_ms", 151936, 32)], ".0f")),
        ],
        context=["batch-32 target of 10×", "W1 / W2"],
        unbacked=["13.4× / 12.0× in an earlier run the same hour", "1.47× / 1.35× in a walk-only process",
                  "3.7k / 5.0k pages per call", "1.0–1.1× at batch 1 in a walk-only A/B of 601 paired calls",
                  "2.5× a single read of the logits"],
    ),
    "benchmarks/decoding/results/decode.md": Figures(
        claims=[
            ("drafter trained {} quickstart steps", lambda: search(DECODE, r"trained for (\d+) steps")),
            ("{} eval prompts × {} tokens", lambda: str(load_json(DECODE)["prompts"]),
             lambda: str(load_json(DECODE)["max_new_tokens"])),
            ("**{}×** with the drafter context cache (tau {}, outputs equal to `generate`)",
             lambda: span([r["speedup"] for r in speedup_rows(DECODE, cached=True)], ".2f"),
             lambda: span([r["tau"] for r in speedup_rows(DECODE, cached=True)], ".2f")),
            ("a verify step (≈{} ms) costs little more than one token of `generate` (≈{} ms)",
             lambda: fmt(mean(phases(r)["verify"] for r in speedup_rows(DECODE)), ".0f"),
             lambda: fmt(mean(map(generate_ms, speedup_rows(DECODE))), ".1f")),
            ("the drafter and its bookkeeping add ≈{} ms per step, so tau {} cannot pay off",
             lambda: fmt(mean(v["overhead_ms"] for v in load_json(DECODE)["verify_lengths"]), ".0f"),
             lambda: fmt(max(r["tau"] for r in speedup_rows(DECODE)), ".1f")),
            ("from {} to {} context tokens: **{} → {} ms** with the cache vs {} → {} ms re-projecting the prefix"
             " ({}× at 4k)", sweep(DECODE, 0, "context"), sweep(DECODE, -1, "context"),
             sweep(DECODE, 0, "cached_ms", ".1f"), sweep(DECODE, -1, "cached_ms", ".1f"),
             sweep(DECODE, 0, "uncached_ms", ".1f"), sweep(DECODE, -1, "uncached_ms", ".1f"),
             sweep(DECODE, -1, "ratio", ".1f")),
        ],
        context=["1M-parameter demo target"],
    ),
    "benchmarks/decoding/results/smollm2/decode.md": Figures(
        claims=[
            ("{} held-out prompts × {} tokens; run at load average ≈ {} on the 2 cores",
             lambda: str(load_json(SMOLLM2_DECODE)["prompts"]), lambda: str(load_json(SMOLLM2_DECODE)["max_new_tokens"]),
             lambda: fmt(load_json(SMOLLM2_DECODE)["machine"]["load_average"].split()[0], ".0f")),
            ("**{}×** (tau {}, outputs equal to `generate`",
             lambda: span([r["speedup"] for r in speedup_rows(SMOLLM2_DECODE)], ".2f"),
             lambda: span([r["tau"] for r in speedup_rows(SMOLLM2_DECODE)], ".2f")),
            ("its {} head rows", lambda: safetensors_metadata(SMOLLM2_DRAFT_VOCAB)["draft_vocab_size"]),
            ("A step now costs **{} `generate` tokens** (break-even tau",
             lambda: span([sum(phases(r).values()) / generate_ms(r) for r in speedup_rows(SMOLLM2_DECODE)], ".1f")),
            ("the verify forward {} tokens",
             lambda: span([phases(r)["verify"] / generate_ms(r) for r in speedup_rows(SMOLLM2_DECODE)], ".1f")),
            ("the drafter {} (",
             lambda: span([drafter_ms(r) / generate_ms(r) for r in speedup_rows(SMOLLM2_DECODE, True)], ".2f")),
            ("**≈ {}% of a verify",
             lambda: span([100 * drafter_ms(r) / phases(r)["verify"] for r in speedup_rows(SMOLLM2_DECODE, True)],
                          ".0f")),
            ("a {}–{}-token forward costs {}× a 1-token one",
             lambda: str(load_json(VERIFY)["forward_costs"][1]["rows"]),
             lambda: str(load_json(VERIFY)["forward_costs"][-1]["rows"]),
             lambda: span([c["default_over_one_row"] for c in load_json(VERIFY)["forward_costs"][1:]], ".1f")),
            ("Drafter step {} → {} context tokens: {} → {} ms cached vs {} → {} ms re-projecting ({}×)",
             sweep(SMOLLM2_DECODE, 0, "context"), sweep(SMOLLM2_DECODE, -1, "context"),
             sweep(SMOLLM2_DECODE, 0, "cached_ms", ".1f"), sweep(SMOLLM2_DECODE, -1, "cached_ms", ".1f"),
             sweep(SMOLLM2_DECODE, 0, "uncached_ms", ".1f"), sweep(SMOLLM2_DECODE, -1, "uncached_ms", ".0f"),
             sweep(SMOLLM2_DECODE, -1, "ratio", ".0f")),
            ("fitted T(n) = {} + {}·n ms at that load",
             lambda: fmt(load_json(SMOLLM2_DECODE)["verify_cost_ms"][0], ".0f"),
             lambda: fmt(load_json(SMOLLM2_DECODE)["verify_cost_ms"][1], ".1f")),
        ],
        context=["SmolLM2-135M-Instruct", "target ≤ 25% met", "T(1)"],
        unbacked=["absolute ms are ≈ 2× the quiet machine's", "0.54–0.57× before", "2.06–2.16 before",
                  "1.8–1.9 before", "0.20–0.22;", "22.2 → 13.9 ms", "0.61× → 0.67×", "0.69× → 0.75×",
                  "108.6 + 5.1·n ms"],
    ),
    "benchmarks/decoding/results/verify_kernels.md": Figures(
        claims=[
            ("a cached {}-token prefix", lambda: search(VERIFY_MD, r"cached (\d+)-token prefix")),
            ("{} repeats", lambda: str(load_json(VERIFY)["repeats"])),
            ("one `generate`-step forward (n = 1) **{} ms**", forward(1, "default_ms")),
            ("a 9-row verify **{} → {} ms** (T(9)/T(1) {} → {})", forward(9, "default_ms"), forward(9, "packed_ms"),
             forward(9, "default_over_one_row", ".2f"), forward(9, "packed_over_one_row", ".2f")),
            ("5 rows {} → {} ms ({}×)", forward(5, "default_ms"), forward(5, "packed_ms"),
             forward(5, "packed_over_default", ".2f")),
            ("2 rows {} → {} ms ({}×)", forward(2, "default_ms"), forward(2, "packed_ms"),
             forward(2, "packed_over_default", ".2f")),
            ("{} held-out prompts × {} tokens, outputs equal): **{}× → {}×** `generate`",
             lambda: str(load_json(VERIFY)["prompts"]), lambda: str(load_json(VERIFY)["max_new_tokens"]),
             lambda: fmt(load_json(VERIFY)["end_to_end"]["default"]["speedup"], ".2f"),
             lambda: fmt(load_json(VERIFY)["end_to_end"]["packed"]["speedup"], ".2f")),
        ],
        context=["SmolLM2-135M-Instruct", "gated head, 1,200 steps", "1M demo target", "2–9 rows", "AVX2"],
        unbacked=["(load ≈ 3–4) measured 0.85× and 0.84×", "(3.8 → 7.1 ms at n = 1"],
    ),
    "benchmarks/training/results/quickstart.md": Figures(
        claims=[
            ("({} steps, 2 validations", lambda: same([r["steps"] for r in load_csv(QUICKSTART)], ".0f")),
            ("**{} s** with one torch thread", lambda: fmt(row(QUICKSTART, torch_threads=1)["wall_s"], ".0f")),
            ("torch's default {} threads", lambda: row(QUICKSTART, omp_num_threads="unset")["torch_threads"]),
            ("but **{} s** on this machine", lambda: fmt(row(QUICKSTART, omp_num_threads="unset")["wall_s"], ".0f")),
            ("target ≤ {} min {} with one thread",
             lambda: fmt(float(row(QUICKSTART, torch_threads=1)["target_s"]) / 60, ".0f"),
             lambda: "met" if row(QUICKSTART, torch_threads=1)["met"] == "yes" else "missed"),
        ],
        unbacked=["50 s with"],
    ),
    "benchmarks/training/results/scaling.md": Figures(
        claims=[
            ("S {} → {}: {} → {} ms (the target's own forward: {} → {} ms)",
             scaling("seq_len", 0, "seq_len"), scaling("seq_len", -1, "seq_len"),
             scaling("seq_len", 0, "step_ms", ".0f"), scaling("seq_len", -1, "step_ms", ".0f"),
             scaling("seq_len", 0, "target_ms", ".0f"), scaling("seq_len", -1, "target_ms", ".0f")),
            ("A {} → {}: {} → {} ms", scaling("anchors", 0, "anchors"), scaling("anchors", -1, "anchors"),
             scaling("anchors", 0, "step_ms", ".0f"), scaling("anchors", -1, "step_ms", ".0f")),
        ],
        unbacked=["~70% of the largest point"],
    ),
}
# fmt: on

GAP_DEMO, GAP_SMOLLM2 = "experiments/demo_heads/gap.json", "experiments/smollm2_heads/400steps/gap.json"
DEMO_RESULTS, COMPUTE = "experiments/demo_heads/results.json", "benchmarks/memory/results/memory_guidance_compute.csv"


def gap(path: str, key: str, step: str | None = None, spec: str | None = ".3f") -> Callable[[], str]:
    """A figure of a gap table; deltas print with a sign and a true minus, as the README writes them."""
    value = lambda: load_json(path)[key] if step is None else load_json(path)[key][step]  # noqa: E731
    return lambda: fmt(value(), spec).replace("-", "−") if spec else str(value())


def vocab(key: str) -> Callable[[], str]:
    """A field of the SmolLM2 draft vocabulary's own metadata (sizes, the training coverage)."""
    return lambda: safetensors_metadata(SMOLLM2_DRAFT_VOCAB)[key]


# Paragraphs (by their opening words) that quote a raw file.
# fmt: off
TRAINING_STEP = "experiments/training_step_speedup/results/training_step.json"
EVAL_SETS = "experiments/smollm2_eval_sets/results.json"


def eval_set(name: str, cost_model: bool, key: str, index: int | None = None, spec: str = ".3f"):
    """A thunk: ``key`` (or its ``index``-th bound) of one eval set's row in the eval-set report, formatted."""

    def value():
        (row,) = [
            r for r in load_json(EVAL_SETS)["eval_sets"]
            if r["eval_set"] == name and (r["threshold"] is not None) == cost_model
        ]  # fmt: skip
        return fmt(row[key] if index is None else row[key][index], spec)

    return value

STUDY = "experiments/smollm2_cpu_hour_study/results.json"


def study(run: str, step: int, eval_set: str, key: str, index: int | None = None, spec: str = "+.3f"):
    """A thunk: ``key`` (or its ``index``-th bound) of one point of the SmolLM2 study, formatted, minus as "−"."""

    def value():
        (point,) = [p for p in load_json(STUDY)["points"] if (p["run"], p["step"], p["eval_set"]) == (run, step, eval_set)]
        return format(point[key] if index is None else point[key][index], spec).replace("-", "−")

    return value


def study_fit(eval_set: str, key: str, scale: float = 1.0, spec: str = "+.2f"):
    return lambda: format(load_json(STUDY)["extrapolation"][eval_set][key] / scale, spec)


PAYS = "experiments/smollm2_cpu_hour_study/wall_clock/results.json"


CODE_DATA = "experiments/smollm2_cpu_hour_study/code_data/results.json"


def pays(head: str, eval_set: str, cost_model: bool, key: str, index: int | None = None, spec: str = ".3f", path=PAYS):
    """A thunk: ``key`` (or a bound) of one timed row of the study's run that pays (``experiments/tools/eval_set_report.py``),
    or of another such report at ``path``."""

    def value():
        (row,) = [
            r for r in load_json(path)["eval_sets"]
            if (r["head"], r["eval_set"], isinstance(r["threshold"], list)) == (head, eval_set, cost_model)
        ]  # fmt: skip
        return format(row[key] if index is None else row[key][index], spec)

    return value


def pays_difference(
    head: str, eval_set: str, schedule: str, index: int | None = None, path=PAYS, key: str = "delta_tau"
):
    """A thunk: a paired difference (``delta_tau`` or ``delta_speedup``, or a bound of its interval) of a report."""

    def value():
        (d,) = [
            d for d in load_json(path)["paired_differences"]
            if (d["head"], d["eval_set"], d["schedule"]) == (head, eval_set, schedule)
        ]  # fmt: skip
        return format(d[key] if index is None else d[f"{key}_ci"][index], "+.3f").replace("-", "−")

    return value


def vocab_metadata(path: str, key: str, scale: float = 1.0, spec: str = ",.0f"):
    """A thunk: a summary figure a draft vocabulary file records in its safetensors metadata."""

    def value():
        from safetensors import safe_open

        with safe_open(str(ROOT / path), "pt") as f:
            return format(float(f.metadata()[key]) * scale, spec)

    return value


GEMMA = "experiments/gemma3_heads/results.json"


def gemma(head: str, key: str, eval_set: str | None = None, cost_model: bool = False, spec: str = ".3f"):
    """A thunk: one head's ``key`` in the Gemma recipe report, on the recipe's prompts or on ``eval_set``."""

    def value():
        (row,) = [r for r in load_json(GEMMA)["rows"] if r["head"] == head]
        if eval_set is not None:
            (row,) = [
                e for e in row["eval_sets"] if e["eval_set"] == eval_set and (e["threshold"] is not None) == cost_model
            ]
        return format(row[key], spec)

    return value


G2400, G1200 = "gated (2,400 steps)", "gated (1,200 steps)"
TWO_THREADS = "experiments/smollm2_cpu_hour_study/two_threads/results.json"
T1200, T2400 = "gated (1,200 steps), 2 threads", "gated (2,400 steps), 2 threads"
CHAT, CODE = "gated, chat data (1,200 steps)", "gated, chat + code data (1,200 steps)"
PACKED_HEAD, P2400 = "experiments/smollm2_cpu_hour_study/packed_head/results.json", "gated (2,400 steps), 2 threads, packed head"

HEADS3 = ("none", "vanilla", "gated")

def packed_head(key: str) -> Callable[[], str]:
    """A setup figure shared by every row of the packed-head report (prompts, tokens, threads)."""
    return lambda: same([r[key] for r in load_json(PACKED_HEAD)["eval_sets"]], ".0f")


def timed(path: str, run: str, eval_set: str, schedule: str, key: str = "speedup_vs_packed_generate") -> Callable[[], str]:
    """A timed run's figure from a study's ``wall_clock`` rows: a speedup with its interval (``1.128x [1.075,
    1.194]``; ``speedup_vs_packed_generate`` is the one against `generate` on the same kernels), else ``.2f``."""

    def value():
        (r,) = [r for r in load_json(path)["wall_clock"] if (r["run"], r["eval_set"], r["schedule"]) == (run, eval_set, schedule)]
        if key.startswith("speedup"):
            return "{:.3f}x [{:.3f}, {:.3f}]".format(r[key], *r[f"{key}_ci"])
        return fmt(r[key], ".2f")

    return value


BF16, OPD = "experiments/smollm2_bf16/results.json", "experiments/smollm2_draft_opd/results.json"
SAMPLED = "experiments/smollm2_sampled_regen/results.json"
MORE = "experiments/smollm2_more_data/results.json"


def measured(path: str, run: str, eval_set: str = "sharegpt_heldout") -> Callable[[], str]:
    """A run's measured tau with its interval, ``1.494 [1.418, 1.594]``."""

    def value():
        (p,) = [p for p in load_json(path)["points"] if (p["run"], p["eval_set"]) == (run, eval_set)]
        return "{:.3f} [{:.3f}, {:.3f}]".format(p["measured_tau"], *p["measured_tau_ci"])

    return value


def tf_tau(path: str, run: str) -> Callable[[], str]:
    """A run's teacher-forced greedy tau (its fit's last validation), ``1.716``."""

    def value():
        (p,) = [p for p in load_json(path)["points"] if (p["run"], p["eval_set"]) == (run, "sharegpt_heldout")]
        return fmt(p["tf_greedy_tau"], ".3f")

    return value


def paired_delta(path: str, run: str, eval_set: str) -> Callable[[], str]:
    """A run's paired difference from the base with its interval, ``+0.028 [+0.015, +0.041]``."""

    def value():
        (p,) = [p for p in load_json(path)["points"] if (p["run"], p["eval_set"]) == (run, eval_set)]
        return "{:+.3f} [{:+.3f}, {:+.3f}]".format(p["delta_vs_base"], *p["delta_vs_base_ci"])

    return value


PROSE = {
    "Per benchmark, SmolLM2-135M-Instruct": Figures(  # README's headline, above its table
        claims=[
            ("{} prompts of each\nevaluation set × {} new tokens per turn",
             lambda: same([r["num_prompts"] for r in per_benchmark_smollm2()], ".0f"),
             lambda: same([r["max_new_tokens"] for r in per_benchmark_smollm2()], ".0f")),
        ],
        context=["SmolLM2-135M-Instruct", "(1,500 steps)", "T = 1", "AVX512-BF16", "bf16", "95%", "Gemma 3"],
    ),
    "**Per benchmark**, the bf16 recipe's": Figures(  # docs/results.md
        claims=[
            ("measures {} on humaneval to {} on mbpp greedily\nand {} at T = 1",
             lambda: fmt(per_benchmark_row("smollm2", 0.0, "humaneval")["measured_tau"], ".3f"),
             lambda: fmt(per_benchmark_row("smollm2", 0.0, "mbpp")["measured_tau"], ".3f"),
             lambda: span([r["measured_tau"] for r in per_benchmark_smollm2() if r["temperature"] == 1.0], ".3f")),
            ("at {}x of bf16 `generate` greedily and {}x sampling",
             lambda: span([r["speedup"] for r in per_benchmark_smollm2() if r["temperature"] == 0.0], ".3f"),
             lambda: span([r["speedup"] for r in per_benchmark_smollm2() if r["temperature"] == 1.0], ".3f")),
            ("({} on sharegpt_heldout) and least on humaneval ({})", per_benchmark_head("sharegpt_heldout"),
             per_benchmark_head("humaneval")),
            ("costs {} at batch size 1 and {} in batches of\n4", per_benchmark_vllm(1), per_benchmark_vllm(4)),
        ],
        context=["SmolLM2", "T = 1", "bf16", "float32", "batch size 1", "Gemma 3"],
    ),
    "Measured fairly (against": Figures(
        claims=[
            ("tau grows about\n{} per 10× training tokens", study_fit("sharegpt_heldout", "slope_per_decade")),
            ("training step {}× the time of speculators'", step("vanilla-B8", "ratio", ".2f")),
            ("the vanilla drafter runs at\n{} of bf16 `generate` on the same kernels on sharegpt_heldout and {} on "
             "humaneval", timed("experiments/smollm2_bf16/results.json", "combined_bf16_long", "sharegpt_heldout",
                                "cost model"),
             timed("experiments/smollm2_bf16/results.json", "combined_bf16_long", "humaneval", "cost model")),
            ("the best so far, at {} on sharegpt_heldout", timed(SAMPLED, "combined_bf16_mixed_long", "sharegpt_heldout",
                                                                 "cost model")),
        ],
        context=["AVX2", "AVX512-BF16", "bf16"],
    ),
    "**Recipe choices, bf16 and a stage on draft-induced states**": Figures(
        claims=[
            ("only feature noise helped: {}\non sharegpt_heldout", paired_delta("experiments/smollm2_recipe_choices/results.json", "feature_noise", "sharegpt_heldout")),
            ("the vanilla\ndrafter runs at {} of bf16 `generate` on the same kernels on sharegpt_heldout and {} on "
             "humaneval", timed(BF16, "combined_bf16_long", "sharegpt_heldout", "cost model"),
             timed(BF16, "combined_bf16_long", "humaneval", "cost model")),
            ("trained as long, measures {} against the vanilla one's {}", measured(BF16, "combined_gated_bf16_long"),
             measured(BF16, "combined_bf16_long")),
            ("the same stage on the text: {} on sharegpt_heldout and {} on humaneval",
             paired_delta(OPD, "combined_stage_opd", "sharegpt_heldout"),
             paired_delta(OPD, "combined_stage_opd", "humaneval")),
            ("same steps: {} on sharegpt_heldout and {} on humaneval",
             paired_delta(SAMPLED, "combined_bf16_sampled", "sharegpt_heldout"),
             paired_delta(SAMPLED, "combined_bf16_sampled", "humaneval")),
            ("the best measured tau so far, {} on sharegpt_heldout, though {} over the greedy hour",
             measured(SAMPLED, "combined_bf16_mixed_long"), paired_delta(SAMPLED, "combined_bf16_mixed_long", "sharegpt_heldout")),
            ("that drafter runs at {} of same-kernel bf16 `generate` on sharegpt_heldout\nand {} on humaneval",
             timed(SAMPLED, "combined_bf16_mixed_long", "sharegpt_heldout", "cost model"),
             timed(SAMPLED, "combined_bf16_mixed_long", "humaneval", "cost model")),
            ("for the same steps measure {} on sharegpt_heldout against that hour, while teacher-forced greedy\ntau rises "
             "from {} to {}", paired_delta(MORE, "combined_bf16_more_long", "sharegpt_heldout"),
             tf_tau(MORE, "combined_bf16_mixed_long"), tf_tau(MORE, "combined_bf16_more_long")),
        ],
        context=["32 prompts", "bf16", "tau stays near 1.5", "2.0", "3,000 conversations", "4,284 replies"],
    ),
    "**Gemma 3 270M, a base model**": Figures(
        claims=[
            ("measured tau {} head-less, {} vanilla and {} gated", *(gemma(h, "measured_tau") for h in HEADS3)),
            ("at {}×, {}× and {}× of `generate`", *(gemma(h, "speedup", spec=".2f") for h in HEADS3)),
            ("HumanEval completion prompts: tau {}, {} and {}", *(gemma(h, "measured_tau", "humaneval") for h in HEADS3)),
            ("({}×, {}×, {}×)", *(gemma(h, "speedup", "humaneval", spec=".2f") for h in HEADS3)),
        ],
        context=["Gemma 3 270M", "600 steps", "512 regenerated", "12 held-out", "128 tokens", "on 12"],
    ),
    "- **Gemma's draft vocabulary**": Figures(
        claims=[
            ("covers **{}%** of the validation continuations' {} tokens",
             vocab_metadata("assets/gemma3/draft_vocab.safetensors", "held_out_coverage", 100, ".1f"),
             vocab_metadata("assets/gemma3/draft_vocab.safetensors", "held_out_supervised_tokens")),
            ("use only {} distinct ids", vocab_metadata("assets/gemma3/draft_vocab.safetensors", "distinct_tokens")),
        ],
        context=["Vd = 32,768 of V = 262,144"],
    ),
    "**The run that pays, not yet**": Figures(
        claims=[
            ("tau **{}** [{}, {}] on sharegpt_heldout and {} on humaneval",
             pays(G2400, "sharegpt_heldout", False, "measured_tau"),
             pays(G2400, "sharegpt_heldout", False, "measured_tau_ci", 0),
             pays(G2400, "sharegpt_heldout", False, "measured_tau_ci", 1),
             pays(G2400, "humaneval", False, "measured_tau")),
            ("at **{}×** [{}, {}] of `generate` with the cost-model schedule ({}× verifying whole blocks) on "
             "sharegpt_heldout and {}× on humaneval",
             pays(G2400, "sharegpt_heldout", True, "speedup"),
             pays(G2400, "sharegpt_heldout", True, "speedup_ci", 0),
             pays(G2400, "sharegpt_heldout", True, "speedup_ci", 1),
             pays(G2400, "sharegpt_heldout", False, "speedup"),
             pays(G2400, "humaneval", True, "speedup")),
            ("the gated head measures {} [{}, {}] over the head-less drafter",
             pays_difference(G1200, "sharegpt_heldout", "whole blocks"),
             pays_difference(G1200, "sharegpt_heldout", "whole blocks", 0),
             pays_difference(G1200, "sharegpt_heldout", "whole blocks", 1)),
            ("tau {} with the cost model and {} with whole blocks",
             pays(G2400, "sharegpt_heldout", True, "break_even_tau", spec=".2f"),
             pays(G2400, "sharegpt_heldout", False, "break_even_tau", spec=".2f")),
        ],
        context=["1,200 steps and gated for 2,400", "first 12 prompts", "128 tokens", "at 2,400 steps", "At 1,200 steps",
                 "speedup above 1 with its interval above 1, tau 2.0, tau 2.5"],
    ),
    "**Code data for HumanEval**": Figures(
        claims=[
            ("move humaneval by **{}** [{}, {}] (tau {} against {})",
             pays_difference(CODE, "humaneval", "whole blocks", path=CODE_DATA),
             pays_difference(CODE, "humaneval", "whole blocks", 0, path=CODE_DATA),
             pays_difference(CODE, "humaneval", "whole blocks", 1, path=CODE_DATA),
             pays(CODE, "humaneval", False, "measured_tau", path=CODE_DATA),
             pays(CHAT, "humaneval", False, "measured_tau", path=CODE_DATA)),
            ("sharegpt_heldout {} [{}, {}]",
             pays_difference(CODE, "sharegpt_heldout", "whole blocks", path=CODE_DATA),
             pays_difference(CODE, "sharegpt_heldout", "whole blocks", 0, path=CODE_DATA),
             pays_difference(CODE, "sharegpt_heldout", "whole blocks", 1, path=CODE_DATA)),
        ],
        context=["SmolLM2's own", "300 code", "1,200 steps", "12 prompts", "128 tokens", "HumanEval's 2.5"],
    ),
    "**On both cores**": Figures(
        claims=[
            ("runs at **{}×** [{}, {}] of `generate` on sharegpt_heldout",
             pays(T1200, "sharegpt_heldout", True, "speedup", path=TWO_THREADS),
             pays(T1200, "sharegpt_heldout", True, "speedup_ci", 0, path=TWO_THREADS),
             pays(T1200, "sharegpt_heldout", True, "speedup_ci", 1, path=TWO_THREADS)),
            ("**{}×** [{}, {}] at 2,400 steps (tau {})",
             pays(T2400, "sharegpt_heldout", True, "speedup", path=TWO_THREADS),
             pays(T2400, "sharegpt_heldout", True, "speedup_ci", 0, path=TWO_THREADS),
             pays(T2400, "sharegpt_heldout", True, "speedup_ci", 1, path=TWO_THREADS),
             pays(T2400, "sharegpt_heldout", True, "measured_tau", path=TWO_THREADS)),
            ("tau is {} [{}, {}] higher",
             pays_difference(T2400, "sharegpt_heldout", "whole blocks", path=TWO_THREADS),
             pays_difference(T2400, "sharegpt_heldout", "whole blocks", 0, path=TWO_THREADS),
             pays_difference(T2400, "sharegpt_heldout", "whole blocks", 1, path=TWO_THREADS)),
        ],
        context=["2 threads each", "1.3–1.7", "1,200 steps", "at or above 1.0×", "no interval lies above 1.0",
                 "2,400-step", "15% faster"],
    ),
    "**Packed LM head, 24 prompts**": Figures(
        claims=[
            ("runs at **{}×** [{}, {}] of `generate` on sharegpt_heldout",
             pays(P2400, "sharegpt_heldout", True, "speedup", path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_ci", 0, path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_ci", 1, path=PACKED_HEAD)),
            ("(tau {})", pays(P2400, "sharegpt_heldout", True, "measured_tau", path=PACKED_HEAD)),
            ("humaneval: {}× [{}, {}])",
             pays(P2400, "humaneval", True, "speedup", path=PACKED_HEAD),
             pays(P2400, "humaneval", True, "speedup_ci", 0, path=PACKED_HEAD),
             pays(P2400, "humaneval", True, "speedup_ci", 1, path=PACKED_HEAD)),
            ("it is {}× [{}, {}]",
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate", path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate_ci", 0, path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate_ci", 1, path=PACKED_HEAD)),
        ],
        context=["24 prompts", "2,400-step", "above 1.0"],
    ),
    "**Where it stands**": Figures(
        claims=[
            ("runs at **{}×** [{}, {}]\nof `generate` on sharegpt_heldout",
             pays(P2400, "sharegpt_heldout", True, "speedup", path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_ci", 0, path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_ci", 1, path=PACKED_HEAD)),
            ("runs at {}× [{}, {}]: not met",
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate", path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate_ci", 0, path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate_ci", 1, path=PACKED_HEAD)),
            ("{} [{}, {}] on sharegpt_heldout and {}\n[{}, {}] on humaneval verifying whole blocks",
             *(pays(P2400, name, False, key, *index, path=PACKED_HEAD)
               for name in ("sharegpt_heldout", "humaneval")
               for key, *index in (("measured_tau",), ("measured_tau_ci", 0), ("measured_tau_ci", 1)))),
            ("near {} × 10¹⁰ training tokens", study_fit("sharegpt_heldout", "tokens_for_target", 1e10, ".1f")),
        ],
        context=["#28", "2,400 steps on 3,000", "2 threads", "24 prompts × 128 tokens", "the 2.0 and 2.5 targets",
                 "puts 2.0", "HumanEval's 2.5"],
    ),
    "**What moves tau per CPU hour**": Figures(
        claims=[
            ("instead of 32 adds **{}** [{}, {}] on sharegpt_heldout and {} on humaneval",
             study("anchors128", 600, "sharegpt_heldout", "delta_vs_base"),
             study("anchors128", 600, "sharegpt_heldout", "delta_vs_base_ci", 0),
             study("anchors128", 600, "sharegpt_heldout", "delta_vs_base_ci", 1),
             study("anchors128", 600, "humaneval", "delta_vs_base")),
            ("add **{}** [{}, {}] on sharegpt_heldout but {} on humaneval",
             study("data3000", 600, "sharegpt_heldout", "delta_vs_base"),
             study("data3000", 600, "sharegpt_heldout", "delta_vs_base_ci", 0),
             study("data3000", 600, "sharegpt_heldout", "delta_vs_base_ci", 1),
             study("data3000", 600, "humaneval", "delta_vs_base")),
            ("draft layer ({}) and lr", study("layers2", 600, "sharegpt_heldout", "delta_vs_base")),
            ("3e-3 ({}) do not help", study("lr3e-3", 600, "sharegpt_heldout", "delta_vs_base")),
            ("tau **{}** [{}, {}] on sharegpt_heldout, {} on humaneval",
             study("combined1200", 1200, "sharegpt_heldout", "measured_tau", spec=".3f"),
             study("combined1200", 1200, "sharegpt_heldout", "measured_tau_ci", 0, spec=".3f"),
             study("combined1200", 1200, "sharegpt_heldout", "measured_tau_ci", 1, spec=".3f"),
             study("combined1200", 1200, "humaneval", "measured_tau", spec=".3f")),
            ("The base gains {} tau per 10×", study_fit("sharegpt_heldout", "slope_per_decade")),
            ("about {} × 10¹⁰", study_fit("sharegpt_heldout", "tokens_for_target", 1e10, ".1f")),
        ],
        context=["#28", "seven", "16 prompts", "128 tokens", "128 blocks per row", "3,000 conversations instead of 1,284",
                 "at 600 steps", "1,200 steps", "(2.0, 2.5, a speedup above 1)", "tau 2.0"],
    ),
    "**Measured on the evaluation sets**": Figures(
        claims=[
            ("tau **{}**\n[{}, {}] on {} held-out ShareGPT V3 prompts × {} tokens",
             eval_set("sharegpt_heldout", False, "measured_tau"),
             eval_set("sharegpt_heldout", False, "measured_tau_ci", 0),
             eval_set("sharegpt_heldout", False, "measured_tau_ci", 1),
             eval_set("sharegpt_heldout", False, "num_prompts", spec=".0f"),
             eval_set("sharegpt_heldout", False, "max_new_tokens", spec=".0f")),
            ("**{}** [{}, {}] on {} HumanEval problems", eval_set("humaneval", False, "measured_tau"),
             eval_set("humaneval", False, "measured_tau_ci", 0), eval_set("humaneval", False, "measured_tau_ci", 1),
             eval_set("humaneval", False, "num_prompts", spec=".0f")),
            ("{}× [{}, {}] and {}× [{}, {}] with whole blocks", eval_set("sharegpt_heldout", False, "speedup"),
             eval_set("sharegpt_heldout", False, "speedup_ci", 0), eval_set("sharegpt_heldout", False, "speedup_ci", 1),
             eval_set("humaneval", False, "speedup"), eval_set("humaneval", False, "speedup_ci", 0),
             eval_set("humaneval", False, "speedup_ci", 1)),
            ("{}× and\n{}× with the cost-model schedule", eval_set("sharegpt_heldout", True, "speedup"),
             eval_set("humaneval", True, "speedup")),
            ("the {} of the report's", lambda: fmt(next(r for r in load_json("experiments/smollm2_heads/1200steps/results.json")["rows"]
                                                     if r["head"] == "gated")["measured_tau"], ".3f")),
        ],
        context=["1,200-step", "95%", "8 prompts × 64 tokens", "#28", "above 1", "≥ 2.0", "≥ 2.5", "V3"],
    ),
    "**A cheaper training step.**": Figures(
        claims=[
            ("a step now trains {} tokens/s against {} before: **{}×**",
             lambda: fmt(load_json(TRAINING_STEP)["after"]["tokens_per_second"], ".0f"),
             lambda: fmt(load_json(TRAINING_STEP)["before"]["tokens_per_second"], ".0f"),
             lambda: fmt(load_json(TRAINING_STEP)["ratio"], ".2f")),
            ("peak tensor memory per step {} → {} MiB",
             lambda: fmt(load_json(TRAINING_STEP)["before"]["peak_memory_mb"], ".0f"),
             lambda: fmt(load_json(TRAINING_STEP)["after"]["peak_memory_mb"], ".0f")),
            ("within {})", lambda: format(load_json(TRAINING_STEP)["after"]["first_loss_error"], ".1e")),
            ("still trains, {}× faster", lambda: fmt(load_json(TRAINING_STEP)["ratio_fallback"], ".2f")),
        ],
        context=["SmolLM2-135M", "1024 tokens", "32 anchors", "B = 8", "Vd = 8192", "one draft layer", "float64",
                 "format 1", "AdamW"],
    ),
    "`dspark-lightning report --output experiments/demo_heads` trains": Figures(
        claims=[
            ("({} steps each", lambda: str(load_json(DEMO_RESULTS)["budget"]["steps"])),
            ("{} min here", lambda: fmt(load_json(DEMO_RESULTS)["seconds"] / 60, ".1f")),
        ],
    ),
    "Where the gap comes from": Figures(
        claims=[
            ("a {}-step quickstart drafter", lambda: search("experiments/demo_heads/gap.md", r"max_steps=(\d+)")),
            ("{} prompts × {} tokens", gap(GAP_DEMO, "prompts", spec=None), gap(GAP_DEMO, "max_new_tokens", spec=None)),
            ("greedy tau {} on validation text, {} ({}) on the target's own replies, {} with the drafter's own",
             gap(GAP_DEMO, "tau", "a"), gap(GAP_DEMO, "tau", "b"), gap(GAP_DEMO, "delta", "b", "+.3f"),
             lambda: "unchanged" if load_json(GAP_DEMO)["delta"]["c"] == 0 else "changed"),
            ("{} ({}) at the positions decoding anchors — {} the measured tau",
             gap(GAP_DEMO, "tau", "d"), gap(GAP_DEMO, "delta", "d", "+.3f"),
             lambda: "exactly" if load_json(GAP_DEMO)["delta"]["measured"] == 0 else "not"),
        ],
    ),
    "The gap decomposed on the gated drafter": Figures(
        claims=[
            ("{}-step gated run", lambda: search("experiments/smollm2_heads/400steps/gap.md", r"(\d+)\s+steps\)")),
            ("{} prompts × {} tokens", gap(GAP_SMOLLM2, "prompts", spec=None),
             gap(GAP_SMOLLM2, "max_new_tokens", spec=None)),
            ("greedy tau {} on the (regenerated) validation text, {} on the target's own replies, {} at decoding's"
             " anchors {} measured", gap(GAP_SMOLLM2, "tau", "a"), gap(GAP_SMOLLM2, "tau", "b"),
             gap(GAP_SMOLLM2, "tau", "d"), lambda: "=" if load_json(GAP_SMOLLM2)["delta"]["measured"] == 0 else "≠"),
            ("the full {}-token vocabulary", vocab("verifier_vocab_size")),
            ("the best of the {} draft tokens", vocab("draft_vocab_size")),
        ],
    ),
    "- **Draft vocabulary**": Figures(
        claims=[
            ("Vd = {} of V = {}, built from the {} training conversations, covers {}% of their supervised tokens",
             lambda: f"{int(vocab('draft_vocab_size')()):,}", lambda: f"{int(vocab('verifier_vocab_size')()):,}",
             lambda: str(len((ROOT / "assets/smollm2/regenerated/train-00000.jsonl").read_text().splitlines())),
             lambda: fmt(100 * float(vocab("coverage")()), ".0f")),
        ],
        context=["~9% is a long tail", "near 0.9"],
        unbacked=["**90.2%** of the validation split's", "553 later training conversations",
                  "91.3% of 70,752 tokens", "1,504 conversations", "91.4% of the validation split"],
    ),
    "Memory is dominated by": Figures(
        claims=[
            ("({}% of a Qwen3-8B step at S = {}, A = {})",
             lambda: row(COMPUTE, target="Qwen3-8B", seq_len=4096)["cache_share_percent"],
             lambda: row(COMPUTE, target="Qwen3-8B", seq_len=4096)["seq_len"],
             lambda: search("benchmarks/memory/results/memory_guidance.md", r"TFLOP\) at A = (\d+)")),
        ],
        context=["S ≈ 4k"],
    ),
}


def head_tau(path: str, head: str, block_size: int | None = None) -> Callable[[], str]:
    """A head's measured tau in a report's ``rows`` (of one block size when the report has several)."""

    def value():
        rows = [r for r in load_json(path)["rows"] if r["head"] == head]
        rows = [r for r in rows if block_size is None or r["block_size"] == block_size]
        (r,) = rows
        return fmt(r["measured_tau"], ".3f")

    return value


def loss_tau(path: str, label: str) -> Callable[[], str]:
    """A loss's measured tau, mean ± std over seeds, in a loss study."""

    def value():
        (g,) = [g for g in load_json(path)["groups"] if g["label"] == label]
        return f"{g['measured_tau']:.3f} ± {g['measured_tau_std']:.3f}"

    return value


def gemma_step(variant: str) -> Callable[[], str]:
    return lambda: fmt(load_json("experiments/gemma3_training_step/results/gemma_step.json")[variant]["tokens_per_second"], ".0f")


RESULTS_DEMO, HEADS_400 = "experiments/demo_heads/results.json", "experiments/smollm2_heads/400steps/results.json"
LOSS_DEMO, LOSS_SMOLLM2 = "experiments/loss_study/demo/results.json", "experiments/loss_study/smollm2/results.json"
AUDIT = "experiments/mutation_audit/results.json"
CHOICES = "experiments/smollm2_recipe_choices/results.json"
HEADS_1200, HEADS_3000 = "experiments/smollm2_heads/1200steps/results.json", "experiments/smollm2_heads/3000steps/results.json"
# experiments/README.md: each row's headline (keyed by its folder) against the experiment's raw file
LEDGER = {
    "per_benchmark/": Figures(
        claims=[
            ("greedy {} on humaneval to {} on mbpp", lambda: fmt(per_benchmark_row("smollm2", 0.0, "humaneval")["measured_tau"], ".3f"),
             lambda: fmt(per_benchmark_row("smollm2", 0.0, "mbpp")["measured_tau"], ".3f")),
            ("{}x of bf16 `generate`", lambda: span([r["speedup"] for r in per_benchmark_smollm2() if r["temperature"] == 0.0], ".3f")),
            ("{}x at T = 1", lambda: span([r["speedup"] for r in per_benchmark_smollm2() if r["temperature"] == 1.0], ".3f")),
            ("the Markov head {} on sharegpt_heldout", per_benchmark_head("sharegpt_heldout")),
            ("inside vLLM {} at batch size 1", per_benchmark_vllm(1)),
        ],
        context=["T = 1", "float32"],
    ),
    "demo_heads/": Figures(
        claims=[("measured tau {} without a head, {} with the vanilla head", head_tau(RESULTS_DEMO, "none", 8),
                 head_tau(RESULTS_DEMO, "vanilla", 8))],
        context=["B = 8"],
    ),
    "loss_study/demo/": Figures(
        claims=[("measured tau kl {} against {} for the default", loss_tau(LOSS_DEMO, "kl"), loss_tau(LOSS_DEMO, "ce+tv"))],
    ),
    "loss_study/smollm2/": Figures(claims=[("tv alone lowest at {}", loss_tau(LOSS_SMOLLM2, "tv"))]),
    "smollm2_heads/400steps/": Figures(
        claims=[("measured tau {} without a head, {} gated", head_tau(HEADS_400, "none"), head_tau(HEADS_400, "gated"))],
    ),
    "smollm2_heads/1200steps/": Figures(
        claims=[("measured tau {} without a head, {} vanilla and gated", head_tau(HEADS_1200, "none"),
                 lambda: same([head_tau(HEADS_1200, h)() for h in ("vanilla", "gated")], ".3f"))],
    ),
    "smollm2_heads/gated_longer/": Figures(),
    "smollm2_heads/3000steps/": Figures(
        claims=[("measured tau gated {}, none {}", head_tau(HEADS_3000, "gated"), head_tau(HEADS_3000, "none"))],
    ),
    "smollm2_eval_sets/": Figures(
        claims=[("tau {} [{}, {}] on sharegpt_heldout", eval_set("sharegpt_heldout", False, "measured_tau"),
                 eval_set("sharegpt_heldout", False, "measured_tau_ci", 0),
                 eval_set("sharegpt_heldout", False, "measured_tau_ci", 1))],
    ),
    "smollm2_cpu_hour_study/": Figures(
        claims=[
            ("tau {} per 10× training tokens", study_fit("sharegpt_heldout", "slope_per_decade")),
            ("{}x [{}, {}] of `generate`", pays(P2400, "sharegpt_heldout", True, "speedup", path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_ci", 0, path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_ci", 1, path=PACKED_HEAD)),
            ("{}x [{}, {}] on the same kernels",
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate", path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate_ci", 0, path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate_ci", 1, path=PACKED_HEAD)),
        ],
    ),
    "smollm2_recipe_choices/": Figures(
        claims=[("feature noise {} on sharegpt_heldout", paired_delta("experiments/smollm2_recipe_choices/results.json", "feature_noise", "sharegpt_heldout"))],
        context=["block 16"],
    ),
    "smollm2_bf16/": Figures(
        claims=[("{} of bf16 `generate` on the same kernels", timed(
            "experiments/smollm2_bf16/results.json", "combined_bf16_long", "sharegpt_heldout", "cost model")),
            ("{} on humaneval", timed(
                "experiments/smollm2_bf16/results.json", "combined_bf16_long", "humaneval", "cost model"))],
        context=["bf16", "3,600 s"],
    ),
    "gemma3_heads/": Figures(
        claims=[("measured tau {} without a head, {} vanilla", gemma("none", "measured_tau"),
                 gemma("vanilla", "measured_tau"))],
        context=["262k"],
    ),
    "training_step_speedup/": Figures(
        claims=[("{} against {} tokens/s: {}×",
                 lambda: fmt(load_json(TRAINING_STEP)["after"]["tokens_per_second"], ".0f"),
                 lambda: fmt(load_json(TRAINING_STEP)["before"]["tokens_per_second"], ".0f"),
                 lambda: fmt(load_json(TRAINING_STEP)["ratio"], ".2f"))],
    ),
    "smollm2_draft_opd/": Figures(
        claims=[("no: {} on sharegpt_heldout and {} on humaneval at the same seconds",
                 paired_delta("experiments/smollm2_draft_opd/results.json", "combined_stage_opd", "sharegpt_heldout"),
                 paired_delta("experiments/smollm2_draft_opd/results.json", "combined_stage_opd", "humaneval"))],
    ),
    "smollm2_sampled_regen/": Figures(
        claims=[("no: sampled alone {} on sharegpt_heldout and {} on humaneval; mixed with the greedy replies {}",
                 paired_delta(SAMPLED, "combined_bf16_sampled", "sharegpt_heldout"),
                 paired_delta(SAMPLED, "combined_bf16_sampled", "humaneval"),
                 paired_delta(SAMPLED, "combined_bf16_mixed", "sharegpt_heldout")),
                ("mixed for an hour {}, {} over the greedy hour", measured(SAMPLED, "combined_bf16_mixed_long"),
                 paired_delta(SAMPLED, "combined_bf16_mixed_long", "sharegpt_heldout"))],
    ),
    "smollm2_more_data/": Figures(
        claims=[("no: {} on sharegpt_heldout and {} on humaneval against the mixed hour; {} of bf16",
                 paired_delta(MORE, "combined_bf16_more_long", "sharegpt_heldout"),
                 paired_delta(MORE, "combined_bf16_more_long", "humaneval"),
                 timed(MORE, "combined_bf16_more_long", "sharegpt_heldout", "cost model"))],
        context=["3,000 conversations", "4,284 replies"],
    ),
    "mutation_audit/": Figures(
        claims=[("{} of {} realistic mutations caught", lambda: str(load_json(AUDIT)["caught"]),
                 lambda: str(load_json(AUDIT)["mutations"]))],
    ),
    "gemma3_training_step/": Figures(
        claims=[("{} against {} tokens/s", gemma_step("vd32k"), gemma_step("full"))],
        context=["32k"],
    ),
}
# fmt: on


# ---------------------------------------------------------------------------------------------------------- tests
def table_key(table: Table, keys) -> tuple | None:
    """The mapping key of a README table: its section (a key may name the start of the heading) and position."""
    found = [key for key in keys if table.section.startswith(key[0]) and table.index == key[1]]
    assert len(found) <= 1, f"{table.section!r}: several mapping keys {found}"
    return found[0] if found else None


def the_table(key) -> Table:
    found = [t for t in readme_tables() if table_key(t, [key])]
    assert len(found) == 1, f"the pages: {len(found)} tables at {key} (a mapped table was moved or removed?)"
    return found[0]


def test_every_readme_table_has_a_raw_file_or_is_prose_only():
    keys = [*RESULTS_TABLES, *PROSE_ONLY, *CHECKED_ELSEWHERE, ("Performance", 0), ("Ledger", 0)]
    unmapped = [(t.section, t.index, t.header) for t in readme_tables() if table_key(t, keys) is None]
    assert not unmapped, f"tables with no raw file mapped in this test (add them to RESULTS_TABLES): {unmapped}"
    for key in keys:
        the_table(key)


@pytest.mark.parametrize("key", list(RESULTS_TABLES), ids=lambda k: f"{k[0]}#{k[1]}")
def test_results_table_matches_its_file(key):
    check_results_table(RESULTS_TABLES[key], the_table(key), key)


def check_results_table(spec: ResultsTable, table: Table, key):
    """``table``'s header is the mapped columns, its rows the file's records and every cell the record's text."""
    assert spec.named in table.before, f"the page names {spec.named} before the table {key}"
    data = load_csv(spec.source) if spec.source.endswith(".csv") else load_json(spec.source)
    columns, records = spec.columns(data), spec.records(data)
    assert table.header == list(columns), f"{key}: columns {table.header}, mapped {list(columns)}"
    key_columns = len(next(iter(records)))
    readme_keys = [tuple(bare(c) for c in cells[:key_columns]) for cells in table.rows]
    assert sorted(readme_keys) == sorted(records), f"{key}: page rows {readme_keys}, {spec.source} {list(records)}"
    wrong = []
    for cells, k in zip(table.rows, readme_keys, strict=True):
        for header, cell in zip(table.header, cells, strict=True):
            expected = columns[header](records[k])
            if bare(cell) != expected:
                wrong.append(f"{k} {header!r}: page {cell!r}, {spec.source} gives {expected!r}")
    assert not wrong, "\n".join(wrong)


def experiment_folders() -> list[str]:
    """Every experiment under ``experiments/``: a folder with a README or a report (``tools/`` is not one)."""
    found = {p.parent for name in ("README.md", "report.md") for p in (ROOT / "experiments").rglob(name)}
    return sorted(f"{p.relative_to(ROOT / 'experiments').as_posix()}/" for p in found if p != ROOT / "experiments")


def test_the_ledger_lists_every_experiment_and_its_headlines_match_their_files():
    table = the_table(("Ledger", 0))
    assert table.header == ["experiment", "question", "status", "headline", "command"]
    names = [re.search(r"`([^`]+)`", cells[0])[1] for cells in table.rows]
    assert sorted(names) == sorted(LEDGER) == experiment_folders() and len(set(names)) == len(names)
    for name, (_, question, status, headline, _) in zip(names, table.rows, strict=True):
        assert status.startswith(("current", "superseded by")), f"{name}: status {status!r}"
        text = re.sub(r"SmolLM2|Gemma 3|\b1200steps|\b400steps", " ", f"{question}\n{status}\n{headline}")  # names
        check_figures(text, LEDGER[name], f"experiments/README.md {name}")


def check_figures(text: str, figures: Figures, where: str):
    """Each claim as filled from the raw files is in ``text``; every other digit is context or marked unbacked."""
    text = " ".join(text.split())  # the README wraps its lines anywhere
    rest, wrong = text, []
    for template, *values in figures.claims:
        expected = " ".join(template.format(*(value() for value in values)).split())
        if expected not in text:
            wrong.append(f"{where}: the page should say {expected!r}")
        rest = rest.replace(expected, " ")
    for snippet in figures.unbacked:
        at = text.find(snippet)
        if at < 0:
            wrong.append(f"{where}: no {snippet!r} (an unbacked figure listed here; delete it from the list?)")
        elif NO_RAW_FILE not in text[max(0, at - 200) : at + len(snippet) + 200]:
            wrong.append(f"{where}: {snippet!r} has no raw file and the page does not say so next to it")
        rest = rest.replace(snippet, " ")
    for snippet in figures.context:
        assert snippet in text, f"{where}: no {snippet!r} (a context snippet listed here)"
        rest = rest.replace(snippet, " ")
    rest = re.sub(r"`[^`]*`|\]\([^)]*\)", " ", rest)  # code spans and link targets: names, not figures
    stray = sorted(set(re.findall(r"[^\s]*\d[^\s]*", rest)))
    if stray:
        wrong.append(f"{where}: figures no claim covers (map them to a raw file or mark them {NO_RAW_FILE!r}): {stray}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("source", list(PERFORMANCE))
def test_performance_row_matches_its_file(source):
    table = the_table(("Performance", 0))
    assert table.header == ["what", "result", "file"]
    assert sorted(cells[2].strip("`") for cells in table.rows) == sorted(PERFORMANCE), "rows vs PERFORMANCE keys"
    what, result, _ = next(cells for cells in table.rows if cells[2].strip("`") == source)
    check_figures(f"{what}\n{result}", PERFORMANCE[source], source)


@pytest.mark.parametrize("start", list(PROSE))
def test_prose_figures_match_their_files(start):
    check_figures(paragraph(start), PROSE[start], start)


@pytest.mark.parametrize("key", list(PROSE_ONLY), ids=lambda k: k[0])
def test_prose_only_tables_hold_no_figures(key):
    table = the_table(key)
    text = " ".join(" ".join(cells) for cells in [table.header, *table.rows])
    for name in [*PROSE_ONLY_NAMES.get(key, []), "95%"]:  # 95%: the confidence level of an interval, a name
        text = text.replace(name, " ")
    text = re.sub(VERSIONS, " ", text)
    text = re.sub(r"`[^`]*`|\]\([^)]*\)|SmolLM2|Qwen3", " ", text)  # code spans, link targets, model names
    assert not re.findall(r"(?<![\w-])\d", text), f"{key}: a figure in a table listed as prose-only"


def test_no_test_count():
    """The README says "the suite", never how many tests it holds: that count drifted (543 quoted, ~600 collected)."""
    prose = re.sub(r"```.*?```|`[^`]*`", " ", TEXT, flags=re.S)  # commands (pytest -n 0 tests/...) are not counts
    assert not re.search(r"\b\d[\d,]*\s+(?:test cases|tests)\b", prose), "a page quotes a number of tests"


def test_raw_files_parsed_from_markdown_are_up_to_date():
    spec = importlib.util.spec_from_file_location(
        "results_from_reports", ROOT / "experiments/tools/results_from_reports.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    stale = [str(p.relative_to(ROOT)) for p, text in script.derived_files().items() if p.read_text() != text]
    assert not stale, f"run python experiments/tools/results_from_reports.py: {stale}"


def test_table_parser_reads_cells_sections_and_the_text_before():
    text = "# A\n\nsee `x.json`:\n\n| k | v |\n|---|---:|\n| a | 1.0 |\n\n```\n| not | a table |\n```\n## B\n| k |\n|---|\n"
    a, b = readme_tables(text)
    assert (a.section, a.index, a.header, a.rows) == ("A", 0, ["k", "v"], [["a", "1.0"]])
    assert "`x.json`" in a.before and (b.section, b.index, b.rows) == ("B", 0, [])


def test_check_figures_fails_on_a_changed_or_unclaimed_figure():
    figures = Figures(claims=[("tau {}", lambda: "1.50")], unbacked=["7 s"], context=["B = 8"])
    check_figures("B = 8: tau 1.50, 7 s (no raw file)", figures, "ok")
    with pytest.raises(AssertionError, match="should say 'tau 1.50'"):
        check_figures("B = 8: tau 1.51, 7 s (no raw file)", figures, "changed")
    with pytest.raises(AssertionError, match=r"no claim covers.*'3x'"):
        check_figures("B = 8: tau 1.50, 7 s (no raw file), 3x", figures, "stray")
    with pytest.raises(AssertionError, match="does not say so"):
        check_figures("B = 8: tau 1.50, 7 s", figures, "unmarked")
