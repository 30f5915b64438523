"""``decode --dtype bfloat16``: the target and its baseline generate run in bf16, and --json names the machine."""

from __future__ import annotations

import json

import pytest
from helpers.hostile import fit_args

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import OptionError
from dspark_lightning.machine import FLAGS
from dspark_lightning.measuring.results import MeasuredRow, from_json


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bf16")
    cli_main(["fit", *fit_args(run_dir, steps=2)])
    return run_dir / "run" / "version_0" / "checkpoints" / "last.ckpt"


def test_bf16_decode_is_measured_against_bf16_generate_and_names_the_machine(checkpoint, tmp_path):
    out = tmp_path / "rows.json"
    rows = cli_main(
        ["decode", f"--ckpt_path={checkpoint}", "--modes=[parallel,markov]", "--num_prompts=2",
         "--max_new_tokens=16", "--dtype=bfloat16", f"--json={out}"]
    )  # fmt: skip
    written = [from_json(MeasuredRow, row, str(out)) for row in json.loads(out.read_text())]
    assert len(written) == len(rows) == 2
    for row in written:
        assert row.dtype == "bfloat16"  # the target decoded (and generate ran) in bf16: measure_speedup read it
        assert row.temperature == 0.0  # greedy, said in the file
        assert set(FLAGS) <= set(row.machine) and row.machine["torch"] and row.machine["cpu"]
        # greedy speculation equals bf16 generate, or differs from it by a counted float tie
        compared = row.comparison
        assert compared.outputs_equal and compared.mismatches == [] and isinstance(compared.ties, list)
        assert all(d["kind"] == "tie" for d in compared.differences)


def test_a_sampled_decode_names_its_temperature_in_the_json(checkpoint, tmp_path):
    out = tmp_path / "rows.json"
    cli_main(
        ["decode", f"--ckpt_path={checkpoint}", "--modes=[markov]", "--num_prompts=2", "--max_new_tokens=8",
         "--temperature=0.7", "--baseline=false", "--dtype=bfloat16", f"--json={out}"]
    )  # fmt: skip
    (row,) = [from_json(MeasuredRow, row, str(out)) for row in json.loads(out.read_text())]
    assert row.temperature == 0.7 and row.tau >= 1.0  # every emitted block holds at least one token
    assert row.comparison is None  # sampled: nothing to compare with greedy generate


def test_bf16_with_packed_verify_is_refused_naming_both_options(checkpoint):
    with pytest.raises(OptionError, match=r"--packed_verify .*--dtype bfloat16"):
        cli_main(["decode", f"--ckpt_path={checkpoint}", "--dtype=bfloat16", "--packed_verify=true"])


def test_report_recipe_refuses_bf16_on_packed_kernels_before_any_training(tmp_path):
    with pytest.raises(OptionError, match=r"--packed_verify .*--dtype bfloat16"):
        cli_main(["report-recipe", "--recipe=smollm2", f"--output={tmp_path}", "--dtype=bfloat16",
                  "--packed_verify=true"])  # fmt: skip
    assert not any(tmp_path.iterdir())
