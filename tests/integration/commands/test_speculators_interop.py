"""Optional: the ``speculators`` library itself loads our export and computes the same logits.

Skipped unless ``speculators`` is importable here or ``DSPARK_SPECULATORS_PYTHON`` names an interpreter that has
it (it is never a dependency of this project; it pins other transformers versions). A throw-away setup:

    python3 -m venv /tmp/specvenv
    /tmp/specvenv/bin/pip install -c constraints-cpu.txt speculators
    /tmp/specvenv/bin/pip uninstall -y torchvision torchaudio     # their CPU wheels break transformers' imports
    DSPARK_SPECULATORS_PYTHON=/tmp/specvenv/bin/python pytest tests/integration/commands/test_speculators_interop.py

Each export is loaded with ``DSparkDraftModel.from_pretrained`` (embedding and LM head re-loaded from the recorded
verifier) and run on one block after a prefix: base logits, Markov bias for given previous tokens, confidence
logits. DFlash-2 form gates must be *refused* by speculators (its gated head has another shape), never loaded wrong.
A Gemma 3 verifier: speculators re-loads its tied head and keeps our rotary base, but embeds without Gemma's
sqrt(hidden) scale, so our export refuses a Gemma drafter; the format reads a plain lookup, as our loader does.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch
from helpers.export import draft_vocab, make_drafter, save_gemma_verifier, save_verifier
from helpers.targets import GEMMA3_MASK_ID
from safetensors.torch import load_file

from dspark_lightning.interop import export_drafter, load_exported
from dspark_lightning.interop.speculators_parity import block_inputs, our_outputs, run_speculators
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
    results = run_speculators(PYTHON, tmp_path, jobs)

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
        PYTHON,
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
