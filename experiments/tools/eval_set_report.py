"""Render a measured-decoding report on the evaluation sets from ``decode --eval_sets ... --json`` output.

    python experiments/tools/eval_set_report.py --decode_json runs/x/decode.json --output reports/NAME \
        --title "..." --fit_command "..." --measure_command "..."
    python experiments/tools/eval_set_report.py --decode_json none=a.json --decode_json gated=b.json ...   # one row per head
        [--paired_against none]   # and each other head's tau minus none's, paired over the same prompts

Writes ``results.json`` (the commands and, per evaluation set and schedule, ``eval_set``, ``measured_tau``,
``measured_tau_ci``, ``speedup``, ``speedup_ci``, the acceptance per slot and every prompt's raw counts and seconds)
and ``table.md`` (the table the report's README quotes), so the quoted numbers are generated, never typed. Given as
``HEAD=PATH``, each file's rows also carry ``head``. Rows timed against ``generate`` get ``break_even_tau``: the
measured seconds per speculative step over the baseline's seconds per token (both totals over the prompts, prompt
forward included), the tau at which this step cost would match ``generate``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from dspark_lightning.machine import machine_description
from dspark_lightning.measuring.intervals import ratio_difference_bootstrap_ci
from dspark_lightning.measuring.results import EvalSetRow, read_eval_set_rows

KEYS = (
    "eval_set", "mode", "threshold", "num_prompts", "max_new_tokens", "measured_tau", "measured_tau_ci", "speedup",
    "speedup_ci", "ci_confidence", "acceptance_per_slot", "outputs_equal", "prompts_without_verify", "mean_verified",
    "phase_ms_per_step", "noisy", "load_average", "torch_threads", "prompt_records", "speedup_vs_packed_generate",
    "speedup_vs_packed_generate_ci",
)  # fmt: skip


def schedule(row: dict) -> str:
    return "cost model" if isinstance(row["threshold"], list | tuple) else "whole blocks"


def break_even_tau(row: dict) -> float | None:
    records = [r for r in row.get("prompt_records") or [] if r.get("baseline_seconds") is not None]
    if not records:
        return None
    step_seconds = sum(r["speculative_seconds"] for r in records) / sum(r["target_forwards"] for r in records)
    token_seconds = sum(r["baseline_seconds"] for r in records) / sum(r["emitted_tokens"] for r in records)
    return step_seconds / token_seconds


def _speedup(value, interval) -> str:
    return "-" if value is None else f"{value:.3f}x [{interval[0]:.3f}, {interval[1]:.3f}]"


def table(rows: list[dict]) -> str:
    heads = any("head" in r for r in rows)
    packed = any(r.get("speedup_vs_packed_generate") is not None for r in rows)  # timed on packed kernels
    lines = [
        ("| head " if heads else "")
        + "| eval set | mode | schedule | prompts | measured tau [95% CI] | speedup vs `generate` [95% CI] "
        + ("| vs `generate` on packed kernels [95% CI] " if packed else "")
        + "| break-even tau | drafts verified per step | outputs equal |",
        ("|---" if heads else "") + "|---|---|---|---:|---|---|" + ("---|" if packed else "") + "---:|---:|---|",
    ]
    for r in rows:
        tau_lo, tau_hi = r["measured_tau_ci"]
        packed_cell = f"| {_speedup(r.get('speedup_vs_packed_generate'), r.get('speedup_vs_packed_generate_ci'))} "
        lines.append(
            (f"| {r['head']} " if heads else "")
            + f"| {r['eval_set']} | {r['mode']} | {schedule(r)} | {r['num_prompts']} "
            f"| {r['measured_tau']:.3f} [{tau_lo:.3f}, {tau_hi:.3f}] | {_speedup(r['speedup'], r['speedup_ci'])} "
            + (packed_cell if packed else "")
            + f"| {r['break_even_tau']:.2f} | {r['mean_verified']:.2f} | {'yes' if r['outputs_equal'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def paired_differences(rows: list[dict], reference: str) -> list[dict]:
    """Each other head's measured tau minus ``reference``'s on the same eval set and schedule, with the paired
    bootstrap interval (the sets' first N prompts are the same prompts in every run, in the same order); where both
    were timed against ``generate``, their speedups' difference too (``delta_speedup``: a speedup is also a ratio of
    sums over prompts, baseline seconds over speculative seconds)."""
    ref = {(r["eval_set"], schedule(r)): r for r in rows if r.get("head") == reference}
    if not ref:
        raise SystemExit(f"--paired_against {reference!r}: no --decode_json names that head")
    differences = []
    for r in rows:
        base = ref.get((r["eval_set"], schedule(r)))
        if r.get("head") == reference or base is None:
            continue
        counts = [[p["emitted_tokens"] for p in x["prompt_records"]] + [p["target_forwards"] for p in x["prompt_records"]]
                  for x in (r, base)]  # fmt: skip
        n = len(r["prompt_records"])
        low, high = ratio_difference_bootstrap_ci(counts[0][:n], counts[0][n:], counts[1][:n], counts[1][n:])
        difference = dict(head=r["head"], against=reference, eval_set=r["eval_set"], schedule=schedule(r),
                          delta_tau=r["measured_tau"] - base["measured_tau"], delta_tau_ci=[low, high])  # fmt: skip
        if all(p.get("baseline_seconds") is not None for x in (r, base) for p in x["prompt_records"]):
            keys = ("baseline_seconds", "speculative_seconds")
            seconds = [[p[k] for p in x["prompt_records"]] for x in (r, base) for k in keys]
            low, high = ratio_difference_bootstrap_ci(*seconds)
            difference |= dict(delta_speedup=r["speedup"] - base["speedup"], delta_speedup_ci=[low, high])
        differences.append(difference)
    return differences


def difference_table(differences: list[dict]) -> str:
    timed = any("delta_speedup" in d for d in differences)
    lines = [
        "| head | minus | eval set | schedule | measured tau difference [paired 95% CI] |"
        + (" speedup difference [paired 95% CI] |" if timed else ""),
        "|---|---|---|---|---|" + ("---|" if timed else ""),
    ]
    for d in differences:
        low, high = d["delta_tau_ci"]
        line = (
            f"| {d['head']} | {d['against']} | {d['eval_set']} | {d['schedule']} "
            f"| {d['delta_tau']:+.3f} [{low:+.3f}, {high:+.3f}] |"
        )
        if timed:
            low, high = d.get("delta_speedup_ci") or (None, None)
            line += f" {d['delta_speedup']:+.3f} [{low:+.3f}, {high:+.3f}] |" if low is not None else " - |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def read_rows(spec: str) -> list[dict]:
    """The rows of one ``decode --json`` file, ``PATH`` or ``HEAD=PATH`` (then each row carries ``head``)."""
    # a file's own name may hold "=" (study/.../step=1200.decode.json): only a spec that is no file names a head
    head, _, path = ("", "", spec) if Path(spec).is_file() else spec.partition("=")
    rows = []
    for measured in read_eval_set_rows(path):
        row = ({"head": head} if head else {}) | study_row(measured)
        rows.append(row | {"break_even_tau": break_even_tau(row)})
    return rows


def study_row(measured: EvalSetRow) -> dict:
    """This report's row (``KEYS``) of one eval-set row: its summary, its decode row's numbers, its spread."""
    summary, decoded = measured.summary, measured.decoded
    compared = decoded.comparison if decoded is not None else None
    spread = compared.spread if compared is not None else None
    return dict(
        eval_set=summary.eval_set, mode=summary.mode, threshold=summary.threshold, num_prompts=summary.num_prompts,
        max_new_tokens=summary.max_new_tokens, measured_tau=summary.measured_tau,
        measured_tau_ci=summary.measured_tau_ci, speedup=summary.speedup, speedup_ci=summary.speedup_ci,
        ci_confidence=summary.ci_confidence, acceptance_per_slot=summary.acceptance_per_slot,
        outputs_equal=summary.outputs_equal, prompts_without_verify=decoded.prompts_without_verify,
        mean_verified=decoded.mean_verified, phase_ms_per_step=decoded.phase_ms_per_step,
        noisy=spread.noisy if spread else None, load_average=spread.load_average if spread else None,
        torch_threads=spread.torch_threads if spread else None,
        prompt_records=[asdict(record) for record in decoded.prompt_records],
        speedup_vs_packed_generate=summary.speedup_vs_packed_generate,
        speedup_vs_packed_generate_ci=summary.speedup_vs_packed_generate_ci,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode_json", required=True, action="append", help="PATH or HEAD=PATH, repeatable")
    parser.add_argument("--output", required=True)
    parser.add_argument("--title", required=True)
    parser.add_argument("--fit_command", required=True)
    parser.add_argument("--measure_command", required=True)
    parser.add_argument("--paired_against", help="a HEAD: every other head's tau difference to it, paired bootstrap")
    args = parser.parse_args()
    rows = [row for spec in args.decode_json for row in read_rows(spec)]
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    results = dict(
        title=args.title, fit_command=args.fit_command, measure_command=args.measure_command,
        machine=machine_description(), eval_sets=rows,
    )  # fmt: skip
    text = table(rows)
    if args.paired_against:
        results["paired_differences"] = paired_differences(rows, args.paired_against)
        text += "\n" + difference_table(results["paired_differences"])
    (output / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (output / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
