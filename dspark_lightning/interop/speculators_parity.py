"""Parity of an export with the ``speculators`` library: its ``DSparkDraftModel`` run on one block, against ours,
under another interpreter that has it: docs/guides/development.md ("Tests").
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch
from safetensors.torch import save_file

SCRIPT = r"""
import json, sys, torch
from safetensors.torch import load_file, save_file
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
torch.set_num_threads(1)
results = {}
for job in json.load(open(sys.argv[1])):
    try:
        # a local verifier is recorded by name (portable exports): speculators is given its directory in the config
        # (from_pretrained's verifier= is ignored for a speculators checkpoint), as vLLM is
        config = DSparkSpeculatorConfig.from_pretrained(job["dir"])
        config.speculators_config.verifier.name_or_path = job["verifier"]
        model = DSparkDraftModel.from_pretrained(job["dir"], config=config).float().eval()
    except Exception as error:
        results[job["name"]] = f"{type(error).__name__}: {error}"
        continue
    x = load_file(job["inputs"])
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = "sdpa"
    with torch.no_grad():
        context = model.hidden_norm(model.fc(x["context_features"]))
        h = model.embed_tokens(x["block_ids"]) * job.get("embed_scale", 1.0)  # a diagnostic scale, 1 = speculators'
        positions = torch.cat([x["context_positions"], x["block_positions"]], dim=1)
        embeddings = model.rotary_emb(h, positions)
        for layer in model.layers:
            h = layer(hidden_states=h, target_hidden=context, position_ids=positions, position_embeddings=embeddings)
        hidden = model.norm(h)
        out = {"base": model.lm_head(hidden)}
        if model.markov_head is not None:
            out["bias"] = model.markov_head.block_bias(prev_token_ids=x["prev"], hidden_states=hidden)
        if model.confidence_head is not None:
            features = hidden
            if model.config.confidence_head_with_markov:
                features = torch.cat([hidden, model.markov_head.prev_embeddings(x["prev"])], dim=-1)
            out["confidence"] = model.confidence_head(features)
    save_file({k: v.contiguous() for k, v in out.items()}, job["outputs"])
    results[job["name"]] = "ok"
print(json.dumps(results))
"""


def block_inputs(target, path, V: int, mask_token_id: int, S: int = 11, B: int = 4):
    """A prefix of S random tokens, its target features and one block per row after it; saved for the script."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V - 1, (2, S), generator=generator)
    features = target.features(ids, torch.arange(S).repeat(2, 1)).context_features
    anchors = torch.randint(0, V - 1, (2,), generator=generator)
    inputs = {
        "context_features": features,
        "context_positions": torch.arange(S).repeat(2, 1),
        "block_ids": torch.cat((anchors[:, None], torch.full((2, B - 1), mask_token_id)), dim=1),
        "block_positions": torch.arange(S, S + B).repeat(2, 1),
        "prev": torch.randint(0, V - 1, (2, B), generator=generator),
    }
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(path))
    return inputs, anchors


@torch.no_grad()
def our_outputs(drafter, inputs, anchors, markov: bool = True) -> dict[str, torch.Tensor]:
    """What the script computes, by our drafter: base logits, Markov bias, confidence logits."""
    S = inputs["context_features"].shape[1]
    base, hidden = drafter.draft(inputs["context_features"], inputs["context_positions"], anchors, torch.full((2,), S))
    ours = {"base": base}
    if drafter.markov_head is not None and markov:
        ours["bias"] = drafter.markov_head.block_bias(inputs["prev"], hidden)
    if drafter.confidence_head is not None:
        ours["confidence"] = drafter.confidence_logits(hidden, inputs["prev"])
    return ours


def run_speculators(python: str, work: Path, jobs: list[dict]) -> dict[str, str]:
    """Run ``SCRIPT`` on ``jobs`` under ``python`` (an interpreter with speculators), writing its files into
    ``work``: job name -> "ok" or the load error."""
    (work / "jobs.json").write_text(json.dumps(jobs))
    (work / "run.py").write_text(SCRIPT)
    env = os.environ | {"HF_HUB_OFFLINE": "1"}  # every verifier is local: a hub lookup is a mistake, fail at once
    run = subprocess.run(
        [python, str(work / "run.py"), str(work / "jobs.json")], capture_output=True, text=True, timeout=600, env=env
    )
    if run.returncode != 0:
        raise RuntimeError(f"the speculators script failed under {python}:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])
