"""``TargetCache``: the target's cache in the layer layout ``generate`` uses, with a crop that rolls back a rejected
tail: sliding-window layers through transformers' rollback mode (trimmed to W - 1 entries only after each crop), full
layers everywhere as the fallback, and linear-attention layers keeping their recurrent state after each of a verify's last
tokens, so a crop restores the one after the accepted prefix. Design: docs/design/design.md §8.6; hybrid targets:
docs/guides/supported_targets.md."""

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
            cache, special = DynamicCache(), []  # full layers: lossless, unbounded (design.md §8.6)
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
