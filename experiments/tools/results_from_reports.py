"""Machine-readable copies of figures that exist only in generated markdown, parsed from the committed reports.

    python experiments/tools/results_from_reports.py           # (re)write every file below from its markdown
    python experiments/tools/results_from_reports.py --check   # exit 1, naming it, if a committed file differs

Some README figures were only ever written as markdown by the code that measured them: the train/serve gap
tables (``decode --check_identity true --gap_table FILE``, rendered by ``measuring/gap.py: gap_markdown``) and the
extrapolated tables of ``benchmarks/memory/anchors_per_gpu.py``. This script parses those committed files and
writes, next to each, the raw file ``tests/repo/test_doc_numbers.py`` checks the pages against:

- ``experiments/demo_heads/gap.json``, ``experiments/smollm2_heads/400steps/gap.json`` from the ``gap.md`` beside them, in the shape of
  ``gap_decomposition``'s result (``mode``, ``stride``, ``prompts``, ``max_new_tokens``, ``tau``, ``blocks``,
  ``harmonic_c``) plus ``delta`` as printed (a delta was computed from unrounded taus, so it is not always the
  difference of the printed ones);
- ``benchmarks/memory/results/memory_guidance_anchors.csv`` (target, gpu_gib, mode, seq_len, max_anchors) and
  ``memory_guidance_compute.csv`` (target, seq_len, target_tflop, drafter_tflop, cache_share_percent) from
  ``memory_guidance.md``.

Nothing is re-measured: every value is the one printed in the markdown, with the precision printed there. After a
new gap table or ``python -m benchmarks.memory.anchors_per_gpu``, run this script again (the test fails until then).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GAP_REPORTS = ("experiments/demo_heads", "experiments/smollm2_heads/400steps")
MEMORY_GUIDANCE = "benchmarks/memory/results/memory_guidance.md"


def table_rows(lines: list[str], header_start: str) -> list[list[str]]:
    """The body cells of the first markdown table whose header line starts with ``header_start``."""
    start = next((i for i, line in enumerate(lines) if line.startswith(header_start)), None)
    if start is None:
        raise ValueError(f"no table starting with {header_start!r}")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def gap_from_markdown(text: str) -> dict:
    """``gap_decomposition``'s result as printed in a ``gap_markdown`` table (values rounded as printed)."""
    lines = text.splitlines()
    intro = re.search(r"over the first (\d+) reply tokens of (\d+) eval prompts, `(\w+)` mode, stride (\d+)\.", text)
    harmonic = re.search(r"Harmonic mean of \(1 \+ accepted\) over the blocks of \(c\): ([\d.]+)", text)
    if intro is None or harmonic is None:
        raise ValueError("not a gap_markdown table (no intro line or harmonic mean)")
    tau, delta, blocks = {}, {}, {}
    for cells in table_rows(lines, "| step | text | previous tokens |"):
        step = cells[0].strip("()")
        blocks[step], tau[step] = int(cells[4]), float(cells[5])
        delta[step] = float(cells[6]) if cells[6] else None
    return dict(
        source="gap.md",
        mode=intro[3],
        stride=int(intro[4]),
        prompts=int(intro[2]),
        max_new_tokens=int(intro[1]),
        tau=tau,
        delta=delta,
        blocks=blocks,
        harmonic_c=float(harmonic[1]),
    )


def memory_guidance_from_markdown(text: str) -> dict[str, list[dict]]:
    """The anchors-that-fit and compute tables of ``memory_guidance.md`` as CSV rows."""
    lines = text.splitlines()
    anchors_header = next(line for line in lines if line.startswith("| target | GPU GiB | mode |"))
    seq_lens = [int(s) for s in re.findall(r"S = (\d+)", anchors_header)]
    anchors = [
        dict(target=c[0], gpu_gib=int(c[1]), mode=c[2], seq_len=s, max_anchors=int(v))
        for c in table_rows(lines, "| target | GPU GiB | mode |")
        for s, v in zip(seq_lens, c[3:], strict=True)
    ]
    compute = [
        dict(
            target=c[0],
            seq_len=int(c[1]),
            target_tflop=float(c[2]),
            drafter_tflop=float(c[3]),
            cache_share_percent=int(c[4].rstrip("%")),
        )
        for c in table_rows(lines, "| target | S | target forward |")
    ]
    return {"memory_guidance_anchors.csv": anchors, "memory_guidance_compute.csv": compute}


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def derived_files(root: Path = ROOT) -> dict[Path, str]:
    """Every file this script writes, with its content, from the committed markdown under ``root``."""
    files = {}
    for report in GAP_REPORTS:
        gap = gap_from_markdown((root / report / "gap.md").read_text())
        files[root / report / "gap.json"] = json.dumps(gap, indent=1) + "\n"
    guidance = root / MEMORY_GUIDANCE
    for name, rows in memory_guidance_from_markdown(guidance.read_text()).items():
        files[guidance.parent / name] = csv_text(rows)
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for path, content in derived_files().items():
        if args.check:
            if not path.exists() or path.read_text() != content:
                stale.append(path.relative_to(ROOT))
        else:
            path.write_text(content)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(
            "out of date with their markdown (run python experiments/tools/results_from_reports.py):",
            *stale,
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
