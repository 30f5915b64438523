"""A greedy output that differs from ``generate``: a float tie, or a bug.

Two kernels (a batched verify forward and ``generate``'s one-row forward) sum in different orders, so where the
target's top logits are within the dtype's resolution either token is the greedy one. ``classify_difference`` looks at
the first differing token: a tie when both tokens there are within ``TIE_ULPS`` units in the last place of the top
logit, in the dtype the target runs in; anything else is an error.
"""

from __future__ import annotations

import math

import torch

# how many units in the last place (of the top logit, in the target's dtype) two logits may differ and still tie:
# the verify and generate forwards round differently in every layer, so the final logits can move by a few ulps
TIE_ULPS = 4


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s numbers at ``value`` (its resolution there; the smallest normal below it)."""
    info = torch.finfo(dtype)
    magnitude = max(abs(value), info.tiny)
    return info.eps * 2.0 ** math.floor(math.log2(magnitude))


def first_difference(reference: torch.Tensor, output: torch.Tensor) -> int | None:
    """The first position where two (1, n) token sequences differ (the shorter one's end counts); None if equal."""
    a, b = reference.flatten(), output.flatten()
    length = min(len(a), len(b))
    unequal = (a[:length] != b[:length]).nonzero()
    if len(unequal):
        return int(unequal[0])
    return None if len(a) == len(b) else length


@torch.no_grad()
def classify_difference(model, reference: torch.Tensor, output: torch.Tensor, prompt_length: int) -> dict:
    """Why ``output`` (speculative) differs from ``reference`` (``generate``), both (1, n) with the same prompt:
    ``{"kind": "tie" | "error", "position", "gap", "tolerance", "ulps"}``. The target (a causal LM) runs once over
    the reference up to the first differing token; ``gap`` is its top-1 minus the speculative token's logit there."""
    position = first_difference(reference, output)
    if position is None:
        raise ValueError("classify_difference: the two outputs are equal")
    record = {"position": position - prompt_length, "gap": None, "tolerance": None, "ulps": None}
    if position < prompt_length or position >= min(reference.shape[-1], output.shape[-1]):
        return {"kind": "error", **record}  # a changed prompt, or one output stops early: no tie explains that
    prefix = reference[..., :position].reshape(1, -1)
    logits = model(input_ids=prefix, attention_mask=torch.ones_like(prefix)).logits[0, -1]
    dtype = logits.dtype
    logits = logits.float()
    top = float(logits.max())
    drafted, expected = int(output.flatten()[position]), int(reference.flatten()[position])
    gap = top - float(logits[drafted])
    tolerance = TIE_ULPS * ulp(top, dtype)
    record.update(gap=gap, tolerance=tolerance, ulps=gap / ulp(top, dtype))
    # both tokens within the tolerance of the top, not "the top two": bf16 rounds several logits to the same value,
    # and topk(2) would then name two of them arbitrarily
    tie = gap <= tolerance and top - float(logits[expected]) <= tolerance
    return {"kind": "tie" if tie else "error", **record}
