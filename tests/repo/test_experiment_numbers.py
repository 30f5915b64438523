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
import re
from collections.abc import Callable

import pytest
import test_doc_numbers as doc
from helpers.paths import ROOT
from test_doc_numbers import Figures, ResultsTable, bare, fmt, load_json, span

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


# Tables (by page, section and position) mapped to their raw file.
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
}

# Tables a script writes whole from the raw file: the page must be what the script makes of that file today.
GENERATED = {
    "mutation_audit": lambda: mutation_script().readme(load_json(AUDIT)["results"]),
}

# Every page's prose: its figures, filled from the raw files, and the setup facts beside them.
PAGES = {
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
            ("cosine to zero at step {}", head(HEADS_3000, "gated", "steps", ",.0f")),
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
    if folder in GENERATED:
        return  # the whole page is compared with what its script writes
    assert found == mapped, f"{folder}/README.md: tables {found}, mapped in TABLES {mapped}"


@pytest.mark.parametrize("key", list(TABLES), ids=lambda k: f"{k[0]}#{k[1]}")
def test_results_table_matches_its_file(key):
    folder, index = key
    doc.check_results_table(TABLES[key], tables(folder)[index], f"experiments/{folder}/README.md table {index}")


@pytest.mark.parametrize("folder", list(GENERATED))
def test_generated_page_is_what_its_script_writes_from_the_raw_file(folder):
    assert page(folder) == GENERATED[folder](), f"experiments/{folder}/README.md differs from its script's rendering"


@pytest.mark.parametrize("folder", list(PAGES))
def test_page_figures_match_their_files(folder):
    text = re.sub(r"\]\([^)]*\)", "]", prose(page(folder)))  # link targets are paths, not figures
    text = re.sub(NAMES, " ", text)
    doc.check_figures(text, PAGES[folder], f"experiments/{folder}/README.md")


def test_the_page_text_drops_tables_and_code_blocks():
    text = "# T 1\n\ntau 2.0\n\n| a | 3 |\n|---|---|\n\n```\nrun 4\n```\nend"
    assert bare(prose(text)).split() == ["#", "T", "1", "tau", "2.0", "end"]
