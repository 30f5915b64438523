"""Smoke tests of the standing benchmarks (``benchmarks/<group>/``): their quick / tiny modes run and write result files with the right columns.

No timing is asserted (the machine is shared); the reference library (``speculators``) is not involved: the training
step benchmark runs with ``reference_venv=None`` (our side only) and must say so in its results. The before/after
comparisons that became experiments are smoke-tested in ``test_experiment_benchmarks.py``.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of the repository, not part of the installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import run_all  # noqa: E402
from benchmarks.data import cache_digest as bench_cache_digest  # noqa: E402
from benchmarks.decoding import lm_head_kernels as bench_lm_head  # noqa: E402
from benchmarks.decoding import speedup_vs_generate as bench_decode  # noqa: E402
from benchmarks.decoding import thread_count as bench_threads  # noqa: E402
from benchmarks.decoding import verify_kernels as bench_verify_kernels  # noqa: E402
from benchmarks.precision import bf16_vs_fp32 as bench_bf16  # noqa: E402
from benchmarks.training import quickstart_wall_time as bench_quickstart  # noqa: E402
from benchmarks.training import step_scaling as bench_scaling  # noqa: E402
from benchmarks.training import step_vs_speculators as bench_train_step  # noqa: E402
from dspark_lightning import huge_pages  # noqa: E402
from dspark_lightning.measuring.results import SpeedupResult, from_json  # noqa: E402


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_train_step_quick_ours_only(tmp_path):
    rows = bench_train_step.run(
        quick=True, out_dir=tmp_path, reference_venv=None, rounds=1, steps=1, log=lambda *_: None
    )
    header, records = read_csv(tmp_path / "train_step_quick.csv")
    assert header == bench_train_step.COLUMNS
    assert len(records) == len(rows) == 1
    record = records[0]
    assert float(record["ours_ms"]) > 0 and float(record["ours_forward_ms"]) > 0
    assert record["theirs_ms"] == "" and record["ratio"] == ""  # no reference: no made-up numbers
    assert int(record["ours_params"]) > 0
    markdown = (tmp_path / "train_step_quick.md").read_text()
    assert "disabled" in markdown and "| tiny |" in markdown
    kernel_gives = (
        "[never]" not in huge_pages.SYSTEM_SETTING.read_text() if huge_pages.SYSTEM_SETTING.exists() else False
    )
    # the default compares both sides under one allocator setting; ours is read back inside its worker
    assert record["huge_pages"] == f"ours {'on' if kernel_gives else 'off'}, theirs on"


def test_train_step_huge_pages_off_reaches_our_worker(tmp_path):
    bench_train_step.run(quick=True, out_dir=tmp_path, reference_venv=None, rounds=1, steps=1, log=lambda *_: None,
                         huge_pages="none")  # fmt: skip
    _, (record,) = read_csv(tmp_path / "train_step_thp_none_quick.csv")
    assert record["huge_pages"] == "ours off, theirs off"
    with pytest.raises(ValueError, match="huge_pages must be one of"):
        bench_train_step.run(quick=True, out_dir=tmp_path, reference_venv=None, huge_pages="yes")


def test_train_step_bf16_runs_under_autocast_into_its_own_files(tmp_path):
    bench_train_step.run(quick=True, out_dir=tmp_path, reference_venv=None, rounds=1, steps=1, log=lambda *_: None,
                         precision="bf16", suffix="amx")  # fmt: skip
    assert not (tmp_path / "train_step_quick.csv").exists()  # the fp32 files are never overwritten by a bf16 run
    _, (record,) = read_csv(tmp_path / "train_step_bf16_amx_quick.csv")
    assert float(record["ours_ms"]) > 0
    assert "bf16 autocast around the forward" in (tmp_path / "train_step_bf16_amx_quick.md").read_text()


def test_scaling_quick_writes_table_and_plots(tmp_path):
    rows = bench_scaling.run(quick=True, out_dir=tmp_path, repeats=1, log=lambda *_: None)
    header, records = read_csv(tmp_path / "scaling_quick.csv")
    assert header == bench_scaling.COLUMNS
    assert [r["sweep"] for r in records] == ["seq_len", "seq_len", "anchors", "anchors"] == [r["sweep"] for r in rows]
    assert all(float(r["step_ms"]) > 0 and int(r["rows"]) == int(r["anchors"]) * bench_scaling.BLOCK for r in records)
    for sweep in ("seq_len", "anchors"):
        assert (tmp_path / f"scaling_{sweep}_quick.png").stat().st_size > 0
    assert "| seq_len | 512 | 128 |" in (tmp_path / "scaling_quick.md").read_text()


def test_decode_quick_writes_speedup_and_context_sweep(tmp_path):
    report = bench_decode.run(quick=True, out_dir=tmp_path, log=lambda *_: None)
    results = [from_json(SpeedupResult, r) for r in report["speedup"]]
    assert [(r.mode, r.drafter_cache) for r in results] == [("markov", True), ("markov", False)]
    assert all(r.comparison.outputs_equal and r.comparison.speedup > 0 for r in results)  # greedy: lossless
    header, records = read_csv(tmp_path / "decode_quick.csv")
    assert header == bench_decode.COLUMNS and [int(r["context"]) for r in records] == list(bench_decode.LENGTHS[:2])
    assert all(float(r["cached_ms"]) > 0 and float(r["uncached_ms"]) > 0 for r in records)
    assert (tmp_path / "decode_quick_context.png").stat().st_size > 0
    assert "untrained drafter" in (tmp_path / "decode_quick.md").read_text()


def test_bf16_quick_puts_both_dtypes_side_by_side_and_names_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_bf16, "RESULTS", tmp_path)
    report = bench_bf16.main(["--quick"])
    saved = json.loads((tmp_path / "bf16_quick.json").read_text())
    assert saved["machine"]["cpu"] and "amx_bf16" in saved["machine"] and saved["machine"]["torch"]
    assert [r["rows"] for r in saved["verify"]] == [1, 2, 3] and saved["verify"][0]["bfloat16_ratio"] == 1.0
    assert {r["dtype"] for r in report["generate"]} == {"float32", "bfloat16"}
    assert "Machine: " in (tmp_path / "bf16_quick.md").read_text()


def test_verify_kernels_quick_times_both_kernels_per_row_count(tmp_path):
    report = bench_verify_kernels.run(quick=True, out_dir=tmp_path, log=lambda *_: None)
    rows = report["forward_costs"]
    assert [r["rows"] for r in rows] == [1, 2, 3] and rows[0]["default_over_one_row"] == 1.0
    assert all(r["default_ms"] > 0 and r["packed_ms"] > 0 for r in rows)
    assert "| 3 |" in (tmp_path / "verify_kernels_quick.md").read_text()


def test_threads_quick_times_generate_and_the_verify_forward_per_thread_count(tmp_path):
    import torch

    before = torch.get_num_threads()
    report = bench_threads.run(quick=True, out_dir=tmp_path, log=lambda *_: None)
    assert torch.get_num_threads() == before  # the caller's thread count comes back
    saved = json.loads((tmp_path / "threads_quick.json").read_text())
    assert saved == json.loads(json.dumps(report))  # the file holds the whole report
    timed = {"generate_ms_per_token", "verify_1_row_ms", "verify_9_rows_ms", "verify_9_rows_packed_ms"}
    ratios = {"verify_block_over_generate", "verify_block_packed_over_generate"}
    assert set(saved["threads"]) == {"1", "2"} and saved["repeats"] == 1
    for r in saved["threads"].values():  # medians and their ratios, each timing's samples (one repeat)
        assert set(r) == timed | ratios | {"samples"} and set(r["samples"]) == timed
        assert all(len(values) == 1 and math.isfinite(values[0]) for values in r["samples"].values())
        assert all(math.isfinite(r[key]) for key in timed | ratios)
    assert "| 2 |" in (tmp_path / "threads_quick.md").read_text()


def test_lm_head_quick_times_both_kernels_per_row_count_and_generate(tmp_path):
    import torch

    before = torch.get_num_threads()
    report = bench_lm_head.run(quick=True, out_dir=tmp_path, threads=1, log=lambda *_: None)
    assert torch.get_num_threads() == before and report["threads"] == 1
    saved = json.loads((tmp_path / "lm_head_quick.json").read_text())
    assert saved == json.loads(json.dumps(report))  # the file holds the whole report
    timed = {f"head_{rows}_rows_{kernels}_ms" for rows in bench_lm_head.ROWS for kernels in ("default", "packed")}
    timed |= {"generate_default_ms_per_token", "generate_packed_ms_per_token"}
    r = saved["results"]
    assert set(r) == timed | {"generate_packed_over_default", "samples"} and set(r["samples"]) == timed
    assert all(len(values) == saved["repeats"] == 1 and math.isfinite(values[0]) for values in r["samples"].values())
    assert all(math.isfinite(r[key]) for key in timed | {"generate_packed_over_default"})
    assert "| 9 |" in (tmp_path / "lm_head_quick.md").read_text()


def test_quickstart_results_from_a_run_directory(tmp_path):
    """The metrics parser and the writer, on a synthetic run directory (the real run is too slow for a unit test)."""
    run_dir = tmp_path / "run" / "runs" / "quickstart" / "version_0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.csv").write_text(
        "epoch,step,train/loss,val/tau,val/accept_rate\n0,9,2.0,,\n0,399,1.0,2.5,0.4\n"
    )
    found = bench_quickstart._metrics(tmp_path / "run")
    assert found == {"steps": 400, "val_tau": 2.5, "val_accept_rate": 0.4}
    common = {"mode": "full", "target_s": 300.0, "exit_code": 0, "s_per_step": 0.3, "checkpoint": True, **found}
    rows = [
        common | {"omp_num_threads": "1", "torch_threads": "1", "wall_s": 60.0, "met": "yes"},
        common | {"omp_num_threads": "unset", "torch_threads": "2", "wall_s": 500.0, "met": "no"},
    ]
    for row in rows:
        row |= {"load_start": 1.0, "load_end": 1.5, "log_tail": ""}
    machine = {"cpu": "test cpu", "cores": "2", "torch": "x", "threads": "2", "load_average": "1 1 1"}
    bench_quickstart.write_results(rows, machine, tmp_path, "quickstart")
    header, records = read_csv(tmp_path / "quickstart.csv")
    assert header == bench_quickstart.COLUMNS and [r["steps"] for r in records] == ["400", "400"]
    markdown = (tmp_path / "quickstart.md").read_text()
    assert "**met**" in markdown and "**missed**" in markdown and "8.3×" in markdown


def test_run_all_quick_selector_into_out_dir(tmp_path):
    """run_all's subprocess wrapper redirects a benchmark without an --out-dir option into the given directory."""
    assert run_all.main(["--quick", "--only", "selector", "--out-dir", str(tmp_path)]) == 0
    header, records = read_csv(tmp_path / "selector_quick.csv")
    assert {"head", "vocab", "sequential_ms", "walk_ms", "speedup"} <= set(header) and records
    assert "| selector | ok |" in (tmp_path / "summary_quick.md").read_text()


@pytest.mark.parametrize("name", list(run_all.BENCHMARKS))
def test_run_all_commands_name_their_output(name, tmp_path):
    command = run_all.command_for(name, quick=True, out_dir=tmp_path)
    assert command[:2] == [run_all.sys.executable, "-c"] and str(tmp_path) in command[2]
    assert all(p.parent == tmp_path for p in run_all.expected_files(name, True, tmp_path))


def test_rollback_quick_names_the_machine(tmp_path):
    from benchmarks.decoding import rollback_cost

    assert rollback_cost.main(["--quick", "--rounds", "1", "--out-dir", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "rollback_quick.json").read_text())
    (row,) = saved["rows"]
    assert row["size"] == "tiny" and row["step_ms"] > 0 and row["verify_plain_ms"] > 0
    assert set(saved["machine"]) >= {"cpu", "torch", "threads"}
    header, records = read_csv(tmp_path / "rollback_quick.csv")
    assert "rollback_share" in header and records[0]["torch"] == saved["machine"]["torch"]
    assert saved["machine"]["cpu"] in (tmp_path / "rollback_quick.md").read_text()


def test_cache_digest_quick_writes_its_medians_and_ratio(tmp_path):
    result = bench_cache_digest.run(4, 2, tmp_path, quick=True, log=lambda *_: None)
    saved = json.loads((tmp_path / "cache_digest_quick.json").read_text())
    assert saved["shard_bytes"] > 4 * 2**20 * 0.9 and len(saved["write_seconds"]) == len(saved["digest_seconds"]) == 2
    assert saved["digest_over_write"] == pytest.approx(
        statistics.median(saved["digest_seconds"]) / statistics.median(saved["write_seconds"])
    )
    assert result["machine"]["cpu"] and "digest / write" in (tmp_path / "cache_digest_quick.md").read_text()
