"""The drafter's projected context for a growing prefix, kept across decoding steps (``DraftContextCache``).

Design: docs/design/design.md §8.1."""

from __future__ import annotations

import torch


class DraftContextCache:
    """Cached drafter context for ``batch`` rows sharing one prefix length (``length`` tokens).

    Per prefix token the cache holds the fused target features (``fc`` + ``hidden_norm``) and, for every draft layer,
    that token's context key (after ``k_norm`` and rotary, exactly as the layer uses it) and value. ``extend``
    projects only the new tokens; ``crop`` drops a suffix, like ``DynamicCache.crop`` does for the target. A draft
    step then costs the block's own projections plus attention over the cached keys, instead of re-projecting the
    whole prefix. Buffers grow by doubling, and each layer's buffers keep room after the prefix where a draft step
    writes the block's keys/values: attention reads one contiguous [prefix ; block] view without concatenating (and
    copying) the prefix every step.

    Args:
        backbone (DFlashBackbone): the drafter's ``DFlashBackbone`` whose ``fc``, norms and key/value projections fill the cache.
        batch: rows decoded together (they share one prefix length).
        device (torch.device | str | None): device of the buffers.
        dtype: dtype of the buffers.
        capacity: positions reserved up front (prefix + one draft block); grown by doubling when exceeded.
    """

    def __init__(self, backbone, batch: int = 1, device=None, dtype: torch.dtype = torch.float32, capacity: int = 256):
        config = backbone.config
        self.backbone = backbone
        self.batch, self.device, self.dtype = batch, device, dtype
        self.length = 0
        self._capacity = 0
        self._kv_shape = (config.num_kv_heads, config.head_dim)
        self.fused = torch.empty(batch, 0, config.hidden_size, device=device, dtype=dtype)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._reserve(capacity)

    def _reserve(self, needed: int) -> None:
        """Make room for ``needed`` positions (prefix + a draft block), growing the buffers by doubling."""
        if needed <= self._capacity:
            return
        capacity = max(needed, 2 * self._capacity, 16)
        heads, head_dim = self._kv_shape

        def grown(old: torch.Tensor, dim: int) -> torch.Tensor:
            shape = list(old.shape)
            shape[dim] = capacity
            new = old.new_empty(shape)
            new.narrow(dim, 0, self.length).copy_(old.narrow(dim, 0, self.length))
            return new

        hidden = self.backbone.config.hidden_size
        if self._capacity == 0:
            self.fused = torch.empty(self.batch, capacity, hidden, device=self.device, dtype=self.dtype)
            shape = (self.batch, heads, capacity, head_dim)
            num_layers = len(self.backbone.layers)
            self.keys = [torch.empty(shape, device=self.device, dtype=self.dtype) for _ in range(num_layers)]
            self.values = [torch.empty(shape, device=self.device, dtype=self.dtype) for _ in range(num_layers)]
        else:
            self.fused = grown(self.fused, 1)
            self.keys = [grown(k, 2) for k in self.keys]
            self.values = [grown(v, 2) for v in self.values]
        self._capacity = capacity

    @torch.no_grad()
    def extend(self, features: torch.Tensor, positions: torch.Tensor | None = None) -> None:
        """Append target features [b, n, num_context_layers * H] of the next n prefix tokens.

        ``positions`` [b, n] are their rotary positions (default: ``length .. length + n - 1``).
        """
        if features.ndim != 3 or features.shape[0] != self.batch:
            raise ValueError(f"features must be [{self.batch}, n, width], got {tuple(features.shape)}")
        n = features.shape[1]
        if n == 0:
            return
        if positions is None:
            positions = torch.arange(self.length, self.length + n, device=features.device).expand(self.batch, n)
        start, end = self.length, self.length + n
        self._reserve(end)
        fused = self.backbone.fuse_context(features.to(self.dtype))
        self.fused[:, start:end] = fused
        for layer, keys, values in zip(self.backbone.layers, self.keys, self.values):
            k, v = layer.self_attn.project_context(fused, positions)
            keys[:, :, start:end] = k
            values[:, :, start:end] = v
        self.length = end

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens (a negative value removes that many from the end, as in transformers)."""
        if length < 0:
            length = self.length + length
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a drafter context of {self.length} tokens to {length}")
        self.length = length  # the buffers beyond ``length`` are overwritten by the next extend

    def fused_context(self) -> torch.Tensor:
        """[b, length, H]: the fused target features of the prefix."""
        return self.fused[:, : self.length]

    def layer_view(self, index: int, block_keys: torch.Tensor, block_values: torch.Tensor, window: int | None = None):
        """Layer ``index``'s [prefix ; block] keys and values [b, heads, length + Q, d], the block written after the
        prefix (into the reserved room; the cache itself still ends at ``length``). ``window``: only the last
        ``window`` prefix tokens (a sliding layer; the block's anchor comes right after the prefix)."""
        q = block_keys.shape[2]
        self._reserve(self.length + q)
        end = self.length + q
        keys, values = self.keys[index], self.values[index]
        keys[:, :, self.length : end] = block_keys
        values[:, :, self.length : end] = block_values
        start = max(0, self.length - window) if window is not None else 0
        return keys[:, :, start:end], values[:, :, start:end]
