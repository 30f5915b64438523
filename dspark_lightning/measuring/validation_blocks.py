"""The one collector of validation blocks: what ``calibrate``, the reports, the tutorials and the notebook measure on.

Blocks come from ``module.shared_step`` at the deterministic evaluation anchors (``lightning.step.evaluation_steps``),
i.e. the same blocks as the validation metrics, flattened to N blocks of B' trained slots (B' = B, or B-1 in the
DFlash convention); blocks without a valid slot are dropped. Only the requested drafter outputs are kept: the
logits fields are [N, B', Vd] each, too large to gather by default over many batches of a real target.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from dspark_lightning.lightning.step import evaluation_steps

BLOCK_FIELDS = ("base_logits", "hidden", "first_prev", "teacher_logprobs", "confidence_logits")


@dataclass
class ValidationBlocks:
    """Validation blocks of a trained drafter: acceptance and validity always, the drafter outputs that were asked
    for (None otherwise, and ``confidence_logits`` None without a confidence head)."""

    alpha: torch.Tensor  # [N, B'] analytic acceptance probability of the drafter (with its Markov head)
    valid: torch.Tensor  # [N, B'] bool
    base_logits: torch.Tensor | None = None  # [N, B', Vd]
    hidden: torch.Tensor | None = None  # [N, B', H]
    first_prev: torch.Tensor | None = None  # [N] target id before slot 0 (the anchor)
    teacher_logprobs: torch.Tensor | None = None  # [N, B', Vd]
    confidence_logits: torch.Tensor | None = None  # [N, B']

    @property
    def num_blocks(self) -> int:
        return int(self.valid.shape[0])


def _trained_field(out, name: str, keep: torch.Tensor, take: int | None) -> torch.Tensor | None:
    """One drafter output of the kept blocks, on the CPU: the token before the first trained slot for
    ``first_prev``, else the trained slots in float32; None where the drafter has no such output."""
    if name == "first_prev":
        return out.trained_slots(out.prev_tokens)[keep][:take, 0].cpu()
    tensor = getattr(out, name)
    if tensor is None:
        return None
    return out.trained_slots(tensor)[keep][:take].detach().cpu().float()


@torch.no_grad()
def collect_blocks(
    module,
    dataloader,
    max_blocks: int | None = 512,
    *,
    max_batches: int | None = None,
    fields: Collection[str] = BLOCK_FIELDS,
) -> ValidationBlocks:
    """Up to ``max_blocks`` blocks with a valid slot from the first ``max_batches`` validation batches (None: no
    limit), with the drafter outputs named in ``fields`` (``BLOCK_FIELDS``)."""
    unknown = sorted(set(fields) - set(BLOCK_FIELDS))
    if unknown:
        raise ValueError(f"unknown block fields {unknown}; choose from {BLOCK_FIELDS}")
    module.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    have = 0
    for step in evaluation_steps(module, dataloader, max_batches):
        alpha, valid, out = step.alpha, step.valid, step.drafter_output
        keep = valid.any(dim=1)
        take = None if max_blocks is None else max_blocks - have
        collected = {"valid": valid[keep][:take].cpu(), "alpha": alpha[keep][:take].float().cpu()}
        collected |= {name: _trained_field(out, name, keep, take) for name in fields}
        for key, value in collected.items():
            if value is not None:
                parts.setdefault(key, []).append(value)
        have += int(collected["valid"].shape[0])
        if max_blocks is not None and have >= max_blocks:
            break
    if not have:
        raise ValueError("the validation dataloader produced no blocks with a valid slot")
    return ValidationBlocks(**{key: torch.cat(values) for key, values in parts.items()})
