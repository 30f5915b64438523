"""The DFlash block-parallel draft backbone: fused target context, Qwen3-style draft layers.

Design: docs/design/design.md §2 (sliding-window draft layers: §2.2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark_lightning.errors import OptionError
from dspark_lightning.models.anchors import Anchors  # noqa: F401 - measuring/identity.py still imports it from here
from dspark_lightning.models.attention import ATTENTION_BACKENDS, DraftAttention, RMSNorm


def default_target_layer_ids(num_target_layers: int, num_layers: int) -> list[int]:
    """Target decoder layers whose outputs feed the drafter: ``num_layers`` of them spread over depth."""
    if num_layers < 1:
        raise ValueError(f"need at least one target layer, got {num_layers}")
    if num_layers > num_target_layers:
        raise ValueError(f"cannot pick {num_layers} distinct layers from a {num_target_layers}-layer target")
    if num_layers == 1:
        return [num_target_layers // 2]
    start = 1 if num_target_layers > num_layers else 0
    end = max(num_target_layers - 3, start + num_layers - 1)
    end = min(end, num_target_layers - 1)
    return [round(start + i * (end - start) / (num_layers - 1)) for i in range(num_layers)]


LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass
class BackboneConfig:
    """Shape of the draft backbone. ``from_target`` fills what a config file leaves as None."""

    hidden_size: int
    num_layers: int = 1
    num_heads: int = 8
    num_kv_heads: int = 8
    head_dim: int = 64
    intermediate_size: int = 1024
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    num_context_layers: int = 1
    attention_backend: str = "auto"
    sliding_window: int | None = None
    layer_types: list[str] | None = None

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise OptionError(f"model.drafter.num_layers must be >= 1, got {self.num_layers}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise OptionError(
                f"model.drafter.sliding_window must be >= 1 (or None for full attention), got {self.sliding_window}"
            )
        if self.layer_types is None:  # a window without layer types: every layer slides
            self.layer_types = ["sliding_attention" if self.sliding_window else "full_attention"] * self.num_layers
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_layers:
            raise OptionError(
                f"model.drafter.layer_types has {len(self.layer_types)} entries, "
                f"expected num_layers = {self.num_layers}"
            )
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise OptionError(f"model.drafter.layer_types: unknown {unknown}; expected entries of {LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise OptionError("model.drafter.layer_types names sliding_attention layers but sliding_window is not set")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise OptionError(
                f"model.drafter.attention_backend: unknown {self.attention_backend!r}; "
                f"expected one of {ATTENTION_BACKENDS}"
            )

    def layer_window(self, index: int) -> int | None:
        """The context window of draft layer ``index`` (None = full attention)."""
        return self.sliding_window if self.layer_types[index] == "sliding_attention" else None


class SwiGLU(nn.Module):
    """The Qwen3 MLP: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftDecoderLayer(nn.Module):
    """Pre-norm Qwen3 decoder layer whose attention also reads the fused target context."""

    def __init__(self, config: BackboneConfig, layer_index: int = 0) -> None:
        super().__init__()
        # a sliding layer sees the context positions i >= anchor - window (its own block always)
        self.sliding_window = config.layer_window(layer_index)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DraftAttention(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.rms_norm_eps,
            config.rope_theta,
        )
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x, context, block_positions, context_positions, attn_mask, context_cache=None, layer_index=0):
        window = self.sliding_window
        if isinstance(attn_mask, dict):  # one mask per layer type (built by the drafter when some layers slide)
            attn_mask = attn_mask["sliding_attention" if window else "full_attention"]
        elif window and attn_mask is None and context is not None:
            # no mask = one block after the whole context (inference): the window is its last ``window`` tokens
            context, context_positions = context[:, -window:], context_positions[:, -window:]
        attended = self.self_attn(
            self.input_layernorm(x),
            context,
            block_positions,
            context_positions,
            attn_mask,
            context_cache,
            layer_index,
            window,
        )
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashBackbone(nn.Module):
    """Fused target context + draft layers + final norm: block embeddings -> draft hidden states.

    docs/design/design.md §2.

    Args:
        config: the draft backbone's shape (``BackboneConfig``): hidden size, layers, heads, rotary base, the number
            of target context layers fused by ``fc``, the attention backend and the sliding-window layer types.
    """

    def __init__(self, config: BackboneConfig) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.num_context_layers * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def fuse_context(self, context_features: torch.Tensor) -> torch.Tensor:
        """[b, S, n*H] concatenated target hidden states -> [b, S, H] context for every layer."""
        expected = self.fc.in_features
        if context_features.shape[-1] != expected:
            raise ValueError(
                f"context features have width {context_features.shape[-1]}, expected {expected} "
                f"({self.config.num_context_layers} target layers x hidden {self.config.hidden_size})"
            )
        return self.hidden_norm(self.fc(context_features))

    def forward(
        self,
        block_embeddings: torch.Tensor,
        context: torch.Tensor,
        block_positions: torch.Tensor,
        context_positions: torch.Tensor,
        attn_mask=None,
        context_cache=None,
    ) -> torch.Tensor:
        """block_embeddings [b, Q, H], fused context [b, S, H] -> draft hidden [b, Q, H].

        With a ``DraftContextCache`` (``models.context_cache``) the layers read their context keys/values from it and
        ``context`` / ``context_positions`` are ignored (pass None).
        """
        x = block_embeddings
        for index, layer in enumerate(self.layers):
            x = layer(x, context, block_positions, context_positions, attn_mask, context_cache, index)
        return self.norm(x)
