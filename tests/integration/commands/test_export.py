"""Export to the speculators DSpark format and back: identical logits, config fields, tensor layout, safetensors only.

A tiny random Qwen3 target (saved with ``save_pretrained`` so it can be named as the verifier), drafters with every
head type, random weights (the heads start at zero otherwise, which would hide mistakes), with and without a draft
vocabulary, in fp32 (bit-identical logits) and bf16 (rounding only). The Lightning path (checkpoint -> CLI ->
load) runs on a tiny target that carries the demo tokenizer. A tiny Gemma 3 verifier: its drafter is refused (the
format cannot scale the embeddings), and what the format does express for it is recorded and loaded as speculators
reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from helpers.export import (
    HEADS,
    RANK,
    B,
    H,
    V,
    draft_vocab,
    make_drafter,
    make_target_dir,
    outputs,
    save_gemma_verifier,
    save_verifier,
    train_and_checkpoint,
)
from helpers.targets import GEMMA3_MASK_ID
from safetensors import safe_open

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import UnsupportedError
from dspark_lightning.interop import (
    build_config,
    export_checkpoint,
    export_drafter,
    exported_tensors,
    load_exported,
    read_checkpoint,
)
from dspark_lightning.models import FrozenTarget, MarkovHeadConfig
from dspark_lightning.models.target import embedding_scale
from dspark_lightning.selector.convert import to_candidate_selector


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory) -> Path:
    return save_verifier(tmp_path_factory.mktemp("verifier"))


@pytest.fixture(scope="module")
def target(verifier_dir) -> FrozenTarget:
    return FrozenTarget.from_pretrained(str(verifier_dir), num_draft_layers=2)


def assert_same_outputs(a, b, exact: bool) -> None:
    for key, value in a.items():
        if value is None:
            assert b[key] is None
        elif exact:
            assert torch.equal(value, b[key]), key
        else:  # bf16 weights: rounding only, relative to the size of the logits
            torch.testing.assert_close(b[key], value, atol=0.03 * value.abs().max().item() + 1e-3, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("with_vocab", [False, True], ids=["full_vocab", "draft_vocab"])
@pytest.mark.parametrize("head", [*HEADS, "selector_layout"])
def test_round_trip_gives_the_same_logits(tmp_path, target, verifier_dir, head, with_vocab, dtype):
    selector_layout = head == "selector_layout"
    drafter = make_drafter(target, "selector" if selector_layout else head, draft_vocab() if with_vocab else None)
    export_drafter(
        drafter, tmp_path, verifier_name_or_path=str(verifier_dir), dtype=dtype, candidate_selector=selector_layout
    )
    loaded = load_exported(tmp_path, target)
    assert loaded.embed_tokens is target.embed_tokens and loaded.lm_head is target.lm_head  # shared, not copied
    assert loaded.draft_lm_head is None and loaded.draft_vocab_size == drafter.draft_vocab_size
    if with_vocab:
        assert torch.equal(loaded.d2t, drafter.d2t)
    assert_same_outputs(outputs(drafter, target), outputs(loaded, target), exact=dtype == "float32")


def test_trained_draft_lm_head_dflash_convention_and_calibration_round_trip(tmp_path, target, verifier_dir):
    drafter = make_drafter(target, "gated", draft_vocab(), train_lm_head=True, sample_from_anchor=False)
    drafter.confidence_temperature.copy_(torch.tensor([1.0, 1.5, 2.0, 0.5]))
    export_drafter(drafter, tmp_path, verifier_name_or_path=str(verifier_dir), dtype="float32")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["sample_from_anchor"] is False
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == B - 1
    loaded = load_exported(tmp_path, target)
    assert loaded.draft_lm_head is not None and not loaded.config.sample_from_anchor
    assert torch.equal(loaded.confidence_temperature, drafter.confidence_temperature)
    assert_same_outputs(outputs(drafter, target), outputs(loaded, target), exact=True)


def test_config_json_has_every_field(tmp_path, target, verifier_dir):
    drafter = make_drafter(target, "vanilla", draft_vocab(40))
    export_drafter(drafter, tmp_path, verifier_name_or_path=str(verifier_dir))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == build_config(drafter, verifier_name_or_path=str(verifier_dir))
    expected = {
        "speculators_model_type": "dspark",
        "architectures": ["Qwen3DSparkModel"],  # vLLM's registry name, which update_dspark keeps
        "draft_vocab_size": 40,
        "block_size": B,
        "aux_hidden_state_layer_ids": [2, 3],  # hidden_states indices: our decoder layers 1, 2 + 1
        "mask_token_id": V - 1,
        "sample_from_anchor": True,
        "markov_rank": RANK,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "target_hidden_size": H,
        "sliding_window_non_causal": True,  # bidirectional blocks, read by vLLM's DFlash path for every layer
        "dtype": "bfloat16",
    }
    assert {key: config[key] for key in expected} == expected
    assert config["speculators_config"] == {
        "algorithm": "dspark",
        "default_proposal_method": "greedy",
        "verifier": {  # a local verifier: its name and config hash travel, its path is for reloading here
            "name_or_path": verifier_dir.name,
            "architectures": ["Qwen3ForCausalLM"],
            "config_sha256": hashlib.sha256((verifier_dir / "config.json").read_bytes()).hexdigest(),
        },
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": B, "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
    }
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "qwen3" and layer["vocab_size"] == V and layer["hidden_size"] == H
    assert (layer["num_hidden_layers"], layer["num_attention_heads"], layer["num_key_value_heads"]) == (2, 4, 2)
    assert (layer["head_dim"], layer["intermediate_size"], layer["rms_norm_eps"]) == (8, 64, 1e-6)
    assert layer["rope_parameters"] == {
        "rope_type": "default",
        "rope_theta": target.config.rope_parameters["rope_theta"],
    }
    assert "markov_gate_input" not in config and "dflash2_candidate_selector" not in config

    pure = make_drafter(target, "none", confidence_head=False)
    none_config = build_config(pure, verifier_name_or_path="Qwen/Qwen3-0.6B", dtype="float32")
    assert (none_config["markov_rank"], none_config["enable_confidence_head"]) == (0, False)
    assert none_config["speculators_config"]["verifier"]["name_or_path"] == "Qwen/Qwen3-0.6B"
    assert none_config["draft_vocab_size"] == V and none_config["dtype"] == "float32"
    gated = build_config(make_drafter(target, "gated_hidden_sigmoid"), verifier_name_or_path=str(verifier_dir))
    assert (gated["markov_gate_input"], gated["markov_gate_activation"]) == ("hidden", "sigmoid")


def test_tensor_names_shapes_and_vocab_maps(tmp_path, target, verifier_dir):
    vocab = draft_vocab(40)
    drafter = make_drafter(target, "gated", vocab)
    export_drafter(drafter, tmp_path, verifier_name_or_path=str(verifier_dir))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    layer = {
        "input_layernorm.weight": [H],
        "post_attention_layernorm.weight": [H],
        "self_attn.q_proj.weight": [32, H],
        "self_attn.k_proj.weight": [16, H],
        "self_attn.v_proj.weight": [16, H],
        "self_attn.o_proj.weight": [H, 32],
        "self_attn.q_norm.weight": [8],
        "self_attn.k_norm.weight": [8],
        "mlp.gate_proj.weight": [64, H],
        "mlp.up_proj.weight": [64, H],
        "mlp.down_proj.weight": [H, 64],
    }
    expected = {f"layers.{i}.{name}": shape for i in range(2) for name, shape in layer.items()}
    expected |= {
        "fc.weight": [H, 2 * H],
        "hidden_norm.weight": [H],
        "norm.weight": [H],
        "markov_head.markov_w1.weight": [V, RANK],
        "markov_head.markov_w2.weight": [40, RANK],
        "markov_head.gate_proj.weight": [RANK, H + RANK],
        "markov_head.gate_proj.bias": [RANK],
        "confidence_head.proj.weight": [1, H + RANK],
        "confidence_head.proj.bias": [1],
        "lm_head.weight": [40, H],
        "d2t": [40],
        "t2d": [V],
    }
    assert {key: list(t.shape) for key, t in tensors.items()} == expected
    assert all(t.dtype == torch.bfloat16 for key, t in tensors.items() if key not in ("d2t", "t2d"))
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert torch.equal(torch.arange(40) + tensors["d2t"], vocab.d2t)  # offsets, as speculators / vLLM read them
    assert torch.equal(tensors["t2d"], vocab.t2d) and int(tensors["t2d"].sum()) == 40
    assert torch.equal(tensors["lm_head.weight"], target.lm_head.weight[vocab.d2t].to(torch.bfloat16))

    full = exported_tensors(make_drafter(target, "rnn"), "float32")
    assert not {"lm_head.weight", "d2t", "t2d", "embed_tokens.weight"} & set(full)  # re-loaded from the verifier
    assert list(full["markov_head.joint_proj.weight"].shape) == [3 * RANK, 2 * RANK + H]


def test_candidate_selector_layout(tmp_path, target, verifier_dir):
    vocab = draft_vocab(40)
    drafter = make_drafter(target, "selector", vocab)
    export_drafter(
        drafter, tmp_path, verifier_name_or_path=str(verifier_dir), candidate_selector=True, selector_top_k=6
    )
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["dflash2_candidate_selector"] is True and config["markov_rank"] == 0
    assert (config["selector_rank"], config["selector_top_k"]) == (RANK, 6)
    assert (config["markov_gate_input"], config["markov_gate_activation"]) == ("hidden", "identity")
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    assert not any(key.startswith("markov_head.") for key in tensors)
    reference = to_candidate_selector(drafter.markov_head, d2t=vocab.d2t)
    for key, value in reference.items():
        assert torch.equal(tensors[key], value.to(torch.bfloat16)), key
    assert list(tensors["candidate_selector.successor_codebook"].shape) == [V, RANK]  # indexed by target id
    assert not tensors["candidate_selector.successor_codebook"][~vocab.t2d].any()
    with pytest.raises(ValueError, match="DFlash-2 form"):
        export_drafter(make_drafter(target, "gated"), tmp_path, verifier_name_or_path="x", candidate_selector=True)


def test_files_are_safetensors_never_pickles(tmp_path, target, verifier_dir):
    export_drafter(make_drafter(target, "vanilla", draft_vocab()), tmp_path, verifier_name_or_path=str(verifier_dir))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    raw = (tmp_path / "model.safetensors").read_bytes()
    assert raw[:1] != b"\x80" and raw[:2] != b"PK"  # neither a pickle nor torch.save's zip
    (header_size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_size])
    assert header["__metadata__"] == {"format": "pt"} and "fc.weight" in header


def test_load_uses_the_recorded_verifier_and_folds_foreign_conventions(tmp_path, target, verifier_dir):
    """An export written elsewhere: unsorted d2t, aux_hidden_state_scales; the verifier is loaded from its path."""
    vocab = draft_vocab(40)
    drafter = make_drafter(target, "vanilla", vocab)
    export_drafter(drafter, tmp_path, verifier_name_or_path=str(verifier_dir), dtype="float32")
    path = tmp_path / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    order = torch.randperm(40, generator=torch.Generator().manual_seed(0))
    absolute = vocab.d2t[order]
    tensors["d2t"] = absolute - torch.arange(40)
    for key in ("lm_head.weight", "markov_head.markov_w2.weight"):
        tensors[key] = tensors[key][order]
    tensors["fc.weight"] = tensors["fc.weight"] / torch.tensor([2.0, 0.5]).repeat_interleave(H)  # exact in binary
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text()) | {"aux_hidden_state_scales": [2.0, 0.5]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded, loaded_target = load_exported(tmp_path, str(verifier_dir), return_target=True)
    assert loaded_target.target_layer_ids == [1, 2] and loaded_target is not target
    assert torch.equal(loaded.d2t, vocab.d2t) and loaded.draft_lm_head is None
    assert_same_outputs(outputs(drafter, target), outputs(loaded, loaded_target), exact=True)


def test_load_rejects_what_the_drafter_cannot_run(tmp_path, target, verifier_dir):
    export_drafter(make_drafter(target, "vanilla"), tmp_path, verifier_name_or_path=str(verifier_dir))
    config = json.loads((tmp_path / "config.json").read_text())
    for change, message in (
        ({"speculators_model_type": "eagle3"}, "not 'dspark'"),
        ({"aux_hidden_state_layer_ids": [0, 2]}, "embedding output"),
        ({"transformer_layer_config": config["transformer_layer_config"] | {"attention_bias": True}}, "bias"),
    ):
        (tmp_path / "config.json").write_text(json.dumps(config | change))
        with pytest.raises((ValueError, NotImplementedError), match=message):
            load_exported(tmp_path, target)


def test_lightning_checkpoint_exports_through_the_cli(tmp_path):
    target_dir = make_target_dir(tmp_path / "target")
    ckpt, module = train_and_checkpoint(tmp_path, target_dir, markov_head=MarkovHeadConfig("gated", RANK))
    plain = torch.load(ckpt, map_location="cpu", weights_only=True)  # no pickled objects in our checkpoints
    assert MarkovHeadConfig.from_dict(plain["hyper_parameters"]["drafter"]["markov_head"]) == MarkovHeadConfig(
        "gated", RANK
    )
    out = cli_main(["export", "--ckpt_path", str(ckpt), "--output", str(tmp_path / "export"), "--dtype", "float32"])
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == target_dir.name
    assert "local_path" not in config["speculators_config"]["verifier"]
    assert config["markov_head_type"] == "gated" and config["block_size"] == B
    loaded, loaded_target = load_exported(out, str(target_dir), return_target=True)
    assert loaded_target.target_layer_ids == module.target.target_layer_ids
    module.eval()
    with torch.no_grad():
        h = torch.randn(2, B, H, generator=torch.Generator().manual_seed(0))
        prev = torch.randint(0, 2048, (2, B), generator=torch.Generator().manual_seed(1))
        assert torch.equal(module.drafter.output_logits(h), loaded.output_logits(h))
        assert torch.equal(module.drafter.markov_head.block_bias(prev, h), loaded.markov_head.block_bias(prev, h))
    for name, tensor in module.drafter.state_dict().items():
        if not name.startswith(("embed_tokens", "lm_head")):
            assert torch.equal(tensor, loaded.state_dict()[name]), name

    # older checkpoints stored the head as a class_path dict: still read
    checkpoint = read_checkpoint(ckpt)
    checkpoint["hyper_parameters"]["drafter"]["markov_head"] = {
        "class_path": "dspark_lightning.models.GatedMarkov",
        "init_args": {"rank": RANK},
    }
    torch.save(checkpoint, tmp_path / "old.ckpt")
    bf16 = export_checkpoint(tmp_path / "old.ckpt", tmp_path / "bf16", verifier_name_or_path="org/target")
    config = json.loads((bf16 / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/target" and config["dtype"] == "bfloat16"
    checkpoint["hyper_parameters"]["drafter"]["markov_head"] = {"class_path": "os.system", "init_args": {}}
    torch.save(checkpoint, tmp_path / "bad.ckpt")
    with pytest.raises(ValueError, match="class_path"):
        export_checkpoint(tmp_path / "bad.ckpt", tmp_path / "bad")


def test_an_export_is_portable_readable_by_others_and_still_loads_when_copied(tmp_path):
    """Ordinary modes (umask, not 0600/0700), the verifier named portably, and a copy elsewhere that still loads."""
    target_dir = make_target_dir(tmp_path / "target")
    ckpt, _ = train_and_checkpoint(tmp_path, target_dir)
    previous = os.umask(0o022)
    try:
        out = cli_main(["export", "--ckpt_path", str(ckpt), "--output", str(tmp_path / "export"), "--dtype", "float32"])
    finally:
        os.umask(previous)
    assert (out.stat().st_mode & 0o777) == 0o755
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        "config.json": 0o644,
        "model.safetensors": 0o644,
    }
    verifier = json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]
    digest = hashlib.sha256((target_dir / "config.json").read_bytes()).hexdigest()
    assert verifier == {
        "name_or_path": "target",  # no path of this machine in what travels
        "architectures": ["Qwen3ForCausalLM"],
        "config_sha256": digest,  # and no local_path: the file is meant to be published
    }
    copy = shutil.copytree(out, tmp_path / "elsewhere" / "drafter")
    # elsewhere the export names what it needs instead of trying the hub for "target"
    with pytest.raises(ValueError, match=r"local model 'target' \(config.json sha256 " + digest[:12]):
        load_exported(copy)
    drafter, loaded_target = load_exported(copy, str(target_dir), return_target=True)  # given the target, it loads
    assert drafter.draft_vocab_size == 2048 and loaded_target.vocab_size == 2048
    # next to the verifier's directory (its recorded name) it loads without target=, digest checked
    previous_dir = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert load_exported(copy).draft_vocab_size == 2048
        (target_dir / "config.json").write_text((target_dir / "config.json").read_text().replace("}", ', "x": 1}', 1))
        with pytest.raises(ValueError, match="another config.json than the export's verifier"):
            load_exported(copy)
    finally:
        os.chdir(previous_dir)
    # exports written before local_path was dropped still load from it
    config = json.loads((copy / "config.json").read_text())
    config["speculators_config"]["verifier"]["local_path"] = str(target_dir)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="another config.json than when it was exported"):
        load_exported(copy)


def test_a_hub_cache_snapshot_is_recorded_by_its_hub_id(tmp_path):
    from dspark_lightning.interop.speculators_format import verifier_record

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert verifier_record(str(snapshot))["name_or_path"] == "Qwen/Qwen3-0.6B"
    assert verifier_record("Qwen/Qwen3-0.6B") == {"name_or_path": "Qwen/Qwen3-0.6B"}  # a hub id as given


def test_a_gemma_drafter_exports_only_when_it_embeds_with_a_plain_lookup(tmp_path):
    """Gemma multiplies its embeddings by sqrt(hidden); the format embeds with a plain lookup: nothing is written."""
    gemma_dir = tmp_path / "gemma3"
    save_gemma_verifier(gemma_dir)
    hidden = json.loads((gemma_dir / "config.json").read_text())["hidden_size"]
    target = FrozenTarget.from_pretrained(str(gemma_dir), target_layer_ids=[1, 2])
    assert embedding_scale(target.embed_tokens) == pytest.approx(hidden**0.5, rel=1e-6)
    refusal = rf"\(Gemma3TextScaledWordEmbedding\) multiplies by {hidden**0.5:.4g} .* plain lookup"
    with pytest.raises(UnsupportedError, match=refusal):
        export_drafter(make_drafter(target, mask_token_id=GEMMA3_MASK_ID), tmp_path / "out", verifier_name_or_path="g")
    assert not (tmp_path / "out").exists()

    ckpt, _ = train_and_checkpoint(tmp_path, gemma_dir)  # the command: refused, no export and no staging left
    with pytest.raises(UnsupportedError, match=refusal + r".*block_embedding: lookup"):
        cli_main(["export", "--ckpt_path", str(ckpt), "--output", str(tmp_path / "export")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemma3", "last.ckpt"]

    # trained on a plain lookup (`model.drafter.block_embedding: lookup`): exported, and loaded back the same
    (tmp_path / "lookup").mkdir()
    ckpt, module = train_and_checkpoint(tmp_path / "lookup", gemma_dir, block_embedding="lookup")
    out = tmp_path / "lookup" / "export"
    cli_main(["export", "--ckpt_path", str(ckpt), "--output", str(out), "--dtype", "float32"])
    trained = module.drafter.eval()
    assert embedding_scale(trained.embed_tokens) is None
    assert_same_outputs(
        outputs(trained, module.target), outputs(load_exported(out, module.target), module.target), True
    )


def hidden_scale(verifier: dict) -> float:
    """Gemma's embedding factor as its modelling code applies it: sqrt(hidden_size), rounded to fp32."""
    return float(torch.tensor(verifier["hidden_size"] ** 0.5, dtype=torch.float32))


def test_a_gemma_verifier_is_recorded_and_loaded_as_speculators_reads_it(tmp_path):
    """The same drafter on a plain lookup of the verifier's embedding (what speculators trains and serves): the
    recorded fields against the verifier's own config.json, and our loader's logits equal to that drafter's."""
    gemma_dir = tmp_path / "gemma3"
    save_gemma_verifier(gemma_dir)
    verifier = json.loads((gemma_dir / "config.json").read_text())
    target = FrozenTarget.from_pretrained(str(gemma_dir), target_layer_ids=[1, 2])
    drafter = make_drafter(target, "vanilla", mask_token_id=GEMMA3_MASK_ID, block_embedding="lookup")
    assert drafter.embed_tokens.weight is target.embed_tokens.weight and embedding_scale(drafter.embed_tokens) is None
    scaled = make_drafter(target, "vanilla", mask_token_id=GEMMA3_MASK_ID)  # the default embeds as the target does
    ids = torch.tensor([3, GEMMA3_MASK_ID])
    torch.testing.assert_close(scaled.embed_tokens(ids), drafter.embed_tokens(ids) * hidden_scale(verifier))
    out = export_drafter(drafter, tmp_path / "export", verifier_name_or_path=str(gemma_dir), dtype="float32")
    config = json.loads((out / "config.json").read_text())
    layer = config["transformer_layer_config"]
    full_theta = verifier["rope_parameters"]["full_attention"]["rope_theta"]  # 1M; the sliding layers' is 10k
    assert layer["rope_parameters"] == {"rope_type": "default", "rope_theta": full_theta}
    assert (layer["hidden_size"], layer["vocab_size"]) == (verifier["hidden_size"], verifier["vocab_size"])
    assert config["speculators_config"]["verifier"]["architectures"] == verifier["architectures"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:  # a tied verifier: its head is re-loaded from it
        assert verifier["tie_word_embeddings"] and not {"lm_head.weight", "embed_tokens.weight"} & set(f.keys())

    loaded = load_exported(out, target)
    assert loaded.embed_tokens.weight is target.embed_tokens.weight and loaded.lm_head is target.lm_head
    assert embedding_scale(loaded.embed_tokens) is None and loaded.backbone.config.rope_theta == full_theta
    assert_same_outputs(outputs(drafter, target), outputs(loaded, target), exact=True)

    # an export whose rope_parameters are per layer type: speculators gives every draft layer the sliding base
    layer["rope_parameters"] = verifier["rope_parameters"]
    (out / "config.json").write_text(json.dumps(config))
    sliding_theta = verifier["rope_parameters"]["sliding_attention"]["rope_theta"]
    assert load_exported(out, target).backbone.config.rope_theta == sliding_theta
