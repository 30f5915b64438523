"""Optional: the ``speculators`` library itself loads our export and computes the same logits.

Skipped unless ``speculators`` is importable here or ``DSPARK_SPECULATORS_PYTHON`` names an interpreter that has
it (it is never a dependency of this project; it pins other transformers versions). A throw-away setup:

    python3 -m venv /tmp/specvenv
    /tmp/specvenv/bin/pip install -c constraints-cpu.txt speculators
    /tmp/specvenv/bin/pip uninstall -y torchvision torchaudio     # their CPU wheels break transformers' imports
    DSPARK_SPECULATORS_PYTHON=/tmp/specvenv/bin/python pytest tests/commands/test_speculators_interop.py

Each export is loaded with ``DSparkDraftModel.from_pretrained`` (embedding and LM head re-loaded from the recorded
verifier) and run on one block after a prefix: base logits, Markov bias for given previous tokens, confidence
logits. DFlash-2 form gates must be *refused* by speculators (its gated head has another shape), never loaded wrong.
A Gemma 3 verifier: speculators re-loads its tied head and keeps our rotary base, but embeds without Gemma's
sqrt(hidden) scale, so our export refuses a Gemma drafter; the format reads a plain lookup, as our loader does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.export import draft_vocab, make_drafter, save_gemma_verifier, save_verifier
from helpers.targets import GEMMA3_MASK_ID
from safetensors.torch import load_file, save_file

from dspark_lightning.interop import export_drafter, load_exported
from dspark_lightning.models import FrozenTarget

PYTHON = os.environ.get("DSPARK_SPECULATORS_PYTHON") or (
    sys.executable if importlib.util.find_spec("speculators") else None
)
pytestmark = pytest.mark.skipif(PYTHON is None, reason="speculators is not installed (set DSPARK_SPECULATORS_PYTHON)")


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory):
    return save_verifier(tmp_path_factory.mktemp("verifier"))


@pytest.fixture(scope="module")
def target(verifier_dir) -> FrozenTarget:
    return FrozenTarget.from_pretrained(str(verifier_dir), num_draft_layers=2)


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

CASES = {
    "none": dict(head="none"),
    "vanilla": dict(head="vanilla"),
    "vanilla_draft_vocab": dict(head="vanilla", vocab=True),
    "gated_draft_vocab": dict(head="gated", vocab=True),
    "rnn": dict(head="rnn"),
    "no_confidence": dict(head="vanilla", confidence_head=False),
    "selector_layout_backbone_only": dict(head="selector", confidence_head=False, selector=True),
    "dflash2_gate_is_refused": dict(head="gated_hidden_sigmoid"),
}


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


def run_speculators(tmp_path, jobs: list[dict]) -> dict[str, str]:
    """Run SCRIPT on ``jobs`` under the speculators interpreter: job name -> "ok" or the load error."""
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    (tmp_path / "run.py").write_text(SCRIPT)
    env = os.environ | {"HF_HUB_OFFLINE": "1"}  # every verifier is local: a hub lookup is a mistake, fail at once
    run = subprocess.run(
        [PYTHON, str(tmp_path / "run.py"), str(tmp_path / "jobs.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def assert_same(theirs: dict, ours: dict, name: str) -> None:
    assert set(theirs) == set(ours), name
    for key, value in ours.items():
        torch.testing.assert_close(theirs[key], value, atol=2e-5, rtol=1e-5, msg=f"{name}: {key}")


def test_speculators_loads_our_export_with_the_same_logits(tmp_path, target, verifier_dir):
    V = 64
    inputs, anchors = block_inputs(target, tmp_path / "inputs.safetensors", V, mask_token_id=V - 1)
    jobs, expected = [], {}
    for name, case in CASES.items():
        kwargs = {"confidence_head": case["confidence_head"]} if "confidence_head" in case else {}
        drafter = make_drafter(target, case["head"], draft_vocab() if case.get("vocab") else None, **kwargs)
        out_dir = tmp_path / name
        export_drafter(
            drafter,
            out_dir,
            verifier_name_or_path=str(verifier_dir),
            dtype="float32",
            candidate_selector="selector" in case,
        )
        expected[name] = our_outputs(drafter, inputs, anchors, markov="selector" not in case)
        jobs.append(
            dict(name=name, dir=str(out_dir), verifier=str(verifier_dir), outputs=str(out_dir / "o"))
            | {"inputs": str(tmp_path / "inputs.safetensors")}
        )
    results = run_speculators(tmp_path, jobs)

    assert "mismatched_sizes" in results.pop("dflash2_gate_is_refused")  # refused, not loaded with a wrong gate
    expected.pop("dflash2_gate_is_refused")
    assert results == dict.fromkeys(expected, "ok")
    for name, ours in expected.items():
        assert_same(load_file(str(tmp_path / name / "o")), ours, name)


def test_a_gemma_drafter_exports_only_on_a_plain_lookup_because_speculators_would_not_scale_its_embeddings(tmp_path):
    verifier_dir = tmp_path / "gemma3"
    hidden = save_gemma_verifier(verifier_dir).config.hidden_size
    target = FrozenTarget.from_pretrained(str(verifier_dir), target_layer_ids=[1, 2])
    inputs, anchors = block_inputs(target, tmp_path / "inputs.safetensors", 2048, GEMMA3_MASK_ID)
    drafter = make_drafter(target, "vanilla", mask_token_id=GEMMA3_MASK_ID)  # on Gemma's scaled embedding
    with pytest.raises(ValueError, match="plain lookup"):
        export_drafter(drafter, tmp_path / "refused", verifier_name_or_path=str(verifier_dir))
    # the same weights on a plain lookup of the verifier's embedding (`block_embedding: lookup`): what the format
    # expresses, so it exports
    plain = make_drafter(target, "vanilla", mask_token_id=GEMMA3_MASK_ID, block_embedding="lookup")
    export_drafter(plain, tmp_path / "plain", verifier_name_or_path=str(verifier_dir), dtype="float32")
    job = {
        "dir": str(tmp_path / "plain"),
        "verifier": str(verifier_dir),
        "inputs": str(tmp_path / "inputs.safetensors"),
    }
    results = run_speculators(
        tmp_path,
        [
            job | {"name": "speculators", "outputs": str(tmp_path / "speculators")},
            job | {"name": "scaled", "outputs": str(tmp_path / "scaled"), "embed_scale": hidden**0.5},
        ],
    )
    assert results == {"speculators": "ok", "scaled": "ok"}
    theirs = load_file(str(tmp_path / "speculators"))
    # speculators' tied head (the embedding weight), verifier and our 1M rotary base agree with ours ...
    assert_same(theirs, our_outputs(plain, inputs, anchors), "plain lookup")
    assert_same(theirs, our_outputs(load_exported(tmp_path / "plain", target), inputs, anchors), "our loader")
    # ... and its embedding is the whole difference: scaled by sqrt(hidden) it gives the Gemma drafter's logits,
    # unscaled (what it serves) other ones, which is why the export refuses that drafter
    assert_same(load_file(str(tmp_path / "scaled")), our_outputs(drafter, inputs, anchors), "scaled by sqrt(H)")
    assert not torch.allclose(theirs["base"], our_outputs(drafter, inputs, anchors)["base"], atol=1e-3)
