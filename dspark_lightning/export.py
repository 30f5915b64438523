"""Export a drafter to the DSpark checkpoint format of ``speculators`` (served by vLLM), and load such a directory back.

The format (vllm-project/speculators, ``speculators.models.dspark`` / ``dflash`` / ``model.DraftVocabMixin``;
vLLM ``transformers_utils/configs/speculators/algos.py`` and ``models/qwen3_dflash.py``) is a directory with

``config.json``
    ``speculators_model_type: "dspark"``, ``architectures: ["DSparkDraftModel"]``, ``transformer_layer_config`` (a
    Qwen3 config of the *draft* layers: hidden size, heads, head_dim, intermediate size, ``num_hidden_layers`` = draft
    layers, ``vocab_size`` = the verifier's vocabulary, rope), ``draft_vocab_size``, ``block_size``,
    ``aux_hidden_state_layer_ids`` (indices into HF ``hidden_states``: 0 = embeddings, i = output of decoder layer
    i-1; ours are decoder-layer ids, so aux = ours + 1 and vLLM's DFlash ``target_layer_ids`` = aux - 1),
    ``mask_token_id``, ``sample_from_anchor``, ``markov_rank`` (0 = no head), ``markov_head_type`` (vanilla | gated |
    rnn), ``enable_confidence_head``, ``confidence_head_with_markov``, ``target_hidden_size``, and
    ``speculators_config = {algorithm: "dspark", proposal_methods: [{proposal_type: "greedy", speculative_tokens,
    verifier_accept_k: 1, accept_tolerance: 0.0}], default_proposal_method: "greedy", verifier: {name_or_path,
    architectures}}`` with ``speculative_tokens`` = block_size (sample_from_anchor) else block_size - 1.
``model.safetensors`` (metadata ``{"format": "pt"}``)
    ``fc.weight`` [H, n*H], ``hidden_norm.weight``, ``norm.weight``, ``layers.{i}.{input_layernorm,
    post_attention_layernorm}.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.
    {q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``markov_head.markov_w1.weight`` [V, r],
    ``markov_head.markov_w2.weight`` [Vd, r], ``markov_head.gate_proj.{weight,bias}`` [r, H+r] (input [h ; W1[a]]),
    ``markov_head.joint_proj.{weight,bias}`` [3r, 2r+H] (input [s ; W1[a] ; h], output gate|cand|out),
    ``confidence_head.proj.{weight,bias}`` [1, H(+r)]. Weights re-loaded from the verifier are *not* stored:
    ``embed_tokens``, ``verifier_lm_head``, ``verifier_norm``, and ``lm_head`` when Vd = V. With a reduced draft
    vocabulary the file also holds ``lm_head.weight`` [Vd, H] and the EAGLE-3 style maps ``d2t`` (int64 [Vd],
    *offsets*: target id = draft index + d2t[index], ascending target ids) and ``t2d`` (bool [V]).

Decisions where the public format is silent or cannot express what we train:
- Gated heads other than the DSpark form (``gate_input: hidden`` and/or ``gate_activation: identity``) are written
  with the same tensor names plus two extra config fields ``markov_gate_input`` / ``markov_gate_activation``
  (speculators' config allows extra fields). ``speculators`` itself only builds the ``hidden+prev``/``sigmoid`` gate,
  so it refuses such a file on the gate's shape instead of loading a wrong head; vLLM serves vanilla heads only.
- ``candidate_selector=True`` (DFlash-2 form heads only) writes the CandidateSelector layout *instead of*
  ``markov_head.*``: ``candidate_selector.predecessor_codebook`` [V, r] (A = W1), ``candidate_selector.
  successor_codebook`` [V, r] (B, indexed by target id as in speculators' DFlash2; zero rows outside a draft vocab)
  and ``candidate_selector.hidden_projection.weight`` [r, H] (H = Wg), with ``dflash2_candidate_selector: true``,
  ``selector_rank``, ``selector_top_k`` and ``markov_rank: 0`` in the config, so a DSpark loader that does not know
  the selector runs the backbone alone rather than an uninitialised Markov head.
- ``confidence_temperature`` (per-slot calibration) goes to the config as a list when it is not all ones.
- Tensors are written in bf16 or fp32; ``d2t``/``t2d`` keep int64/bool. Only safetensors, never pickles.
- Checkpoints are read with ``torch.load(weights_only=True)`` (the module stores the Markov head as a class_path
  dict; for older checkpoints that pickled the config object, only our own config classes are allow-listed).
- ``load_exported`` builds our ``DSparkDrafter`` from any directory in this format: offsets d2t are turned into
  absolute ids; a d2t that is not ascending is sorted and the Vd-row tensors permuted with it (our draft vocab is
  kept sorted); ``aux_hidden_state_scales`` (a per-layer fc input scale some trainers add) is folded into ``fc``;
  a reduced-vocab ``lm_head`` equal to the target's rows becomes the frozen target rows, otherwise a trained
  ``draft_lm_head``. Sliding-window layers (``layer_types``, ``sliding_window``) are exported with
  ``sliding_window_non_causal`` true (our blocks are bidirectional). Unsupported features (attention bias, rope
  scaling, sliding windows with causal blocks, aux layer 0) raise.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import PositiveInt
from safetensors.torch import load_file, save_file

from dspark_lightning.models import DrafterConfig, DraftVocab, DSparkDrafter, FrozenTarget, MarkovHeadConfig
from dspark_lightning.models.backbone import BackboneConfig
from dspark_lightning.selector_convert import read_candidate_selector, to_candidate_selector

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
SELECTOR_PREFIX = "candidate_selector."
DFLASH2_FORM = ("gated", "hidden", "identity")  # (head_type, gate_input, gate_activation) of the CandidateSelector
SPECULATORS_FORMAT_VERSION = "0.9.0"  # the speculators release whose save_pretrained output this mirrors
DRAFT_ROW_TENSORS = {"lm_head", "markov_head.markov_w2", SELECTOR_PREFIX + "successor_codebook"}  # [Vd, ...]
# tensors of the format that belong to the verifier and are ignored when present
VERIFIER_KEYS = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in EXPORT_DTYPES.values():
        return dtype
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"export dtype must be one of {sorted(EXPORT_DTYPES)}, got {dtype!r}")
    return EXPORT_DTYPES[dtype]


def _format_key(name: str) -> str | None:
    """Our drafter state-dict key -> the format's key (None: not part of the file)."""
    if name.startswith("backbone."):
        return name.removeprefix("backbone.")
    if name.startswith(("markov_head.", "confidence_head.")):
        return name
    if name == "draft_lm_head.weight":
        return "lm_head.weight"
    return None  # the target's embed_tokens / lm_head, draft_vocab buffers, confidence_temperature


def _gate_form(head) -> tuple[str, str, str] | None:
    return None if head is None else (head.head_type, head.gate_input, head.gate_activation)


def exported_tensors(
    drafter: DSparkDrafter, dtype: str | torch.dtype = "bfloat16", candidate_selector: bool = False
) -> dict[str, torch.Tensor]:
    """The ``model.safetensors`` content for ``drafter`` (floating tensors cast to ``dtype``, all on CPU)."""
    dtype = _dtype(dtype)
    head = drafter.markov_head
    if candidate_selector and _gate_form(head) != DFLASH2_FORM:
        raise ValueError(
            "candidate_selector=True needs a DFlash-2 form Markov head (SelectorMarkov: gated, gate_input 'hidden', "
            f"gate_activation 'identity'); this drafter has {head!r}"
        )
    tensors = {}
    for name, tensor in drafter.state_dict().items():
        key = _format_key(name)
        if key is None or (candidate_selector and key.startswith("markov_head.")):
            continue
        tensors[key] = tensor
    vocab = drafter.draft_vocab
    if vocab is not None:
        tensors.setdefault("lm_head.weight", drafter.lm_head.weight[vocab.d2t])
        tensors["d2t"] = vocab.d2t - torch.arange(vocab.draft_vocab_size, device=vocab.d2t.device)
        tensors["t2d"] = vocab.t2d
    if candidate_selector:
        tensors.update(to_candidate_selector(head, prefix=SELECTOR_PREFIX, d2t=drafter.d2t))
    return {
        key: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).cpu().contiguous().clone()
        for key, t in tensors.items()
    }


def _target_config_dict(target_config, verifier_name_or_path: str) -> dict:
    """The verifier's config as a dict (given, or read from a local ``config.json``; {} when unavailable)."""
    if target_config is None:
        path = Path(verifier_name_or_path) / CONFIG_NAME
        target_config = json.loads(path.read_text()) if path.is_file() else {}
    if not isinstance(target_config, dict):
        target_config = target_config.to_dict()
    return target_config.get("text_config") or target_config


def build_config(
    drafter: DSparkDrafter,
    *,
    verifier_name_or_path: str,
    dtype: str | torch.dtype = "bfloat16",
    candidate_selector: bool = False,
    selector_top_k: int = 16,
    target_config=None,
    target_layer_ids: list[int] | None = None,
) -> dict:
    """The ``config.json`` of the export (see the module docstring for every field)."""
    cfg, bc = drafter.config, drafter.backbone.config
    layer_ids = list(cfg.target_layer_ids or target_layer_ids or [])
    if len(layer_ids) != bc.num_context_layers:
        raise ValueError(
            f"the drafter reads {bc.num_context_layers} target layers but its config names {layer_ids or 'none'}: "
            "pass target_layer_ids= (the FrozenTarget's target_layer_ids)"
        )
    target = _target_config_dict(target_config, verifier_name_or_path)
    head = drafter.markov_head
    sliding = "sliding_attention" in bc.layer_types
    # fmt: off
    layer_config = {
        "model_type": "qwen3", "hidden_size": bc.hidden_size, "intermediate_size": bc.intermediate_size,
        "num_hidden_layers": bc.num_layers, "num_attention_heads": bc.num_heads,
        "num_key_value_heads": bc.num_kv_heads, "head_dim": bc.head_dim, "hidden_act": "silu",
        "rms_norm_eps": bc.rms_norm_eps, "vocab_size": drafter.verifier_vocab_size,
        "max_position_embeddings": target.get("max_position_embeddings", 32768),
        "rope_theta": bc.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": bc.rope_theta},
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": sliding,
        "sliding_window": bc.sliding_window if sliding else None, "layer_types": list(bc.layer_types),
        "tie_word_embeddings": False,
    }
    # fmt: on
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if target.get(key) is not None:
            layer_config[key] = target[key]
    dtype_name = str(_dtype(dtype)).removeprefix("torch.")
    block = cfg.block_size
    proposal = {"proposal_type": "greedy", "speculative_tokens": block if cfg.sample_from_anchor else block - 1}
    verifier = {"name_or_path": str(verifier_name_or_path), "architectures": target.get("architectures", [])}
    # fmt: off
    config = {
        "architectures": ["DSparkDraftModel"], "speculators_model_type": "dspark",
        "transformer_layer_config": layer_config, "draft_vocab_size": drafter.draft_vocab_size,
        "block_size": block, "max_anchors": cfg.max_anchors,
        "target_hidden_size": None,  # None = the draft's hidden size (ours always equals the target's)
        "aux_hidden_state_layer_ids": [i + 1 for i in layer_ids], "mask_token_id": cfg.mask_token_id,
        "sample_from_anchor": cfg.sample_from_anchor,
        # our blocks attend bidirectionally; speculators makes sliding-window blocks causal unless this is set
        "sliding_window_non_causal": sliding,
        "markov_rank": head.rank if head is not None and not candidate_selector else 0,
        "markov_head_type": head.head_type if head is not None else "vanilla",
        "enable_confidence_head": drafter.confidence_head is not None,
        "confidence_head_with_markov": drafter.confidence_head is not None and cfg.confidence_with_markov,
        "speculators_config": {
            "algorithm": "dspark", "default_proposal_method": "greedy", "verifier": verifier,
            "proposal_methods": [proposal | {"verifier_accept_k": 1, "accept_tolerance": 0.0}],
        },
        "speculators_version": SPECULATORS_FORMAT_VERSION, "tie_word_embeddings": False,
        "torch_dtype": dtype_name, "dtype": dtype_name,
    }
    # fmt: on
    if head is not None and head.head_type == "gated" and _gate_form(head) != ("gated", "hidden+prev", "sigmoid"):
        config |= {"markov_gate_input": head.gate_input, "markov_gate_activation": head.gate_activation}
    if candidate_selector:
        k = min(int(selector_top_k), drafter.draft_vocab_size)
        config |= {"dflash2_candidate_selector": True, "selector_rank": head.rank, "selector_top_k": k}
    temperature = drafter.confidence_temperature
    if drafter.confidence_head is not None and not bool((temperature == 1).all()):
        config["confidence_temperature"] = [float(t) for t in temperature]
    return config


def export_drafter(
    drafter: DSparkDrafter,
    output_dir: str | os.PathLike,
    *,
    verifier_name_or_path: str,
    dtype: str | torch.dtype = "bfloat16",
    candidate_selector: bool = False,
    selector_top_k: int = 16,
    target_config=None,
    target_layer_ids: list[int] | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` for ``drafter`` into ``output_dir``; returns the directory.

    ``verifier_name_or_path`` is recorded as the verifier (hub id or path); ``target_config`` (a dict or
    ``PretrainedConfig``, default: read from ``verifier_name_or_path/config.json`` when it is local) supplies the
    verifier architectures, max positions and special token ids; ``target_layer_ids`` is needed only when the
    drafter's config does not name its target layers (``DSparkDrafter.for_target`` leaves them to the target).
    """
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    tensors = exported_tensors(drafter, dtype, candidate_selector)
    config = build_config(
        drafter,
        verifier_name_or_path=verifier_name_or_path,
        dtype=dtype,
        candidate_selector=candidate_selector,
        selector_top_k=selector_top_k,
        target_config=target_config,
        target_layer_ids=target_layer_ids,
    )
    save_file(tensors, str(output / WEIGHTS_NAME), metadata={"format": "pt"})
    (output / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return output


# ---------------------------------------------------------------------------------------------------------- checkpoints
def read_checkpoint(ckpt_path: str | os.PathLike) -> dict:
    """``torch.load(weights_only=True)``. Current checkpoints hold only plain data (the Markov head as a class_path
    dict); older ones pickled the head config object, so our own config classes (and nothing else) are allowed."""
    from dspark_lightning.checks import read_checkpoint as read

    return read(ckpt_path)


def load_checkpoint_module(ckpt_path: str | os.PathLike, target: str | None = None):
    """Rebuild the ``DSparkModule`` of a Lightning checkpoint (``target`` overrides the recorded target path)."""
    from dspark_lightning.checks import check_finite_state
    from dspark_lightning.lightning.module import DSparkModule

    checkpoint = read_checkpoint(ckpt_path)
    hparams = dict(checkpoint["hyper_parameters"])
    hparams = {k: v for k, v in hparams.items() if not k.startswith("_")}  # LightningCLI bookkeeping
    hparams["compile"] = False
    if target is not None:
        hparams["target"] = target
    state = checkpoint["state_dict"]
    check_finite_state(state, f"checkpoint {ckpt_path}")  # never export (or rebuild) a diverged drafter
    with tempfile.TemporaryDirectory() as tmp:
        vocab_path = hparams.get("draft_vocab")
        if vocab_path and not Path(vocab_path).is_file() and "drafter.draft_vocab.d2t" in state:
            hparams["draft_vocab"] = str(Path(tmp) / "draft_vocab.safetensors")  # the file moved: use the ckpt's d2t
            save_file({"d2t": state["drafter.draft_vocab.d2t"].contiguous()}, hparams["draft_vocab"])
        module = DSparkModule(**hparams)
    missing, unexpected = module.load_state_dict(state, strict=False)
    needed = set(module.state_dict()) - module.frozen_state_keys()
    if unexpected or needed & set(missing):
        raise KeyError(
            f"checkpoint does not match its model: missing {sorted(needed & set(missing))[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )
    return module.eval()


def export_checkpoint(
    ckpt_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    verifier_name_or_path: str | None = None,
    dtype: str = "bfloat16",
    candidate_selector: bool = False,
    selector_top_k: int | None = None,
    target: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Export the drafter of a Lightning checkpoint.

    The verifier defaults to the checkpoint's ``target`` (a local directory is recorded as an absolute path; pass a
    hub id for a portable export). A non-empty ``output_dir`` is refused unless ``overwrite``; then the export is
    written next to it and swapped in, so no file of the old export survives.
    """
    output = Path(output_dir)
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        raise FileExistsError(f"--output {str(output)!r} exists and is not empty: pass --overwrite true to replace it")
    module = load_checkpoint_module(ckpt_path, target)
    hp = module.hparams
    if verifier_name_or_path is None and Path(hp.target).is_dir():
        verifier_name_or_path = str(Path(hp.target).resolve())
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        export_drafter(
            module.drafter,
            staging,
            verifier_name_or_path=verifier_name_or_path or hp.target,
            dtype=dtype,
            candidate_selector=candidate_selector,
            selector_top_k=selector_top_k or hp.candidate_k,
            target_config=module.target.config,
        )
        if output.is_dir():
            shutil.rmtree(output)
        elif output.exists():
            output.unlink()
        staging.rename(output)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return output


# ------------------------------------------------------------------------------------------------------------ loading
def read_exported(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, tensors) of an export directory (single ``model.safetensors`` or an HF shard index)."""
    directory = Path(path)
    config = json.loads((directory / CONFIG_NAME).read_text())
    index = directory / f"{WEIGHTS_NAME}.index.json"
    if (directory / WEIGHTS_NAME).is_file():
        return config, load_file(str(directory / WEIGHTS_NAME))
    if index.is_file():
        tensors = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            tensors |= load_file(str(directory / shard))
        return config, tensors
    raise FileNotFoundError(f"{directory} has no {WEIGHTS_NAME} (pickled .bin checkpoints are not read)")


def _layer_types(layer: dict) -> list[str] | None:
    """Per-layer attention types of a transformer layer config: ``layer_types``, else from ``use_sliding_window``."""
    if layer.get("layer_types"):
        return list(layer["layer_types"])
    if layer.get("use_sliding_window"):
        return ["sliding_attention"] * int(layer["num_hidden_layers"])
    return None


def _check_supported(config: dict, layer: dict) -> None:
    rope = layer.get("rope_parameters") or {}
    scaling = layer.get("rope_scaling") or {}
    problems = []
    if rope.get("rope_type", rope.get("type", "default")) != "default" or scaling.get("rope_type", scaling.get("type")):
        problems.append(f"rope scaling ({rope or scaling})")
    if layer.get("attention_bias"):
        problems.append("attention bias")
    if _layer_types(layer) is not None and "sliding_attention" in _layer_types(layer):
        if not config.get("sliding_window_non_causal"):
            problems.append("sliding-window layers with causal blocks (sliding_window_non_causal false)")
        if not layer.get("sliding_window"):
            problems.append("sliding_attention layers without a sliding_window")
    if layer.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {layer['hidden_act']!r}")
    if config.get("target_hidden_size") not in (None, layer["hidden_size"]):
        problems.append("a target hidden size different from the draft's")
    if problems:
        raise NotImplementedError(f"this drafter uses features DSparkDrafter does not implement: {', '.join(problems)}")


def _resolve_target(target, config: dict, layer_ids: list[int], trust_remote_code: bool) -> FrozenTarget:
    if isinstance(target, FrozenTarget):
        return target if target.target_layer_ids == layer_ids else FrozenTarget(target.model, layer_ids)
    if isinstance(target, torch.nn.Module):
        return FrozenTarget(target, layer_ids)
    if target is None:
        target = config.get("speculators_config", {}).get("verifier", {}).get("name_or_path")
        if target is None:
            raise ValueError("the export names no verifier: pass target= (a FrozenTarget, model or path)")
    return FrozenTarget.from_pretrained(str(target), layer_ids, trust_remote_code=trust_remote_code)


def load_exported(
    path: str | os.PathLike,
    target=None,
    *,
    trust_remote_code: bool = False,
    return_target: bool = False,
):
    """Build a ``DSparkDrafter`` from a directory in the speculators DSpark (or DFlash) format.

    Args:
        path: the export directory (``config.json`` + ``model.safetensors``).
        target: a ``FrozenTarget``, a Hugging Face causal LM, a path / hub id, or None for the recorded verifier.
            Its embedding and LM head are shared with the drafter (never copied). The drafter is float32; for bf16
            inference load the target in bf16 and cast the drafter with ``.to(torch.bfloat16)``.
        return_target: also return the ``FrozenTarget`` (with the export's target layer ids) that feeds the drafter.
    """
    config, tensors = read_exported(path)
    model_type = config.get("speculators_model_type")
    if model_type not in ("dspark", "dflash"):
        raise ValueError(f"{path}: speculators_model_type {model_type!r} is not 'dspark' or 'dflash'")
    dspark = model_type == "dspark"
    layer = config["transformer_layer_config"]
    _check_supported(config, layer)
    V = int(layer["vocab_size"])
    Vd = int(config.get("draft_vocab_size") or V)
    aux = config.get("aux_hidden_state_layer_ids")
    if not aux or min(aux) < 1:
        raise NotImplementedError(f"aux_hidden_state_layer_ids {aux!r}: need ids >= 1 (0 is the embedding output)")
    layer_ids = [int(a) - 1 for a in aux]
    target = _resolve_target(target, config, layer_ids, trust_remote_code)
    if target.vocab_size != V or target.hidden_size != layer["hidden_size"]:
        raise ValueError(
            f"target (vocab {target.vocab_size}, hidden {target.hidden_size}) does not match the export "
            f"(vocab {V}, hidden {layer['hidden_size']})"
        )
    tensors = {k: v for k, v in tensors.items() if k not in VERIFIER_KEYS}

    vocab = None
    if Vd != V:
        d2t = tensors.pop("d2t").long() + torch.arange(Vd)
        t2d = tensors.pop("t2d", None)
        if t2d is not None and (int(t2d.sum()) != Vd or not bool(t2d.bool()[d2t].all())):
            raise ValueError("t2d and d2t disagree")
        order = torch.argsort(d2t)
        if not torch.equal(order, torch.arange(Vd)):  # keep our draft vocab sorted: permute the Vd-row tensors
            for key in [k for k in tensors if k.removesuffix(".weight") in DRAFT_ROW_TENSORS]:
                if tensors[key].shape[0] == Vd:
                    tensors[key] = tensors[key][order]
        vocab = DraftVocab(d2t, V)
    else:
        for key in ("d2t", "t2d", "lm_head.weight"):  # a full-vocab lm_head is the verifier's own
            tensors.pop(key, None)

    if config.get("dflash2_candidate_selector") or any(k.startswith(SELECTOR_PREFIX) for k in tensors):
        predecessor, successor, projection = read_candidate_selector(tensors, prefix=SELECTOR_PREFIX)
        tensors = {k: v for k, v in tensors.items() if not k.startswith(SELECTOR_PREFIX)}
        if vocab is not None and successor.shape[0] == V:
            successor = successor[vocab.d2t]
        tensors |= {
            "markov_head.markov_w1.weight": predecessor,
            "markov_head.markov_w2.weight": successor,
            "markov_head.gate_proj.weight": projection,
        }
        markov = MarkovHeadConfig(int(predecessor.shape[1]), "gated", "hidden", "identity")
    else:
        rank = int(config.get("markov_rank", 256 if dspark else 0) or 0)
        markov = None
        if rank > 0:
            markov = MarkovHeadConfig(
                rank,
                config.get("markov_head_type", "vanilla"),
                config.get("markov_gate_input", "hidden+prev"),
                config.get("markov_gate_activation", "sigmoid"),
            )
    confidence = bool(config.get("enable_confidence_head", dspark))
    with_markov = confidence and bool(config.get("confidence_head_with_markov", dspark))

    train_lm_head = False
    if vocab is not None and "lm_head.weight" in tensors:
        stored = tensors["lm_head.weight"]
        train_lm_head = not torch.equal(target.lm_head.weight.detach()[vocab.d2t].to(stored.dtype), stored)
        if not train_lm_head:
            del tensors["lm_head.weight"]  # exactly the target's rows: share them frozen, as in training
    scales = config.get("aux_hidden_state_scales")
    if scales:
        fc = tensors["fc.weight"].float()
        tensors["fc.weight"] = (fc.view(fc.shape[0], len(scales), -1) * torch.tensor(scales)[:, None]).flatten(1)

    H, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
    rope = layer.get("rope_parameters") or {}
    backbone = BackboneConfig(
        hidden_size=H,
        num_layers=int(layer["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or H // heads),
        intermediate_size=int(layer["intermediate_size"]),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta") or layer.get("rope_theta") or 10_000.0),
        num_context_layers=len(layer_ids),
        sliding_window=int(layer["sliding_window"]) if "sliding_attention" in (_layer_types(layer) or []) else None,
        layer_types=_layer_types(layer),
    )
    drafter_config = DrafterConfig(
        block_size=int(config.get("block_size", 8)),
        num_layers=backbone.num_layers,
        max_anchors=int(config.get("max_anchors") or config.get("num_anchors") or 64),
        sample_from_anchor=bool(config.get("sample_from_anchor", dspark)),
        mask_token_id=config.get("mask_token_id"),
        target_layer_ids=layer_ids,
        markov_head=markov,
        confidence_head=confidence,
        confidence_with_markov=with_markov,
        train_lm_head=train_lm_head,
        num_heads=backbone.num_heads,
        num_kv_heads=backbone.num_kv_heads,
        head_dim=backbone.head_dim,
        intermediate_size=backbone.intermediate_size,
        sliding_window=backbone.sliding_window,
        layer_types=backbone.layer_types,
    )
    drafter = DSparkDrafter(drafter_config, backbone, target.embed_tokens, target.lm_head, vocab)

    state, missing = {}, []
    for name in drafter.state_dict():
        key = _format_key(name)
        if key is not None and key in tensors:
            state[name] = tensors.pop(key)
        elif key is not None:
            missing.append(key)
    if missing or tensors:
        raise KeyError(f"{path}: tensors missing {sorted(missing)[:8]}, unexpected {sorted(tensors)[:8]}")
    drafter.load_state_dict(state, strict=False)
    if config.get("confidence_temperature"):
        drafter.confidence_temperature.copy_(torch.tensor(config["confidence_temperature"]))
    drafter.eval()
    return (drafter, target) if return_target else drafter


# ---------------------------------------------------------------------------------------------------------------- CLI
def export_command(
    ckpt_path: str,
    output: str,
    dtype: Literal["bfloat16", "float32"] = "bfloat16",
    verifier: str | None = None,
    candidate_selector: bool = False,
    selector_top_k: PositiveInt | None = None,
    target: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a checkpoint in the speculators DSpark format (config.json + model.safetensors) that vLLM serves.

    Args:
        ckpt_path: Lightning checkpoint (e.g. last.ckpt)
        output: output directory
        dtype: tensor dtype
        verifier: verifier hub id or path to record (default: the target)
        candidate_selector: write a DFlash-2 form head in the CandidateSelector layout (predecessor/successor
            codebooks)
        selector_top_k: candidates of the CandidateSelector (default: candidate_k)
        target: load the target from here instead of the recorded path
        overwrite: replace a non-empty output directory (no stale files are left)
    """
    written = export_checkpoint(
        ckpt_path,
        output,
        verifier_name_or_path=verifier,
        dtype=dtype,
        candidate_selector=candidate_selector,
        selector_top_k=selector_top_k,
        target=target,
        overwrite=overwrite,
    )
    config = json.loads((written / CONFIG_NAME).read_text())
    head = config["markov_head_type"] if config["markov_rank"] else "none"
    head = "candidate selector" if config.get("dflash2_candidate_selector") else head
    print(
        f"exported to {written}: {CONFIG_NAME} + {WEIGHTS_NAME} ({dtype}), verifier "
        f"{config['speculators_config']['verifier']['name_or_path']!r}, block {config['block_size']}, "
        f"markov head {head}, draft vocab {config['draft_vocab_size']}"
    )
    return written
