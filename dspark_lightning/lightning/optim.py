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


def muon_parameter(name: str, parameter: torch.Tensor) -> bool:
    """Whether Muon trains this drafter parameter: a 2-D weight of the backbone (its layers and the context fusion);
    embeddings, norms, biases, the Markov, confidence and draft LM heads stay on AdamW."""
    return name.startswith("backbone.") and parameter.ndim == 2


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on the backbone's weight matrices and ``AdamW`` on every other parameter, as one optimizer
    (speculators' default recipe: Muon at about 10x the AdamW learning rate).

    Takes ``named_parameters()`` (``DSparkModule.configure_optimizers`` passes them); ``param_groups`` are the two
    inner optimizers' groups, so an LR scheduler scales both. ``configs/anchors/muon.yaml`` selects it."""

    def __init__(
        self,
        params,
        lr: float = 6e-3,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        adamw_lr: float = 6e-4,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_weight_decay: float = 0.0,
    ) -> None:
        named = list(params)
        if not all(isinstance(item, tuple) and len(item) == 2 for item in named):
            raise ValueError("MuonAdamW needs (name, parameter) pairs, as named_parameters() gives")
        matrices = [(n, p) for n, p in named if muon_parameter(n, p)]
        others = [(n, p) for n, p in named if not muon_parameter(n, p)]
        if not matrices:
            raise ValueError("MuonAdamW: no backbone weight matrix among the parameters for Muon to train")
        self.muon = torch.optim.Muon(matrices, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.adamw = (
            torch.optim.AdamW(others, lr=adamw_lr, betas=adamw_betas, weight_decay=adamw_weight_decay)
            if others
            else None
        )
        self.inner = [self.muon] + ([self.adamw] if self.adamw is not None else [])
        super().__init__([p for _, p in named], {"lr": lr})
        self.param_groups = [group for optimizer in self.inner for group in optimizer.param_groups]

    @property
    def state(self):  # what Lightning and torch read (e.g. to move state to a device)
        merged = {}
        for optimizer in getattr(self, "inner", []):
            merged.update(optimizer.state)
        return merged

    @state.setter
    def state(self, value) -> None:  # torch.optim.Optimizer.__init__ assigns an empty state: kept by the inner ones
        pass

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.inner:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.inner:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"inner": [optimizer.state_dict() for optimizer in self.inner]}

    def load_state_dict(self, state_dict: dict) -> None:
        for optimizer, state in zip(self.inner, state_dict["inner"], strict=True):
            optimizer.load_state_dict(state)
        self.param_groups = [group for optimizer in self.inner for group in optimizer.param_groups]
