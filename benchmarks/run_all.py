"""Run every standing benchmark and regenerate its group's ``results/`` (what ``make bench`` calls).

    python -m benchmarks.run_all                 # full run (10-25 minutes on 2 shared cores, see benchmarks/README.md)
    python -m benchmarks.run_all --quick         # smoke run of every benchmark into a temporary directory
    python -m benchmarks.run_all --only train_step scaling [--out-dir DIR]

Design choices:
- A benchmark is a module ``benchmarks/<group>/<what_it_measures>.py`` (groups: training, memory, decoding); its
  results go to ``benchmarks/<group>/results/`` unless ``--out-dir`` sends every benchmark's files to one directory.
  Its ``run_all`` name is the stem of its result files (``--only decode`` reruns what writes ``decode.*``).
- Each benchmark runs in its own subprocess (``python -c`` calling the module's ``main``), one after another: a crash
  or an out-of-memory kill in one does not stop the others, memory is returned between them, and they never compete
  for the cores. The run exits non-zero if any of them failed, after running the rest.
- ``selector`` and ``loss_memory`` have no output-directory option; the subprocess sets their module-level
  ``RESULTS`` before calling ``main``, and ``PYTHONPATH`` points at the repository so their own worker subprocesses
  still import ``benchmarks.*`` from any working directory.
- ``--quick`` runs each benchmark's smoke mode (``--quick``, or tiny sizes for ``loss_memory``) into a fresh
  temporary directory unless ``--out-dir`` is given, so that a smoke run never overwrites the committed results.
- Every ``benchmarks/<group>/*.py`` not starting with ``_`` is run: the ones listed in ``KNOWN`` with their arguments
  and result files, any other one (named ``group.module``) with no arguments (``--quick`` in quick mode if it has that
  flag) and only its exit status checked.
- ``summary.md`` (``benchmarks/summary.md``, or in ``--out-dir``) lists each benchmark's status, wall time, finishing
  time and the load average before and after it (the machine is shared); ``--only`` replaces only the rows of what it
  reran (``summary.json`` keeps the records).
- One-off before/after comparisons are not here: they are experiments (``experiments/training_step_speedup/``,
  ``experiments/gemma3_training_step/``), run by their own commands.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
GROUPS = ("training", "memory", "decoding", "precision", "data")


# name -> (module under benchmarks/, full-run arguments, quick-run arguments, result stem, quick result stem)
# fmt: off
KNOWN: dict[str, tuple[str, list[str], list[str], str | None, str | None]] = {
    "train_step": ("training.step_vs_speculators", [], ["--quick"], "train_step", "train_step_quick"),
    "scaling": ("training.step_scaling", [], ["--quick"], "scaling", "scaling_quick"),
    "loss_memory": ("memory.loss_peak", ["--threads", "1"], ["--rows", "64", "--vocab", "4096"], "loss_memory", "loss_memory"),
    "memory_guidance": ("memory.anchors_per_gpu", [], ["--quick"], "memory_guidance", "memory_guidance"),
    "decode": ("decoding.speedup_vs_generate", [], ["--quick"], "decode", "decode_quick"),
    "verify_kernels": ("decoding.verify_kernels", [], ["--quick"], "verify_kernels", "verify_kernels_quick"),
    "threads": ("decoding.thread_count", [], ["--quick"], "threads", "threads_quick"),
    "lm_head": ("decoding.lm_head_kernels", ["--threads", "2"], ["--quick"], "lm_head", "lm_head_quick"),
    "bf16": ("precision.bf16_vs_fp32", [], ["--quick"], "bf16", "bf16_quick"),
    "rollback": ("decoding.rollback_cost", [], ["--quick"], "rollback", "rollback_quick"),
    "selector": ("decoding.selector_walk", ["--threads", "1"], ["--quick", "--threads", "1"], "selector", "selector_quick"),
    "cache_digest": ("data.cache_digest", [], ["--quick"], "cache_digest", "cache_digest_quick"),
    "quickstart": ("training.quickstart_wall_time", [], ["--quick"], "quickstart", "quickstart_quick"),  # last: the longest, the most load-bound
}
# fmt: on
# the others get RESULTS patched instead
OUT_DIR_OPTION = {
    "train_step",
    "scaling",
    "quickstart",
    "decode",
    "verify_kernels",
    "threads",
    "lm_head",
    "rollback",
    "cache_digest",
}


def discover() -> dict[str, tuple[str, list[str], list[str], str | None, str | None]]:
    """The known benchmarks in their order, then any other ``benchmarks/<group>/*.py`` (run with ``--quick`` in quick
    mode when its source mentions that flag; its result files unknown, so only its exit status is checked)."""
    found = {
        f"{group}.{p.stem}": p for group in GROUPS for p in sorted((HERE / group).glob("*.py")) if p.stem[0] != "_"
    }
    table = {name: spec for name, spec in KNOWN.items() if spec[0] in found}
    known = {spec[0] for spec in table.values()}
    for module, path in found.items():
        if module not in known:
            table[module] = (module, [], ["--quick"] if "--quick" in path.read_text() else [], None, None)
    return table


BENCHMARKS = discover()


def results_dir(name: str) -> Path:
    """Where benchmark ``name`` writes by default: its group's ``results/``."""
    return HERE / BENCHMARKS[name][0].split(".")[0] / "results"


_WRAPPER = """
import sys
from pathlib import Path
import {module} as bench
bench.RESULTS = Path({out_dir!r})
bench.RESULTS.mkdir(parents=True, exist_ok=True)
code = bench.main({argv!r})
sys.exit(code if isinstance(code, int) else 0)
"""


def command_for(name: str, quick: bool, out_dir: Path) -> list[str]:
    """The subprocess command line that runs benchmark ``name`` writing into ``out_dir``."""
    module, full, quick_args, _, _ = BENCHMARKS[name]
    module = f"benchmarks.{module}"
    argv = list(quick_args if quick else full)
    if name in OUT_DIR_OPTION:
        argv += ["--out-dir", str(out_dir)]
    return [sys.executable, "-c", _WRAPPER.format(module=module, out_dir=str(out_dir), argv=argv)]


def expected_files(name: str, quick: bool, out_dir: Path) -> list[Path]:
    stem = BENCHMARKS[name][4 if quick else 3]
    return [] if stem is None else [out_dir / f"{stem}.csv", out_dir / f"{stem}.md"]


def run(names: list[str], quick: bool, out_dir: Path | None, log=print) -> list[dict]:
    """Run ``names`` one after another, each into ``out_dir`` (or, when None, its group's ``results/``); the summary
    goes to ``out_dir`` (or ``benchmarks/``)."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("WANDB_MODE", "disabled")
    records = []
    for name in names:
        target = out_dir or results_dir(name)
        target.mkdir(parents=True, exist_ok=True)
        log(f"==> {name} ({'quick' if quick else 'full'}) -> {target}")
        load_start, start = os.getloadavg()[0], time.perf_counter()
        done = subprocess.run(command_for(name, quick, target), cwd=ROOT, env=env)
        seconds = time.perf_counter() - start
        missing = [p.name for p in expected_files(name, quick, target) if not p.exists()]
        status = "ok" if done.returncode == 0 and not missing else f"failed (exit {done.returncode})"
        if missing:
            status += f", missing {', '.join(missing)}"
        records.append(
            {
                "name": name,
                "status": status,
                "seconds": round(seconds, 1),
                "finished": time.strftime("%Y-%m-%d %H:%M"),
                "load": f"{load_start:.2f} → {os.getloadavg()[0]:.2f}",
            }  # fmt: skip
        )
        log(f"<== {name}: {status} in {seconds:.0f} s")
    write_summary(records, quick, out_dir)
    return records


def write_summary(records: list[dict], quick: bool, out_dir: Path | None) -> None:
    """``summary[_quick].md`` (+ ``.json``): this run's records merged over those of earlier runs into ``out_dir``
    (``benchmarks/`` when None; the results column then names files under each group's ``results/``)."""
    summary_dir = out_dir or HERE
    summary_dir.mkdir(parents=True, exist_ok=True)
    from dspark_lightning.machine import machine_description

    stem = "summary_quick" if quick else "summary"
    merged: dict[str, dict] = {}
    try:
        merged = json.loads((summary_dir / f"{stem}.json").read_text())
    except (OSError, ValueError):
        pass
    machine = machine_description()
    merged |= {r["name"]: {**r, "machine": machine} for r in records}  # each record names the machine it ran on
    (summary_dir / f"{stem}.json").write_text(json.dumps(merged, indent=1, ensure_ascii=False) + "\n")
    lines = [
        f"# Benchmark runs{' (quick smoke mode)' if quick else ''}",
        "",
        f"`python -m benchmarks.run_all{' --quick' if quick else ''}` (`--only NAME` reruns one benchmark; its row "
        f"here is replaced, the others are kept) on {machine['cpu']} (flags: {machine.get('flags', 'not recorded')}; {machine['cores']} cores visible), torch "
        f"{machine['torch']}. Load = the 1-minute load average before → after each benchmark (a shared machine).",
        "",
        "| benchmark | status | wall time | finished | load | results |",
        "|---|---|---:|---|---|---|",
    ]
    for name in BENCHMARKS:
        found = [p for p in expected_files(name, quick, out_dir or results_dir(name)) if p.exists()]
        files = ", ".join(f"`{p.relative_to(summary_dir).as_posix()}`" for p in found)
        r = merged.get(name)
        if r is None:
            lines.append(f"| {name} | not run by `run_all` | — | — | — | {files} |")
        else:
            lines.append(f"| {name} | {r['status']} | {r['seconds']:.0f} s | {r['finished']} | {r['load']} | {files} |")
    (summary_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's smoke mode, into a temporary directory")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run only these benchmarks")
    parser.add_argument("--skip", nargs="+", choices=list(BENCHMARKS), default=[], help="do not run these")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="default: each group's results/ (full), a temp dir (quick)"
    )
    args = parser.parse_args(argv)
    names = [n for n in (args.only or list(BENCHMARKS)) if n not in args.skip]
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="dspark_bench_quick_")) if args.quick else None)
    records = run(names, args.quick, out_dir)
    failed = [r["name"] for r in records if r["status"] != "ok"]
    where = out_dir or "benchmarks/{training,memory,decoding}/results (summary: benchmarks/summary.md)"
    print(f"results in {where}" + (f"; FAILED: {', '.join(failed)}" if failed else "; all ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
