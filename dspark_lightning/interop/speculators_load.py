"""Load a directory in the speculators DSpark (or DFlash) format back into a ``DSparkDrafter``.

The format and the config conversion are ``interop/speculators_format.py``; this module reads the tensors,
maps the draft vocabulary and the CandidateSelector layout back to ours, and shares the target's embedding and LM
head with the drafter (never copied).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from dspark_lightning.interop.speculators_format import (
    CONFIG_NAME,
    DRAFT_ROW_TENSORS,
    SELECTOR_PREFIX,
    VERIFIER_KEYS,
    WEIGHTS_NAME,
    _check_supported,
    _format_key,
    drafter_configs,
    markov_head_config,
    recorded_verifier,
)
from dspark_lightning.models import DraftVocab, DSparkDrafter, FrozenTarget, MarkovHeadConfig
from dspark_lightning.models.target import final_logit_softcap, plain_lookup
from dspark_lightning.selector.convert import read_candidate_selector


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


def _resolve_target(target, config: dict, layer_ids: list[int], trust_remote_code: bool) -> FrozenTarget:
    if isinstance(target, FrozenTarget):
        return target if target.target_layer_ids == layer_ids else FrozenTarget(target.model, layer_ids)
    if isinstance(target, torch.nn.Module):
        return FrozenTarget(target, layer_ids)
    if target is None:
        target = recorded_verifier(config)
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
        target: a ``FrozenTarget``, a Hugging Face causal LM, a path / hub id, or None for the recorded verifier
            (``recorded_verifier``: its local directory when it is on this machine, else its hub id).
            Its embedding and LM head are shared with the drafter (never copied); an embedding that is no plain
            lookup (Gemma's, scaled) is read as the format reads it, as a plain lookup of the same weight. The
            drafter is float32; for bf16 inference load the target in bf16 and cast the drafter with
            ``.to(torch.bfloat16)``.
        return_target: also return the ``FrozenTarget`` (with the export's target layer ids) that feeds the drafter.
    """
    config, tensors = read_exported(path)
    model_type = config.get("speculators_model_type")
    if model_type not in ("dspark", "dflash"):
        raise ValueError(f"{path}: speculators_model_type {model_type!r} is not 'dspark' or 'dflash'")
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
        markov = MarkovHeadConfig.selector(int(predecessor.shape[1]))
    else:
        markov = markov_head_config(config)
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

    backbone, drafter_config = drafter_configs(config, layer_ids, markov, train_lm_head)
    softcap = final_logit_softcap(target.config)  # the teacher's logits are the target's (soft-capped on Gemma 2)
    # the format's draft layers read a plain lookup of the verifier's embedding (Gemma's scale is not applied)
    embed_tokens = plain_lookup(target.embed_tokens)
    drafter = DSparkDrafter(drafter_config, backbone, embed_tokens, target.lm_head, vocab, softcap)

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
