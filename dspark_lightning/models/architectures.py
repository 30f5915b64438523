"""Which targets the decoding loop and the feature extraction can serve, from the model class and its config:
``check_target_supported`` raises a one-line ``UnsupportedError`` (model type and reason) before decoding or the first
step of ``fit`` / ``cache``; recurrent layers are accepted only for the types whose rollback is tested
(``ROLLBACK_TESTED``), and ``carries_recurrent_state`` says when packed rows run one document at a time.
The matrix and the refusals: docs/guides/supported_targets.md."""

from __future__ import annotations

import inspect
import sys

from dspark_lightning.errors import UnsupportedError

# recurrent model types whose decoding equals ``generate`` in every mode (tests/integration/test_architecture_matrix.py)
ROLLBACK_TESTED = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
_ATTENTION_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer", "DummyLayer")
_RECURRENT_LAYERS = ("LinearAttentionLayer", "LinearAttentionAndFullAttentionLayer",
                     "LinearAttentionAndSlidingWindowAttentionLayer")  # fmt: skip


def _cache_layer_names(config) -> list[str]:
    """The class names of the layers of the cache ``generate`` builds for ``config`` (``DynamicCache(config=...)``)."""
    from transformers import DynamicCache

    return [type(layer).__name__ for layer in DynamicCache(config=config).layers]


def _text_model_type(config) -> str:
    """The decoder's model type: a Qwen3.5 checkpoint (``qwen3_5``, with a vision tower) decodes as ``qwen3_5_text``."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return text.model_type


def unsupported_reason(model_class: type, config) -> str | None:
    """Why a target of ``model_class`` with ``config`` cannot be decoded or trained against here, or None."""
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model; the drafter needs a decoder-only causal LM"
    supports_cache = getattr(model_class, "_supports_default_dynamic_cache", None)
    if supports_cache is not None and not supports_cache():
        return (
            "it keeps its own cache class, not transformers' DynamicCache, which the decoding loop rolls back after "
            "a rejected draft"
        )
    if "position_ids" not in inspect.signature(model_class.forward).parameters:
        return "its forward takes no position_ids, which packed training and the verify forwards pass"
    try:
        names = _cache_layer_names(config)
    except Exception as error:  # noqa: BLE001 - any failure here means generate's own cache cannot be built either
        return f"transformers cannot build its cache from the config ({type(error).__name__}: {error})"
    unknown = sorted({name for name in names if name not in _ATTENTION_LAYERS + _RECURRENT_LAYERS})
    if unknown:
        return (
            f"its cache has {', '.join(unknown)} layers, which the decoding loop cannot roll back after a rejected "
            "draft (it knows full, sliding-window and tested linear-attention layers)"
        )
    if any(name in _RECURRENT_LAYERS for name in names) and _text_model_type(config) not in ROLLBACK_TESTED:
        source = inspect.getsource(sys.modules[model_class.__module__])
        how = (
            "the rollback of its recurrent layers is untested here"
            if "get_recurrent_states_to_keep" in source
            else "its recurrent layers keep no per-token states (transformers' recurrent_states_to_keep)"
        )
        return f"{how}, so a rejected draft could leave a wrong state (tested: {', '.join(ROLLBACK_TESTED)})"
    return None


def check_target_supported(model_class: type, config) -> None:
    """Raise a one-line ``UnsupportedError`` when the target cannot be served (see the module docstring)."""
    reason = unsupported_reason(model_class, config)
    if reason is not None:
        raise UnsupportedError(
            f"target model type {config.model_type!r} ({model_class.__name__}) is not supported: {reason}"
        )


def check_config_supported(config) -> None:
    """``check_target_supported`` for the causal-LM class transformers maps ``config`` to, before any weight is
    loaded; a config it does not map (remote code) is checked once its model is built."""
    from transformers import AutoModelForCausalLM

    model_class = AutoModelForCausalLM._model_mapping.get(type(config), None)
    if model_class is not None:
        check_target_supported(model_class, config)


def carries_recurrent_state(config) -> bool:
    """True when some layer keeps a recurrent state across tokens (linear attention, convolution): position ids that
    restart do not reset it, so documents packed in one row would leak into each other."""
    try:
        names = _cache_layer_names(config)
    except Exception:  # noqa: BLE001 - a config transformers cannot build a cache for: the support check names it
        return False
    return any(name in _RECURRENT_LAYERS for name in names)
