"""``serve-check`` without vLLM: per-slot counts against a hand count, both tau conventions, the comparison, the
one-line refusals, and the orchestration against a stand-in vLLM interpreter (the DSpark method on CPU: serving
skipped in one line, the load check still run and failing the command when a tensor differs)."""

from __future__ import annotations

import json
import sys

import pytest
from helpers.export import make_drafter, save_verifier, with_demo_tokenizer

from dspark_lightning.errors import OptionError
from dspark_lightning.interop import export_drafter
from dspark_lightning.interop.serve_check import (
    ServeCheckFailed,
    compare,
    counts_line,
    serve_check_command,
    slot_counts,
)
from dspark_lightning.models import FrozenTarget


def test_slot_counts_and_both_tau_conventions():
    # three verify steps of 3 drafts each: 2, 0 and 3 accepted
    drafted, accepted = slot_counts([2, 0, 3], [3, 3, 3], 3)
    assert drafted == [3, 3, 3] and accepted == [2, 2, 1]
    line = counts_line("x", 3, drafted, accepted)
    assert "accepted     5" in line and "tau (accepted+1) 2.667" in line and "EAL (no bonus) 1.667" in line


def test_compare_needs_equal_outputs_and_equal_counts(capsys):
    served = {"outputs": [[1, 2], [3]], "counters": {"num_drafts": 3, "num_draft_tokens": 9}}
    served["counters"]["num_accepted_tokens_per_pos"] = [2, 2, 1]
    ours = {"outputs": [[1, 2], [3]], "accepted": [2, 0, 3], "verified": [3, 3, 3]}
    assert compare(served, ours, 3)["equal"]
    assert "outputs: equal on 2/2 prompts" in capsys.readouterr().out
    assert not compare(served, ours | {"accepted": [2, 0, 2]}, 3)["counts_equal"]
    assert not compare(served | {"outputs": [[1, 2], [4]]}, ours, 3)["outputs_equal"]
    assert "outputs: DIFFERENT on 1/2 prompts" in capsys.readouterr().out


def test_a_missing_vllm_interpreter_is_one_line_naming_the_option(monkeypatch, tmp_path):
    monkeypatch.delenv("DSPARK_VLLM_PYTHON", raising=False)
    with pytest.raises(OptionError, match="^--vllm_python: .*DSPARK_VLLM_PYTHON"):
        serve_check_command(str(tmp_path), "x")
    with pytest.raises(OptionError, match="no such interpreter"):
        serve_check_command(str(tmp_path), "x", vllm_python=str(tmp_path / "python"))


STAND_IN = """#!{python}
import json, sys
job = json.load(open(sys.argv[2]))
assert job["task"] == "load" and job["method"] == "dspark" and job["num_tokens"] == 4, job
json.dump({{"class": "Qwen3DSparkForCausalLM", "architecture": "Qwen3DSparkModel", "compared": 23, "differ": {differ},
           "unused": [], "not_from_export": [], "from_verifier": ["lm_head.weight"]}}, open(job["result"], "w"))
"""


@pytest.mark.parametrize("differ", [[], ["model.fc.weight"]])
def test_dspark_on_cpu_skips_serving_in_one_line_and_still_checks_the_load(tmp_path, capsys, differ):
    verifier = with_demo_tokenizer(save_verifier(tmp_path / "verifier"))  # tokenizes the prompts only
    target = FrozenTarget.from_pretrained(str(verifier), num_draft_layers=2)
    out = export_drafter(make_drafter(target, "vanilla"), tmp_path / "export", verifier_name_or_path=str(verifier))
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable, differ=json.dumps(differ)))
    python.chmod(0o755)
    if differ:
        with pytest.raises(ServeCheckFailed, match="the load check"):
            serve_check_command(str(out), str(verifier), vllm_python=str(python), device="cpu")
    else:
        result = serve_check_command(str(out), str(verifier), vllm_python=str(python), device="cpu")
        assert result["served"] is False and result["head"] == "vanilla"
    lines = capsys.readouterr().out.splitlines()
    assert "vanilla head; support matrix: vLLM 0.32 serves it" in lines[0]
    assert lines[1].startswith("load check: vLLM's Qwen3DSparkForCausalLM")
    assert ("all equal" in lines[1]) == (not differ)
    assert (
        lines[2] == "serving: skipped: vLLM runs the dspark method only in Model Runner V2, which needs a GPU (Triton)"
    )
