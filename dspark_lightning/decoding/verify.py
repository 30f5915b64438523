"""The verification rule of one speculative step: which drafted tokens the target accepts, and the token it adds.

Greedy (temperature 0): the longest prefix equal to the target's argmax. Sampling: accept d_i with probability
min(1, p(d_i) / q(d_i)), else resample from (p - q)_+ normalised and stop (standard speculative rejection sampling:
the output distribution is exactly the target's). The target's own next token is always emitted.
"""

from __future__ import annotations

import torch

from dspark_lightning.dtypes import at_least_float32


def verify_block(
    drafted: torch.Tensor,
    q: torch.Tensor | None,
    logits,
    drafter,
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Accept a prefix of ``drafted`` given the target logits [n+1, V] of [x, d_1..d_n]; return (#accepted, next).

    ``q`` [n, Vd]: the draft distribution of each slot (read only when sampling); q and p are compared in float32 at
    least. ``logits`` is a tensor or anything whose ``[i]`` is row i: rows are read in order, each once, and only up
    to the first rejection. Of ``drafter`` only ``d2t`` is read (the draft vocabulary's target ids, None when it is
    the target's).
    """
    n = drafted.shape[0]
    drafts = drafted.tolist()
    if temperature == 0:
        for i in range(n):
            token = int(logits[i].argmax())
            if token != drafts[i]:
                return i, token
        return n, int(logits[n].argmax())
    d2t = drafter.d2t
    for i in range(n):
        # at least float32 whatever the model's dtype: bf16 probabilities would round p / q by up to 2^-8
        p = torch.softmax(at_least_float32(logits[i]) / temperature, dim=-1)
        q_target = torch.zeros_like(p)
        if d2t is None:
            q_target[: q.shape[-1]] = q[i].to(p.dtype)
        else:
            q_target[d2t] = q[i].to(p.dtype)
        token = drafts[i]
        ratio = p[token] / q_target[token].clamp_min(1e-30)
        if torch.rand((), generator=generator) < ratio:
            continue
        residual = (p - q_target).clamp_min(0)
        if residual.sum() <= 0:  # p == q: any rejection is measure-zero; fall back to p
            residual = p
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    p = torch.softmax(at_least_float32(logits[n]) / temperature, dim=-1)
    return n, int(torch.multinomial(p, 1, generator=generator))
