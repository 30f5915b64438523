"""The default optimizer and learning-rate schedule of ``DSparkModule`` (each replaceable from the CLI)."""

from __future__ import annotations

import math

import torch


def default_optimizer(params):
    return torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.0)


def warmup_cosine_schedule(optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1):
    """Linear warm-up to the optimizer's lr, then cosine decay to ``min_lr_ratio`` of it at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
