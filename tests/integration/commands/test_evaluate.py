"""After training: measured speculative decoding (`decode`) and confidence calibration (`calibrate`) on a checkpoint."""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.quickstart import quickstart_fit_args

from dspark_lightning.checks import dumps_json
from dspark_lightning.cli import cli_main
from dspark_lightning.errors import OptionError
from dspark_lightning.machine import machine_description
from dspark_lightning.measuring.eval_sets import EvalSetError
from dspark_lightning.measuring.loading import load_trained
from dspark_lightning.measuring.results import EvalSetRow, MeasuredRow, from_json, to_json


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory) -> Path:
    """A short quickstart run on the shipped on-policy data (about 20 s on 2 cores): 60 steps lift the measured markov
    tau on these prompts to about 1.3, where the untrained drafter gets exactly 1.0."""
    run_dir = tmp_path_factory.mktemp("quickstart")
    # the quickstart's callbacks measure decoding and draw charts at each validation; these tests measure it themselves
    checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"}
    only_checkpoint = [{**checkpoint, "init_args": {"save_last": True, "save_top_k": 0}}]
    cli_main(
        [
            *quickstart_fit_args(),
            "--data.limit_val_samples=24",
            "--data.seq_len=256",
            "--trainer.max_steps=60",
            "--trainer.val_check_interval=60",
            "--trainer.limit_val_batches=3",
            f"--trainer.callbacks={json.dumps(only_checkpoint)}",
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
            f"--trainer.logger.save_dir={run_dir}",
            "--trainer.logger.name=run",
        ]
    )
    return run_dir / "run" / "version_0" / "checkpoints" / "last.ckpt"


def test_decode_command_measures_real_acceptance(trained_checkpoint, tmp_path, capsys):
    out = tmp_path / "decode.json"
    rows = cli_main(
        [
            "decode",
            f"--ckpt_path={trained_checkpoint}",
            "--num_prompts=3",
            "--max_new_tokens=32",
            "--thresholds=[0.3]",
            "--cost_model=true",
            f"--json={out}",
        ]
    )
    written = [from_json(MeasuredRow, row, str(out)) for row in json.loads(out.read_text())]
    assert {row.machine["cpu"] for row in written} == {machine_description()["cpu"]}  # each row names it
    assert {row.dtype for row in written} == {"float32"}  # the dtype the target decoded in, on every row
    assert {row.temperature for row in written} == {0.0}  # and its temperature: greedy
    # the file is the returned rows, read back whole (strict JSON: NaN is null; the context filled in)
    expected = [replace(row, dtype="float32", temperature=0.0, machine=written[0].machine) for row in rows]
    assert json.loads(out.read_text()) == json.loads(dumps_json([to_json(row) for row in expected]))
    cost_rows = [r for r in rows if isinstance(r.threshold, list)]  # ["cost", t0, t1]
    assert len(cost_rows) == 3 and {r.mode for r in cost_rows} == {"parallel", "markov", "selector"}
    (schedule,) = {tuple(r.threshold) for r in cost_rows}  # one measured (t0, t1), shared by every mode's row
    assert len(schedule) == 3 and schedule[0] == "cost" and all(map(math.isfinite, schedule[1:]))
    assert all(1.0 <= r.mean_verified <= 8 for r in cost_rows)
    rows = [r for r in rows if not isinstance(r.threshold, list)]
    by_mode = {(r.mode, r.threshold): r for r in rows}
    assert set(by_mode) == {(m, t) for m in ("parallel", "markov", "selector") for t in (None, 0.3)}
    # the trained drafter gets drafts accepted by the real target (tau = tokens per target forward; untrained: 1.0)
    assert by_mode[("markov", None)].tau > 1.0
    for row in rows:
        assert 1.0 <= row.tau <= 1 + 8
        assert 1.0 <= row.mean_verified <= 8
    assert by_mode[("markov", 0.3)].mean_verified <= by_mode[("markov", None)].mean_verified
    # the baseline: the target's own generate, timed alternately; greedy outputs equal
    for row in rows:
        compared = row.comparison
        assert (
            compared.outputs_equal
            and math.isfinite(compared.speedup)
            and math.isfinite(compared.baseline_tokens_per_second)
        )
        assert set(row.phase_ms_per_step) == {"draft_backbone", "draft_head", "verify", "bookkeeping"}
        # every row says how far its wall clock can be trusted (the JSON keeps what the tables leave out)
        assert compared.spread.torch_threads >= 1 and len(compared.spread.prompt_speedups) == 3
    # the cost model's verify-length report on the whole-block rows
    for mode in ("parallel", "markov", "selector"):
        best = by_mode[(mode, None)].verify_length
        assert 1 <= best["best_n"] <= 8 and len(best["tokens_per_second"]) == len(best["expected_tokens"])
    # the plan first (3 modes x 3 schedules x 3 prompts, baseline and speculative timed), then progress over the runs
    printed = capsys.readouterr()
    plan = "decode: 3 modes x 3 schedules x 3 prompts x 32 new tokens, baseline on: 54 timed runs"
    assert plan in printed.out and printed.out.index(plan) < printed.out.index("speculative decoding, 3 prompts")
    assert "54/54" in printed.err and "ETA" in printed.err
    # the tables fit 80 columns: every (mode, schedule) row on one line, with all its cells
    lines = printed.out[printed.out.index(plan) + len(plan) :].splitlines()
    notes = [line for line in lines if line.startswith("? ")]  # a "too noisy to trust" note on a loaded machine
    assert all("too noisy to trust" in note for note in notes)  # a note is one whole line, never wrapped
    assert max(len(line) for line in lines if line not in notes) <= 80
    row_lines = [line for line in lines if re.match(r" ?(parallel|markov|selector) +(-|0\.30|cost model) +\d", line)]
    assert len(row_lines) == 9 * 3  # numbers, accepted rate per slot, ms per phase


def test_decode_check_identity_on_a_trained_checkpoint(trained_checkpoint, tmp_path):
    gap = tmp_path / "gap.md"
    rows = cli_main(
        [
            "decode",
            f"--ckpt_path={trained_checkpoint}",
            "--num_prompts=2",
            "--max_new_tokens=24",
            "--check_identity=true",
            f"--gap_table={gap}",
        ]
    )
    assert {row["mode"] for row in rows} == {"parallel", "markov", "selector"} and len(rows) == 6
    assert all(row["ok"] and row["measured_tau"] == row["teacher_forced_tau"] for row in rows)
    lines = gap.read_text().splitlines()
    measured = next(line for line in lines if line.startswith("| measured"))
    step_d = next(line for line in lines if line.startswith("| (d)"))
    assert measured.split("|")[-3] == step_d.split("|")[-3] and measured.split("|")[-2].strip() == "+0.000"


def test_calibrate_command_stores_temperatures(trained_checkpoint, tmp_path):
    output = tmp_path / "calibrated.ckpt"
    result = cli_main(["calibrate", f"--ckpt_path={trained_checkpoint}", f"--output={output}", "--max_batches=3"])
    assert result["ece_after"] <= result["ece_before"] + 1e-9
    module, _ = load_trained(str(output))
    stored = module.drafter.confidence_temperature
    assert torch.allclose(stored, torch.tensor(result["temperatures"]))
    assert not torch.allclose(stored, torch.ones_like(stored))
    assert [p.name for p in tmp_path.iterdir()] == ["calibrated.ckpt"]  # no staging file left beside it
    # an existing output (here: the training checkpoint itself) is refused before any work, unless asked
    before = trained_checkpoint.read_bytes()
    with pytest.raises(FileExistsError, match=r"--output .*last\.ckpt' exists: pass --overwrite true"):
        cli_main(["calibrate", f"--ckpt_path={trained_checkpoint}", f"--output={trained_checkpoint}"])
    assert trained_checkpoint.read_bytes() == before
    again = cli_main(
        ["calibrate", f"--ckpt_path={output}", f"--output={output}", "--max_batches=3", "--overwrite=true"]
    )
    assert again["temperatures"] == pytest.approx(result["temperatures"])  # fitted on raw logits: the same again


def test_decode_on_eval_sets_reports_tau_and_speedup_with_intervals(trained_checkpoint, tmp_path, capsys):
    out = tmp_path / "eval_sets.json"
    cli_main(
        [
            "decode",
            f"--ckpt_path={trained_checkpoint}",
            "--modes=[parallel,markov]",
            "--eval_sets=[sharegpt_heldout,humaneval]",
            "--eval_set_limit=3",
            "--max_new_tokens=16",
            f"--json={out}",
        ]
    )
    rows = [from_json(EvalSetRow, row, str(out)) for row in json.loads(out.read_text())]
    printed = capsys.readouterr()  # the same plan wording as decode's, one per set, and a progress bar each
    assert "eval set humaneval: 2 modes x 1 schedules x 3 prompts x 16 new tokens, baseline on: 12 timed runs" in (
        printed.out
    )
    assert printed.err.count("12/12") == 2
    assert [(row.summary.eval_set, row.summary.mode) for row in rows] == [
        ("sharegpt_heldout", "parallel"),
        ("sharegpt_heldout", "markov"),
        ("humaneval", "parallel"),
        ("humaneval", "markov"),
    ]
    for row in rows:
        summary, records = row.summary, row.decoded.prompt_records
        assert summary.num_prompts == len(records) == 3 - row.decoded.prompts_without_verify
        # the set's tau is total emitted / total forwards over prompts (recomputed here from the raw records)
        tau = sum(r.emitted_tokens for r in records) / sum(r.target_forwards for r in records)
        assert summary.measured_tau == pytest.approx(tau)
        low, high = summary.measured_tau_ci
        assert 1.0 <= low <= summary.measured_tau <= high
        speedup = sum(r.baseline_seconds for r in records) / sum(r.speculative_seconds for r in records)
        assert summary.speedup == pytest.approx(speedup)
        assert summary.speedup_ci[0] <= summary.speedup <= summary.speedup_ci[1]
        assert summary.outputs_equal is True  # greedy speculative decoding == the target's generate on every prompt
        # captured stdout is not a terminal (as a log file): each row prints whole on one line, name and intervals
        tau_cell = f"{summary.measured_tau:.2f} [{low:.2f}, {high:.2f}]"
        speedup_cell = "{:.2f}x [{:.2f}, {:.2f}]".format(summary.speedup, *summary.speedup_ci)
        assert any(
            line.split()[:2] == [summary.eval_set, summary.mode] and tau_cell in line and speedup_cell in line
            for line in printed.out.splitlines()
        ), printed.out


def test_decode_refuses_an_unknown_eval_set(trained_checkpoint):
    with pytest.raises(SystemExit):  # jsonargparse names the option and the allowed values
        cli_main(["decode", f"--ckpt_path={trained_checkpoint}", "--eval_sets=[mmlu]"])


def prompt_files(directory: Path) -> list[Path]:
    """A user's prompts in each supported shape: ``prompt``, ``turns`` (two user turns) and ShareGPT
    ``conversations`` (gzipped; the reply and what follows it are not part of the prompt)."""
    shapes = {
        "prompts.jsonl": [{"id": "p1", "prompt": "Name three colours."}, {"prompt": "What is a cat?"}],
        "turns.jsonl": [{"turns": ["Say a number.", "Now double it."]}, {"turns": ["Hi!", "How are you?"]}],
        "chats.jsonl.gz": [
            {"id": "c1", "conversations": [{"from": "human", "value": "Write a haiku."}, {"from": "gpt", "value": "."}]},
            {"id": "c2", "conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]},
        ],
    }  # fmt: skip
    paths = []
    for name, records in shapes.items():
        path = directory / name
        text = "".join(json.dumps(record) + "\n" for record in records)
        path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
        paths.append(path)
    return paths


def test_decode_runs_every_named_set_and_each_prompt_file_shape(trained_checkpoint, tmp_path):
    files = prompt_files(tmp_path)
    names = ["sharegpt_heldout", "humaneval", "gsm8k", "mbpp", "mt_bench", *map(str, files)]
    out = tmp_path / "sets.json"
    cli_main(["decode", f"--ckpt_path={trained_checkpoint}", "--modes=[markov]", f"--eval_sets=[{','.join(names)}]",
              "--eval_set_limit=2", "--max_new_tokens=8", f"--json={out}"])  # fmt: skip
    rows = [from_json(EvalSetRow, row) for row in json.loads(out.read_text())]
    assert [row.summary.eval_set for row in rows] == names
    for row in rows:
        records = row.decoded.prompt_records
        assert row.summary.num_prompts == len(records) == 2 - row.decoded.prompts_without_verify > 0
        assert row.summary.outputs_equal is True  # each turn's output equals the target's own greedy generate
        assert all(
            r.emitted_tokens <= 8 * (2 if row.summary.eval_set in ("mt_bench", str(files[1])) else 1) for r in records
        )
    two_turns = [row for row in rows if row.summary.eval_set in ("mt_bench", str(files[1]))]
    # both turns measured: more than one turn's 8 new tokens per question (the replies here never stop early)
    assert all(r.emitted_tokens > 8 for row in two_turns for r in row.decoded.prompt_records)


def test_decode_at_temperature_one_is_lossless_sampling_seeded(trained_checkpoint, tmp_path):
    args = ["decode", f"--ckpt_path={trained_checkpoint}", "--modes=[markov]", "--eval_sets=[gsm8k,mt_bench]",
            "--eval_set_limit=3", "--max_new_tokens=8", "--temperature=1.0"]  # fmt: skip

    def decoded(name: str) -> list[EvalSetRow]:
        cli_main([*args, f"--json={tmp_path / name}"])
        return [from_json(EvalSetRow, row) for row in json.loads((tmp_path / name).read_text())]

    def counts(rows: list[EvalSetRow]) -> list:  # what the seeded sampling decides (not the clock)
        return [[(r.emitted_tokens, r.target_forwards, r.accepted_per_slot) for r in row.decoded.prompt_records]
                for row in rows]  # fmt: skip

    first, second = decoded("a.json"), decoded("b.json")
    assert [row.decoded.temperature for row in first] == [1.0, 1.0]
    assert counts(first) == counts(second)
    for row in first:  # timed against generate sampling at T = 1: a speedup with its interval, outputs not compared
        assert row.summary.num_prompts == 3 and row.summary.outputs_equal is None
        assert row.summary.speedup > 0 and row.summary.speedup_ci[0] <= row.summary.speedup <= row.summary.speedup_ci[1]
        assert row.decoded.comparison.outputs_equal is None
    untimed = ["decode", *args[1:], "--baseline=false", f"--json={tmp_path / 'c.json'}"]
    cli_main(untimed)
    rows = [from_json(EvalSetRow, row) for row in json.loads((tmp_path / "c.json").read_text())]
    assert [row.summary.speedup for row in rows] == [None, None]


def test_a_bad_prompt_file_is_one_line_naming_the_file_and_the_record(trained_checkpoint, tmp_path):
    bad = tmp_path / "mine.jsonl"
    cases = {
        '{"prompt": "ok"}\n{"prompt": "a", "turns": ["b"]}\n': r"mine\.jsonl:2: a prompt record holds exactly one of",
        '{"prompt": "ok"}\n{"turns": []}\n': r"mine\.jsonl:2: 'turns' must be a non-empty list of strings",
        '{"prompt": "ok"}\n{"prompt": "ok"\n': r"mine\.jsonl:2: not a JSON record",
        '{"conversations": [{"from": "gpt", "value": "hi"}]}\n': r"mine\.jsonl:1: the prompt must end in a user turn",
        "": r"mine\.jsonl holds no prompts",
    }
    for text, message in cases.items():
        bad.write_text(text)
        with pytest.raises(EvalSetError, match=rf"^eval set '{re.escape(str(bad))}': .*{message}") as error:
            cli_main(["decode", f"--ckpt_path={trained_checkpoint}", f"--eval_sets=[gsm8k,{bad}]"])
        assert "\n" not in str(error.value)
    with pytest.raises(EvalSetError, match=r"eval set '.*missing\.jsonl': .*missing\.jsonl: no such file$"):
        cli_main(["decode", f"--ckpt_path={trained_checkpoint}", f"--eval_sets=[{tmp_path / 'missing.jsonl'}]"])


def test_a_checkpoint_that_does_not_match_its_hyper_parameters_is_a_clear_error(trained_checkpoint, tmp_path):
    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    dropped = next(name for name in checkpoint["state_dict"] if name.startswith("drafter."))
    del checkpoint["state_dict"][dropped]  # e.g. a drafter edited by hand, or saved by another version's layout
    edited = tmp_path / "edited.ckpt"
    torch.save(checkpoint, edited)
    with pytest.raises(
        OptionError, match=rf"edited\.ckpt does not match the drafter .*missing \['{re.escape(dropped)}'"
    ):
        cli_main(["decode", f"--ckpt_path={edited}"])


def test_decode_json_keeps_the_rows_finished_before_a_stop(trained_checkpoint, tmp_path, monkeypatch):
    from dspark_lightning.measuring import tables as decode_tables

    measured, real = [], decode_tables._untimed_row

    def stop_at_the_third_row(*args, **kwargs):
        if len(measured) == 2:
            raise KeyboardInterrupt  # Ctrl-C (or a scheduler's kill) during the third (set, mode) row
        measured.append(real(*args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(decode_tables, "_untimed_row", stop_at_the_third_row)
    out = tmp_path / "rows.json"
    args = ["decode", f"--ckpt_path={trained_checkpoint}", "--modes=[parallel,markov]", "--baseline=false"]
    with pytest.raises(KeyboardInterrupt):
        cli_main([*args, "--eval_sets=[sharegpt_heldout,humaneval]", "--eval_set_limit=2", "--max_new_tokens=8",
                  f"--json={out}"])  # fmt: skip
    rows = [from_json(EvalSetRow, row) for row in json.loads(out.read_text())]  # the first set's two rows, whole
    assert [(row.summary.eval_set, row.summary.mode) for row in rows] == [
        ("sharegpt_heldout", "parallel"),
        ("sharegpt_heldout", "markov"),
    ]
    assert [row.decoded.prompt_records for row in rows] == [m.prompt_records for m in measured]  # the measured runs
    assert not list(tmp_path.glob(".*partial"))  # no staging file left behind
