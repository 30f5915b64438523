"""Draft attention: block queries read [target context features ; block tokens] as keys and values.

``BlockVisibility`` is the one description of the visibility rule, from which both backends (``sdpa``, ``flex``) are
built. Design: docs/design/design.md §2.2, §2.3."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from dspark_lightning.errors import OptionError
from dspark_lightning.models.sparse_attention import GroupedMask, grouped_attention

ATTENTION_BACKENDS = ("auto", "sdpa", "flex")


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, as in Qwen3."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables [..., head_dim] for integer positions (HF "rotate_half" layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, T, d]; cos/sin [b, T, d]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass
class BlockVisibility:
    """Everything the mask rule needs: anchors [b, A], their validity, per-position document ids [b, S].

    Padding positions carry document id -1 and are never visible. ``anchor_documents`` is the document of each
    anchor (-2 for invalid anchors, which therefore see only their own block).
    """

    anchor_positions: torch.Tensor
    anchor_documents: torch.Tensor
    context_documents: torch.Tensor
    block_size: int
    window: int | None = None  # sliding layers: context i visible only if i >= anchor - window

    @property
    def num_queries(self) -> int:
        return self.anchor_positions.shape[1] * self.block_size

    @property
    def context_length(self) -> int:
        return self.context_documents.shape[1]

    def dense(self) -> torch.Tensor:
        """Boolean mask [b, 1, Q, S + Q], True = may attend."""
        S, B = self.context_length, self.block_size
        anchors = self.anchor_positions.repeat_interleave(B, dim=1)  # [b, Q]
        docs = self.anchor_documents.repeat_interleave(B, dim=1)  # [b, Q]
        ctx_idx = torch.arange(S, device=anchors.device)
        context_visible = (self.context_documents[:, None, :] == docs[:, :, None]) & (
            ctx_idx[None, None, :] < anchors[:, :, None]
        )
        if self.window is not None:
            context_visible &= ctx_idx[None, None, :] >= anchors[:, :, None] - self.window
        block_id = torch.arange(self.num_queries, device=anchors.device) // B
        block_visible = (block_id[:, None] == block_id[None, :]).expand(anchors.shape[0], -1, -1)
        return torch.cat((context_visible, block_visible), dim=-1).unsqueeze(1)

    def build(self, backend: str):
        """The mask object for a resolved backend (``sdpa`` -> dense tensor, ``flex`` -> BlockMask)."""
        return self.block_mask() if backend == "flex" else self.dense()

    def block_mask(self):
        """The same rule as a FlexAttention ``BlockMask``."""
        from torch.nn.attention.flex_attention import create_block_mask

        S, B = self.context_length, self.block_size
        batch = self.anchor_positions.shape[0]
        pad = torch.full(
            (batch, self.num_queries), -3, dtype=self.context_documents.dtype, device=self.context_documents.device
        )
        kv_documents = torch.cat((self.context_documents, pad), dim=1)
        anchor_positions, anchor_documents, window = self.anchor_positions, self.anchor_documents, self.window

        def mask_mod(b, h, q_idx, kv_idx):
            block = q_idx // B
            in_context = (kv_idx < S) & (kv_documents[b, kv_idx] == anchor_documents[b, block])
            in_context = in_context & (kv_idx < anchor_positions[b, block])
            if window is not None:
                in_context = in_context & (kv_idx >= anchor_positions[b, block] - window)
            own_block = (kv_idx >= S) & ((kv_idx - S) // B == block)
            return in_context | own_block

        return create_block_mask(
            mask_mod, batch, None, self.num_queries, S + self.num_queries, device=self.anchor_positions.device
        )


@cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention_backend {backend!r}; expected one of {ATTENTION_BACKENDS}")
    if backend == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    return backend


class DraftAttention(nn.Module):
    """Qwen3-style grouped-query attention whose keys/values are [context features ; block tokens]."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rms_norm_eps: float,
        rope_theta: float,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise OptionError(f"model.drafter.num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, rms_norm_eps)

    def project_context(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (after k_norm and rotary, as attention uses them) and values [b, kv_heads, n, d] of inputs [b, n, H]."""
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))).transpose(1, 2)
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        cos, sin = rotary_cos_sin(positions, self.head_dim, self.rope_theta, k.dtype)
        return apply_rotary(k, cos, sin), v

    def forward(
        self,
        block_hidden: torch.Tensor,
        context: torch.Tensor | None,
        block_positions: torch.Tensor,
        context_positions: torch.Tensor | None,
        attn_mask=None,
        context_cache=None,
        layer_index: int = 0,
        window: int | None = None,
    ) -> torch.Tensor:
        """block_hidden [b, Q, H], context [b, S, H] -> [b, Q, H].

        ``attn_mask`` comes from ``BlockVisibility.build(backend)``: a dense boolean tensor (SDPA), a FlexAttention
        ``BlockMask`` (flex), a ``GroupedMask`` (the training forward's dense mask cut into query groups,
        ``sparse_attention.py``), or ``None`` (every query sees every key). With a ``DraftContextCache`` the context
        keys/values come from it (``context`` and ``context_positions`` are ignored), the last ``window`` of them
        for a sliding layer.
        """
        q = self.q_norm(self.q_proj(block_hidden).unflatten(-1, (self.num_heads, self.head_dim))).transpose(1, 2)
        cos_q, sin_q = rotary_cos_sin(block_positions, self.head_dim, self.rope_theta, q.dtype)
        q = apply_rotary(q, cos_q, sin_q)
        if context_cache is not None:
            k, v = context_cache.layer_view(layer_index, *self.project_context(block_hidden, block_positions), window)
        else:
            k, v = self.project_context(
                torch.cat((context, block_hidden), dim=1), torch.cat((context_positions, block_positions), dim=1)
            )

        # under autocast the fp32 norm weights promote q/k to fp32 while v stays bf16: give all three one dtype
        q, k = q.to(v.dtype), k.to(v.dtype)
        gqa = self.num_heads != self.num_kv_heads
        if isinstance(attn_mask, GroupedMask):  # the training forward's dense mask, group by group
            out = grouped_attention(q, k, v, attn_mask, gqa)
        elif attn_mask is not None and not isinstance(attn_mask, torch.Tensor):  # a FlexAttention BlockMask
            from torch.nn.attention.flex_attention import flex_attention

            attend = _compiled_flex_attention() if q.device.type == "cuda" else flex_attention
            out = attend(q, k, v, block_mask=attn_mask, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).flatten(2))
