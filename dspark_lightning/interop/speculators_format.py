"""The speculators DSpark format: its constants and the conversion between our drafter configuration and its
``config.json`` (``build_config`` writes one, ``drafter_configs`` reads one back), shared by export and load.

The format (vllm-project/speculators, ``speculators.models.dspark`` / ``dflash`` / ``model.DraftVocabMixin``;
vLLM ``transformers_utils/configs/speculators/algos.py`` and ``models/qwen3_dflash.py``) is a directory with

``config.json``
    ``speculators_model_type: "dspark"``, ``architectures: ["Qwen3DSparkModel"]``, ``transformer_layer_config`` (a
    Qwen3 config of the *draft* layers: hidden size, heads, head_dim, intermediate size, ``num_hidden_layers`` = draft
    layers, ``vocab_size`` = the verifier's vocabulary, rope, ``is_causal: false``), ``draft_vocab_size``, ``block_size``,
    ``aux_hidden_state_layer_ids`` (indices into HF ``hidden_states``: 0 = embeddings, i = output of decoder layer
    i-1; ours are decoder-layer ids, so aux = ours + 1 and vLLM's DFlash ``target_layer_ids`` = aux - 1),
    ``mask_token_id``, ``sample_from_anchor``, ``markov_rank`` (0 = no head), ``markov_head_type`` (vanilla | gated |
    rnn), ``enable_confidence_head``, ``confidence_head_with_markov``, ``target_hidden_size``,
    ``sliding_window_non_causal: true`` (every draft layer is bidirectional within a block), and
    ``speculators_config = {algorithm: "dspark", proposal_methods: [{proposal_type: "greedy", speculative_tokens,
    verifier_accept_k: 1, accept_tolerance: 0.0}], default_proposal_method: "greedy", verifier: {name_or_path,
    architectures, [config_sha256]}}`` with ``speculative_tokens`` = block_size (sample_from_anchor) else block_size - 1.
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
- The format embeds draft tokens with a *plain lookup* of the verifier's embedding weight: speculators builds an
  ``nn.Embedding``, fills it from the verifier on every load and has no field for a scale. A target whose input
  embedding is no plain lookup (Gemma's ``Gemma3TextScaledWordEmbedding`` multiplies by sqrt(hidden_size)) has a
  drafter trained on scaled block embeddings, which speculators would feed unscaled ones: other logits. Folding the
  scale into the draft weights (every residual write divided by it) is exact only up to the RMSNorms' eps, one field
  for all the draft norms, so ``build_config`` refuses such a drafter (``embedding_scale`` measures the factor)
  rather than write an export that serves wrong logits; a drafter trained with ``block_embedding: lookup``
  (``DrafterConfig``) embeds as the format does and exports. Loading reads the format as speculators does: the draft
  layers get the plain lookup of the target's weight (``plain_lookup``), and nested per-layer-type
  ``rope_parameters`` give the ``sliding_attention`` base, as its ``flatten_rope_parameters`` picks (ours are flat:
  the full-attention base, ``models.target.rope_theta``). A tied verifier's LM head is its embedding weight in both.
- The verifier is recorded portably (``verifier_record``): a hub id as given; a local target directory by a name
  (the hub id of a Hugging Face cache snapshot, else the directory's name) plus ``config_sha256`` (of its
  ``config.json``); no path of the exporting machine is written (the files are meant to be published), so loading
  a local-verifier export elsewhere takes ``target=``. ``recorded_verifier`` reads it back. No field is ``null``.
  vLLM's reading of every field is in docs/guides/serve_with_vllm.md.
- Tensors are written in bf16 or fp32; ``d2t``/``t2d`` keep int64/bool. Only safetensors, never pickles.
- Checkpoints are read with ``torch.load(weights_only=True)`` (the module stores its configs as plain dicts).
- ``load_exported`` builds our ``DSparkDrafter`` from any directory in this format: offsets d2t are turned into
  absolute ids; a d2t that is not ascending is sorted and the Vd-row tensors permuted with it (our draft vocab is
  kept sorted); ``aux_hidden_state_scales`` (a per-layer fc input scale some trainers add) is folded into ``fc``;
  a reduced-vocab ``lm_head`` equal to the target's rows becomes the frozen target rows, otherwise a trained
  ``draft_lm_head``. Sliding-window layers (``layer_types``, ``sliding_window``) are read as ours only when
  ``sliding_window_non_causal`` is true (our blocks are bidirectional). Unsupported features (attention bias, rope
  scaling, sliding windows with causal blocks, aux layer 0) raise.
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
    """The export's ``verifier`` fields naming ``name_or_path``, portably (see the module docstring): a hub id (or
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
    """The ``config.json`` of the export (see the module docstring for every field).

    ``verifier_name_or_path`` is recorded as the verifier (hub id or path, ``verifier_record``); ``target_config`` (a dict or
    ``PretrainedConfig``, default: read from ``verifier_name_or_path/config.json`` when it is local) supplies the
    verifier architectures, max positions and special token ids; ``target_layer_ids`` is needed only when the
    drafter's config does not name its target layers (``DSparkDrafter.for_target`` leaves them to the target).
    A drafter whose input embedding is no plain lookup (Gemma's) is refused (see the module docstring).
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
