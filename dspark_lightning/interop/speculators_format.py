"""The speculators DSpark format: its constants and the conversion between our drafter configuration and its
``config.json`` (``build_config`` writes one, ``drafter_configs`` reads one back), shared by export and load. The
layout, and what we write where the public format is silent: docs/design/data.md §6.4.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch

from dspark_lightning.dtypes import torch_dtype
from dspark_lightning.errors import UnsupportedError
from dspark_lightning.models import DrafterConfig, DSparkDrafter, MarkovHeadConfig
from dspark_lightning.models.backbone import BackboneConfig
from dspark_lightning.models.target import embedding_scale

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
EXPORT_DTYPES = ("bfloat16", "float32")  # the dtypes the speculators format is read in
SELECTOR_PREFIX = "candidate_selector."
DFLASH2_FORM = ("gated", "hidden", "identity")  # (kind, gate_input, gate_activation) of the CandidateSelector
VLLM_DSPARK_ARCHITECTURE = "Qwen3DSparkModel"  # vLLM's registry name (update_dspark keeps it, else rewrites to it)
SPECULATORS_FORMAT_VERSION = "0.9.0"  # the speculators release whose save_pretrained output this mirrors
DRAFT_ROW_TENSORS = {"lm_head", "markov_head.markov_w2", SELECTOR_PREFIX + "successor_codebook"}  # [Vd, ...]
# tensors of the format that belong to the verifier and are ignored when present
VERIFIER_KEYS = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


HUB_CACHE_DIR = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)")  # huggingface_hub's cache layout


def config_digest(directory: Path) -> str | None:
    """sha256 of ``directory/config.json`` (None without one): what names a local verifier across machines."""
    config = Path(directory) / CONFIG_NAME
    return hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None


def verifier_record(name_or_path: str) -> dict:
    """The export's ``verifier`` fields naming ``name_or_path``, portably (docs/design/data.md §6.4): a hub id (or
    anything that is not a local directory) as given; a local directory as ``name_or_path`` = its hub id when it is a
    Hugging Face cache snapshot, else its directory name, with ``config_sha256``."""
    path = Path(name_or_path)
    if not path.is_dir():
        return {"name_or_path": str(name_or_path)}
    resolved = path.resolve()
    hub = next((m for p in (resolved, *resolved.parents) if (m := HUB_CACHE_DIR.fullmatch(p.name))), None)
    record = {"name_or_path": f"{hub['owner']}/{hub['name']}" if hub else resolved.name}
    digest = config_digest(resolved)
    # no path of this machine: the file is meant to be published (hub uploads), and a path is wrong everywhere else
    return record | ({"config_sha256": digest} if digest else {})


def recorded_verifier(config: dict) -> str:
    """Where to load an export's verifier from: ``name_or_path`` (a hub id, or a directory of that name here, whose
    ``config.json`` must have the recorded digest); exports written before 0.2 also kept a ``local_path``, used when
    that directory is here."""
    verifier = config.get("speculators_config", {}).get("verifier", {})
    name, local, digest = verifier.get("name_or_path"), verifier.get("local_path"), verifier.get("config_sha256")
    if local and Path(local).is_dir():
        if digest and config_digest(Path(local)) != digest:
            raise ValueError(
                f"the export's verifier {local} has another config.json than when it was exported (sha256 "
                f"{digest[:12]}...): pass target= (the verifier it was trained on)"
            )
        return local
    if name is None:
        raise ValueError("the export names no verifier: pass target= (a FrozenTarget, model or path)")
    if digest and Path(name).is_dir() and config_digest(Path(name)) != digest:
        raise ValueError(
            f"the directory {name!r} here has another config.json than the export's verifier (sha256 {digest[:12]}"
            "...): pass target= (the verifier it was trained on)"
        )
    if digest and not Path(name).is_dir():
        raise ValueError(
            f"the export's verifier is the local model {name!r} (config.json sha256 {digest[:12]}...), which is not "
            f"on this machine{f' at {local}' if local else ''}: pass target= (its directory, a model or a hub id)"
        )
    return name


def _refuse_scaled_embedding(drafter: DSparkDrafter) -> None:
    scale = embedding_scale(drafter.embed_tokens)
    if scale is not None:
        raise UnsupportedError(
            f"the target's input embedding ({type(drafter.embed_tokens).__name__}) multiplies by {scale:.4g} (Gemma: "
            "sqrt(hidden_size)), but the speculators DSpark format embeds draft tokens with a plain lookup of the "
            "verifier's weight and records no scale: speculators would feed the draft layers unscaled embeddings "
            "and serve other logits than this drafter's. Train the drafter with `model.drafter.block_embedding: lookup` "
            "(a plain lookup, as the format serves it) to export it"
        )


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    return torch_dtype(dtype, EXPORT_DTYPES, what="export dtype")


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
    return None if head is None else (head.config.kind, head.config.gate_input, head.config.gate_activation)


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
    """The ``config.json`` of the export (every field: docs/design/data.md §6.4).

    ``verifier_name_or_path`` is recorded as the verifier (hub id or path, ``verifier_record``); ``target_config`` (a dict or
    ``PretrainedConfig``, default: read from ``verifier_name_or_path/config.json`` when it is local) supplies the
    verifier architectures, max positions and special token ids; ``target_layer_ids`` is needed only when the
    drafter's config does not name its target layers (``DSparkDrafter.for_target`` leaves them to the target).
    A drafter whose input embedding is no plain lookup (Gemma's) is refused (docs/design/design.md §11).
    """
    _refuse_scaled_embedding(drafter)
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
        "layer_types": list(bc.layer_types), "tie_word_embeddings": False,
        # every draft layer attends bidirectionally within a block: vLLM reads this first, for every layer (without
        # it, its DSpark path makes sliding_attention layers causal)
        "is_causal": False,
    }
    if sliding:
        layer_config["sliding_window"] = bc.sliding_window
    # fmt: on
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if target.get(key) is not None:
            layer_config[key] = target[key]
    dtype_name = str(_dtype(dtype)).removeprefix("torch.")
    block = cfg.block_size
    proposal = {"proposal_type": "greedy", "speculative_tokens": block if cfg.sample_from_anchor else block - 1}
    recorded = verifier_record(str(verifier_name_or_path))
    verifier = {"name_or_path": recorded["name_or_path"], "architectures": target.get("architectures", [])} | recorded
    # fmt: off
    config = {
        # vLLM's registry name for the Qwen3 DSpark drafter ("DSparkDraftModel" there is DeepSeek-V4's)
        "architectures": [VLLM_DSPARK_ARCHITECTURE], "speculators_model_type": "dspark",
        "transformer_layer_config": layer_config, "draft_vocab_size": drafter.draft_vocab_size,
        "block_size": block, "max_anchors": cfg.max_anchors,
        "target_hidden_size": bc.hidden_size,  # ours always equals the draft's
        "aux_hidden_state_layer_ids": [i + 1 for i in layer_ids], "mask_token_id": cfg.mask_token_id,
        "sample_from_anchor": cfg.sample_from_anchor,
        # our blocks attend bidirectionally on every layer: speculators makes sliding-window blocks causal unless
        # this is set, and vLLM's DFlash path makes *every* layer causal when it is false
        "sliding_window_non_causal": True,
        "markov_rank": head.config.rank if head is not None and not candidate_selector else 0,
        "markov_head_type": head.config.kind if head is not None else "vanilla",
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
    if head is not None and head.config.kind == "gated" and _gate_form(head) != ("gated", "hidden+prev", "sigmoid"):
        config |= {"markov_gate_input": head.config.gate_input, "markov_gate_activation": head.config.gate_activation}
    if candidate_selector:
        k = min(int(selector_top_k), drafter.draft_vocab_size)
        config |= {"dflash2_candidate_selector": True, "selector_rank": head.config.rank, "selector_top_k": k}
    temperature = drafter.confidence_temperature
    if drafter.confidence_head is not None and not bool((temperature == 1).all()):
        config["confidence_temperature"] = [float(t) for t in temperature]
    return without_nulls(config)


def without_nulls(value):
    """``value`` with every ``None`` entry of its dicts dropped (recursively): an engine reads a missing field as
    its default, but a ``null`` as a value (vLLM copies some as they are)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _layer_types(layer: dict) -> list[str] | None:
    """Per-layer attention types of a transformer layer config: ``layer_types``, else from ``use_sliding_window``."""
    if layer.get("layer_types"):
        return list(layer["layer_types"])
    if layer.get("use_sliding_window"):
        return ["sliding_attention"] * int(layer["num_hidden_layers"])
    return None


def _rope_parameters(layer: dict) -> dict:
    """A layer config's rope parameters, flat: nested per-layer-type ones give their ``sliding_attention`` entry, the
    one speculators hands every draft layer (its ``flatten_rope_parameters``); ours are always flat."""
    rope = layer.get("rope_parameters") or {}
    return rope.get("sliding_attention", rope)


def _check_supported(config: dict, layer: dict) -> None:
    rope = _rope_parameters(layer)
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


def markov_head_config(config: dict) -> MarkovHeadConfig | None:
    """The Markov head a ``config.json`` describes (None for ``markov_rank`` 0; a DFlash export has none by default).

    A CandidateSelector layout is read from its tensors instead (``speculators_load``)."""
    dspark = config.get("speculators_model_type") == "dspark"
    rank = int(config.get("markov_rank", 256 if dspark else 0) or 0)
    if rank <= 0:
        return None
    return MarkovHeadConfig(
        config.get("markov_head_type", "vanilla"),
        rank,
        config.get("markov_gate_input", "hidden+prev"),
        config.get("markov_gate_activation", "sigmoid"),
    )


def drafter_configs(
    config: dict, layer_ids: list[int], markov: MarkovHeadConfig | None, train_lm_head: bool
) -> tuple[BackboneConfig, DrafterConfig]:
    """The inverse of ``build_config``: our (BackboneConfig, DrafterConfig) for an export's ``config.json``.

    ``markov`` and ``train_lm_head`` come from the tensors (a CandidateSelector layout, a stored draft LM head), so
    the caller decides them; a DFlash export (``speculators_model_type: dflash``) defaults to no Markov or confidence
    head and the DFlash slot convention.
    """
    dspark = config.get("speculators_model_type") == "dspark"
    layer = config["transformer_layer_config"]
    confidence = bool(config.get("enable_confidence_head", dspark))
    with_markov = confidence and bool(config.get("confidence_head_with_markov", dspark))
    H, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
    rope = _rope_parameters(layer)
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
    # the draft layer shape is the backbone's, field for field
    shape = (
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "sliding_window",
        "layer_types",
    )
    drafter_config = DrafterConfig(
        **{name: getattr(backbone, name) for name in shape},
        block_size=int(config.get("block_size", 8)),
        max_anchors=int(config.get("max_anchors") or config.get("num_anchors") or 64),
        sample_from_anchor=bool(config.get("sample_from_anchor", dspark)),
        mask_token_id=config.get("mask_token_id"),
        target_layer_ids=layer_ids,
        markov_head=markov,
        confidence_head=confidence,
        confidence_with_markov=with_markov,
        train_lm_head=train_lm_head,
    )
    return backbone, drafter_config
