"""Run every benchmark and regenerate ``benchmarks/results`` (what ``make bench`` calls).

    python -m benchmarks.run_all                 # full run (10-25 minutes on 2 shared cores, see benchmarks/README.md)
    python -m benchmarks.run_all --quick         # smoke run of every benchmark into a temporary directory
    python -m benchmarks.run_all --only train_step scaling [--out-dir DIR]

Design choices:
- Each benchmark runs in its own subprocess (``python -c`` calling the module's ``main``), one after another: a crash
  or an out-of-memory kill in one does not stop the others, memory is returned between them, and they never compete
  for the cores. The run exits non-zero if any of them failed, after running the rest.
- ``bench_selector`` and ``bench_loss_memory`` have no output-directory option; the subprocess sets their module-level
  ``RESULTS`` before calling ``main``, and ``PYTHONPATH`` points at the repository so their own worker subprocesses
  still import ``benchmarks.*`` from any working directory.
- ``--quick`` runs each benchmark's smoke mode (``--quick``, or tiny sizes for ``bench_loss_memory``) into a fresh
  temporary directory unless ``--out-dir`` is given, so that a smoke run never overwrites the committed results.
- Every ``benchmarks/bench_*.py`` is run: the ones listed in ``KNOWN`` with their arguments and result files, any
  other one with no arguments (``--quick`` in quick mode if it has that flag) and only its exit status checked.
- ``summary.md`` (in the output directory) lists each benchmark's status, wall time, finishing time and the load
  average before and after it (the machine is shared); ``--only`` replaces only the rows of what it reran
  (``summary.json`` keeps the records).
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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"

# name -> (full-run arguments, quick-run arguments, stem of the result files, quick stem); module benchmarks.bench_NAME
# fmt: off
KNOWN: dict[str, tuple[list[str], list[str], str | None, str | None]] = {
    "train_step": ([], ["--quick"], "train_step", "train_step_quick"),
    "training_step": ([], ["--quick"], "training_step", "training_step_quick"),
    "gemma_step": ([], ["--quick"], "gemma_step", "gemma_step_quick"),
    "loss_memory": (["--threads", "1"], ["--rows", "64", "--vocab", "4096"], "loss_memory", "loss_memory"),
    "selector": (["--threads", "1"], ["--quick", "--threads", "1"], "selector", "selector_quick"),
    "scaling": ([], ["--quick"], "scaling", "scaling_quick"),
    "memory_guidance": ([], ["--quick"], "memory_guidance", "memory_guidance"),
    "decode": ([], ["--quick"], "decode", "decode_quick"),
    "verify_kernels": ([], ["--quick"], "verify_kernels", "verify_kernels_quick"),
    "threads": ([], ["--quick"], "threads", "threads_quick"),
    "lm_head": (["--threads", "2"], ["--quick"], "lm_head", "lm_head_quick"),
    "bf16": ([], ["--quick"], "bf16", "bf16_quick"),
    "quickstart": ([], ["--quick"], "quickstart", "quickstart_quick"),  # last: the longest, and the most load-bound
}
# fmt: on
# the others get RESULTS patched instead
OUT_DIR_OPTION = {
    "train_step",
    "training_step",
    "gemma_step",
    "scaling",
    "quickstart",
    "decode",
    "verify_kernels",
    "threads",
    "lm_head",
}


def discover() -> dict[str, tuple[list[str], list[str], str | None, str | None]]:
    """The known benchmarks in their order, then any other ``benchmarks/bench_*.py`` (run with ``--quick`` in quick
    mode when its source mentions that flag; its result files unknown, so only its exit status is checked)."""
    found = {p.stem.removeprefix("bench_"): p for p in sorted(Path(__file__).parent.glob("bench_*.py"))}
    table = {name: spec for name, spec in KNOWN.items() if name in found}
    for name, path in found.items():
        if name not in table:
            table[name] = ([], ["--quick"] if "--quick" in path.read_text() else [], None, None)
    return table


BENCHMARKS = discover()

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
    full, quick_args, _, _ = BENCHMARKS[name]
    module = f"benchmarks.bench_{name}"
    argv = list(quick_args if quick else full)
    if name in OUT_DIR_OPTION:
        argv += ["--out-dir", str(out_dir)]
    return [sys.executable, "-c", _WRAPPER.format(module=module, out_dir=str(out_dir), argv=argv)]


def expected_files(name: str, quick: bool, out_dir: Path) -> list[Path]:
    stem = BENCHMARKS[name][3 if quick else 2]
    return [] if stem is None else [out_dir / f"{stem}.csv", out_dir / f"{stem}.md"]


def run(names: list[str], quick: bool, out_dir: Path, log=print) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("WANDB_MODE", "disabled")
    records = []
    for name in names:
        log(f"==> {name} ({'quick' if quick else 'full'}) -> {out_dir}")
        load_start, start = os.getloadavg()[0], time.perf_counter()
        done = subprocess.run(command_for(name, quick, out_dir), cwd=ROOT, env=env)
        seconds = time.perf_counter() - start
        missing = [p.name for p in expected_files(name, quick, out_dir) if not p.exists()]
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


def write_summary(records: list[dict], quick: bool, out_dir: Path) -> None:
    """``summary[_quick].md`` (+ ``.json``): this run's records merged over those of earlier runs into ``out_dir``."""
    from dspark_lightning.machine import machine_description

    stem = "summary_quick" if quick else "summary"
    merged: dict[str, dict] = {}
    try:
        merged = json.loads((out_dir / f"{stem}.json").read_text())
    except (OSError, ValueError):
        pass
    machine = machine_description()
    merged |= {r["name"]: {**r, "machine": machine} for r in records}  # each record names the machine it ran on
    (out_dir / f"{stem}.json").write_text(json.dumps(merged, indent=1, ensure_ascii=False) + "\n")
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
        files = ", ".join(f"`{p.name}`" for p in expected_files(name, quick, out_dir) if p.exists())
        r = merged.get(name)
        if r is None:
            lines.append(f"| {name} | not run by `run_all` | — | — | — | {files} |")
        else:
            lines.append(f"| {name} | {r['status']} | {r['seconds']:.0f} s | {r['finished']} | {r['load']} | {files} |")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's smoke mode, into a temporary directory")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run only these benchmarks")
    parser.add_argument("--skip", nargs="+", choices=list(BENCHMARKS), default=[], help="do not run these")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="default: benchmarks/results (full), a temp dir (quick)"
    )
    args = parser.parse_args(argv)
    names = [n for n in (args.only or list(BENCHMARKS)) if n not in args.skip]
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="dspark_bench_quick_")) if args.quick else RESULTS)
    records = run(names, args.quick, out_dir)
    failed = [r["name"] for r in records if r["status"] != "ok"]
    print(f"results in {out_dir}" + (f"; FAILED: {', '.join(failed)}" if failed else "; all ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
