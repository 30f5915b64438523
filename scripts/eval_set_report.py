"""Render a measured-decoding report on the evaluation sets from ``decode --eval_sets ... --json`` output.

    python scripts/eval_set_report.py --decode_json runs/x/decode.json --output reports/NAME \
        --title "..." --fit_command "..." --measure_command "..."

Writes ``results.json`` (the commands and, per evaluation set and schedule, ``eval_set``, ``measured_tau``,
``measured_tau_ci``, ``speedup``, ``speedup_ci``, the acceptance per slot and every prompt's raw counts and seconds)
and ``table.md`` (the table the report's README quotes), so the quoted numbers are generated, never typed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEYS = (
    "eval_set", "mode", "threshold", "num_prompts", "max_new_tokens", "measured_tau", "measured_tau_ci", "speedup",
    "speedup_ci", "ci_confidence", "acceptance_per_slot", "outputs_equal", "prompts_without_verify", "mean_verified",
    "phase_ms_per_step", "noisy", "load_average", "prompt_records",
)  # fmt: skip


def schedule(row: dict) -> str:
    return "cost model" if isinstance(row["threshold"], list | tuple) else "whole blocks"


def table(rows: list[dict]) -> str:
    lines = [
        "| eval set | mode | schedule | prompts | measured tau [95% CI] | speedup vs `generate` [95% CI] "
        "| drafts verified per step | outputs equal |",
        "|---|---|---|---:|---|---|---:|---|",
    ]
    for r in rows:
        tau_lo, tau_hi = r["measured_tau_ci"]
        sp_lo, sp_hi = r["speedup_ci"]
        lines.append(
            f"| {r['eval_set']} | {r['mode']} | {schedule(r)} | {r['num_prompts']} "
            f"| {r['measured_tau']:.3f} [{tau_lo:.3f}, {tau_hi:.3f}] | {r['speedup']:.3f}x [{sp_lo:.3f}, {sp_hi:.3f}] "
            f"| {r['mean_verified']:.2f} | {'yes' if r['outputs_equal'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode_json", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--title", required=True)
    parser.add_argument("--fit_command", required=True)
    parser.add_argument("--measure_command", required=True)
    args = parser.parse_args()
    rows = [{k: r.get(k) for k in KEYS} for r in json.loads(Path(args.decode_json).read_text())]
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    results = dict(title=args.title, fit_command=args.fit_command, measure_command=args.measure_command, eval_sets=rows)
    (output / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (output / "table.md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
