"""Block-sparse SDPA for the training forward: skip the context keys that no query of a group can see (exact).

Design: docs/design/design.md §2.3 and docs/design/training_step.md §4."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

GROUP_QUERIES = 32  # queries per group (rounded to whole blocks): small enough to follow the anchors' stretches


@dataclass
class GroupedMask:
    """A dense boolean mask [b, 1, Q, S + Q] over a (compacted) context of S positions, cut into query groups
    (q0, q1, c0, c1): queries q0:q1 attend to context keys c0:c1 and to block keys S + q0 : S + q1."""

    dense: torch.Tensor
    groups: list[tuple[int, int, int, int]]


def _plan(dense: torch.Tensor, block_size: int, group_queries: int) -> list[tuple[int, int, int, int]]:
    Q = dense.shape[-2]
    S = dense.shape[-1] - Q
    size = max(1, group_queries // block_size) * block_size
    starts = range(0, Q, size)
    seen = dense[..., :S].flatten(0, -3).any(0)  # [Q, S]: some row sees (query, key)
    if not S:
        return [(q0, min(q0 + size, Q), 0, 0) for q0 in starts]
    group_seen = torch.stack([seen[q0 : q0 + size].any(0) for q0 in starts])  # [groups, S]
    index = torch.arange(S, device=dense.device)
    first = torch.where(group_seen, index, S).amin(-1)
    stop = torch.where(group_seen, index + 1, 0).amax(-1)
    ranges = torch.stack((first, stop)).T.tolist()  # a group that sees no context: (S, 0), an empty range
    return [(q0, min(q0 + size, Q), min(c0, c1), c1) for q0, (c0, c1) in zip(starts, ranges, strict=True)]


def _sparse(dense: torch.Tensor, groups: list, keep: torch.Tensor | None, rank: torch.Tensor | None) -> GroupedMask:
    """The mask with the context columns outside ``keep`` dropped and the group ranges renumbered."""
    if keep is None:
        return GroupedMask(dense, groups)
    S = rank.shape[0]
    columns = torch.cat((keep, torch.arange(S, dense.shape[-1], device=keep.device)))
    renumbered = []
    for q0, q1, c0, c1 in groups:
        start = int(rank[c0]) if c1 > c0 else 0
        renumbered.append((q0, q1, start, start + c1 - c0))
    return GroupedMask(dense.index_select(-1, columns), renumbered)


def grouped_context(masks, context_features: torch.Tensor, context_positions: torch.Tensor, block_size: int):
    """(context features, their positions, masks) with the context cut to the positions some group sees and each
    dense mask (a tensor, or a dict of them per layer type) turned into a ``GroupedMask``."""
    named = masks if isinstance(masks, dict) else {None: masks}
    plans = {name: _plan(dense, block_size, GROUP_QUERIES) for name, dense in named.items()}
    S = context_features.shape[1]
    needed = torch.zeros(S, dtype=torch.bool)
    for groups in plans.values():
        for _, _, c0, c1 in groups:
            needed[c0:c1] = True
    keep = rank = None
    if not bool(needed.all()):
        keep = needed.nonzero().squeeze(-1).to(context_features.device)
        rank = needed.cumsum(0) - needed.long()  # kept positions before each position
        context_features = context_features.index_select(1, keep)
        context_positions = context_positions.index_select(1, keep)
    grouped = {name: _sparse(named[name], groups, keep, rank) for name, groups in plans.items()}
    return context_features, context_positions, grouped if isinstance(masks, dict) else grouped[None]


class _ContextRanges(torch.autograd.Function):
    """Overlapping ranges [c0, c1) of dim 2 of x [b, h, S, d] as views; backward adds their gradients into one
    [b, h, S, d] tensor (slicing instead would allocate a zero tensor of x's size per range)."""

    @staticmethod
    def forward(ctx, x, ranges):
        ctx.shape, ctx.ranges = x.shape, ranges
        return tuple(x.narrow(2, c0, c1 - c0) for c0, c1 in ranges)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        total = None
        for (c0, c1), grad in zip(ctx.ranges, grads, strict=True):
            if grad is None or c1 == c0:
                continue
            if total is None:
                total = torch.zeros(ctx.shape, dtype=grad.dtype, device=grad.device)
            total[:, :, c0:c1] += grad
        return total, None


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: GroupedMask, enable_gqa: bool
) -> torch.Tensor:
    """SDPA of q [b, h, Q, d] against k, v [b, kv, S + Q, d] group by group: [b, h, Q, d]."""
    Q = q.shape[2]
    S = k.shape[2] - Q
    sizes = [q1 - q0 for q0, q1, _, _ in mask.groups]
    ranges = [(c0, c1) for _, _, c0, c1 in mask.groups]
    queries = torch.split(q, sizes, dim=2)
    keys, values = [], []
    for x, out in ((k, keys), (v, values)):
        context, block = torch.split(x, [S, Q], dim=2)
        out.extend(zip(_ContextRanges.apply(context, ranges), torch.split(block, sizes, dim=2), strict=True))
    outputs = []
    for (q0, q1, c0, c1), query, key, value in zip(mask.groups, queries, keys, values, strict=True):
        visible = torch.cat((mask.dense[..., q0:q1, c0:c1], mask.dense[..., q0:q1, S + q0 : S + q1]), dim=-1)
        outputs.append(
            F.scaled_dot_product_attention(
                query, torch.cat(key, dim=2), torch.cat(value, dim=2), attn_mask=visible, enable_gqa=enable_gqa
            )
        )
    return torch.cat(outputs, dim=2)


__all__ = ["GROUP_QUERIES", "GroupedMask", "grouped_attention", "grouped_context"]
