"""Selector walk (top-k pair scores + walk) vs sequential full-vocabulary Markov decode, per block, on CPU.

Run: ``python -m benchmarks.decoding.selector_walk`` (about 2-3 minutes on 2 cores) or ``--quick`` for a smoke run.
Writes ``benchmarks/decoding/results/selector.csv`` and ``selector.md`` (``--quick`` writes ``selector_quick.*``).

Setup: B = 16 slots, k = 16 candidates, rank r = 256, hidden H = 1024, Vd in {2048, 32768, 151936} (V = Vd, no d2t),
batch 1 and 32 blocks, float32, random weights, greedy decoding, ``torch.inference_mode``. Each timing is the median
of several repeats after a warm-up call; the calls being compared are interleaved (seq, walk, ..., seq, walk, ...)
so that load from other processes on a shared machine affects them alike. Heads: ``vanilla`` and ``gated`` with
``gate_input=hidden+prev`` (the DSpark checkpoint form). For the latter the walk uses the previous-token gate table
by default (``precompute_prev_gate_table``, cached on the head: a [V, r] gather replaces the per-predecessor r x r
gate product); it is also timed without it (``prev_gate_table=False``, the per-predecessor product), and the two
walks' tokens are compared.
``--compare REV`` also times the walk as it was at git revision REV (its ``selector/{topk,pairs,walks}.py``, imported
as a temporary package) in the same interleaved loop, and checks that both walks draft the same tokens.

Analytic cost per block row, in multiply-adds (MACs):
    sequential   B * Vd * r                      (+ gate B * (H + r) * r for hidden+prev)
    walk         B * k * k * r                   (+ gate B * H * r with the gate table, + B * k * r * r without)
                                                    + top-k over B * Vd logits
"""

from __future__ import annotations

import argparse
import csv
import importlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dspark_lightning.machine import machine_description, machine_line
from dspark_lightning.models import MarkovHead
from dspark_lightning.selector import candidate_topk, selector_decode, sequential_decode

BLOCK, K, RANK, HIDDEN = 16, 16, 256, 1024
VOCABS = (2048, 32768, 151936)
BATCHES = (1, 32)
HEADS = ("vanilla", "gated")
RESULTS = Path(__file__).resolve().parent / "results"


def repeats_for(vocab: int, batch: int, quick: bool) -> int:
    if quick:
        return 2
    work = vocab * batch
    return 31 if work <= 2048 * 32 else 11 if work <= 32768 * 32 else 7 if work <= 151936 else 5


def interleaved_times_ms(fns: dict[str, object], repeats: int) -> dict[str, float]:
    """Median and minimum wall time (ms) of each function (keys ``{name}_ms`` and ``{name}_min_ms``); the calls are
    interleaved, in an order rotated every repeat, so that load from other processes hits all of them alike."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for repeat in range(repeats):
        # rotate the order each repeat: a call right after the sequential decode finds colder caches
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
    medians = {f"{name}_ms": statistics.median(values) for name, values in times.items()}
    minima = {f"{name}_min_ms": min(values) for name, values in times.items()}
    return medians | minima


def selector_at_revision(revision: str):
    """The ``walks`` module of ``dspark_lightning.selector`` at a git revision, imported as a temporary package (every
    module of that revision's ``selector/`` but its ``__init__``, which would import the rest of the package)."""
    root = Path(__file__).resolve().parents[2]
    package = Path(tempfile.mkdtemp()) / "selector_at_revision"
    package.mkdir()
    (package / "__init__.py").write_text("")
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-tree", "--name-only", f"{revision}:dspark_lightning/selector"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in (f.removesuffix(".py") for f in listed if f.endswith(".py") and f != "__init__.py"):
        source = subprocess.run(
            ["git", "-C", str(root), "show", f"{revision}:dspark_lightning/selector/{name}.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (package / f"{name}.py").write_text(source.replace("dspark_lightning.selector.", "selector_at_revision."))
    sys.path.insert(0, str(package.parent))
    return importlib.import_module("selector_at_revision.walks")


def page_faults(fn) -> int:
    """Minor page faults of one call (memory the allocator had returned to the OS and the call touches again)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def make_head(kind: str, vocab: int) -> MarkovHead:
    head = MarkovHead(
        verifier_vocab_size=vocab,
        draft_vocab_size=vocab,
        rank=RANK,
        hidden_size=HIDDEN,
        kind=kind,
        gate_input="hidden+prev",
        gate_activation="sigmoid",
    )
    with torch.no_grad():
        head.markov_w2.weight.normal_(0.0, RANK**-0.5)  # starts at zero; random weights make the bias real
    return head.eval().requires_grad_(False)


def macs_per_row(kind: str, vocab: int) -> dict[str, int]:
    gated = kind == "gated"
    return {
        "sequential": BLOCK * vocab * RANK + (BLOCK * (HIDDEN + RANK) * RANK if gated else 0),
        "walk": BLOCK * K * K * RANK + (BLOCK * HIDDEN * RANK if gated else 0),
        "walk_no_table": BLOCK * K * K * RANK + (BLOCK * HIDDEN * RANK + BLOCK * K * RANK * RANK if gated else 0),
    }


def bench_case(kind: str, vocab: int, batch: int, repeats: int, old=None) -> dict[str, object]:
    torch.manual_seed(0)
    head = make_head(kind, vocab)
    base = torch.randn(batch, BLOCK, vocab)
    hidden = torch.randn(batch, BLOCK, HIDDEN)
    first_prev = torch.randint(0, vocab, (batch,))
    row: dict[str, object] = {"head": kind, "vocab": vocab, "batch": batch, "repeats": repeats}
    with torch.inference_mode():
        fns = {
            "sequential": lambda: sequential_decode(base, head, first_prev, hidden),
            "walk": lambda: selector_decode(base, head, first_prev, hidden, K),
            "topk": lambda: candidate_topk(base, K),
        }
        if old is not None:
            fns["walk_old"] = lambda: old.selector_decode(base, head, first_prev, hidden, K)
        if kind == "gated":
            fns["walk_no_table"] = lambda: selector_decode(base, head, first_prev, hidden, K, prev_gate_table=False)
        row.update(interleaved_times_ms(fns, repeats))
        row.setdefault("walk_no_table_ms", "")
        row.setdefault("walk_no_table_min_ms", "")
        row.setdefault("walk_old_ms", "")
        row.setdefault("walk_old_min_ms", "")
        # sanity: the benchmark measures decodes that agree where the candidate sets allow it
        walk = selector_decode(base, head, first_prev, hidden, K)
        seq = sequential_decode(base, head, first_prev, hidden)
        row["agreement"] = float((walk == seq).double().mean())
        no_table = selector_decode(base, head, first_prev, hidden, K, prev_gate_table=False)
        row["table_equal"] = float((walk == no_table).double().mean())
        for name in ("sequential", "walk", "walk_old"):
            row[f"{name}_page_faults"] = page_faults(fns[name]) if name in fns else ""
        row["old_equal"] = (
            ""
            if old is None
            else float((walk == old.selector_decode(base, head, first_prev, hidden, K)).double().mean())
        )
    macs = macs_per_row(kind, vocab)
    row.update({f"{name}_macs_per_row": value for name, value in macs.items()})
    row["topk_elements_per_row"] = BLOCK * vocab
    row["speedup"] = row["sequential_ms"] / row["walk_ms"]
    row["speedup_no_table"] = row["sequential_ms"] / row["walk_no_table_ms"] if row["walk_no_table_ms"] != "" else ""
    row["speedup_of_minima"] = row["sequential_min_ms"] / row["walk_min_ms"]
    row["old_over_new"] = row["walk_old_ms"] / row["walk_ms"] if old is not None else ""
    row["old_over_new_of_minima"] = row["walk_old_min_ms"] / row["walk_min_ms"] if old is not None else ""
    return row


def write_results(
    rows: list[dict[str, object]],
    machine: dict[str, str],
    stem: str,
    total_s: float,
    note: str = "",
    revision: str | None = None,
) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    fields = list(rows[0])
    with open(RESULTS / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {key: (f"{value:.4f}" if isinstance(value, float) else value) for key, value in row.items()}
            )

    def fmt(value: object, spec: str) -> str:
        return "—" if value == "" else format(value, spec)

    lines = [
        "# Selector walk vs sequential Markov decode (CPU)",
        "",
        f"B = {BLOCK}, k = {K}, r = {RANK}, H = {HIDDEN}, float32, greedy, `torch.inference_mode`, random weights. "
        "Times are per call (one call decodes `batch` blocks): median over repeats, calls interleaved; the minimum "
        "over repeats is in the CSV and gives the last speedup column. Generated by "
        "`python -m benchmarks.decoding.selector_walk`.",
        "",
        f"{machine_line(machine)} Load average {machine['load_average']} at start, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at end (a shared machine: other jobs ran meanwhile, expect "
        f"noise). Total benchmark time {total_s:.0f} s.",
        *([note] if note else []),
        "",
        "| head | Vd | batch | sequential ms | walk ms | speedup | walk without gate table ms | speedup (no table) "
        "| speedup of minima (walk) | top-k ms | MACs/row seq | MACs/row walk | MACs/row walk (no table) | walk = seq "
        "| tokens table = no table |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        gated = row["head"] == "gated"
        lines.append(
            f"| {'gated hidden+prev' if gated else 'vanilla'} | {row['vocab']} | {row['batch']} "
            f"| {row['sequential_ms']:.2f} | {row['walk_ms']:.2f} | {row['speedup']:.1f}× "
            f"| {fmt(row['walk_no_table_ms'], '.2f')} | {fmt(row['speedup_no_table'], '.1f')}{'×' if gated else ''} "
            f"| {row['speedup_of_minima']:.1f}× | {row['topk_ms']:.2f} "
            f"| {row['sequential_macs_per_row'] / 1e6:.1f} M | {row['walk_macs_per_row'] / 1e6:.1f} M "
            f"| {row['walk_no_table_macs_per_row'] / 1e6:.1f} M | {row['agreement']:.0%} "
            f"| {row['table_equal']:.0%} |"
        )
    if revision is not None:
        lines += [
            "",
            f"Same-run A/B against the walk at `{revision}` (its `selector/{{topk,pairs,walks}}.py`, timed in the same "
            "interleaved loop; `--compare`), with the minor page faults of one call:",
            "",
            f"| head | Vd | batch | walk ms | walk at {revision} ms | {revision} / this (medians) | (minima) "
            "| tokens equal | page faults: walk / at rev / sequential |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in rows:
            lines.append(
                f"| {row['head']} | {row['vocab']} | {row['batch']} | {row['walk_ms']:.2f} | {row['walk_old_ms']:.2f} "
                f"| {row['old_over_new']:.2f}× | {row['old_over_new_of_minima']:.2f}× | {row['old_equal']:.0%} "
                f"| {row['walk_page_faults']} / {row['walk_old_page_faults']} / {row['sequential_page_faults']} |"
            )
    lines += [
        "",
        "MACs per block row: sequential = B·Vd·r (+ B·(H+r)·r gate); walk = B·k²·r (+ B·H·r gate with the "
        "previous-token gate table, the default at inference; + B·k·r² more without it) plus an exact top-k over B·Vd "
        "logits (`candidate_topk`, timed alone in the `top-k ms` column and included in the walk time). `walk = seq` is "
        "the fraction of slots where the k = 16 walk drafts the sequential token (random weights and logits: a "
        "pessimistic case for coverage, not a quality measurement); `tokens table = no table` compares the walk's "
        "tokens with and without the gate table (the same map up to float summation order).",
        "",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: smallest vocab only, 2 repeats")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--note", default="", help="a sentence about the run, added to the markdown")
    parser.add_argument("--compare", metavar="REV", default=None, help="also time the walk at this git revision")
    parser.add_argument("--vocabs", type=int, nargs="+", default=None, help=f"draft vocab sizes (default {VOCABS})")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_description()
    vocabs = args.vocabs or (VOCABS[:1] if args.quick else VOCABS)
    old = selector_at_revision(args.compare) if args.compare else None
    start = time.perf_counter()
    rows = []
    for vocab in vocabs:
        for batch in BATCHES:
            for kind in HEADS:
                row = bench_case(kind, vocab, batch, repeats_for(vocab, batch, args.quick), old)
                rows.append(row)
                print(
                    f"{kind:8s} Vd={vocab:6d} batch={batch:2d}  sequential {row['sequential_ms']:9.2f} ms  "
                    f"walk {row['walk_ms']:8.2f} ms  ({row['speedup']:.1f}x)  no table {row['walk_no_table_ms']}  "
                    f"at {args.compare} {row['walk_old_ms']}",
                    flush=True,
                )
    stem = "selector_quick" if args.quick else "selector"
    write_results(rows, machine, stem, time.perf_counter() - start, args.note, args.compare)
    print(f"wrote {RESULTS}/selector{'_quick' if args.quick else ''}.{{csv,md}}")


if __name__ == "__main__":
    main()
