"""Validation curves of finished runs, side by side: one CSV and one tau-vs-step chart from their ``metrics.csv``.

    python scripts/validation_curves.py --run 1200_steps=runs/smollm2_1200/gated/version_0/metrics.csv \
        --run 3000_steps=runs/smollm2_3000/gated/version_0/metrics.csv --output experiments/smollm2_heads/3000steps

Reads the rows of a Lightning ``CSVLogger`` file that carry a validation (``val/greedy_tau``); steps are reported
1-based (the logger writes the 0-based step of the last optimizer step, so a validation after 500 steps is step
499 there). Each run keeps its own validation steps: runs validated at different intervals plot on one axis.
Writes ``validation_curve.csv`` (run, step, tf_greedy_tau, tf_expected_tau, val_loss) and ``tau_vs_steps.png``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

COLUMNS = {"tf_greedy_tau": "val/greedy_tau", "tf_expected_tau": "val/tau", "val_loss": "val/loss"}


def validation_rows(name: str, metrics_csv: Path) -> list[dict]:
    """The validation rows of one run, in step order; a file without any is an error naming it."""
    with open(metrics_csv, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS.values()) - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{metrics_csv}: no validation columns {sorted(missing)} (is it a CSVLogger metrics.csv?)")
        rows = [
            {"run": name, "step": int(r["step"]) + 1, **{k: float(r[v]) for k, v in COLUMNS.items()}}
            for r in reader
            if r["val/greedy_tau"]
        ]
    if not rows:
        raise ValueError(f"{metrics_csv}: no row with a validation (val/greedy_tau is empty everywhere)")
    return sorted(rows, key=lambda r: r["step"])


def write_curves(runs: dict[str, Path], output: Path) -> list[dict]:
    from dspark_lightning import plotting

    rows = [row for name, path in runs.items() for row in validation_rows(name, path)]
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "validation_curve.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["run", "step", *COLUMNS], lineterminator="\n")
        writer.writeheader()
        writer.writerows({**r, **{k: f"{r[k]:.4f}" for k in COLUMNS}} for r in rows)
    mine = {name: [r for r in rows if r["run"] == name] for name in runs}
    fig = plotting.xy_chart(
        None,
        {name: [r["tf_greedy_tau"] for r in run] for name, run in mine.items()},
        "validation during training",
        "optimizer step",
        "teacher-forced greedy tau",
        curve_xs={name: [r["step"] for r in run] for name, run in mine.items()},
    )
    plotting.save(fig, output / "tau_vs_steps.png")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=path/to/metrics.csv (repeatable)")
    parser.add_argument("--output", type=Path, required=True, help="directory for validation_curve.csv and the chart")
    args = parser.parse_args(argv)
    runs = {}
    for spec in args.run:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"--run {spec!r}: expected NAME=path/to/metrics.csv")
        runs[name] = Path(path)
    for row in write_curves(runs, args.output):
        print(f"{row['run']:>16} step {row['step']:>5}: TF greedy tau {row['tf_greedy_tau']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
