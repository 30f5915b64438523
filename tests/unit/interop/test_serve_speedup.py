"""``serve-speedup`` without vLLM: a stand-in interpreter plays the engine (scripted seconds; its outputs are the
verifier's own greedy continuations, computed with transformers), so the ratio, its interval, the batch rows, the
output comparisons and the raw file are checked against an independent computation."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from helpers.export import make_drafter, make_target_dir

from dspark_lightning.errors import OptionError
from dspark_lightning.interop import export_drafter
from dspark_lightning.interop.serve_speedup import serve_speedup_command
from dspark_lightning.models import FrozenTarget

SECONDS = {"target": [2.0, 2.5, 2.0, 3.0], "drafter": [1.0, 2.0, 1.5, 1.0]}
BATCH_SECONDS = {"target": [3.0, 4.0], "drafter": [2.0, 2.5]}  # two batches of two prompts

STAND_IN = """#!{python}
import json, sys
import torch
from transformers import AutoModelForCausalLM
job = json.load(open(sys.argv[2]))
assert job["task"] == "time" and job["method"] == "dflash" and job["batch_sizes"] == [2], job
name = "drafter" if job["speculative"] else "target"
model = AutoModelForCausalLM.from_pretrained(job["target"])
outputs = []
for ids in job["prompts"]:
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=job["max_new_tokens"], eos_token_id=[],
                         pad_token_id=0)
    outputs.append(out[0, len(ids):].tolist())
if name == "drafter" and {flip}:
    outputs[1] = outputs[1][:-1] + [outputs[1][-1] + 1]
json.dump({{"seconds": {seconds}[name], "outputs": outputs, "counters": {{"num_drafts": 10, "num_accepted_tokens": 7}},
           "batches": {{"2": {{"seconds": {batch}[name], "outputs": outputs}}}}, "load_average": [0.1, 0.1, 0.1]}},
          open(job["result"], "w"))
"""


def setup(tmp_path, flip=False):
    verifier = make_target_dir(tmp_path / "verifier")  # the demo tokenizer's 2048 ids: the prompts tokenize
    target = FrozenTarget.from_pretrained(str(verifier), num_draft_layers=2)
    drafter = make_drafter(target, "none", markov_head=None, confidence_head=False, sample_from_anchor=False)
    export = export_drafter(drafter, tmp_path / "export", verifier_name_or_path=str(verifier), dtype="float32",
                            format="dflash")  # fmt: skip
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable, seconds=SECONDS, batch=BATCH_SECONDS, flip=flip))
    python.chmod(0o755)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}?"}) + "\n" for i in range(4)))
    return verifier, export, python, prompts


def test_the_ratio_its_interval_and_the_comparisons_against_the_engine(tmp_path, capsys):
    verifier, export, python, prompts = setup(tmp_path)
    out = tmp_path / "raw.json"
    result = serve_speedup_command(str(export), str(verifier), eval_set=str(prompts), num_prompts=4, max_new_tokens=6,
                                   batch_sizes=[2], vllm_python=str(python), json=str(out))  # fmt: skip
    expected = sum(SECONDS["target"]) / sum(SECONDS["drafter"])
    row = result["batch_1"]
    assert row["speedup"] == pytest.approx(expected) and row["units"] == 4
    assert row["speedup_ci"][0] <= expected <= row["speedup_ci"][1] and row["speedup_ci"][0] < row["speedup_ci"][1]
    assert row["speculative_seconds_per_output_token"] == pytest.approx(sum(SECONDS["drafter"]) / 24)
    assert result["batches"][2]["speedup"] == pytest.approx(7.0 / 4.5)
    assert result["outputs_equal"] is True and result["vllm_tau"] == pytest.approx(1.7)
    # this project's loop on the same export: timed against generate, whose outputs equal the engine's
    assert result["ours"]["outputs_equal_to_generate"] is True and result["ours"]["prompts_equal_to_vllm"] == 4
    assert result["ours"]["speedup"] == pytest.approx(
        np.sum(result["ours"]["baseline_seconds"]) / np.sum(result["ours"]["speculative_seconds"])
    )
    raw = json.loads(out.read_text())
    assert raw["machine"]["cpu"] and raw["vllm"]["target"]["seconds"] == SECONDS["target"]
    assert "batch size 1" in capsys.readouterr().out


def test_different_outputs_are_reported_and_a_dspark_export_is_refused_on_cpu(tmp_path):
    verifier, export, python, prompts = setup(tmp_path, flip=True)
    result = serve_speedup_command(str(export), str(verifier), eval_set=str(prompts), num_prompts=4, max_new_tokens=6,
                                   batch_sizes=[2], vllm_python=str(python), ours=False)  # fmt: skip
    assert result["outputs_equal"] is False and "ours" not in result
    target = FrozenTarget.from_pretrained(str(verifier), num_draft_layers=2)
    dspark = export_drafter(make_drafter(target, "vanilla"), tmp_path / "dspark", verifier_name_or_path=str(verifier))
    with pytest.raises(OptionError, match="the dspark method needs a GPU in vLLM; export with --format dflash"):
        serve_speedup_command(str(dspark), str(verifier), eval_set=str(prompts), vllm_python=str(python))
    with pytest.raises(OptionError, match="--batch_sizes each >= 2"):
        serve_speedup_command(
            str(export), str(verifier), eval_set=str(prompts), batch_sizes=[1], vllm_python=str(python)
        )
