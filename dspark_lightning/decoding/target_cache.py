"""The target's KV cache in speculative decoding: the layer layout ``generate`` uses, and a crop that can roll back.

A verify forward appends n+1 tokens and a rejection removes up to n of them again. A full-attention layer keeps every
entry, so removing a suffix restores exactly the cache of the accepted prefix. A sliding-window layer (Gemma 2/3,
Mistral; transformers' ``DynamicSlidingWindowLayer``, window W) normally keeps only its last W - 1 entries after each
update: once a verify forward has pushed the oldest ones out, cropping its rejected tail cannot bring them back, and
the next forward would attend to a window with a hole (``docs/design/design.md §8.6``).

``TargetCache`` builds the cache ``generate`` builds (``DynamicCache(config=...)``: full layers for full attention,
sliding layers holding W - 1 entries for sliding attention) and, once the prompt is in, switches its sliding layers
to transformers' own rollback mode (``activate_past_recording``): an update then keeps every entry until the next
``crop``, which removes the rejected tail and only then trims the layer back to its last W - 1 entries. Between
steps a sliding layer therefore holds the positions ``generate``'s cache holds after the same tokens, during a verify
forward W - 1 + n + 1 entries, and attention is masked by absolute position (``kv_offset``) in both cases.

Where the installed transformers has a layer that trims itself but has no such mode, the cache falls back to full
layers everywhere (``DynamicCache()``): the sliding-window mask is then computed from absolute positions over
the whole prefix, which is the same attention with the out-of-window keys masked instead of dropped (lossless, but
memory and attention grow with the prefix on every layer).
"""

from __future__ import annotations


def _needs_rollback_mode(layer) -> bool:
    """A layer that drops old entries by itself (anything but a plain full-attention ``DynamicLayer``)."""
    from transformers.cache_utils import DynamicLayer

    return type(layer) is not DynamicLayer


class TargetCache:
    """One decode's target KV cache: pass ``.cache`` to the forwards, call ``prompt_done`` after the prompt forward
    and ``crop(length)`` after every verify forward (also when nothing was rejected: it trims the sliding layers)."""

    def __init__(self, model, verify_rows: int | None = None) -> None:
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)  # the layout generate uses (sliding layers where the model has them)
        special = [layer for layer in cache.layers if _needs_rollback_mode(layer)]
        if not all(hasattr(layer, "activate_past_recording") for layer in special):
            cache, special = DynamicCache(), []  # full layers: lossless, unbounded (module docstring)
        self.cache = cache
        self.rollback = bool(special)  # some layer trims itself: record the past, crop after every verify
        # a linear-attention layer (Qwen3-Next) keeps the recurrent state after each of a verify forward's last
        # ``verify_rows`` tokens, so crop can restore the one after the accepted tokens (None crashed in transformers)
        self.verify_rows = verify_rows

    def prompt_done(self) -> None:
        """Switch the sliding layers to rollback mode. Not before the prompt forward: in that mode a layer keeps all
        it is given until the next crop, and the prompt would be held whole once (transformers' ``generate`` makes the
        same choice for its assistant caches)."""
        if self.rollback:
            self.cache.activate_past_recording(recurrent_states_to_keep=self.verify_rows)

    def length(self) -> int:
        """Tokens the cache covers (a sliding layer counts every token it has seen, not the entries it holds)."""
        return self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens. A negative ``crop`` (remove this many) is the form every layer type
        accepts in transformers 4.x and 5.x; with sliding layers it runs even when nothing is removed, to trim them
        back to W - 1 entries."""
        surplus = self.length() - length
        if surplus < 0:
            raise ValueError(f"cannot crop the target's KV cache to {length} tokens: it covers {self.length()}")
        if surplus > 0 or self.rollback:
            self.cache.crop(-surplus)
