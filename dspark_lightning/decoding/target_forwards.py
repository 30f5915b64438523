"""The target's side of speculative decoding: its prompt forward and verify forwards over one KV cache.

Both forwards return the target's logits and the features of the layers that feed the drafter. The verify forward
runs the LM head only on the rows verification reads (up to the first rejection): the decoder once over the block,
the vocabulary-sized head row by row; the prompt forward keeps its last row only, as ``generate`` does. The KV cache
is ``generate``'s layout, rolled back after each verify (``decoding.target_cache``: sliding-window layers included).
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from dspark_lightning.decoding.kernels import PackedLinears
from dspark_lightning.decoding.target_cache import TargetCache
from dspark_lightning.models.architectures import check_target_supported
from dspark_lightning.models.drafter import DSparkDrafter


def causal_lm(target):
    """The Hugging Face causal LM behind ``target`` (a ``FrozenTarget`` or the model itself)."""
    return getattr(target, "model", target) if not hasattr(target, "generate") else target


def _cache_keyword(forward) -> str:
    """What a forward calls its KV cache argument (``cache`` in newer transformers)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


class TargetForwards:
    """The target's forwards of one decode, over its KV cache (``crop`` drops rejected tokens from it).

    ``target`` is a ``FrozenTarget`` or a Hugging Face causal LM (then ``drafter.config.target_layer_ids`` says which
    layers feed the drafter). ``packed_verify`` runs the verify forwards' decoder linears and LM head on oneDNN-packed
    weights (``decoding.kernels``); the prompt forward keeps the default kernels, tuned for long inputs.
    """

    def __init__(self, target, drafter: DSparkDrafter, packed_verify: bool = False) -> None:
        self.model = model = causal_lm(target)
        # a one-line refusal before any forward (of the model itself when torch.compile wrapped it)
        check_target_supported(type(getattr(model, "_orig_mod", model)), model.config)
        layer_ids = getattr(target, "target_layer_ids", None) or drafter.config.target_layer_ids
        if layer_ids is None:
            raise ValueError("the drafter's config has no target_layer_ids and the target does not provide them")
        self.layer_ids = list(layer_ids)
        self.target_cache = TargetCache(model, drafter.block_size + 1)
        self.cache = self.target_cache.cache
        self.cache_keyword = _cache_keyword(model.forward)
        self.body = getattr(model, getattr(model, "base_model_prefix", ""), None)
        self.head = model.get_output_embeddings()
        self.body_cache_keyword = _cache_keyword(self.body.forward if self.body is not None else model.forward)
        self.verify_kernels = (
            PackedLinears(self.body if self.body is not None else model, drafter.block_size + 1)
            if packed_verify
            else contextlib.nullcontext()
        )
        self.packed_verify, self.block_rows = packed_verify, drafter.block_size + 1
        self.head_kernels = None  # the packed head, set by the prefill when the verify forward applies the head
        # set by the prefill: True when logits == head(final hidden state), checked on the real output; a model that
        # post-processes its logits (soft-capping, a logit scale) keeps the full-logits verify path
        self.own_head = False

    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt forward [1, T]: the last row's logits [V] (as ``generate`` computes them) and every row's
        features [1, T, F]."""
        model, body, head = self.model, self.body, self.head
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None]
        keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        final = []
        hook = body.register_forward_hook(lambda _m, _a, out: final.append(out[0])) if body is not None else None
        try:
            out = model(
                input_ids=tokens, position_ids=positions, use_cache=True, output_hidden_states=True,
                **keep, **{self.cache_keyword: self.cache},
            )  # fmt: skip
        finally:
            if hook is not None:
                hook.remove()
        self.target_cache.prompt_done()
        logits = out.logits[0, -1].float()
        self.own_head = (
            bool(final) and head is not None and torch.allclose(head(final[0][:, -1:])[0, -1].float(), logits)
        )
        if self.own_head and self.packed_verify and isinstance(head, torch.nn.Linear):
            # all n+1 rows of a verify forward in less than one default row's time (SmolLM2, 2 threads: 9 packed
            # rows 17.0 ms, one default row 20.8 ms; benchmarks/decoding/results/lm_head.md)
            self.head_kernels = PackedLinears(head, self.block_rows)
        return logits, self._features(out)

    def verify(self, tokens: torch.Tensor, start: int):
        """The verify forward over [x, d_1..d_n] at positions ``start``..: (logits rows, features [1, n+1, F]).

        With the model's own head on the default kernels the rows are computed on demand (``_RowLogits``):
        verification reads rows in order and stops at the first rejection, and on a CPU one vocabulary-sized head row
        costs as much as several decoder layers. On packed kernels the head runs once over every row instead.
        """
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)[None]
        kwargs = dict(input_ids=tokens, position_ids=positions, use_cache=True, output_hidden_states=True)
        with self.verify_kernels:
            if self.own_head:
                out = self.body(**kwargs, **{self.body_cache_keyword: self.cache})
            else:
                out = self.model(**kwargs, **{self.cache_keyword: self.cache})
        if self.own_head and self.head_kernels is not None:
            with self.head_kernels:
                logits = self.head(out.last_hidden_state[0]).float()
        elif self.own_head:
            logits = _RowLogits(self.head, out.last_hidden_state[0])  # head rows on the default kernels, on demand
        else:
            logits = out.logits[0].float()
        return logits, self._features(out)

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens in the KV cache (called after every verify forward)."""
        self.target_cache.crop(length)

    def _features(self, out) -> torch.Tensor:
        return torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)


class _RowLogits:
    """The target logits of one verify forward, row i = ``head(hidden[i])`` computed when read."""

    def __init__(self, head, hidden: torch.Tensor) -> None:
        self.head, self.hidden = head, hidden

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.head(self.hidden[i : i + 1])[0].float()
