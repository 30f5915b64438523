"""The frozen target (verifier): any Hugging Face causal LM, and ``TargetHeads``, the target without its decoder.

What it provides and how packed documents stay apart: docs/design/design.md §2.1; Gemma's embeddings: §11."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dspark_lightning.errors import OptionError, loading
from dspark_lightning.models.architectures import (
    carries_recurrent_state,
    check_config_supported,
    check_target_supported,
)
from dspark_lightning.models.backbone import default_target_layer_ids
from dspark_lightning.shipped import local_or_shipped


@dataclass
class TargetFeatures:
    """What the drafter reads from one target forward: the chosen layers' hidden states concatenated
    [b, S, n·H] (``context_features``) and the final hidden state after the model's norm [b, S, H]."""

    context_features: torch.Tensor
    final_hidden: torch.Tensor


def load_causal_lm(name_or_path: str, dtype: torch.dtype | str = "auto", trust_remote_code: bool = False, **kwargs):
    """``AutoModelForCausalLM.from_pretrained`` with safe defaults (sdpa attention where the model has it, else its
    own default: Gemma 2's soft-capped attention is eager only; no remote code)."""
    from transformers import AutoModelForCausalLM

    chosen = "attn_implementation" in kwargs
    kwargs.setdefault("attn_implementation", "sdpa")
    with loading("target", name_or_path):  # a one-line error naming it: unreachable, or no model in the folder
        try:
            return AutoModelForCausalLM.from_pretrained(
                name_or_path, dtype=dtype, trust_remote_code=trust_remote_code, **kwargs
            )
        except ValueError as error:
            if chosen or "scaled_dot_product_attention" not in str(error):
                raise
        kwargs.pop("attn_implementation")
        return AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=dtype, trust_remote_code=trust_remote_code, **kwargs
        )


def resolve_target_layer_ids(num_layers: int, target_layer_ids: list[int] | None, num_draft_layers: int) -> list[int]:
    """The given layer ids, checked against the target's depth, or the default spread over depth."""
    if target_layer_ids is None:
        return default_target_layer_ids(num_layers, num_draft_layers)
    if not target_layer_ids:
        raise OptionError("model.drafter.target_layer_ids is empty: name at least one target layer (or null: default)")
    for layer_id in target_layer_ids:
        if not 0 <= layer_id < num_layers:
            raise OptionError(
                f"target layer id {layer_id} out of range for a {num_layers}-layer target "
                "(model.drafter.target_layer_ids, or cache --layers: ids 0.."
                f"{num_layers - 1})"
            )
    return list(target_layer_ids)


class FrozenTarget(nn.Module):
    """Wraps a causal LM; exposes embeddings, LM head, per-layer features and the final hidden state.

    Frozen and in eval mode for good (docs/design/design.md §2.1); ``from_pretrained`` loads one from a hub id or a
    local directory.

    Args:
        model: the Hugging Face causal LM (``AutoModelForCausalLM``).
        target_layer_ids: decoder layers whose outputs make ``context_features``; None for the default spread
            (``default_target_layer_ids``).
        num_draft_layers: how many layers the default spread picks when ``target_layer_ids`` is None.
    """

    def __init__(self, model: nn.Module, target_layer_ids: list[int] | None = None, num_draft_layers: int = 1) -> None:
        super().__init__()
        self.model = model
        config = model.config
        self.num_layers = config.num_hidden_layers
        self.target_layer_ids = resolve_target_layer_ids(self.num_layers, target_layer_ids, num_draft_layers)
        self.per_document = carries_recurrent_state(config)  # packed documents would share a recurrent state
        model.eval()
        model.requires_grad_(False)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        target_layer_ids: list[int] | None = None,
        num_draft_layers: int = 1,
        dtype: torch.dtype | str = torch.float32,
        trust_remote_code: bool = False,
    ) -> FrozenTarget:
        """Load the target, refusing one the decoding loop cannot serve (``models.architectures``) before its weights
        are read."""
        from transformers import AutoConfig

        name_or_path = local_or_shipped(name_or_path)  # the quickstart's assets/demo-target from any directory
        with loading("target", name_or_path):
            check_config_supported(AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code))
        model = load_causal_lm(name_or_path, dtype, trust_remote_code)
        check_target_supported(type(model), model.config)
        return cls(model, target_layer_ids, num_draft_layers)

    def train(self, mode: bool = True) -> FrozenTarget:  # the target never leaves eval mode
        return super().train(False)

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().weight.shape[0]

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> TargetFeatures:
        """Run the target over packed rows (documents separated by restarting ``position_ids``)."""
        if self.per_document:
            return self._features_per_document(input_ids, position_ids)
        return self._forward(input_ids, position_ids)

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> TargetFeatures:
        outputs = getattr(self.model, self.model.base_model_prefix)(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, output_hidden_states=True
        )
        hidden_states = outputs.hidden_states
        context = torch.cat([hidden_states[i + 1] for i in self.target_layer_ids], dim=-1)
        return TargetFeatures(context_features=context, final_hidden=outputs.last_hidden_state)

    def _features_per_document(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> TargetFeatures:
        """Each document of each row run alone (a document starts where ``position_ids`` do not go on by one; every
        padding position is then a document of its own), the documents of one length in one batch."""
        starts = torch.ones_like(position_ids, dtype=torch.bool)
        starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
        by_length: dict[int, list[tuple[int, int, int]]] = {}
        for row in range(input_ids.shape[0]):
            bounds = [*starts[row].nonzero().flatten().tolist(), input_ids.shape[1]]
            for start, end in zip(bounds[:-1], bounds[1:], strict=False):
                by_length.setdefault(end - start, []).append((row, start, end))
        context = final = None
        for segments in by_length.values():
            part = self._forward(
                torch.stack([input_ids[r, s:e] for r, s, e in segments]),
                torch.stack([position_ids[r, s:e] for r, s, e in segments]),
            )
            if context is None:
                context = part.context_features.new_empty((*input_ids.shape, part.context_features.shape[-1]))
                final = part.final_hidden.new_empty((*input_ids.shape, part.final_hidden.shape[-1]))
            for i, (r, s, e) in enumerate(segments):
                context[r, s:e], final[r, s:e] = part.context_features[i], part.final_hidden[i]
        return TargetFeatures(context_features=context, final_hidden=final)


def _checkpoint_files(name_or_path: str) -> tuple[dict[str, str], Callable[[str], str]]:
    """(weight name -> safetensors file name, file name -> local path) for a local directory or a hub id."""
    local = os.path.isdir(name_or_path)

    def fetch(filename: str) -> str:
        if local:
            return os.path.join(name_or_path, filename)
        from huggingface_hub import hf_hub_download

        return hf_hub_download(name_or_path, filename)

    try:
        index_path = fetch("model.safetensors.index.json")
        if not os.path.exists(index_path):
            raise FileNotFoundError(index_path)
        with open(index_path) as handle:
            return dict(json.load(handle)["weight_map"]), fetch
    except Exception:  # noqa: BLE001 - not sharded (or no index): a single model.safetensors
        single = fetch("model.safetensors")
        if not os.path.exists(single):
            raise FileNotFoundError(
                f"target {name_or_path!r} has no model.safetensors(.index.json); cache mode needs safetensors weights"
            ) from None
        from safetensors import safe_open

        with safe_open(single, "pt") as handle:
            return dict.fromkeys(handle.keys(), "model.safetensors"), fetch


class TargetHeads(nn.Module):
    """Config + input embedding + LM head of a target, without its decoder layers (docs/design/design.md §2.1).

    For training from an offline feature cache; ``from_pretrained`` reads only those tensors.

    Args:
        config: the target's transformers config.
        embed_tokens: the target's input embedding (the model's own module class, so Gemma's scale applies).
        lm_head: the target's LM head (sharing the embedding's weight when the head is tied).
        target_layer_ids: the decoder layers the cache holds features of; None for the default spread.
        num_draft_layers: how many layers the default spread picks when ``target_layer_ids`` is None.
    """

    def __init__(
        self,
        config,
        embed_tokens: nn.Embedding,
        lm_head: nn.Linear,
        target_layer_ids: list[int] | None = None,
        num_draft_layers: int = 1,
    ) -> None:
        super().__init__()
        self._config = config
        self.num_layers = config.num_hidden_layers
        self.target_layer_ids = resolve_target_layer_ids(self.num_layers, target_layer_ids, num_draft_layers)
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.requires_grad_(False)
        self.eval()

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        target_layer_ids: list[int] | None = None,
        num_draft_layers: int = 1,
        dtype: torch.dtype | str = "auto",
        trust_remote_code: bool = False,
    ) -> TargetHeads:
        from safetensors import safe_open
        from transformers import AutoConfig, AutoModelForCausalLM

        with loading("target", name_or_path):
            config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        check_target_supported(type(skeleton), config)  # what is trained here must decode (models.architectures)
        embedding, head = skeleton.get_input_embeddings().weight, skeleton.get_output_embeddings().weight
        names = {"embed": None, "head": None}
        for name, parameter in skeleton.named_parameters(remove_duplicate=False):
            if parameter is embedding and names["embed"] is None:
                names["embed"] = name
            if parameter is head and names["head"] is None:
                names["head"] = name
        tied = head is embedding
        weight_map, fetch = _checkpoint_files(name_or_path)

        def load(name: str) -> torch.Tensor:
            if name not in weight_map:
                raise KeyError(
                    f"target {name_or_path!r}: tensor {name!r} not found in its safetensors files "
                    "(renamed checkpoint keys?); train online instead of from a cache"
                )
            with safe_open(fetch(weight_map[name]), "pt") as handle:
                tensor = handle.get_tensor(name)
            return tensor if dtype == "auto" else tensor.to(dtype)

        embed_tokens = _input_embedding(skeleton, load(names["embed"]), name_or_path)
        if tied:
            head_weight = embed_tokens.weight
        elif names["head"] in weight_map:
            head_weight = nn.Parameter(load(names["head"]), requires_grad=False)
        else:
            raise KeyError(f"target {name_or_path!r}: LM head {names['head']!r} is not in its safetensors files")
        lm_head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False, device="meta")
        lm_head.weight = head_weight
        return cls(config, embed_tokens, lm_head, target_layer_ids, num_draft_layers)

    def train(self, mode: bool = True) -> TargetHeads:  # frozen, like the full target
        return super().train(False)

    @property
    def config(self):
        return self._config

    @property
    def hidden_size(self) -> int:
        return self._config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.embed_tokens.weight.shape[0]

    def features(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> TargetFeatures:
        raise RuntimeError(
            "this target was loaded without its decoder (cache mode): the batch must carry context_features and "
            "final_hidden from an offline cache (data.train_cache / data.val_cache)"
        )


def _input_embedding(skeleton: nn.Module, weight: torch.Tensor, name_or_path: str) -> nn.Module:
    """The meta ``skeleton``'s own input-embedding module holding ``weight`` (frozen): the same class as in the full
    model, so it embeds the same way (Gemma scales by sqrt(hidden) in its forward). Its non-persistent buffers (Gemma's
    ``embed_scale``) are not in the checkpoint; the model's own weight initialisation fills them, as ``from_pretrained``
    does (the weight is still on the meta device then, so nothing else is computed)."""
    module = skeleton.get_input_embeddings()
    buffers = [(owner, name) for owner in module.modules() for name, b in owner.named_buffers(recurse=False)]
    for owner, name in buffers:
        owner._buffers[name] = torch.empty_like(owner._buffers[name], device=weight.device)
    if buffers:
        skeleton._init_weights(module)
    module.weight = nn.Parameter(weight, requires_grad=False)
    unset = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if unset:
        raise ValueError(
            f"target {name_or_path!r}: the input embedding ({type(module).__name__}) has tensors {unset} that are "
            "neither in the checkpoint nor set by the model's initialisation; train online instead of from a cache"
        )
    return module


@torch.no_grad()
def embedding_scale(embed_tokens: nn.Module) -> float | None:
    """None when ``embed_tokens`` is the plain lookup ``weight[ids]`` the format assumes (checked on its first 64
    ids), else the factor it multiplies by (least squares; Gemma's sqrt(hidden_size), rounded to the weight's dtype)."""
    weight = embed_tokens.weight
    ids = torch.arange(min(64, weight.shape[0]), device=weight.device)
    looked_up, embedded = weight[ids].double(), embed_tokens(ids).double()
    if torch.equal(looked_up, embedded):
        return None
    return float((embedded * looked_up).sum() / (looked_up * looked_up).sum().clamp_min(1e-30))


def plain_lookup(embed_tokens: nn.Module) -> nn.Module:
    """``embed_tokens`` when it is a plain lookup, else an ``nn.Embedding`` sharing its weight (never copied): what
    ``DrafterConfig.block_embedding: lookup`` embeds block tokens with, as the speculators DSpark format does."""
    if embedding_scale(embed_tokens) is None:
        return embed_tokens
    plain = nn.Embedding(*embed_tokens.weight.shape, device="meta")
    plain.weight = embed_tokens.weight
    return plain


def rope_theta(config) -> float:
    """The rotary base of the draft layers, from the target's config across transformers versions.

    A single base (``rope_parameters["rope_theta"]`` in transformers 5, ``rope_theta`` before): that one. Bases per
    layer type (Gemma 3 in transformers 5: ``rope_parameters = {"sliding_attention": {...}, "full_attention": {...}}``):
    the full-attention layers' base, because every draft layer reads the whole context as the target's full layers do
    (docs/design/design.md §11); transformers 4 stored that one as ``rope_theta`` (the local one as ``rope_local_base_freq``).
    """
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        if "rope_theta" in params:
            return float(params["rope_theta"])
        per_type = {kind: p for kind, p in params.items() if isinstance(p, dict) and "rope_theta" in p}
        if "full_attention" in per_type:
            return float(per_type["full_attention"]["rope_theta"])
        if len(per_type) == 1:
            return float(next(iter(per_type.values()))["rope_theta"])
        if per_type:
            raise ValueError(
                f"the target's rope_parameters give bases per layer type {sorted(per_type)} but none for "
                "full_attention: the draft layers' rotary base is ambiguous"
            )
    theta = getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else 10_000.0


def final_logit_softcap(config) -> float | None:
    """The target's final logit soft-cap c (Gemma 2: logits = c·tanh(W h / c)), or None when it has none (Gemma 3)."""
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap else None
